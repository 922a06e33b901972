"""Print the project's runtime requirements from pyproject.toml, one per line.

Used by docker/Dockerfile to install the dependencies in a layer of their own,
before the source is copied in, so editing code does not reinstall TensorFlow.

    python requirements_from_pyproject.py pyproject.toml [EXTRA ...]
    python requirements_from_pyproject.py --extras-only pyproject.toml [EXTRA ...]
    python requirements_from_pyproject.py --constraints requirements.lock pyproject.toml

The first form prints `[project] dependencies` plus those of each named optional
extra (e.g. `gpu`, which brings `tensorflow[and-cuda]` and the CUDA/cuDNN wheels).
An unknown extra is an error, so a typo in TF_VARIANT cannot silently build a
CPU image. `--extras-only` prints only the extras' requirements (nothing for no
extra): the Dockerfile installs them in a layer of their own on top of the
dependencies both variants share.

The second form turns a pip-freeze style lock file into a constraints file pip
accepts: only `name==version` lines are kept, extras are dropped (pip refuses
constraints with extras), and so are the project itself, editable and URL lines.
A missing lock file gives an empty constraints file.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def requirements(pyproject: dict, extras: list[str], base: bool = True) -> list[str]:
    project = pyproject.get("project", {})
    reqs = list(project.get("dependencies", [])) if base else []
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


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
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
    base = argv[0] != "--extras-only"
    if not base:
        argv = argv[1:]
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[0], "rb") as f:
        data = tomllib.load(f)
    for req in requirements(data, [e for e in argv[1:] if e], base):
        print(req)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
