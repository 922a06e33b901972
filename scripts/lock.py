"""`make lock`: resolve requirements.lock (CPU) and requirements-gpu.lock (GPU) from pyproject.toml, with hashes.

    python scripts/lock.py [--upgrade] UV   # UV: the uv binary; this python must hold tensorflow (the Makefile's)

The pins of the locks there are stay where pyproject.toml allows them (uv prefers an output file's pins);
--upgrade (make lock UPGRADE=1) resolves every package afresh.

Both are resolved by `uv pip compile --generate-hashes` for Linux x86_64 (manylinux_2_28) and Python 3.11, then
resolved again for Python 3.12 against those pins: a package that would need another version there stops the
lock. The hashes are those of every file of each pinned release, so pip can check whichever wheel it picks.

The GPU lock comes first: pyproject.toml's dependencies and its dev, hub, track, tune, formats and gpu extras, every
nvidia-* wheel pinned to the lowest version tensorflow[and-cuda] allows (uv's lowest-direct resolution on them;
TensorFlow's ranges start at the releases it was built against). The CPU lock is the same without the gpu extra,
resolved under the GPU lock's pins, so every package both hold is identical. Each lock opens with comments saying
what it holds; the GPU lock's say, for each CUDA wheel, whether it is the version TensorFlow was built against (its
build info) or only the lowest its range allows.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLATFORM = "x86_64-manylinux_2_28"
PYTHONS = ("3.11", "3.12")  # resolved for the first, checked on the others
CPU_LOCK, GPU_LOCK = "requirements.lock", "requirements-gpu.lock"
# The extras both locks hold (the GPU lock adds gpu); `make setup` installs from a lock the part EXTRAS names.
LOCKED_EXTRAS = ["dev", "hub", "track", "tune", "formats"]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.M)


def pins(text: str) -> dict[str, str]:
    """The `name==version` lines of a requirements file, names normalised."""
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in _PIN.findall(text)}


def compile_lock(uv: str, extras: list[str], python: str, *args: str, output: Path | None = None) -> str:
    """uv pip compile's requirements; with `output`, the pins already in that file are preferred (uv's rule)."""
    command = [uv, "pip", "compile", "pyproject.toml", "--quiet", "--no-header", "--python-platform", PLATFORM]
    command += ["--python-version", python, *(f"--extra={extra}" for extra in extras), *args]
    command += ["--output-file", str(output)] if output else []
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"make lock: {' '.join(command)} failed:\n{result.stderr.strip()}")
    return output.read_text() if output else result.stdout


def write_pins(path: Path, versions: dict[str, str]) -> str:
    path.write_text("".join(f"{name}=={version}\n" for name, version in sorted(versions.items())))
    return str(path)


def same_on_other_pythons(uv: str, extras: list[str], locked: dict[str, str], constraints: str) -> None:
    for python in PYTHONS[1:]:
        other = pins(compile_lock(uv, extras, python, "--no-annotate", "-c", constraints))
        if other != locked:
            differences = sorted(set(other.items()) ^ set(locked.items()))
            raise SystemExit(f"make lock: Python {python} resolves other pins than {PYTHONS[0]}: {differences}")


def without_helper_files(text: str, helpers: Path) -> str:
    """uv names the temporary constraint files among each package's `# via`; they mean nothing in the lock."""
    kept = [line for line in text.splitlines() if str(helpers) not in line]
    return "\n".join(kept) + "\n"


def tensorflow_facts(pin: str) -> tuple[dict[str, str], dict[str, str]]:
    """tensorflow[and-cuda]'s lower bounds ({wheel: version}) and TensorFlow's build info, from the installed wheel."""
    installed = metadata.version("tensorflow")
    if installed != pin:
        raise SystemExit(f"make lock: this python has tensorflow {installed}, pyproject.toml pins {pin}")
    lowest = {}
    for requirement in metadata.requires("tensorflow") or []:
        match = re.match(r"([A-Za-z0-9._-]+)[^;]*?>=\s*([0-9.]+).*extra\s*==\s*.and-cuda", requirement)
        if match:
            lowest[match.group(1).lower()] = match.group(2)
    info = metadata.distribution("tensorflow").locate_file("tensorflow/python/platform/build_info.py")
    build = dict(re.findall(r"\('(cuda_version|cudnn_version)', '([^']*)'\)", Path(str(info)).read_text()))
    return lowest, build


def cuda_comments(cuda: dict[str, str], lowest: dict[str, str], build: dict[str, str], tf: str) -> list[str]:
    """One line per CUDA wheel: the version TensorFlow was built against, or only the lowest its range allows."""
    built_cuda, built_cudnn = build.get("cuda_version", ""), build.get("cudnn_version", "")
    runtime = cuda.get("nvidia-cuda-runtime-cu12", "")
    cuda_matches = bool(built_cuda) and runtime.split(".")[:2] == built_cuda.split(".")[:2]
    lines = [
        f"# CUDA wheels: each pinned to the lowest version tensorflow[and-cuda]=={tf} allows. TensorFlow {tf} was",
        f"# built against CUDA {built_cuda or '?'} and cuDNN {built_cudnn or '?'} (tf.sysconfig.get_build_info(); "
        "no NCCL entry), and its",
        "# ranges start at those releases: where the build names the library, the pin is the built-against version.",
    ]
    for name, version in sorted(cuda.items()):
        floor = lowest.get(name)
        if "cudnn" in name:
            built = floor == version and version.split(".")[0] == built_cudnn.split(".")[0]
            why = f"built against: cuDNN {built_cudnn}" if built else "lowest allowed"
        elif "nccl" in name:
            built, why = False, "lowest allowed: TensorFlow's build info names no NCCL"
        else:
            built = floor == version and cuda_matches
            why = f"built against: CUDA {built_cuda}" if built else "lowest allowed"
        lines.append(f"#   {name}=={version}  {why}" + ("" if floor else " (a dependency of the other CUDA wheels)"))
    return lines


def header(name: str, holds: str, uv: str) -> list[str]:
    version = " ".join(subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.split()[:2])
    return [
        f"# {name}: {holds},",
        f"# for Linux x86_64 and Python {' and '.join(PYTHONS)}, with the hashes of every file of each release.",
        f"# Made by `make lock` (scripts/lock.py: {version} pip compile --generate-hashes",
        f"# --python-platform {PLATFORM}).",
        f"# Install: pip install --require-hashes -r {name}, then pip install --no-deps -e .",
    ]


def main(argv: list[str]) -> int:
    upgrade = "--upgrade" in argv
    argv = [arg for arg in argv if arg != "--upgrade"]
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    uv = argv[0]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (tf,) = [r.split("==")[1].strip() for r in project["dependencies"] if re.match(r"tensorflow\s*==", r)]
    gpu_extras, cpu_extras, python = [*LOCKED_EXTRAS, "gpu"], LOCKED_EXTRAS, PYTHONS[0]
    with tempfile.TemporaryDirectory() as scratch:
        helpers = Path(scratch)
        floating = pins(compile_lock(uv, gpu_extras, python, "--no-annotate"))
        names = helpers / "cuda.in"
        names.write_text("".join(f"{name}\n" for name in floating if name.startswith("nvidia-")))
        lowest_run = compile_lock(uv, gpu_extras, python, str(names), "--resolution=lowest-direct", "--no-annotate")
        cuda = {name: version for name, version in pins(lowest_run).items() if name.startswith("nvidia-")}
        cuda_pins = write_pins(helpers / "cuda-pins.txt", cuda)
        # The pins of the locks there are stay unless pyproject.toml needs others (or --upgrade): uv prefers them.
        previous = next((REPO / n for n in (GPU_LOCK, CPU_LOCK) if (REPO / n).is_file()), None)
        seed = helpers / "previous.lock"
        seed.write_text(previous.read_text() if previous and not upgrade else "")
        gpu = compile_lock(uv, gpu_extras, python, "--generate-hashes", "-c", cuda_pins, output=seed)
        gpu = without_helper_files(gpu, helpers)
        gpu_pins = write_pins(helpers / "gpu-pins.txt", pins(gpu))
        same_on_other_pythons(uv, gpu_extras, pins(gpu), gpu_pins)
        cpu = without_helper_files(compile_lock(uv, cpu_extras, python, "--generate-hashes", "-c", gpu_pins), helpers)
        same_on_other_pythons(uv, cpu_extras, pins(cpu), gpu_pins)
    lowest, build = tensorflow_facts(tf)
    gpu_holds = (
        "the GPU environment, pyproject.toml's dependencies and its dev, hub, track, tune, formats and gpu extras"
    )
    gpu_head = header(GPU_LOCK, gpu_holds, uv)
    gpu_head += cuda_comments(cuda, lowest, build, tf)
    cpu_holds = "the CPU environment, pyproject.toml's dependencies and its dev, hub, track, tune and formats extras"
    cpu_head = header(CPU_LOCK, cpu_holds, uv)
    cpu_head += [f"# Every package here is pinned as in {GPU_LOCK}, which adds the gpu extra (the CUDA wheels)."]
    (REPO / GPU_LOCK).write_text("\n".join(gpu_head) + "\n" + gpu)
    (REPO / CPU_LOCK).write_text("\n".join(cpu_head) + "\n" + cpu)
    print(f"make lock: {CPU_LOCK} ({len(pins(cpu))} packages), {GPU_LOCK} ({len(pins(gpu))}, {len(cuda)} CUDA wheels)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
