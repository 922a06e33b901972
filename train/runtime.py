"""Devices, then the distribution strategy, in that order, in one place.

TensorFlow fixes its devices the first time anything runs, so `setup_runtime` must be called
before any other TensorFlow work in the process. It is also the one place that computes the
global batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from train.errors import SettingsError
from train.gpus import DeviceBackend
from train.settings import Settings


@dataclass(frozen=True)
class DevicePlan:
    """What `configure_devices` found and applied."""

    physical_gpus: int
    visible_gpus: tuple[int, ...]  # physical indices, in the order TensorFlow numbers them
    memory_growth: bool
    memory_limit_mb: int | None
    cpu_devices: int
    notes: tuple[str, ...]

    @property
    def training_devices(self) -> tuple[str, ...]:
        """Logical device names the replicas run on: every visible GPU, else every CPU device."""
        if self.visible_gpus:
            return tuple(f"/gpu:{i}" for i in range(len(self.visible_gpus)))
        return tuple(f"/cpu:{i}" for i in range(self.cpu_devices))


def configure_devices(settings: Settings, backend: DeviceBackend) -> DevicePlan:
    """Apply GPUS, MEMORY_GROWTH, GPU_MEMORY_LIMIT_MB and CPU_DEVICES. Raises SettingsError."""
    gpus = backend.physical_gpus()
    notes = []
    if settings.gpus == "all":
        chosen = list(range(len(gpus)))
        if not gpus:
            notes.append("No GPU found: training on CPU.")
    elif settings.gpus == "none":
        chosen = []
    else:
        missing = [i for i in settings.gpus if i >= len(gpus)]
        if missing:
            found = f"indices 0-{len(gpus) - 1}" if gpus else "none"
            raise SettingsError(
                f"GPUS={','.join(map(str, settings.gpus))} asks for GPU {','.join(map(str, missing))}, "
                f"but TensorFlow sees {len(gpus)} GPU(s) ({found}): use GPUS=all, GPUS=none or existing indices"
            )
        chosen = list(settings.gpus)

    selected = [gpus[i] for i in chosen]
    try:
        if gpus:
            backend.set_visible_gpus(selected)
        for gpu in selected:
            if settings.gpu_memory_limit_mb is not None:
                backend.set_memory_limit(gpu, settings.gpu_memory_limit_mb)
            else:
                backend.set_memory_growth(gpu, settings.memory_growth)
        if settings.cpu_devices > 1:
            backend.split_cpu(settings.cpu_devices)
    except RuntimeError as error:
        # TensorFlow's message is "... cannot be modified after being initialized".
        raise SettingsError(
            f"devices could not be configured ({error}): configure them before TensorFlow runs anything, "
            "in a fresh process"
        ) from None

    return DevicePlan(
        physical_gpus=len(gpus),
        visible_gpus=tuple(chosen),
        memory_growth=settings.memory_growth and settings.gpu_memory_limit_mb is None and bool(chosen),
        memory_limit_mb=settings.gpu_memory_limit_mb if chosen else None,
        cpu_devices=settings.cpu_devices,
        notes=tuple(notes),
    )


def choose_strategy(requested: str, device_count: int) -> tuple[str, tuple[str, ...]]:
    """The strategy to build for STRATEGY and the number of training devices, with what to say about it."""
    name = requested
    if requested == "auto":
        name = "mirrored" if device_count >= 2 else "one_device"
    notes = []
    if name == "mirrored" and device_count == 1:
        notes.append("STRATEGY=mirrored with one device: it runs, with one replica and nothing to mirror.")
    if name == "one_device" and device_count > 1:
        notes.append(f"STRATEGY=one_device: training on the first device only; {device_count - 1} more stay idle.")
    return name, tuple(notes)


@dataclass(frozen=True)
class Resolution:
    """What the settings resolve to on the configured devices; the one place the global batch is computed."""

    strategy_name: str
    devices: tuple[str, ...]  # one per replica
    per_replica_batch: int
    plan: DevicePlan
    notes: tuple[str, ...]

    @property
    def replicas(self) -> int:
        return len(self.devices)

    @property
    def global_batch(self) -> int:
        return self.per_replica_batch * self.replicas

    def with_batch(self, per_replica_batch: int) -> Resolution:
        return replace(self, per_replica_batch=per_replica_batch)

    def describe(self) -> dict[str, Any]:
        return {
            "physical_gpus": self.plan.physical_gpus,
            "visible_gpus": list(self.plan.visible_gpus),
            "memory_growth": self.plan.memory_growth,
            "memory_limit_mb": self.plan.memory_limit_mb,
            "cpu_devices": self.plan.cpu_devices,
            "strategy": self.strategy_name,
            "devices": list(self.devices),
            "replicas": self.replicas,
            "per_replica_batch": self.per_replica_batch,
            "global_batch": self.global_batch,
            "notes": list(self.notes),
        }


def resolve(settings: Settings, plan: DevicePlan) -> Resolution:
    name, notes = choose_strategy(settings.strategy, len(plan.training_devices))
    devices = plan.training_devices if name == "mirrored" else plan.training_devices[:1]
    return Resolution(name, devices, settings.batch_size, plan, plan.notes + notes)


@dataclass(frozen=True)
class Runtime:
    """The built strategy and its resolution (replicas, batches) in one object."""

    strategy: Any  # tf.distribute.Strategy
    resolution: Resolution

    def __getattr__(self, name: str) -> Any:  # runtime.global_batch, runtime.replicas, ...
        return getattr(self.resolution, name)

    def with_batch(self, per_replica_batch: int) -> Runtime:
        return Runtime(self.strategy, self.resolution.with_batch(per_replica_batch))


def setup_runtime(settings: Settings, backend: DeviceBackend | None = None) -> Runtime:
    """Configure devices, then build the strategy. Call once, before any other TensorFlow work."""
    import tensorflow as tf

    from train.gpus import TensorFlowDevices

    resolution = resolve(settings, configure_devices(settings, backend or TensorFlowDevices()))
    if resolution.strategy_name == "mirrored":
        strategy = tf.distribute.MirroredStrategy(devices=list(resolution.devices))
    else:
        strategy = tf.distribute.OneDeviceStrategy(resolution.devices[0])
    assert strategy.num_replicas_in_sync == resolution.replicas
    return Runtime(strategy, resolution)
