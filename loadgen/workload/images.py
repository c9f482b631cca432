"""Images in chat requests (``workload.images``): synthetic ones made here (seeded noise, a PNG of
the asked size: nothing is downloaded, and no two requests share an image, so no engine can
answer one request from another's image cache), or the files of a local directory in turn; each
sent as a data URL."""

from __future__ import annotations

import base64
import functools
import stat
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


MAX_IMAGE_BYTES = 20 << 20  # what OpenAI's API takes in one image; servers refuse larger ones too
# each type's first bytes (WebP: RIFF, then four of size, then WEBP at 8)
MAGIC = {"image/png": (0, b"\x89PNG\r\n\x1a\n"), "image/jpeg": (0, b"\xff\xd8\xff"), "image/webp": (8, b"WEBP")}


def _image_problem(path: Path) -> str | None:
    """Why a file of the directory is not sent: a link (it could point anywhere: /etc/shadow),
    not a plain file (a FIFO would hang the run), too large, or not what its name says."""
    try:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            return "a symbolic link; loadgen sends the directory's own files only: copy the image in"
        if not stat.S_ISREG(st.st_mode):
            return "not a plain file"
        if st.st_size > MAX_IMAGE_BYTES:
            return f"{st.st_size / 2**20:,.0f} MiB, over the 20 MiB servers take in one image: make it smaller"
        with path.open("rb") as f:
            head = f.read(12)
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    media = TYPES[path.suffix.lower()]
    at, magic = MAGIC[media]
    if head[at:at + len(magic)] != magic:
        return f"not a {media.split('/')[1].upper()} image (its first bytes say otherwise)"
    return None


def directory_files(images: Images) -> tuple[Path, ...]:
    """The images of ``images.directory``, in name order, each checked (once a run: this is
    asked for each request made); ``ScenarioError`` naming the file when one cannot be sent."""
    assert images.directory is not None
    return _checked_files(images.directory)


@functools.lru_cache(maxsize=8)
def _checked_files(directory: Path) -> tuple[Path, ...]:
    try:
        found = sorted(p for p in directory.iterdir() if p.suffix.lower() in TYPES)
    except OSError as exc:
        raise ScenarioError(f"{directory}: cannot list workload.images.directory ({exc.strerror or exc})") from None
    for path in found:
        if (problem := _image_problem(path)) is not None:
            raise ScenarioError(f"{path}: {problem} (workload.images.directory)")
    if not found:
        raise ScenarioError(f"{directory}: no image (.png, .jpg, .jpeg, .webp) in workload.images.directory")
    return tuple(found)


def data_url(data: bytes, media: str) -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def request_images(
    images: Images, key: tuple[int, ...], files: tuple[Path, ...] | None = None,
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
