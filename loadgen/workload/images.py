"""Images in chat requests (``workload.images``): synthetic ones made here (seeded noise, a PNG of
the asked size: nothing is downloaded, and no two requests share an image, so no engine can
answer one request from another's image cache), or the files of a local directory in turn; each
sent as a data URL."""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path

import numpy as np

from loadgen.errors import ScenarioError
from loadgen.scenario.shapes import Images

IMAGE_DRAW = 7  # the stream of draws images come from (apart from prompts' and lengths')
TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}


def png(pixels: np.ndarray) -> bytes:
    """An RGB image (height x width x 3, uint8) as a PNG file."""
    height, width, _ = pixels.shape
    rows = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))  # filter 0 on every row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b"")


def noise(width: int, height: int, key: tuple[int, ...]) -> bytes:
    """A PNG of seeded noise: the same key, the same image; another key, another image."""
    rng = np.random.default_rng((*key, IMAGE_DRAW))
    return png(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))


def directory_files(images: Images) -> list[Path]:
    """The images of ``images.directory``, in name order; ``ScenarioError`` when there is none."""
    assert images.directory is not None
    found = sorted(p for p in images.directory.iterdir() if p.suffix.lower() in TYPES)
    if not found:
        raise ScenarioError(f"{images.directory}: no image (.png, .jpg, .jpeg, .webp) in workload.images.directory")
    return found


def data_url(data: bytes, media: str) -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def request_images(
    images: Images, key: tuple[int, ...], files: list[Path] | None = None,
) -> tuple[tuple[str, ...], int]:
    """The data URLs of one request's images and their bytes (before base64)."""
    urls, total = [], 0
    for k in range(images.count):
        if files:
            path = files[(key[-1] * images.count + k) % len(files)]
            data, media = path.read_bytes(), TYPES[path.suffix.lower()]
        else:
            data, media = noise(images.width, images.height, (*key, k)), "image/png"
        urls.append(data_url(data, media))
        total += len(data)
    return tuple(urls), total
