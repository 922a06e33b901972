"""The doctor's three sets of cuDNN, CUDA and NCCL versions, and how they compare with requirements-gpu.lock.

- built against: TensorFlow's build info (`tf.sysconfig.get_build_info()`), which names CUDA and cuDNN, not NCCL;
- installed: the nvidia-* wheels' metadata (`importlib.metadata`), every one of them compared with the lock;
- loaded: what the libraries in this process report (`cudnnGetVersion`, `cudaRuntimeGetVersion`, `ncclGetVersion`
  through ctypes), asked only where a GPU is present, through `ProbedDevices` (the device seam, train.devices.backend,
  with the doctor's own calls).
"""

from __future__ import annotations

import ctypes
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, TypedDict

from train.devices.backend import TensorFlowDevices

GPU_LOCK = "requirements-gpu.lock"
LIBRARIES = ("cudnn", "cuda", "nccl")
LABELS = {"cudnn": "cuDNN", "cuda": "CUDA", "nccl": "NCCL"}
# The wheel whose version stands for each library (the CUDA runtime's for CUDA).
WHEELS = {"cudnn": "nvidia-cudnn-cu12", "cuda": "nvidia-cuda-runtime-cu12", "nccl": "nvidia-nccl-cu12"}
_PIN = re.compile(r"^(nvidia-[A-Za-z0-9._-]+)==([^\s\\;]+)", re.M)
# library: (its file name, the pip wheel's directory under site-packages/nvidia, the call that says its version)
CUDA_LIBRARIES = {
    "cudnn": ("libcudnn.so.9", "cudnn", "cudnnGetVersion"),
    "cuda": ("libcudart.so.12", "cuda_runtime", "cudaRuntimeGetVersion"),
    "nccl": ("libnccl.so.2", "nccl", "ncclGetVersion"),
}


class BuildInfo(TypedDict, total=False):
    """What tf.sysconfig.get_build_info says of CUDA (a CPU build names no versions)."""

    is_cuda_build: bool
    cuda_version: str
    cudnn_version: str


class ProbedDevices(TensorFlowDevices):
    """The device seam with what only the doctor asks: TensorFlow's build, and the loaded CUDA libraries' versions
    (ctypes calls only a GPU machine can really make; the tests' fakes have the same methods)."""

    def build_info(self) -> BuildInfo:
        info = self._tf.sysconfig.get_build_info()
        return BuildInfo(**{key: value for key, value in info.items() if key in BuildInfo.__optional_keys__})

    def loaded_cuda_versions(self) -> dict[str, str | None]:
        """{"cudnn", "cuda", "nccl": the version the library in this process reports, or None where none loads}."""
        return {library: library_version(library) for library in CUDA_LIBRARIES}


def _library_file(name: str, wheel_dir: str) -> str:
    """The copy this process has loaded, else the pip wheel's (TensorFlow's RUNPATH finds it), else the name (ld's)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    loaded = re.search(rf"(/\S*/{re.escape(name)})$", maps, re.M)
    if loaded:
        return loaded.group(1)
    for site in sys.path:
        wheel = Path(site) / "nvidia" / wheel_dir / "lib" / name
        if wheel.is_file():
            return str(wheel)
    return name


def decode_version(library: str, code: int) -> str:
    """A library's version call's integer as a dotted version (cuDNN 90300 -> 9.3.0, CUDA 12050 -> 12.5)."""
    if library == "cuda":
        return f"{code // 1000}.{code % 1000 // 10}"
    if library == "cudnn" and code < 90000:  # cuDNN 8 counted major * 1000
        return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"  # cuDNN 9, NCCL 2.9+


def library_version(library: str) -> str | None:
    name, wheel_dir, call = CUDA_LIBRARIES[library]
    try:
        handle = ctypes.CDLL(_library_file(name, wheel_dir))
        if library == "cudnn":
            getattr(handle, call).restype = ctypes.c_size_t
            return decode_version(library, getattr(handle, call)())
        code = ctypes.c_int(0)
        if getattr(handle, call)(ctypes.byref(code)) != 0:  # cudaSuccess, ncclSuccess
            return None
        return decode_version(library, code.value)
    except (OSError, AttributeError):  # not there, or not the library it says
        return None


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_wheels() -> dict[str, str]:
    """{name: version} of every nvidia-* distribution installed in this environment."""
    found = {}
    for dist in metadata.distributions():
        name = _normalise(dist.metadata.get("Name") or "")
        if name.startswith("nvidia-"):
            found[name] = dist.version
    return found


def lock_path() -> Path | None:
    """requirements-gpu.lock beside the source (a checkout, make setup) or in the environment (the image's venv)."""
    source_root = Path(__file__).resolve().parents[2]
    for candidate in (source_root / GPU_LOCK, Path(sys.prefix) / GPU_LOCK):
        if candidate.is_file():
            return candidate
    return None


def locked_wheels(path: Path | None) -> dict[str, str]:
    """{name: version} of the nvidia-* pins in the lock (empty without one)."""
    if path is None:
        return {}
    return {_normalise(name): version for name, version in _PIN.findall(path.read_text())}


def _matches(found: str, pinned: str) -> bool:
    """A library reports fewer parts than its wheel's version (cuDNN 9.3.0 from 9.3.0.75, CUDA 12.5 from 12.5.82)."""
    parts = found.split(".")
    return parts == pinned.split(".")[: len(parts)]


def cuda_versions(
    build: dict[str, Any], installed: dict[str, str], loaded: dict[str, str | None] | None, lock: dict[str, Any]
) -> dict[str, Any]:
    """The report's `cuda_versions`: the three sets, the lock's, and every wheel or library that differs from it.

    `lock` is {"file": path or None, "wheels": {name: version}}; `loaded` is None where no GPU was there to ask.
    """
    pinned = lock["wheels"]
    differ = []
    if installed and pinned:  # a CPU environment has no CUDA wheels: nothing to compare
        for name, version in sorted(pinned.items()):
            have = installed.get(name)
            if have != version:
                differ.append(f"{name} {have or 'missing'} installed, {version} locked")
        extra = sorted(set(installed) - set(pinned))
        differ += [f"{name} {installed[name]} installed, not in the lock" for name in extra]
    loaded_differ = []
    for library in LIBRARIES:
        found, want = (loaded or {}).get(library), pinned.get(WHEELS[library])
        if found and want and not _matches(found, want):
            loaded_differ.append(f"{LABELS[library]} {found} loaded, {want} locked ({WHEELS[library]})")
    return {
        "built": {"cudnn": build.get("cudnn_version"), "cuda": build.get("cuda_version"), "nccl": None},
        "installed": {library: installed.get(WHEELS[library]) for library in LIBRARIES},
        "loaded": loaded,
        "lock": {"file": lock["file"], **{library: pinned.get(WHEELS[library]) for library in LIBRARIES}},
        "installed_differ": differ,
        "loaded_differ": loaded_differ,
    }


def format_versions(versions: dict[str, Any]) -> list[str]:
    """The doctor's table: one row per set, one column per library."""

    def row(title: str, values: dict[str, str | None] | None, where: str) -> str:
        cells = "".join(f"{(values or {}).get(library) or '-':<11}" for library in LIBRARIES)
        return f"  {title:<15}{cells}{where}"

    lock = versions["lock"]
    return [
        (f"{'CUDA versions':<17}" + "".join(f"{LABELS[library]:<11}" for library in LIBRARIES)).rstrip(),
        row("built against", versions["built"], "TensorFlow's build info (it names no NCCL)"),
        row("installed", versions["installed"], "the nvidia-* wheels' metadata"),
        row("loaded", versions["loaded"], "the libraries' own calls" if versions["loaded"] else "no GPU: none asked"),
        row("locked", lock, lock["file"] or f"no {GPU_LOCK} found"),
    ]
