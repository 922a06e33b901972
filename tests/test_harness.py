"""The fork server the tests start their TensorFlow processes from (tests/harness/forkserver.py): a forked run
must see what a fresh interpreter sees, or the tests that go through it would test something else."""

from __future__ import annotations

import ast
import copy
import json
import re
import signal
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.conftest import EXTRA_MODULES, REPO, clean_env, run_python, start_python

SEEN = """
import json, os, sys, tempfile
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "setting": os.environ.get("EPOCHS"), "path": sys.path[:2],
                  "tmp": tempfile.gettempdir()}))
sys.exit(3)
"""


def test_a_forked_run_sees_what_a_fresh_interpreter_sees(tmp_path):
    (tmp_path / "tmp").mkdir()
    env = clean_env(EPOCHS=7, TMPDIR=tmp_path / "tmp")
    env["PYTHONPATH"] += ":" + str(tmp_path)
    forked, fresh = (run_python(["-c", SEEN, "a", "b"], cwd=tmp_path, env=env, fresh=f) for f in (False, True))
    assert (forked.returncode, fresh.returncode) == (3, 3), forked.stderr[-2000:]
    seen = json.loads(forked.stdout)
    assert seen == json.loads(fresh.stdout)
    assert (seen["argv"], seen["setting"], seen["tmp"]) == (["-c", "a", "b"], "7", str(tmp_path / "tmp"))
    module = run_python(["-m", "json.tool", "--help"], cwd=tmp_path)
    assert module.returncode == 0 and "json.tool" in module.stdout


def test_a_forked_run_is_signalled_and_killed_as_a_process_is(tmp_path):
    waiting = "import sys, time\nprint('up', flush=True)\ntime.sleep(60)"
    process = start_python(["-c", waiting], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "up" and process.poll() is None
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == -signal.SIGTERM
    process.stdout.close()


def test_no_test_process_starts_where_a_developers_env_would_be_read():
    """A .env is read from the working directory: no process a test starts runs in the repository (where a
    developer keeps theirs); one started without a folder of its own runs in an empty one."""
    with pytest.raises(ValueError, match=r"would read a developer's \.env there"):
        start_python(["-c", "pass"], cwd=REPO)
    with pytest.raises(ValueError, match=r"would read a developer's \.env there"):
        start_python(["-c", "pass"], cwd=REPO / "tests" / "..")
    where = run_python(["-c", "import os; print(os.getcwd(), os.path.exists('.env'))"])
    folder, has_dotenv = where.stdout.split()[-2:]
    assert Path(folder).resolve() != REPO and has_dotenv == "False"


def _code(node: ast.AST) -> str:
    """`node`'s code without its docstrings (which may say `import mlflow` without doing it)."""
    node = copy.deepcopy(node)
    for each in ast.walk(node):
        body = getattr(each, "body", None)
        if isinstance(body, list) and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body[0] = ast.Pass()
    return ast.unparse(node)


def _defined(node: ast.stmt) -> list[str]:
    """The names a module-level statement defines: a function's or class's, or an assignment's."""
    names = [node.name] if isinstance(node, ast.FunctionDef | ast.ClassDef) else []
    return names + [target.id for target in getattr(node, "targets", []) if isinstance(target, ast.Name)]


def _imports_of_extras(source: str) -> set[str]:
    """The extras whose modules `source` imports: in its code, or in code it hands a process as a string."""
    found = set()
    for extra, modules in EXTRA_MODULES.items():
        names = "|".join(modules)
        if re.search(rf"\b(import|from)\s+([\w.]+\s*,\s*)*({names})\b", source):
            found.add(extra)
    return found


def _skips_for(node: ast.AST, marks: dict[str, set[str]]) -> set[str]:
    """The extras a decorator list, a `pytestmark` or a module-level call skips for: needs(EXTRA), a name bound to
    one, or pytest.importorskip(MODULE)."""
    if isinstance(node, ast.Name):
        return marks.get(node.id, set())
    if isinstance(node, ast.List | ast.Tuple):
        return set().union(*(_skips_for(each, marks) for each in node.elts))
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        called = ast.unparse(node.func)
        if called == "needs":
            return {node.args[0].value}
        if called == "pytest.importorskip":
            return {extra for extra, modules in EXTRA_MODULES.items() if node.args[0].value in modules}
    return set()


def _unguarded(path: Path, tainted_imports: dict[str, set[str]]) -> list[str]:
    """The tests of `path` that import an extra (themselves, through a function or string of their module, or a
    name imported from tests/) without skipping where it is missing."""
    tree = ast.parse(path.read_text())
    tainted = {name: set(extras) for name, extras in tainted_imports.items()}
    marks: dict[str, set[str]] = {}
    module_skips: set[str] = set()
    bodies = {}
    for node in tree.body:
        if isinstance(node, ast.Expr):
            module_skips |= _skips_for(node.value, marks)
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            marks[name] = _skips_for(node.value, marks)
            module_skips |= marks[name] if name == "pytestmark" else set()
        for name in _defined(node):
            bodies[name] = node
            tainted.setdefault(name, set()).update(_imports_of_extras(_code(node)))
    changed = True
    while changed:  # a function that uses a tainted name is tainted
        changed = False
        for name, node in bodies.items():
            used = {each.id for each in ast.walk(node) if isinstance(each, ast.Name)} - {name}
            grown = tainted[name].union(*(tainted.get(each, set()) for each in used))
            changed |= grown != tainted[name]
            tainted[name] = grown
    imports = [ast.unparse(node) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    top = _imports_of_extras("\n".join(imports))
    unguarded = [f"{path.name}: imports {extra} at the top" for extra in sorted(top - module_skips)]
    for name, node in bodies.items():
        if name.startswith("test_") and isinstance(node, ast.FunctionDef):
            skips = module_skips.union(*(_skips_for(each, marks) for each in node.decorator_list))
            unguarded += [f"{path.name}::{name} needs {extra}" for extra in sorted(tainted[name] - skips)]
    return unguarded


def test_every_test_that_imports_an_extra_skips_without_it():
    """`make test` runs on the README's set-up, which installs no extra: a test that imports one (KerasHub, MLflow,
    Optuna) skips without it, naming the extra, rather than failing. Checked here for every test, the slow ones
    (which CI runs with the extras) included."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRA_MODULES) == set(extras) - {"dev", "gpu", "profile"}  # each extra a test may need, named
    helpers: dict[tuple[str, str], set[str]] = {}  # (module, name): what each module of tests/ defines
    for path in sorted((REPO / "tests").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            for name in _defined(node):
                helpers[module, name] = _imports_of_extras(_code(node))
    unguarded = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        imported = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
                for alias in node.names:
                    imported[alias.asname or alias.name] = helpers.get((node.module, alias.name), set())
        unguarded += _unguarded(path, imported)
    assert unguarded == []
