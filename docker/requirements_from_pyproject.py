"""Print the project's runtime requirements from pyproject.toml, one per line.

Used by docker/Dockerfile to install the dependencies in a layer of their own,
before the source is copied in, so editing code does not reinstall TensorFlow.

    python requirements_from_pyproject.py pyproject.toml [EXTRA ...]
    python requirements_from_pyproject.py --constraints requirements.lock pyproject.toml
    python requirements_from_pyproject.py --locked LOCK [--except FILE] pyproject.toml [EXTRA ...]

The first form prints `[project] dependencies` plus those of each named optional
extra (e.g. `gpu`, which brings `tensorflow[and-cuda]` and the CUDA/cuDNN wheels).
An unknown extra is an error, so a typo in TF_VARIANT cannot silently build a
CPU image.

The second form turns a pip-freeze style lock file into a constraints file pip
accepts: only `name==version` lines are kept, extras are dropped (pip refuses
constraints with extras), and so are the project itself, editable and URL lines.
A missing lock file gives an empty constraints file.

The third form prints, from a lock made by `make lock` (hashes and `# via` annotations), the entries the
image needs: `[project] dependencies` plus the named extras and everything they pull in (followed through
the lock's `# via` lines), each with its hashes, for `pip install --require-hashes -r`. Packages named in
FILE (the shared layer's requirements.txt) are left out; where LOCK pins one of them otherwise, that is an
error (the two locks disagree: run make lock).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject.get("project", {})
    reqs = list(project.get("dependencies", []))
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            known = ", ".join(sorted(optional)) or "none"
            raise SystemExit(f"error: pyproject.toml has no optional extra {extra!r} (known: {known})")
        reqs.extend(optional[extra])
    return reqs


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(==\s*[^\s;#]+)(\s*;[^#]*)?")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints(lock_text: str, project_name: str) -> list[str]:
    out = []
    for line in lock_text.splitlines():
        line = line.strip()
        match = _PIN.match(line)
        if not match or _normalise(match.group(1)) == _normalise(project_name):
            continue
        name, _extras, version, marker = match.groups()
        out.append(f"{name}{version.replace(' ', '')}{(marker or '').rstrip()}")
    return out


def lock_entries(lock_text: str) -> dict[str, tuple[str, set[str]]]:
    """{name: (the entry's requirement and hash lines, the names in its `# via`)}, names normalised."""
    entries: dict[str, tuple[str, set[str]]] = {}
    name = ""
    for line in lock_text.splitlines():
        match = _PIN.match(line)
        if match:
            name = _normalise(match.group(1))
            entries[name] = (line, set())
        elif name and line.lstrip().startswith("--hash"):
            entries[name] = (entries[name][0] + "\n" + line, entries[name][1])
        elif name and (via := re.match(r"\s*#\s+(?:via\s+)?([A-Za-z0-9][A-Za-z0-9._-]*)", line)) and via[1] != "via":
            entries[name][1].add(_normalise(via.group(1)))
    return entries


def locked(lock: Path, pyproject: dict, extras: list[str], leave_out: Path | None) -> list[str]:
    entries = lock_entries(lock.read_text())
    if not any(parents for _, parents in entries.values()):
        raise SystemExit(f"error: {lock} has no `# via` annotations: make lock writes them")
    children: dict[str, set[str]] = {}
    for name, (_, parents) in entries.items():
        for parent in parents:
            children.setdefault(parent, set()).add(name)
    wanted = [_normalise(re.split(r"[\[=<>~!; ]", r.strip(), maxsplit=1)[0]) for r in requirements(pyproject, extras)]
    missing = sorted(set(wanted) - set(entries))
    if missing:
        raise SystemExit(f"error: {lock} does not hold {', '.join(missing)} from pyproject.toml: run make lock")
    closure: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name not in closure:
            closure.add(name)
            wanted.extend(children.get(name, ()))
    shared = lock_entries(leave_out.read_text()) if leave_out else {}
    for name in sorted(closure & set(shared)):
        if shared[name][0].split() != entries[name][0].split():
            raise SystemExit(f"error: {lock} and {leave_out} pin {name} differently: run make lock")
    return [entries[name][0] for name in sorted(closure - set(shared))]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if argv[0] == "--locked" and len(argv) >= 3:
        lock, argv = Path(argv[1]), argv[2:]
        leave_out = None
        if argv[0] == "--except" and len(argv) >= 3:
            leave_out, argv = Path(argv[1]), argv[2:]
        with open(argv[0], "rb") as f:
            data = tomllib.load(f)
        for entry in locked(lock, data, [e for e in argv[1:] if e], leave_out):
            print(entry)
        return 0
    if argv[0] == "--constraints":
        if len(argv) != 3:
            print(__doc__.strip(), file=sys.stderr)
            return 2
        lock, pyproject_path = Path(argv[1]), argv[2]
        with open(pyproject_path, "rb") as f:
            name = tomllib.load(f).get("project", {}).get("name", "")
        if lock.is_file():
            for line in constraints(lock.read_text(), name):
                print(line)
        return 0
    with open(argv[0], "rb") as f:
        data = tomllib.load(f)
    for req in requirements(data, [e for e in argv[1:] if e]):
        print(req)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
