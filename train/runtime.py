"""Devices, then the distribution strategy, in that order, in one place.

TensorFlow fixes its devices the first time anything runs, so `setup_runtime` must be called
before any other TensorFlow work in the process. It is also the one place that computes the
global batch: BATCH_SIZE x the replicas of every worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from train.cluster import Cluster, StartupDeadline
from train.errors import SettingsError, TrainingError
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
    compute_capabilities: tuple[tuple[int, int] | None, ...] = ()  # of each visible GPU, where TensorFlow says

    @property
    def training_devices(self) -> tuple[str, ...]:
        """Logical device names the replicas run on: every visible GPU, else every CPU device."""
        if self.visible_gpus:
            return tuple(f"/gpu:{i}" for i in range(len(self.visible_gpus)))
        return tuple(f"/cpu:{i}" for i in range(self.cpu_devices))


def cpu_cores() -> int:
    """The cores this process may run on (a cpuset or taskset limits them; a CPU quota like docker --cpus does not)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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
            cores = cpu_cores()
            if not chosen and settings.cpu_devices > cores:
                notes.append(
                    f"CPU_DEVICES={settings.cpu_devices} on {cores} CPU core(s): the replicas share the cores, "
                    "which tests the multi-replica path but does not speed it up."
                )
    except RuntimeError as error:
        # TensorFlow's message is "... cannot be modified after being initialized".
        raise SettingsError(
            f"devices could not be configured ({error}): configure them before TensorFlow runs anything, "
            "in a fresh process"
        ) from None

    capabilities = tuple(backend.gpu_details(gpu).get("compute_capability") for gpu in selected)
    return DevicePlan(
        physical_gpus=len(gpus),
        visible_gpus=tuple(chosen),
        memory_growth=settings.memory_growth and settings.gpu_memory_limit_mb is None and bool(chosen),
        memory_limit_mb=settings.gpu_memory_limit_mb if chosen else None,
        cpu_devices=settings.cpu_devices,
        notes=tuple(notes),
        compute_capabilities=tuple(tuple(c) if c else None for c in capabilities),
    )


TENSOR_CORES = (7, 0)  # compute capability from which float16 matrix math runs on tensor cores (Volta on)


def choose_precision(requested: str, plan: DevicePlan) -> tuple[str, tuple[str, ...]]:
    """MIXED_PRECISION as a Keras dtype policy name, and what to say about it.

    auto: mixed_float16 where every visible GPU has tensor cores; float32 elsewhere. On this template's CPU
    benchmark mixed_bfloat16 was slower than float32 (README, How fast), so the CPU default stays float32.
    """
    if requested == "auto":
        tensor_cores = plan.visible_gpus and all(c and c >= TENSOR_CORES for c in plan.compute_capabilities)
        return ("mixed_float16" if tensor_cores else "float32"), ()
    if requested == "off":
        return "float32", ()
    if requested == "mixed_float16" and not plan.visible_gpus:
        return requested, ("MIXED_PRECISION=mixed_float16 on CPU: it runs, but CPUs have no faster float16 math.",)
    return requested, ()


def choose_cross_device_ops(requested: str, strategy_name: str, plan: DevicePlan) -> tuple[str | None, tuple[str, ...]]:
    """CROSS_DEVICE_OPS for MirroredStrategy: the all-reduce to build (None: TensorFlow's own choice), notes.

    auto: what TensorFlow picks itself: ReductionToOneDevice on CPU devices (named here, so the run says which;
    hierarchical copy measured the same within the noise, README How fast), NCCL between GPUs where available.
    """
    if strategy_name != "mirrored":
        if requested == "auto":
            return None, ()
        return None, (f"CROSS_DEVICE_OPS={requested} has no effect: {strategy_name} has nothing to all-reduce.",)
    if requested == "nccl" and not plan.visible_gpus:
        raise SettingsError(
            "CROSS_DEVICE_OPS=nccl needs GPUs (NCCL all-reduces between GPUs), and the training devices are CPUs: "
            "use auto, reduce_to_one or hierarchical_copy"
        )
    if requested == "auto":
        return (None if plan.visible_gpus else "reduce_to_one"), ()
    return requested, ()


def choose_strategy(requested: str, device_count: int, workers: int = 0) -> tuple[str, tuple[str, ...]]:
    """The strategy to build for STRATEGY, the training devices and the workers TF_CONFIG names (0: no TF_CONFIG)."""
    name = requested
    notes = []
    if requested == "auto":
        if workers > 1:
            name = "multi_worker"
        else:
            name = "mirrored" if device_count >= 2 else "one_device"
            if workers == 1:
                notes.append(
                    "TF_CONFIG names one worker: training on this host only (STRATEGY=multi_worker to use it)."
                )
    if name == "mirrored" and device_count == 1:
        notes.append("STRATEGY=mirrored with one device: it runs, with one replica and nothing to mirror.")
    if name == "one_device" and device_count > 1:
        notes.append(f"STRATEGY=one_device: training on the first device only; the other {device_count - 1} stay idle.")
    return name, tuple(notes)


@dataclass(frozen=True)
class Resolution:
    """What the settings resolve to on the configured devices; the one place the global batch is computed."""

    strategy_name: str
    devices: tuple[str, ...]  # one per replica on this worker
    per_replica_batch: int
    plan: DevicePlan
    notes: tuple[str, ...]
    cluster: Cluster | None = None  # set for multi_worker only
    precision: str = "float32"  # the Keras dtype policy
    cross_device_ops: str | None = None  # mirrored: the all-reduce; None is TensorFlow's own choice

    @property
    def workers(self) -> int:
        return self.cluster.num_workers if self.cluster else 1

    @property
    def worker_index(self) -> int:
        return self.cluster.worker_index if self.cluster else 0

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the run directory: the only process, or the cluster's chief."""
        return self.worker_index == 0

    @property
    def replicas(self) -> int:
        """Replicas of every worker (TensorFlow assumes each worker has as many devices as this one)."""
        return len(self.devices) * self.workers

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
            "workers": self.workers,
            "precision": self.precision,
            "cross_device_ops": self.cross_device_ops,
            "cluster": self.cluster.describe() if self.cluster else None,
            "notes": list(self.notes),
        }


def resolve(settings: Settings, plan: DevicePlan, local_only: bool = False) -> Resolution:
    """What the settings mean on these devices. `local_only`: this host alone (evaluate, check), TF_CONFIG or not."""
    cluster = settings.cluster
    workers = cluster.num_workers if cluster else 0
    requested = settings.strategy
    if local_only and (requested == "multi_worker" or settings.multi_worker):
        requested, workers = "auto", 0
    name, notes = choose_strategy(requested, len(plan.training_devices), workers)
    precision, precision_notes = choose_precision(settings.mixed_precision, plan)
    if name == "multi_worker":
        # MultiWorkerMirroredStrategy runs one replica per visible GPU, or one on the CPU: a split CPU does not count.
        devices = plan.training_devices if plan.visible_gpus else plan.training_devices[:1]
        if not plan.visible_gpus and plan.cpu_devices > 1:
            notes += (
                f"CPU_DEVICES={plan.cpu_devices} does not apply to multi_worker: a worker without GPUs is one replica.",
            )
        notes += precision_notes
        return Resolution(name, devices, settings.batch_size, plan, plan.notes + notes, cluster, precision)
    devices = plan.training_devices if name == "mirrored" else plan.training_devices[:1]
    cross_device_ops, ops_notes = choose_cross_device_ops(settings.cross_device_ops, name, plan)
    notes += precision_notes + ops_notes
    return Resolution(name, devices, settings.batch_size, plan, plan.notes + notes, None, precision, cross_device_ops)


@dataclass(frozen=True)
class Runtime:
    """The built strategy and its resolution (replicas, batches) in one object."""

    strategy: Any  # tf.distribute.Strategy
    resolution: Resolution

    def __getattr__(self, name: str) -> Any:  # runtime.global_batch, runtime.replicas, ...
        return getattr(self.resolution, name)

    def with_batch(self, per_replica_batch: int) -> Runtime:
        return Runtime(self.strategy, self.resolution.with_batch(per_replica_batch))


def setup_runtime(settings: Settings, backend: DeviceBackend | None = None, local_only: bool = False) -> Runtime:
    """Configure devices, then build the strategy. Call once, before any other TensorFlow work.

    Multi-worker: blocks until every worker of TF_CONFIG has joined, at most WORKER_START_TIMEOUT seconds.
    """
    import keras
    import tensorflow as tf

    from train.gpus import TensorFlowDevices

    # TFDS logs through absl, which gives the root logger a handler: TensorFlow's Python warnings, passed on to
    # it as well as printed by TensorFlow's own handler, showed twice.
    tf.get_logger().propagate = False
    resolution = resolve(settings, configure_devices(settings, backend or TensorFlowDevices()), local_only)
    keras.mixed_precision.set_global_policy(resolution.precision)  # before any model or optimizer is made
    if resolution.strategy_name == "multi_worker":
        strategy = _multi_worker_strategy(settings, resolution)
    elif resolution.strategy_name == "mirrored":
        all_reduce = {
            None: None,
            "nccl": tf.distribute.NcclAllReduce,
            "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
            "reduce_to_one": tf.distribute.ReductionToOneDevice,
        }[resolution.cross_device_ops]
        strategy = tf.distribute.MirroredStrategy(
            devices=list(resolution.devices), cross_device_ops=all_reduce() if all_reduce else None
        )
    else:
        strategy = tf.distribute.OneDeviceStrategy(resolution.devices[0])
    assert strategy.num_replicas_in_sync == resolution.replicas
    return Runtime(strategy, resolution)


def _multi_worker_strategy(settings: Settings, resolution: Resolution) -> Any:
    """MultiWorkerMirroredStrategy from TF_CONFIG (TensorFlow reads it from the environment itself)."""
    import tensorflow as tf

    cluster = resolution.cluster
    assert cluster is not None
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.AUTO  # NCCL on GPUs, gRPC rings on CPUs
    )
    with StartupDeadline(cluster, settings.worker_start_timeout):
        try:
            return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        except tf.errors.OpError as error:  # a peer's registration deadline, a refused connection, ...
            text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise TrainingError(
                f"worker {cluster.worker_index} ({cluster.address}) could not join the {cluster.num_workers} workers "
                f"of TF_CONFIG ({type(error).__name__}: {text[:160]}): start every worker with the same TF_CONFIG "
                "cluster and its own task index"
            ) from None
