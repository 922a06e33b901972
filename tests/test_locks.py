"""requirements.lock and requirements-gpu.lock, checked offline (no CUDA wheel is downloaded; part of `make test`).

The GPU lock is the whole GPU environment: it agrees with pyproject.toml, pins every package it shares with
requirements.lock identically (version and hashes), and pins every nvidia-* wheel tensorflow[and-cuda] needs with
its hashes, at the lowest its range allows; its opening comments say which of those are the versions TensorFlow
was built against, and docs/devices.md's table agrees. TensorFlow's ranges and build info come from the installed
tensorflow's metadata and build_info.py, read without importing it.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CPU_LOCK, GPU_LOCK = REPO / "requirements.lock", REPO / "requirements-gpu.lock"
REQS_HELPER = REPO / "docker" / "requirements_from_pyproject.py"
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?: \\)?$")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def entries(path: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """{name: (version, sorted hashes)}; a requirement line that is not `name==version` fails the test."""
    found: dict[str, tuple[str, list[str]]] = {}
    name = ""
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith(" "):
            hashed = re.fullmatch(r"\s+--hash=sha256:([0-9a-f]{64})(?: \\)?", line)
            assert hashed and name, f"{path.name}: unexpected line {line!r}"
            found[name][1].append(hashed.group(1))
            continue
        match = _ENTRY.match(line)
        assert match, f"{path.name}: {line!r} is not pinned with =="
        name = normalise(match.group(1))
        found[name] = (match.group(2), [])
    return {name: (version, tuple(sorted(hashes))) for name, (version, hashes) in found.items()}


def pyproject_pins(*extras: str) -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    pins = {}
    for requirement in requirements:
        match = re.match(r"([A-Za-z0-9._-]+)(\[[^\]]*\])?\s*==\s*([^\s;]+)", requirement)
        assert match, f"pyproject.toml: {requirement!r} is not pinned with =="
        pins[normalise(match.group(1))] = match.group(3)
    return pins


def tensorflow_cuda_ranges() -> dict[str, tuple[str, str]]:
    """{wheel: (lowest, below)} of tensorflow[and-cuda], from the installed tensorflow (the pinned one)."""
    assert metadata.version("tensorflow") == pyproject_pins()["tensorflow"]
    ranges = {}
    for requirement in metadata.requires("tensorflow") or []:
        if re.search(r"extra\s*==\s*.and-cuda", requirement):
            name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
            lowest, below = re.search(r">=\s*([0-9.]+)", requirement)[1], re.search(r"<\s*([0-9.]+)", requirement)[1]
            ranges[normalise(name)] = (lowest, below)
    return ranges


def build_info() -> dict[str, str]:
    info = metadata.distribution("tensorflow").locate_file("tensorflow/python/platform/build_info.py")
    return dict(re.findall(r"\('(cuda_version|cudnn_version)', '([^']*)'\)", Path(str(info)).read_text()))


def release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def test_every_package_of_both_locks_is_pinned_with_hashes():
    for path in (CPU_LOCK, GPU_LOCK):
        found = entries(path)
        assert len(found) > 50, path.name
        assert not [name for name, (_, hashes) in found.items() if not hashes], f"{path.name}: entries without a hash"


def test_the_locks_agree_with_pyproject():
    cpu, gpu = entries(CPU_LOCK), entries(GPU_LOCK)
    for lock, pins in (
        (cpu, pyproject_pins("dev", "hub", "track", "tune", "formats")),
        (gpu, pyproject_pins("dev", "hub", "track", "tune", "formats", "gpu")),
    ):
        assert {name: lock.get(name, ("missing",))[0] for name in pins} == pins
    # Nothing else: every package is needed by pyproject.toml's requirements, through the locks' `# via` lines.
    for path, extras in (
        (CPU_LOCK, ["dev", "hub", "track", "tune", "formats"]),
        (GPU_LOCK, ["dev", "hub", "track", "tune", "formats", "gpu"]),
    ):
        command = [sys.executable, str(REQS_HELPER), "--locked", str(path), str(REPO / "pyproject.toml"), *extras]
        needed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        assert set(entries(path)) == {normalise(line.split("==")[0]) for line in needed.splitlines() if "==" in line}


def test_the_gpu_lock_holds_the_cpu_lock_identically():
    cpu, gpu = entries(CPU_LOCK), entries(GPU_LOCK)
    assert set(cpu) <= set(gpu), f"only in {CPU_LOCK.name}: {sorted(set(cpu) - set(gpu))}"
    assert {name: gpu[name] for name in cpu} == cpu  # versions and hashes
    assert sorted(set(gpu) - set(cpu)) == sorted(name for name in gpu if name.startswith("nvidia-"))


def test_every_cuda_wheel_tensorflow_needs_is_pinned_at_the_lowest_its_range_allows():
    gpu, ranges = entries(GPU_LOCK), tensorflow_cuda_ranges()
    assert len(ranges) >= 10  # CUDA runtime, cuBLAS, cuDNN, NCCL, ...
    for name, (lowest, below) in ranges.items():
        assert name in gpu, f"{name} (tensorflow[and-cuda]) is not in {GPU_LOCK.name}"
        version, hashes = gpu[name]
        assert hashes and version == lowest, f"{name}=={version}: the range is >={lowest},<{below}"
        assert release(version) < release(below)


def test_the_gpu_lock_says_which_pins_tensorflow_was_built_against():
    text, gpu, build = GPU_LOCK.read_text(), entries(GPU_LOCK), build_info()
    assert build["cuda_version"] and build["cudnn_version"]
    comments = dict(re.findall(r"^#\s+(nvidia-[a-z0-9-]+==\S+)\s+(.+)$", text, re.M))
    for name, (version, _) in gpu.items():
        if not name.startswith("nvidia-"):
            continue
        why = comments.get(f"{name}=={version}")
        assert why, f"{GPU_LOCK.name}'s opening comments do not name {name}=={version}"
        if "nccl" in name:  # the build info names no NCCL
            assert why.startswith("lowest allowed")
        elif "cudnn" in name:
            assert why == f"built against: cuDNN {build['cudnn_version']}"
            assert version.split(".")[0] == build["cudnn_version"].split(".")[0]
        else:
            assert why == f"built against: CUDA {build['cuda_version']}"
    runtime = gpu["nvidia-cuda-runtime-cu12"][0]
    assert runtime.split(".")[:2] == build["cuda_version"].split(".")[:2]  # CUDA 12.5's runtime for a 12.5.1 build


def test_docs_devices_table_agrees_with_the_gpu_lock():
    text = (REPO / "docs" / "devices.md").read_text()
    rows = dict(re.findall(r"^\|[^|]*\|\s*`(nvidia-[a-z0-9-]+)`\s*\|\s*([0-9.]+)\s*\|", text, re.M))
    locked = {name: version for name, (version, _) in entries(GPU_LOCK).items() if name.startswith("nvidia-")}
    assert rows == locked


def make_setup(venv: Path, extras: str) -> list[str]:
    """`make -n setup`'s commands (continued lines joined)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {name: value for name, value in os.environ.items() if not name.startswith("MAKE")}  # not make test's flags
    command = ["make", "-n", "setup", f"VENV={venv}", f"EXTRAS={extras}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.replace("\\\n", " ").splitlines()


@pytest.mark.parametrize(
    ("extras", "lock", "hub"),
    [("dev", "requirements.lock", False), ("dev,gpu", "requirements-gpu.lock", False),
     ("dev,hub", "requirements.lock", True), ("dev,gpu,hub", "requirements-gpu.lock", True)],
)  # fmt: skip
def test_make_setup_installs_from_the_lock_with_hashes_then_the_project_without_dependencies(
    tmp_path, extras, lock, hub
):
    commands = make_setup(tmp_path / "venv", extras)
    pips = [line.split(" -m pip install ", 1)[1] for line in commands if " -m pip install " in line]
    assert pips[1:] == [f"--quiet --require-hashes -r {tmp_path}/venv/locked.txt", "--quiet --no-deps -e ."]
    # locked.txt: the lock's entries that the dependencies and the named extras need, as the set-up writes them.
    (written,) = [line for line in commands if line.endswith(f"> {tmp_path}/venv/locked.txt")]
    assert f"--locked {lock} pyproject.toml" in written
    locked = subprocess.run(["bash", "-c", written.rsplit(">", 1)[0]], cwd=REPO, capture_output=True, text=True)
    assert locked.returncode == 0, locked.stderr
    names = {normalise(line.split("==")[0]) for line in locked.stdout.splitlines() if "==" in line}
    assert "--hash=sha256:" in locked.stdout and {"tensorflow", "pytest"} <= names
    assert ({"keras-hub", "tensorflow-text", "kagglehub"} <= names) is hub
    assert not ({"keras-hub", "tensorflow-text", "kagglehub", "sentencepiece"} & names) or hub
    assert ("nvidia-cudnn-cu12" in names) is ("gpu" in extras)


def test_the_makefile_installs_with_hashes_the_extras_the_locks_hold():
    """LOCKED_EXTRAS, in the Makefile and scripts/lock.py: an extra the locks hold is installed from them, hashed;
    one they do not hold (profile) under their pins."""
    makefile = re.search(r"^LOCKED_EXTRAS := (.+)$", (REPO / "Makefile").read_text(), re.M)
    locked = re.search(r"^LOCKED_EXTRAS = (\[.+\])$", (REPO / "scripts" / "lock.py").read_text(), re.M)
    assert makefile and locked
    assert set(makefile.group(1).split()) == {*ast.literal_eval(locked.group(1)), "gpu"}
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) == {*makefile.group(1).split(), "profile"}


def test_other_extras_run_the_set_up_again(tmp_path):
    """The set-up remembers the extras it installed ($(VENV)/bin/.extras): `make setup EXTRAS=dev,hub` on a venv
    set up with EXTRAS=dev runs it again (pip adds what is missing); the same extras do not."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / ".extras").write_text("dev\n")
    os.utime(bin_dir / ".extras", (1, 1))
    (bin_dir / ".installed").touch()
    env = {name: value for name, value in os.environ.items() if not name.startswith("MAKE")}

    def setup(extras: str) -> subprocess.CompletedProcess:
        command = ["make", "setup", f"VENV={tmp_path}/venv", f"EXTRAS={extras}", "PYTHON=false"]  # a set-up fails
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)

    same = setup("dev")
    assert same.returncode == 0 and "false -m venv" not in same.stdout, same.stdout + same.stderr
    other = setup("dev,hub")
    assert other.returncode != 0 and "false -m venv" in other.stdout
    assert (bin_dir / ".extras").read_text() == "dev,hub\n"


def set_up_venv(tmp_path: Path, extras: str) -> Path:
    """A venv as make sees one the set-up left with `extras`: bin/.extras, older than bin/.installed."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / ".extras").write_text(f"{extras}\n")
    os.utime(bin_dir / ".extras", (1, 1))
    (bin_dir / ".installed").touch()
    return tmp_path / "venv"


def make_on(venv: Path, *args: str, extras: str | None = None) -> subprocess.CompletedProcess:
    """make with VENV=venv and `args`; EXTRAS in the environment only where `extras` gives it."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("MAKE") and name != "EXTRAS"}
    env |= {} if extras is None else {"EXTRAS": extras}
    return subprocess.run(["make", *args, f"VENV={venv}"], cwd=REPO, capture_output=True, text=True, env=env)


@pytest.mark.parametrize("given", [(), ("EXTRAS=dev",), ("EXTRAS=dev,track",), ("EXTRAS=",)])
def test_make_keeps_the_extras_the_venv_has(tmp_path, given):
    """Issue 58: a target run with no EXTRAS, or with extras the venv has (mlflow-ui's `make setup EXTRAS=dev,track`),
    uses the venv's ($(VENV)/bin/.extras): the set-up does not run again, and drops none of them."""
    venv = set_up_venv(tmp_path, "dev,track,hub")
    dry = make_on(venv, "-n", "train", *given)
    assert dry.returncode == 0 and dry.stdout.splitlines() == [f"{venv}/bin/python -m train fit"], dry.stdout
    real = make_on(venv, "setup", "PYTHON=false", *given)  # a set-up fails
    assert real.returncode == 0 and "false -m venv" not in real.stdout, real.stdout + real.stderr
    assert (venv / "bin" / ".extras").read_text() == "dev,track,hub\n"


@pytest.mark.parametrize(
    ("recorded", "given", "union", "lock"),
    [("dev,track,hub", "tune", "dev,track,hub,tune", "requirements.lock"),
     ("dev,track", "hub,dev,tune", "dev,track,hub,tune", "requirements.lock"),
     ("track", "gpu,dev", "dev,track,gpu", "requirements-gpu.lock")],
)  # fmt: skip
@pytest.mark.parametrize("where", ["command line", "environment"])
def test_an_extras_given_adds_to_the_venvs(tmp_path, recorded, given, union, lock, where):
    """EXTRAS on the command line or in the environment adds to the venv's extras: the set-up runs again with their
    union (dev first, then the venv's, then the new ones; gpu in it picks the GPU lock), which .extras records."""
    venv = set_up_venv(tmp_path, recorded)
    args, extras = ((f"EXTRAS={given}",), None) if where == "command line" else ((), given)
    dry = make_on(venv, "-n", "train", *args, extras=extras)
    assert dry.returncode == 0, dry.stderr
    commands = dry.stdout.replace("\\\n", " ").splitlines()
    into = f" > {venv}/locked.txt"
    (written,) = [line.removesuffix(into) for line in commands if line.endswith(into)]
    assert written.split(f"--locked {lock} pyproject.toml ")[1].split() == union.split(",")  # what locked.txt holds
    assert f'echo "{union}" > {venv}/bin/.extras' in dry.stdout and commands[-1] == f"{venv}/bin/python -m train fit"
    real = make_on(venv, "setup", "PYTHON=false", *args, extras=extras)  # a set-up fails
    assert real.returncode != 0 and "false -m venv" in real.stdout
    assert (venv / "bin" / ".extras").read_text() == f"{union}\n"


def test_the_images_install_hash_checked_entries_of_the_locks(tmp_path):
    def helper(*args: str) -> str:
        command = [sys.executable, str(REQS_HELPER), *args]
        return subprocess.run(command, capture_output=True, text=True, check=True, cwd=tmp_path).stdout

    shared = tmp_path / "requirements.txt"
    shared.write_text(helper("--locked", str(CPU_LOCK), str(REPO / "pyproject.toml"), "formats"))  # as the image
    names = {normalise(line.split("==")[0]) for line in shared.read_text().splitlines() if "==" in line}
    assert {"tensorflow", "keras", "numpy"} <= names and not names & {"pytest", "ruff", "keras-hub"}  # no dev, no hub
    assert {"tf2onnx", "onnx", "onnxruntime", "ai-edge-litert"} <= names  # formats: in every image
    assert "--hash=sha256:" in shared.read_text()
    variant = helper("--locked", str(GPU_LOCK), "--except", str(shared), str(REPO / "pyproject.toml"), "gpu")
    wheels = {normalise(line.split("==")[0]) for line in variant.splitlines() if "==" in line}
    assert wheels == {name for name in entries(GPU_LOCK) if name.startswith("nvidia-")}
    assert helper("--locked", str(CPU_LOCK), "--except", str(shared), str(REPO / "pyproject.toml")) == ""  # cpu: none
    # A GPU lock that pins a shared package otherwise stops the build.
    other = tmp_path / "other.lock"
    other.write_text(GPU_LOCK.read_text().replace("\nkeras==", "\nkeras==0.0.1\n# was keras==", 1))
    command = [sys.executable, str(REQS_HELPER), "--locked", str(other), "--except", str(shared), "pyproject.toml"]
    refused = subprocess.run([*command, "gpu"], capture_output=True, text=True, cwd=REPO)
    assert refused.returncode != 0 and "pin keras differently: run make lock" in refused.stderr
