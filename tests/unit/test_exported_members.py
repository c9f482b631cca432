from __future__ import annotations

import subprocess
import sys

import loadgen


def test_package_exports_only_its_version() -> None:
    assert loadgen.__all__ == ["__version__"]
    assert loadgen.__version__.count(".") >= 2


def test_import_loads_at_most_three_loadgen_modules() -> None:
    code = "import loadgen, sys; print(sorted(m for m in sys.modules if m.startswith('loadgen')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names = eval(loaded)  # a list literal printed by the child
    assert names == ["loadgen"], names
