"""Nothing outside tests/ depends on the tests (issue 22): the program, the CLI, the tools,
the benches and the local hosts (localhosts/) import no module that lives in tests/ and
do not put tests/ on sys.path, so tests/ keeps only tests, their helpers and the test
doubles (which localhosts/ uses as files, by path, never by import)."""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
# Top-level folders that are not the project's code: the tests themselves, the
# virtualenv (a symlink in a worktree), git's own.
NOT_CHECKED = {"tests", "venv", ".venv", ".git"}


def modules_in_tests() -> set[str]:
    """Every name an import could reach in tests/ with tests/ on sys.path: its modules
    (fleet_helpers, pulumi_mocks, not_run, tiny_model, test_*, ...), its folders that hold
    Python (doubles, golden), and `tests` itself (`from tests.pulumi_mocks import ...`)."""
    names = {"tests"} | {path.stem for path in TESTS.glob("*.py")}
    names |= {
        folder.name
        for folder in TESTS.iterdir()
        if folder.is_dir() and folder.name != "__pycache__" and any(folder.rglob("*.py"))
    }
    return names


def python_files_outside_tests() -> list[Path]:
    """Every .py file outside tests/, and the extension-less Python scripts ruff lints
    (ruff.toml extend-include) that are outside tests/."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        if Path(folder) == ROOT:
            subfolders[:] = [name for name in subfolders if name not in NOT_CHECKED]
        subfolders[:] = [name for name in subfolders if name != "__pycache__"]
        found += [Path(folder) / name for name in files if name.endswith(".py")]
    scripts = tomllib.loads((ROOT / "ruff.toml").read_text())["extend-include"]
    found += [ROOT / script for script in scripts if not script.startswith("tests/")]
    return sorted(found)


def _mentions_tests(node: ast.AST, names_for_tests: set[str]) -> bool:
    """Whether `node` names the tests folder: the string "tests" in it, or a name bound
    to an expression that has it (TESTS = ROOT / "tests")."""
    for part in ast.walk(node):
        if isinstance(part, ast.Constant) and isinstance(part.value, str) and "tests" in part.value.split("/"):
            return True
        if isinstance(part, ast.Name) and part.id in names_for_tests:
            return True
    return False


def _is_sys_path(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _changes_sys_path(node: ast.AST) -> bool:
    """sys.path.insert/append/extend(...), or an assignment to sys.path or a slice of it."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return _is_sys_path(node.func.value) and node.func.attr in ("insert", "append", "extend")
    if isinstance(node, ast.Assign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(_is_sys_path(t) or (isinstance(t, ast.Subscript) and _is_sys_path(t.value)) for t in targets)
    return False


def dependencies_on_tests(source: str, modules: set[str]) -> list[tuple[int, str]]:
    """(line, what) for every import of a module in `modules` (those that live in tests/)
    and every change of sys.path that adds tests/, in the Python `source`."""
    tree = ast.parse(source)
    names_for_tests: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _mentions_tests(node.value, set()):
            names_for_tests |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, f"imports {alias.name}, which lives in tests/")
                for alias in node.names
                if alias.name.split(".")[0] in modules
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in modules:
                found.append((node.lineno, f"imports from {node.module}, which lives in tests/"))
        elif _changes_sys_path(node) and _mentions_tests(node, names_for_tests):
            found.append((node.lineno, "puts tests/ on sys.path"))
    return sorted(found)


def test_nothing_outside_tests_imports_from_tests_or_puts_it_on_sys_path():
    modules = modules_in_tests()
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in python_files_outside_tests()
        for line, what in dependencies_on_tests(path.read_text(), modules)
    ]
    assert not problems, "code outside tests/ depends on the tests:\n" + "\n".join(problems)


def test_the_check_finds_the_imports_the_local_target_and_the_benches_had():
    """What tools/local_target.py and bench/ did before localhosts/ (issue 22), and the
    other ways of reaching tests/, are each found with their line."""
    source = """import sys
from pathlib import Path
ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
sys.path.insert(0, str(TESTS))
from fleet import Fleet
from fleet_cluster import FakeHub
import replay, json
from tests.pulumi_mocks import run_stack
from doubles.fake_hf_hub import download_counts
from localhosts.fleet import Fleet as Allowed
import components.spec
sys.path.insert(0, str(ROOT))
"""
    modules = modules_in_tests() | {"fleet", "fleet_cluster", "replay"}  # where they lived
    assert dependencies_on_tests(source, modules) == [
        (5, "puts tests/ on sys.path"),
        (6, "puts tests/ on sys.path"),
        (7, "imports from fleet, which lives in tests/"),
        (8, "imports from fleet_cluster, which lives in tests/"),
        (9, "imports replay, which lives in tests/"),
        (10, "imports from tests.pulumi_mocks, which lives in tests/"),
        (11, "imports from doubles.fake_hf_hub, which lives in tests/"),
    ]


def test_the_modules_of_tests_include_its_helpers_and_doubles_and_none_of_localhosts():
    modules = modules_in_tests()
    assert {"pulumi_mocks", "not_run", "tiny_model", "efs_authorization", "doubles", "fleet_helpers"} <= modules
    assert "test_project_layout" in modules and "tests" in modules
    assert not {"localhosts", "fleet", "fleet_cluster", "replay", "ssh_dial", "components"} & modules
