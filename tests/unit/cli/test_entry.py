"""Ctrl-C while the command line loads (its first half second): "interrupted" and exit 130, as
at any later moment, instead of a KeyboardInterrupt traceback from deep in an import."""

from __future__ import annotations

import importlib.abc
import sys

import pytest

from loadgen import entry


class _InterruptedImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "loadgen.cli":
            raise KeyboardInterrupt
        return None


def test_a_ctrl_c_while_the_command_line_loads_ends_as_one_later(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    for name in [m for m in sys.modules if m == "loadgen.cli" or m.startswith("loadgen.cli.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport(), *sys.meta_path])
    with pytest.raises(SystemExit) as ended:
        entry.main()
    assert ended.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"
