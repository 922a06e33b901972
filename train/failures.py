"""What can go wrong while training or evaluating, told in one line (or, out of memory under AUTO_BATCH, mended).

Each handler names the last checkpoint, which stays intact: the run resumes from it once the cause is fixed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf

from train.checkpoints import RunCheckpoint
from train.data.images import DECODE_ERROR, undecodable
from train.data.shapes import odd_shape
from train.devices.runtime import Runtime
from train.errors import TrainingError, first_line
from train.model_file import RESNET_EXAMPLE
from train.resume import rebase
from train.run_state import Position, Start
from train.step import smaller_micro_batch
from train.writer import Writer


@contextlib.contextmanager
def streamed_files_intact(start: Start, checkpoint: RunCheckpoint) -> Iterator[None]:
    """Damage in a streamed split's files, found while reading them (training or evaluating), in one line; and an
    image that cannot be decoded, by its filename."""
    data = start.data
    try:
        yield
    # What reading damaged TFRecords raises: lost bytes, a missing file, fewer examples than recorded.
    except (tf.errors.DataLossError, tf.errors.NotFoundError, tf.errors.FailedPreconditionError) as error:
        if data.in_memory:
            raise
        raise TrainingError(
            f"reading the streamed {data.name} failed while training ({first_line(error, 160)}): its prepared "
            f"files are damaged; the last checkpoint {checkpoint.latest} is intact. Delete the "
            "dataset's directory, prepare it anew and run again to resume"
        ) from None
    except tf.errors.InvalidArgumentError as error:
        if not DECODE_ERROR.search(str(error.message)):
            raise
        for split in (data.train, data.eval):
            found = undecodable(split, data.spec)
            if found:
                raise TrainingError(
                    f"the image {found[0]} of DATASET={start.settings.dataset} cannot be decoded ({found[1]}); the "
                    f"last checkpoint {checkpoint.latest} is intact. Remove or replace the file and train in a "
                    "new OUTPUT_DIR (the data then differs)"
                ) from None
        raise


@contextlib.contextmanager
def preprocess_shapes_hold(start: Start, checkpoint: RunCheckpoint) -> Iterator[None]:
    """A later example whose output differs from the shape the first examples gave (train.data.shapes), in one
    line."""
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        odd = odd_shape(error)
        if odd is None:
            raise
        raise TrainingError(
            f"MODEL={start.settings.model!r}: preprocess returned {odd[0]} for an example of {start.data.name}, where "
            f"the first examples gave {odd[1]}; the last checkpoint {checkpoint.latest} is intact. Make "
            f"preprocess return one shape for every example (resize or crop it to a constant size, as "
            f"{RESNET_EXAMPLE} does)"
        ) from None


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
