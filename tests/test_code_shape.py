"""The layout shows the design (issue 37): the next engineer finds a domain in a module of
its own, reads any function on one screen, and follows imports that run one way.

- no module of components/ is above 800 lines;
- no function of components/, cli/ or localhosts/ is above 60 lines;
- no two modules of components/ import each other, directly or round a longer circle,
  counting imports inside functions (they only hide a circle);
- localhosts/ imports nothing from tools/ (tools/ are commands for a developer; the
  arrow runs from tools/ and tests/ down to the code, never back up);
- every top-level folder opens with a few lines that say what lives there and what may
  import it: a README.md, or for a Python package its __init__.py's docstring.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 60
# Folders that are not the project's code or are made by tools: the virtualenv, git's,
# caches.
NOT_PROJECT_FOLDERS = {"venv", ".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache"}


def _python_files(folder: str) -> list[Path]:
    return sorted(path for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def long_functions(folders: tuple[str, ...]) -> list[str]:
    found = []
    for folder in folders:
        for path in _python_files(folder):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return found


def imported_modules(path: Path, own: str | None = None) -> set[str]:
    """Every module `path` (the module `own`, by default its name in the project)
    imports, anywhere in it (top level or inside a function), as dotted names resolved
    against the project (relative imports included)."""
    own = own or _module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            # `from components import sizing` imports the module components.sizing.
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def components_import_graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in _python_files("components")}
    graph = {}
    for name, path in modules.items():
        reached = set()
        for imported in imported_modules(path):
            # A submodule import reaches its package's __init__ too; only edges between
            # two of components' own modules count, and a package's own submodules are
            # its parts, not a circle.
            if imported in modules and imported != name:
                reached.add(imported)
        graph[name] = reached
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of imports, each as the modules round it (Tarjan's strongly
    connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for other in graph[name]:
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in on_stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == name:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return circles


def _is_part_of(child: str, parent: str) -> bool:
    return child.startswith(parent + ".")


def test_no_module_of_components_is_above_800_lines():
    long_modules = [
        f"{path.relative_to(ROOT)} ({lines} lines)"
        for path in _python_files("components")
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert long_modules == []


def test_no_function_is_above_60_lines():
    assert long_functions(("components", "cli", "localhosts")) == []


def test_no_two_modules_of_components_import_each_other():
    graph = components_import_graph()
    # A package and its own submodules (components.spec and components.spec.shape) are
    # one domain: the package's __init__ gathers its parts. Any other circle is a defect.
    circles = [
        circle
        for circle in import_cycles(graph)
        if not all(member == circle[0] or _is_part_of(member, circle[0]) for member in circle[1:])
    ]
    assert circles == []


def test_the_circle_finder_finds_a_circle_through_a_function_level_import(tmp_path):
    # The check above must be able to fail: a circle of three, one edge inside a function.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    source = "def f():\n    from components.bootstrap import EFS_UTILS_VERSION\n"
    module = tmp_path / "sizing.py"
    module.write_text(source)
    assert "components.bootstrap" in imported_modules(module, "components.sizing")


def test_localhosts_imports_nothing_from_tools():
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _python_files("localhosts")
        for name in imported_modules(path)
        if name == "tools" or name.startswith("tools.")
    ]
    assert wrong == []


def test_every_top_level_folder_opens_with_what_lives_there():
    silent = []
    for folder in sorted(ROOT.iterdir()):
        if not folder.is_dir() or folder.name in NOT_PROJECT_FOLDERS or folder.name.startswith("."):
            continue
        readme = folder / "README.md"
        init = folder / "__init__.py"
        if readme.is_file() and len(readme.read_text().strip().splitlines()) >= 2:
            continue
        if init.is_file():
            docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
            if len(docstring.split()) >= 15:
                continue
        silent.append(folder.name)
    assert silent == []
