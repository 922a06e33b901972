"""The one seam between the template and TensorFlow's device configuration calls.

Every call that only a GPU machine can really exercise (visible devices, memory growth, memory caps, memory info)
goes through `TensorFlowDevices` (the doctor's CUDA probing: train.tools.cuda_versions.ProbedDevices). Tests hand
`configure_devices` (and the doctor) an object with the same methods that records what was applied, since no test
machine has a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # importing this module loads no TensorFlow: TensorFlowDevices loads it when it is made
    import tensorflow as tf


class GpuDetails(TypedDict, total=False):
    """What tf.config.experimental.get_device_details says of a GPU (either key may be missing)."""

    device_name: str
    compute_capability: tuple[int, int]


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

    def device_names(self) -> dict[str, list[str]]:
        return {
            "physical": [device.name for device in self._tf.config.list_physical_devices()],
            "logical": [device.name for device in self._tf.config.list_logical_devices()],
        }
