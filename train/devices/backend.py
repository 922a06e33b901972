"""The one seam between the template and TensorFlow's device configuration calls.

Every call that only a GPU machine can really exercise (visible devices, memory growth, memory caps,
memory info, the versions the loaded CUDA libraries report) goes through `TensorFlowDevices`. Tests hand
`configure_devices` (and the doctor) an object with the same methods that records what was applied, since no
test machine has a GPU.
"""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # importing this module loads no TensorFlow: TensorFlowDevices loads it when it is made
    import tensorflow as tf

# library: (its file name, the pip wheel's directory under site-packages/nvidia, the call that says its version)
CUDA_LIBRARIES = {
    "cudnn": ("libcudnn.so.9", "cudnn", "cudnnGetVersion"),
    "cuda": ("libcudart.so.12", "cuda_runtime", "cudaRuntimeGetVersion"),
    "nccl": ("libnccl.so.2", "nccl", "ncclGetVersion"),
}


class GpuDetails(TypedDict, total=False):
    """What tf.config.experimental.get_device_details says of a GPU (either key may be missing)."""

    device_name: str
    compute_capability: tuple[int, int]


class BuildInfo(TypedDict, total=False):
    """What tf.sysconfig.get_build_info says of CUDA (a CPU build names no versions)."""

    is_cuda_build: bool
    cuda_version: str
    cudnn_version: str


class TensorFlowDevices:
    """The real backend: `tf.config` calls, importable only where TensorFlow is wanted. The tests' fakes have the
    same methods (duck-typed: this class is the type)."""

    def __init__(self) -> None:
        import tensorflow as tf

        self._tf = tf

    def physical_gpus(self) -> list[tf.config.PhysicalDevice]:
        return self._tf.config.list_physical_devices("GPU")

    def gpu_details(self, gpu: tf.config.PhysicalDevice) -> GpuDetails:
        return self._tf.config.experimental.get_device_details(gpu)

    def set_visible_gpus(self, gpus: list[tf.config.PhysicalDevice]) -> None:
        self._tf.config.set_visible_devices(gpus, "GPU")

    def set_memory_growth(self, gpu: tf.config.PhysicalDevice, enabled: bool) -> None:
        self._tf.config.experimental.set_memory_growth(gpu, enabled)

    def set_memory_limit(self, gpu: tf.config.PhysicalDevice, megabytes: int) -> None:
        config = self._tf.config.LogicalDeviceConfiguration(memory_limit=megabytes)
        self._tf.config.set_logical_device_configuration(gpu, [config])

    def split_cpu(self, count: int) -> None:
        cpu = self._tf.config.list_physical_devices("CPU")[0]
        configs = [self._tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        self._tf.config.set_logical_device_configuration(cpu, configs)

    def memory_info(self, device: str) -> dict[str, int]:
        return self._tf.config.experimental.get_memory_info(device)

    def reset_memory_stats(self, device: str) -> None:
        self._tf.config.experimental.reset_memory_stats(device)

    def build_info(self) -> BuildInfo:
        info = self._tf.sysconfig.get_build_info()
        return BuildInfo(**{key: value for key, value in info.items() if key in BuildInfo.__optional_keys__})

    def device_names(self) -> dict[str, list[str]]:
        return {
            "physical": [device.name for device in self._tf.config.list_physical_devices()],
            "logical": [device.name for device in self._tf.config.list_logical_devices()],
        }

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
