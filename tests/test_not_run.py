"""The end of a test run names what it did not run (tests/not_run.py through
tests/conftest.py): the file, how many tests, why, and the command that runs them,
so a skipped suite cannot pass for a green one."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from not_run import not_run_lines

ROOT = Path(__file__).resolve().parent.parent
THEN = "fix that, then run: make test" if os.geteuid() == 0 else "run: sudo make test"

SKIPPED_SUITE = """
import pytest

pytestmark = pytest.mark.skipif(True, reason="no local fleet here: the fleet needs root")


def test_one():
    pass


def test_two():
    pass
"""
PLAIN_SUITE = """
import pytest


def test_runs():
    pass


def test_skips_inside():
    pytest.skip("Debian's nginx is not installed")
"""
WHOLE_FILE_SKIPPED = """
import pytest

pytest.skip("not on this machine", allow_module_level=True)
"""


def run_suite(tmp_path: Path, files: dict[str, str]) -> list[str]:
    """A tiny suite beside copies of the project's conftest.py and not_run.py, run
    by pytest in a subprocess as `make test` runs the real one; its output lines."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    for name in ("conftest.py", "not_run.py"):
        shutil.copy(ROOT / "tests" / name, tests / name)
    for name, text in files.items():
        (tests / name).write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--color=no"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def test_a_skipped_suite_is_named_at_the_end_with_the_command_that_runs_it(tmp_path):
    lines = run_suite(tmp_path, {"test_fleetlike.py": SKIPPED_SUITE, "test_plain.py": PLAIN_SUITE})
    header = next(i for i, line in enumerate(lines) if "tests that did not run" in line)
    assert lines[header + 1 : header + 3] == [
        f"NOT RUN: tests/test_fleetlike.py (2 tests): no local fleet here: the fleet needs root; {THEN}",
        f"NOT RUN: tests/test_plain.py (1 test): Debian's nginx is not installed; {THEN}",
    ]
    # Only pytest's own closing line comes after it.
    assert lines[header + 3 :] == lines[-1:] and "1 passed, 3 skipped" in lines[-1]


def test_a_file_skipped_as_it_is_collected_is_named_whole(tmp_path):
    lines = run_suite(
        tmp_path, {"test_elsewhere.py": WHOLE_FILE_SKIPPED, "test_plain.py": "def test_runs():\n    pass\n"}
    )
    assert f"NOT RUN: tests/test_elsewhere.py (the whole file): not on this machine; {THEN}" in lines


def test_a_run_that_skips_nothing_says_nothing_more(tmp_path):
    lines = run_suite(tmp_path, {"test_plain.py": "def test_runs():\n    pass\n"})
    assert not any("did not run" in line or "NOT RUN" in line for line in lines)


def test_without_root_the_command_is_sudo_make_test():
    skipped = [
        ("tests/test_fleet.py::test_a", "no local fleet here: the fleet needs root"),
        ("tests/test_fleet.py::test_b", "no local fleet here: the fleet needs root"),
    ]
    assert not_run_lines(skipped, as_root=False) == [
        "NOT RUN: tests/test_fleet.py (2 tests): no local fleet here: the fleet needs root; run: sudo make test"
    ]
    # As root, sudo changes nothing: the reason is what to fix.
    assert not_run_lines(skipped, as_root=True)[0].endswith("; fix that, then run: make test")
