"""Images in chat requests: seeded noise PNGs (nothing downloaded), counted as input by the
server's usage (the simulator's configured tokens per image), and their bytes per cell."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import orjson
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.results.records import read_records
from loadgen.workload.images import noise, png
from tests.conftest import StartSim


def test_image_tokens_come_from_usage_and_their_bytes_are_counted(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=1, image_tokens=100)
    path = tmp_path / "img.yaml"
    path.write_text("name: img\ntarget: {api: chat}\nworkload: {num_prompts: 6, input_tokens: 32, output_tokens: 4}\n"
                    "load: {concurrency: 2, warmup_requests: 0}\n")
    runs = {}
    for name, extra in (("plain", []), ("images", ["--set", "workload.images={count: 2, width: 16, height: 8}"])):
        result = CliRunner().invoke(app, ["run", str(path), "--base-url", base_url, "--out", str(tmp_path / name),
                                          *extra])
        assert result.exit_code == 0, result.output
        runs[name] = [r for r in read_records(tmp_path / name / "records.jsonl") if r.request_id >= 0]
    # the server counts 100 tokens for each of the 2 images, beside the same 32-token text
    assert {r.prompt_tokens for r in runs["plain"]} == {32}
    assert {r.prompt_tokens for r in runs["images"]} == {32 + 2 * 100}
    # each image a 16 x 8 PNG: the same bytes for every request, no two requests the same image
    sizes = {r.image_bytes for r in runs["images"]}
    assert len(sizes) == 1
    (cell,) = orjson.loads((tmp_path / "images" / "summary.json").read_bytes())["cells"]
    assert cell["metrics"]["image_bytes_total"] == sum(r.image_bytes for r in runs["images"]) == 6 * sizes.pop()
    assert "image_bytes_total" not in orjson.loads((tmp_path / "plain" / "summary.json").read_bytes()
                                                   )["cells"][0]["metrics"]


def test_noise_is_a_png_of_the_size_asked_and_differs_by_key() -> None:
    a, b = noise(16, 8, (1, 2, 3)), noise(16, 8, (1, 2, 4))
    assert a[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(a[16:20], "big") == 16  # the header's width, then height
    assert int.from_bytes(a[20:24], "big") == 8
    assert a != b
    assert noise(16, 8, (1, 2, 3)) == a
    # its pixel data: 8 rows, each a filter byte and 16 RGB pixels
    start = a.index(b"IDAT") + 4
    length = int.from_bytes(a[start - 8:start - 4], "big")
    assert len(zlib.decompress(a[start:start + length])) == 8 * (1 + 16 * 3)
    # a black pixel: its one row holds the filter byte and three zeros
    one = png(np.zeros((1, 1, 3), dtype=np.uint8))
    start = one.index(b"IDAT") + 4
    assert zlib.decompress(one[start:start + int.from_bytes(one[start - 8:start - 4], "big")]) == b"\x00" * 4
