"""What can go wrong while training or evaluating, told in one line (or, out of memory under AUTO_BATCH, mended).

Each handler names the last checkpoint, which stays intact: the run resumes from it once the cause is fixed.
"""

from __future__ import annotations

from train.batches import smaller_micro_batch
from train.checkpoints import RunCheckpoint
from train.devices.runtime import Runtime
from train.errors import TrainingError
from train.resume import rebase
from train.run_state import Position, Start
from train.writer import Writer


def _smaller(start: Start, runtime: Runtime) -> tuple[int | None, bool]:
    """The batch AUTO_BATCH would go on with (None: none is smaller), and whether the model's own train_step keeps
    it from accumulating micro-batches under GLOBAL_BATCH_SIZE."""
    settings = start.settings
    own_step = bool(settings.global_batch_size) and not start.built.step.accumulates  # the model's own train_step
    if settings.global_batch_size:
        return (None if own_step else smaller_micro_batch(runtime)), own_step
    return runtime.per_replica_batch // 2 or None, own_step


def halve_batch(start: Start, position: Position, checkpoint: RunCheckpoint, writer: Writer) -> None:
    """Out of memory: AUTO_BATCH goes on from the last checkpoint at half the batch (under GLOBAL_BATCH_SIZE: the
    next smaller micro-batch, accumulating more); otherwise a clear error."""
    runtime, settings = position.runtime, start.settings
    failed, picture = runtime.per_replica_batch, memory_picture(runtime)
    smaller, own_step = _smaller(start, runtime)
    if not settings.auto_batch or smaller is None:
        if own_step:
            lower = f"GLOBAL_BATCH_SIZE (e.g. {max(runtime.replicas, runtime.global_batch // 2)}; this model's own "
            lower += "train_step cannot accumulate)"
        elif settings.global_batch_size:
            lower = f"BATCH_SIZE (e.g. {max(1, failed // 2)}: a step then accumulates micro-batches of it)"
        else:
            lower = f"BATCH_SIZE (e.g. {max(1, failed // 2)})"
        halve = "" if runtime.workers > 1 else ", or AUTO_BATCH=true to find one that fits"
        raise TrainingError(
            f"out of memory at BATCH_SIZE={failed} per replica (global batch {runtime.global_batch}); {picture}; "
            f"the last checkpoint {checkpoint.latest} is intact. Lower {lower}, "
            f"set MEMORY_GROWTH=true{halve}"
        ) from None
    now = runtime.with_micro_batch(smaller) if settings.global_batch_size else runtime.with_batch(smaller)
    checkpoint.newest(start.say)
    rebase(start, position, now, checkpoint.step, writer)
    start.built.network.reset_metrics()
    if settings.global_batch_size:
        went_on = (f"with micro-batches of {now.per_replica_batch} per replica, {now.accumulation} accumulated a step "
                   f"(global batch {now.global_batch} and the data order unchanged)")  # fmt: skip
    else:
        went_on = f"with BATCH_SIZE={now.per_replica_batch} (global batch {now.global_batch})"
    start.say(
        f"AUTO_BATCH: out of memory at BATCH_SIZE={failed} ({picture}); continuing from {checkpoint.latest} {went_on}."
    )


def memory_picture(runtime: Runtime) -> str:
    """Per-GPU memory now and at peak, or a note that the devices do not report it."""
    if not runtime.plan.visible_gpus:
        return "memory: not reported on CPU"
    from train.devices.backend import TensorFlowDevices

    devices = TensorFlowDevices()
    parts = []
    for logical in range(len(runtime.plan.visible_gpus)):
        info = devices.memory_info(f"GPU:{logical}")
        parts.append(f"GPU:{logical} {info['current'] >> 20} MiB now, {info['peak'] >> 20} MiB peak")
    return "memory: " + "; ".join(parts)
