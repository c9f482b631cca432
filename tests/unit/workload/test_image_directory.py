"""A directory of images sends its own plain image files only, each checked once before the run:
a link (it could point at /etc/shadow), a FIFO (the run would hang on it), a text file named
.png, or an image past the 20 MiB servers take, is named in one line instead."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from loadgen.errors import ScenarioError
from loadgen.scenario.shapes import Images
from loadgen.workload.images import _checked_files, directory_files, png


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    _checked_files.cache_clear()  # (checked once a run: here, once a case)
    d = tmp_path / "images"
    d.mkdir()
    (d / "a.png").write_bytes(png(np.zeros((4, 4, 3), dtype=np.uint8)))
    (d / "b.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 64)
    (d / "notes.txt").write_text("not an image, and not named as one: left alone")
    return d


def test_the_plain_images_in_name_order(folder: Path) -> None:
    assert [p.name for p in directory_files(Images(directory=folder))] == ["a.png", "b.jpg"]


@pytest.mark.parametrize(("make", "problem"), [
    (lambda d: (d / "c.png").symlink_to("/etc/hostname"), "c.png: a symbolic link; loadgen sends the directory's own"),
    (lambda d: os.mkfifo(d / "c.png"), "c.png: not a plain file"),
    (lambda d: (d / "c.png").write_text("hello"), "c.png: not a PNG image (its first bytes say otherwise)"),
    (lambda d: (d / "c.webp").write_bytes(b"RIFF\x00\x00\x00\x00WEBx"), "c.webp: not a WEBP image"),
    (lambda d: ((d / "c.jpg").write_bytes(b"\xff\xd8\xff"), os.truncate(d / "c.jpg", 21 << 20)),
     "c.jpg: 21 MiB, over the 20 MiB servers take in one image: make it smaller"),
])
def test_what_cannot_be_sent_is_named(folder: Path, make: object, problem: str) -> None:
    make(folder)  # type: ignore[operator]
    with pytest.raises(ScenarioError, match="workload.images.directory") as err:
        directory_files(Images(directory=folder))
    assert problem in str(err.value)


def test_a_directory_that_cannot_be_listed_is_one_line(tmp_path: Path) -> None:
    _checked_files.cache_clear()
    with pytest.raises(ScenarioError, match=r"cannot list workload.images.directory \(No such file or directory\)"):
        directory_files(Images(directory=tmp_path / "gone"))
