"""The house rules that keep the engine forkable, checked on the source itself (no TensorFlow)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

# The engine: everything under train/ but its tools and the command line (which calls engine and tools alike).
ENGINE = [
    path
    for path in (REPO / "train").rglob("*.py")
    if "tools" not in path.relative_to(REPO / "train").parts and path.name not in ("cli.py", "__main__.py")
]
LONGEST_FUNCTION = 80  # lines: readable in one sitting


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_the_engine_never_imports_a_tool():
    """The doctor, check and bench sit on top of the engine; the arrows run one way."""
    offenders = {
        str(path.relative_to(REPO)): sorted(m for m in imported_modules(path) if m.startswith("train.tools"))
        for path in ENGINE
    }
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def test_no_engine_function_is_longer_than_one_sitting():
    long = []
    for path in ENGINE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_what_a_fork_edits_stands_apart_from_the_engine():
    """The engine names the fork's folder only as a default place to look: project/defaults.env and
    project.datasets. It never imports a fork's model by name (MODEL says where it is)."""
    for path in ENGINE:
        assert not any(m.startswith(("project", "examples")) for m in imported_modules(path)), path


def _runtime_distributions() -> set[str]:
    """pyproject's [project] dependencies and everything they require, as installed (not the dev extra's)."""
    import re
    import tomllib
    from importlib import metadata

    def name(requirement: str) -> str:
        return re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")

    pending = [name(each) for each in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    found: set[str] = set()
    while pending:
        distribution = pending.pop()
        if distribution in found:
            continue
        found.add(distribution)
        try:
            requires = metadata.requires(distribution) or []
        except metadata.PackageNotFoundError:
            continue
        pending += [name(each) for each in requires if "extra ==" not in each]
    return found


def test_the_package_imports_only_what_its_runtime_dependencies_bring():
    """The image installs pyproject's dependencies alone: an import that only the dev extra brings (click, which
    typer no longer needs: it carries its own) works in the venv and fails in the container."""
    import sys
    from importlib import metadata

    installed = {module: {d.lower().replace("_", "-") for d in dists}
                 for module, dists in metadata.packages_distributions().items()}  # fmt: skip
    runtime = _runtime_distributions()
    missing = {}
    for path in (REPO / "train").rglob("*.py"):
        for module in imported_modules(path):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in ("train", "project", "__future__"):
                continue
            if not installed.get(top, set()) & runtime:
                missing.setdefault(top, []).append(str(path.relative_to(REPO)))
    assert not missing, f"imported but not a runtime dependency: {missing}"
