"""The one seam between the template and TensorFlow's device configuration calls.

Every call that only a GPU machine can really exercise (visible devices, memory growth,
memory caps, memory info) goes through `TensorFlowDevices`. Tests hand `configure_devices`
an object with the same methods that records what was applied, since no test machine has a GPU.
"""

from __future__ import annotations

from typing import Any, Protocol


class DeviceBackend(Protocol):
    def physical_gpus(self) -> list[Any]: ...
    def gpu_details(self, gpu: Any) -> dict[str, Any]: ...
    def set_visible_gpus(self, gpus: list[Any]) -> None: ...
    def set_memory_growth(self, gpu: Any, enabled: bool) -> None: ...
    def set_memory_limit(self, gpu: Any, megabytes: int) -> None: ...
    def split_cpu(self, count: int) -> None: ...
    def memory_info(self, device: str) -> dict[str, int]: ...
    def reset_memory_stats(self, device: str) -> None: ...
    def build_info(self) -> dict[str, Any]: ...
    def device_names(self) -> dict[str, list[str]]: ...


class TensorFlowDevices:
    """The real backend: `tf.config` calls, importable only where TensorFlow is wanted."""

    def __init__(self) -> None:
        import tensorflow as tf

        self._tf = tf

    def physical_gpus(self) -> list[Any]:
        return self._tf.config.list_physical_devices("GPU")

    def gpu_details(self, gpu: Any) -> dict[str, Any]:
        return self._tf.config.experimental.get_device_details(gpu)

    def set_visible_gpus(self, gpus: list[Any]) -> None:
        self._tf.config.set_visible_devices(gpus, "GPU")

    def set_memory_growth(self, gpu: Any, enabled: bool) -> None:
        self._tf.config.experimental.set_memory_growth(gpu, enabled)

    def set_memory_limit(self, gpu: Any, megabytes: int) -> None:
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

    def build_info(self) -> dict[str, Any]:
        return dict(self._tf.sysconfig.get_build_info())

    def device_names(self) -> dict[str, list[str]]:
        return {
            "physical": [device.name for device in self._tf.config.list_physical_devices()],
            "logical": [device.name for device in self._tf.config.list_logical_devices()],
        }
