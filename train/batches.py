"""What a step's batch is: the global batch, what one replica takes at once, and how many micro-batches make a
step (GLOBAL_BATCH_SIZE with BATCH_SIZE). No TensorFlow: settings are checked without it; train.devices.runtime
resolves it on the devices, and train.step says it on the start line. The settings are not imported: the top of
the run hands a `Batch` (train.start.batch_of).
"""

from __future__ import annotations

from dataclasses import dataclass

from train.errors import SettingsError


@dataclass(frozen=True)
class Batch:
    """GLOBAL_BATCH_SIZE and BATCH_SIZE as asked (None: not set), and the layer each came from (setting, where)."""

    global_size: int | None
    size: int | None
    sources: tuple[tuple[str, str], ...] = ()


def batch_plan(batch: Batch, replicas: int) -> tuple[int, int]:
    """(what one replica takes at once, micro-batches a step). BATCH_SIZE alone: (BATCH_SIZE, 1). GLOBAL_BATCH_SIZE
    alone: (its share per replica, 1). Both: the micro-batch is the largest divisor of the share that is at most
    BATCH_SIZE, taken share / micro-batch times a step. Raises SettingsError where the replicas do not divide
    GLOBAL_BATCH_SIZE."""
    total = batch.global_size
    if total is None:
        return batch.size, 1
    if total % replicas:
        below, above = total // replicas * replicas, -(-total // replicas) * replicas
        nearest = " or ".join(str(value) for value in (below, above) if value)
        raise SettingsError(
            f"GLOBAL_BATCH_SIZE={total} does not divide by the {replicas} replicas of this run (BATCH_SIZE would be "
            f"{total / replicas:g} per replica): use a multiple of {replicas}, like {nearest}"
        )
    share = total // replicas
    if batch.size is None:
        return share, 1
    micro = max(d for d in range(1, min(share, batch.size) + 1) if share % d == 0)
    return micro, share // micro
