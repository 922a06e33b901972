"""Devices, then the distribution strategy, in that order, in one place.

TensorFlow fixes its devices the first time anything runs, so `setup_runtime` must be called
before any other TensorFlow work in the process. It is also the one place that computes the
global batch: BATCH_SIZE x the replicas of every worker, or GLOBAL_BATCH_SIZE, accumulated over micro-batches
of at most BATCH_SIZE where BATCH_SIZE is set too (`batch_plan`).

Multi-worker: TensorFlow waits for missing peers in C++ without a limit, holding Python's interpreter lock, so
only another process can end that wait: `StartupDeadline`'s watchdog, inside which the strategy is made.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from train.batches import Batch, batch_plan
from train.devices.backend import TensorFlowDevices
from train.errors import SettingsError, TrainingError, first_line
from train.settings import Settings
from train.settings.tf_config import Cluster

if TYPE_CHECKING:  # TensorFlow loads inside setup_runtime: the settings are checked without it
    import tensorflow as tf


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


def configure_devices(settings: Settings, backend: TensorFlowDevices) -> DevicePlan:
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


TENSOR_CORES = (7, 0)  # compute capability from which float16 matrix math runs on tensor cores (V100, T4)
BFLOAT16_CORES = (8, 0)  # ... and from which bfloat16 does too (A100, L4, H100, H200): no loss scaling needed


def auto_precision(plan: DevicePlan) -> tuple[str, str]:
    """What MIXED_PRECISION=auto resolves to on these devices, and why."""
    capabilities = plan.compute_capabilities
    if not plan.visible_gpus:
        return "float32", "no GPU: CPUs have no faster 16-bit math, and bfloat16 measured slower here"
    if all(c and c >= BFLOAT16_CORES for c in capabilities):
        return "mixed_bfloat16", "every GPU has compute capability 8.0+: bfloat16 tensor cores, no loss scaling"
    if all(c and c >= TENSOR_CORES for c in capabilities):
        return "mixed_float16", "every GPU has compute capability 7.x+: float16 tensor cores, with loss scaling"
    return "float32", "a GPU below compute capability 7.0 (or of unknown capability): no tensor cores"


def choose_precision(requested: str, plan: DevicePlan) -> tuple[str, tuple[str, ...]]:
    """MIXED_PRECISION as a Keras dtype policy name, and what to say about it."""
    if requested == "auto":
        return auto_precision(plan)[0], ()
    if requested == "off":
        return "float32", ()
    if requested == "mixed_float16" and not plan.visible_gpus:
        return requested, ("MIXED_PRECISION=mixed_float16 on CPU: it runs, but CPUs have no faster float16 math.",)
    return requested, ()


def choose_cross_device_ops(requested: str, strategy_name: str, plan: DevicePlan) -> tuple[str | None, tuple[str, ...]]:
    """CROSS_DEVICE_OPS for MirroredStrategy: the all-reduce to build (None: TensorFlow's own choice), notes.

    auto: what TensorFlow picks itself: ReductionToOneDevice on CPU devices (named here, so the run says which;
    hierarchical copy measured the same within the noise, docs/performance.md), NCCL between GPUs where available.
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
class Runtime:
    """What the settings resolve to on the configured devices (`resolve`; the one place the global batch is
    computed), and the strategy built for them (`setup_runtime`): what every other part of a run is made under."""

    strategy_name: str
    devices: tuple[str, ...]  # one per replica on this worker
    per_replica_batch: int  # what one replica takes at once: the micro-batch where a step accumulates
    plan: DevicePlan
    notes: tuple[str, ...]
    cluster: Cluster | None = None  # set for multi_worker only
    precision: str = "float32"  # the Keras dtype policy
    precision_why: str = ""
    deterministic: bool = False  # DETERMINISTIC: TensorFlow's op determinism is on
    cross_device_ops: str | None = None  # mirrored: the all-reduce; None is TensorFlow's own choice
    accumulation: int = 1  # micro-batches a step accumulates on each replica before its one optimizer update
    strategy: tf.distribute.Strategy | None = None  # None until setup_runtime builds it

    @property
    def on_gpus(self) -> bool:
        return bool(self.plan.visible_gpus)

    def with_precision(self, precision: str) -> Runtime:
        """The dtype policy the run settled on (the cluster's answer to MIXED_PRECISION=auto), set for Keras."""
        import keras

        keras.mixed_precision.set_global_policy(precision)  # before any model or optimizer is made
        return replace(self, precision=precision)

    @property
    def workers(self) -> int:
        return self.cluster.num_workers if self.cluster else 1

    @property
    def worker_index(self) -> int:
        return self.cluster.worker_index if self.cluster else 0

    @property
    def replicas(self) -> int:
        """Replicas of every worker (TensorFlow assumes each worker has as many devices as this one)."""
        return len(self.devices) * self.workers

    @property
    def global_batch(self) -> int:
        """The examples of one step (one optimizer update) over every replica."""
        return self.per_replica_batch * self.accumulation * self.replicas

    @property
    def micro_global_batch(self) -> int:
        """What every replica takes at once, together: evaluation's global batch, so it fits where training does."""
        return self.per_replica_batch * self.replicas

    def with_batch(self, per_replica_batch: int) -> Runtime:
        """Another per-replica batch without accumulation (a new global batch)."""
        return replace(self, per_replica_batch=per_replica_batch, accumulation=1)

    def with_micro_batch(self, micro_batch: int) -> Runtime:
        """The same global batch in micro-batches of `micro_batch`, which must divide each replica's share."""
        share = self.per_replica_batch * self.accumulation
        assert share % micro_batch == 0, (share, micro_batch)
        return replace(self, per_replica_batch=micro_batch, accumulation=share // micro_batch)

    def describe(self) -> dict[str, object]:
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
            "accumulation": self.accumulation,
            "global_batch": self.global_batch,
            "workers": self.workers,
            "precision": self.precision,
            "precision_why": self.precision_why,
            "deterministic": self.deterministic,
            "cross_device_ops": self.cross_device_ops,
            "cluster": self.cluster.describe() if self.cluster else None,
            "notes": list(self.notes),
        }


def resolve(settings: Settings, plan: DevicePlan, local_only: bool = False) -> Runtime:
    """What the settings mean on these devices, the strategy not built yet. `local_only`: this host alone (evaluate,
    check), TF_CONFIG or not."""
    cluster = settings.cluster
    workers = cluster.num_workers if cluster else 0
    requested = settings.strategy
    if local_only and (requested == "multi_worker" or settings.multi_worker):
        requested, workers = "auto", 0
    name, notes = choose_strategy(requested, len(plan.training_devices), workers)
    precision, precision_notes = choose_precision(settings.mixed_precision, plan)
    why = (
        auto_precision(plan)[1] if settings.mixed_precision == "auto" else f"MIXED_PRECISION={settings.mixed_precision}"
    )
    multi = name == "multi_worker"
    # MultiWorkerMirroredStrategy runs one replica per visible GPU, or one on the CPU: a split CPU does not count.
    every = name == "mirrored" or (multi and plan.visible_gpus)
    devices = plan.training_devices if every else plan.training_devices[:1]
    if multi and not plan.visible_gpus and plan.cpu_devices > 1:
        notes += (
            f"CPU_DEVICES={plan.cpu_devices} does not apply to multi_worker: a worker without GPUs is one replica.",
        )
    ops, ops_notes = (None, ()) if multi else choose_cross_device_ops(settings.cross_device_ops, name, plan)
    batch = Batch(settings.global_batch_size, settings.batch_size)
    per_replica, accumulation = batch_plan(batch, len(devices) * (workers if multi else 1))
    return Runtime(
        name,
        devices,
        per_replica,
        plan,
        plan.notes + notes + precision_notes + ops_notes,
        cluster if multi else None,
        precision=precision,
        precision_why=why,
        deterministic=settings.deterministic,
        cross_device_ops=ops,
        accumulation=accumulation,
    )


def choose_xla(
    requested: str, runtime: Runtime, whole_call: bool, convolutional: bool, layer_without_xla: str | None
) -> tuple[bool, str]:
    """JIT_COMPILE resolved for this model on these devices, and why (the start line says it). Raises
    SettingsError for JIT_COMPILE=true where XLA cannot compile the step.

    `whole_call`: the feed lets XLA compile the whole training call (the step gathers its batch from the
    call's tensors); otherwise only the replica step is compiled and the tf.data iterator stays outside, as
    tensorflow/models does. auto is never the slow choice measured (docs/performance.md, XLA): on one CPU
    device, the whole call compiled, XLA speeds up dense models and slows convolutional ones (XLA's CPU
    convolutions); `check` measures both for the model at hand. On one GPU auto is Keras's own default (on);
    under strategies of more than one GPU it stays off, as Keras has it (keras PR #18716), until `make
    test-gpu` measures it.
    """
    on_gpus = bool(runtime.plan.visible_gpus)
    if requested == "false":
        return False, "JIT_COMPILE=false"
    if runtime.deterministic:  # JIT_COMPILE=true with it is refused with the settings
        return False, "auto: off with DETERMINISTIC=true (not every XLA kernel is deterministic)"
    if layer_without_xla:
        if requested == "true":
            raise SettingsError(
                f"JIT_COMPILE=true is not allowed with this model: layer {layer_without_xla} says XLA cannot "
                "compile it (supports_jit = False); use JIT_COMPILE=auto or false"
            )
        return False, f"auto: layer {layer_without_xla} cannot be compiled by XLA"
    if not on_gpus and runtime.strategy_name == "mirrored":
        if requested == "true":
            raise SettingsError(
                f"JIT_COMPILE=true is not allowed with MirroredStrategy on CPU devices ({len(runtime.devices)} "
                f"replicas, CPU_DEVICES={runtime.plan.cpu_devices}): XLA cannot compile a step whose variables are "
                "mirrored on several CPU devices; use JIT_COMPILE=auto or false"
            )
        return False, "auto: XLA cannot compile a step mirrored on CPU devices"
    if requested == "true":
        if on_gpus and runtime.replicas > 1 and runtime.precision == "mixed_float16":
            raise SettingsError(
                "JIT_COMPILE=true is not allowed with MIXED_PRECISION=mixed_float16 on more than one GPU: Keras "
                "reports hangs there (keras#20763) and make test-gpu has not shown it runs; use "
                "MIXED_PRECISION=mixed_bfloat16 (compute capability 8.0+), or JIT_COMPILE=auto or false"
            )
        return True, "JIT_COMPILE=true" + ("" if whole_call else ", the replica step (tf.data stays outside)")
    if on_gpus:
        if runtime.replicas > 1:
            return False, "auto: off under a strategy of several GPUs, as Keras has it"
        return True, "auto: on for one GPU, Keras's own default"
    if runtime.strategy_name == "multi_worker" or not whole_call:
        return False, "auto: off on CPU where tf.data feeds the step"
    if convolutional:
        return False, "auto: off for a convolutional model on CPU, where XLA's convolutions are slower"
    return True, "auto: on for one CPU device, the whole call compiled"


def setup_runtime(settings: Settings, backend: TensorFlowDevices | None = None, local_only: bool = False) -> Runtime:
    """Configure devices, then build the strategy. Call once, before any other TensorFlow work.

    Multi-worker: blocks until every worker of TF_CONFIG has joined, at most WORKER_START_TIMEOUT seconds.
    """
    import tensorflow as tf

    # TFDS logs through absl, which gives the root logger a handler: TensorFlow's Python warnings, passed on to
    # it as well as printed by TensorFlow's own handler, showed twice.
    tf.get_logger().propagate = False
    resolution = resolve(settings, configure_devices(settings, backend or TensorFlowDevices()), local_only)
    if settings.deterministic:  # before any op runs: every kernel from here on is a deterministic one
        tf.config.experimental.enable_op_determinism()
    if resolution.strategy_name == "multi_worker":
        strategy = _multi_worker_strategy(settings.worker_start_timeout, resolution)
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
    return replace(resolution, strategy=strategy).with_precision(
        resolution.precision
    )  # what this host resolves; a cluster may settle otherwise


def _multi_worker_strategy(start_timeout: int, resolution: Runtime) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy from TF_CONFIG (TensorFlow reads it from the environment itself), its workers
    joined within WORKER_START_TIMEOUT (`start_timeout`, seconds)."""
    import tensorflow as tf

    cluster = resolution.cluster
    assert cluster is not None
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.AUTO  # NCCL on GPUs, gRPC rings on CPUs
    )
    with StartupDeadline(cluster, start_timeout):
        try:
            return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        except tf.errors.OpError as error:  # a peer's registration deadline, a refused connection, ...
            cause = f"{type(error).__name__}: {first_line(error, 160)}"
            raise TrainingError(
                f"worker {cluster.worker_index} ({cluster.address}) could not join the {cluster.num_workers} workers "
                f"of TF_CONFIG ({cause}): start every worker with the same TF_CONFIG cluster and its own task index"
            ) from None


# The start-up deadline: a watchdog process, because TensorFlow's wait for peers holds the GIL. Every
# `every` seconds it says who is up (something listens at the address) and who is awaited.
_WATCHDOG = r"""
import os, select, signal, socket, sys, time
parent, seconds, every, message, index, addresses = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), \
    sys.argv[4], int(sys.argv[5]), sys.argv[6:]
start = time.monotonic()

def listening(address):
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
        return True
    except OSError:
        return False

while True:
    left = seconds - (time.monotonic() - start)
    ready, _, _ = select.select([sys.stdin], [], [], max(0.0, min(every, left)))
    if ready:  # the parent wrote "ok" or exited: either way, nothing to do
        sys.exit(0)
    if time.monotonic() - start >= seconds:
        break
    up, awaited = [f"worker {index} (this one, {addresses[index]})"], []
    for i, address in enumerate(addresses):
        if i != index and listening(address):
            up.append(f"worker {i} ({address})")
        elif i != index:
            awaited.append(f"worker {i} at {address}")
    waiting = (f"awaited: {', '.join(awaited)} (nothing listens there)" if awaited else
               "every address answers: waiting for the workers to register (the same TF_CONFIG cluster on each?)")
    sys.stdout.write(f"Waiting for the workers of TF_CONFIG ({time.monotonic() - start:.0f} s of "
                     f"WORKER_START_TIMEOUT={seconds:g}): up: {', '.join(up)}; {waiting}\n")
    sys.stdout.flush()
silent = [a for i, a in enumerate(addresses) if i != index and not listening(a)]
missing = ("; nothing listens at " + ", ".join(silent)) if silent else ""
sys.stderr.write("error: " + message + missing + "\n")
sys.stderr.flush()
os.kill(int(parent), signal.SIGKILL)
"""
WAITING_REPORT_SECONDS = 30  # how often a worker waiting for the others says who it waits for


class StartupDeadline:
    """Within `seconds`, the block must finish, or this process is killed with a one-line error (exit 137).

    A small child process watches a pipe; leaving the block (or this process dying) closes it. Meanwhile it
    prints, every `report_every` seconds, which workers are up and which are awaited, at which address.
    """

    def __init__(self, cluster: Cluster, seconds: float, report_every: float = WAITING_REPORT_SECONDS) -> None:
        self.cluster = cluster
        self.seconds = seconds
        self.report_every = report_every
        self._child: subprocess.Popen | None = None

    def __enter__(self) -> StartupDeadline:
        message = (
            f"WORKER_START_TIMEOUT={self.seconds:g}: worker {self.cluster.worker_index} ({self.cluster.address}) "
            f"waited {self.seconds:g} s and the {self.cluster.num_workers} workers of TF_CONFIG did not all join. "
            "Start every worker with the same TF_CONFIG cluster and its own task index, check that the "
            "addresses are reachable, or raise WORKER_START_TIMEOUT"
        )
        arguments = [str(os.getpid()), str(self.seconds), str(self.report_every), message]
        self._child = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, *arguments, str(self.cluster.worker_index), *self.cluster.addresses],
            stdin=subprocess.PIPE,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._child is not None and self._child.stdin is not None
        try:
            self._child.stdin.write(b"ok\n")
            self._child.stdin.close()
        except BrokenPipeError:
            pass
        self._child.wait()
