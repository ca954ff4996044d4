"""Puts the repository root on sys.path so tests import `components` as the program does,
and ends a run naming the tests it skipped (tests/not_run.py)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from not_run import pytest_terminal_summary  # noqa: E402,F401  (a hook: pytest finds it here)
