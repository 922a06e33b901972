"""What a step's batch is: the global batch, what one replica takes at once, and how many micro-batches a step
accumulates (GLOBAL_BATCH_SIZE with BATCH_SIZE), and how the start line says it. No TensorFlow: settings are
checked, and the start line's text tested, without it; train.devices.runtime resolves it on the devices. The
settings are not imported: the top of the run hands a `Batch` (train.start.batch_of).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from train.errors import SettingsError


@dataclass(frozen=True)
class Batch:
    """GLOBAL_BATCH_SIZE and BATCH_SIZE as asked (None: not set), and the layer each came from (setting, where)."""

    global_size: int | None
    size: int | None
    sources: tuple[tuple[str, str], ...] = ()


def largest_divisor(number: int, at_most: int) -> int:
    """The largest divisor of `number` that is at most `at_most` (1 at the least)."""
    return max(d for d in range(1, min(number, at_most) + 1) if number % d == 0)


def batch_plan(batch: Batch, replicas: int) -> tuple[int, int]:
    """(what one replica takes at once, micro-batches a step accumulates). BATCH_SIZE alone: (BATCH_SIZE, 1).
    GLOBAL_BATCH_SIZE alone: (its share per replica, 1). Both: the micro-batch is the largest divisor of the
    share that is at most BATCH_SIZE, accumulated share / micro-batch times. Raises SettingsError where the
    replicas do not divide GLOBAL_BATCH_SIZE."""
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
    micro = largest_divisor(share, batch.size)
    return micro, share // micro


def smaller_micro_batch(runtime) -> int | None:
    """AUTO_BATCH under GLOBAL_BATCH_SIZE: the next smaller divisor of each replica's share of the global batch
    (so the global batch, and with it the data order, stays), None where the micro-batch is 1 already."""
    share = runtime.per_replica_batch * runtime.accumulation
    smaller = [d for d in range(1, runtime.per_replica_batch) if share % d == 0]
    return smaller[-1] if smaller else None


def describe_batch(batch: Batch, runtime) -> str:
    """The start line's batch: the global batch, what a replica takes at once, how many micro-batches a step
    accumulates and why, and where BATCH_SIZE and GLOBAL_BATCH_SIZE came from."""
    per, replicas, accumulation = runtime.per_replica_batch, runtime.replicas, runtime.accumulation
    if accumulation > 1:
        text = f"global batch {runtime.global_batch} = micro-batch {per} x {accumulation} accumulated x {replicas}"
    else:
        text = f"global batch {runtime.global_batch} = {per} per replica x {replicas}"
    if batch.global_size is None or batch.size is None:
        return text
    sources = dict(batch.sources)
    share = runtime.global_batch // replicas
    where = (f"GLOBAL_BATCH_SIZE={batch.global_size} from {sources.get('GLOBAL_BATCH_SIZE', 'the settings')}, "
             f"BATCH_SIZE={batch.size} from {sources.get('BATCH_SIZE', 'the settings')}")  # fmt: skip
    if accumulation == 1:
        return f"{text} ({where}: {share} a replica, no accumulation)"
    return f"{text} ({where}: {share} a replica, at most {batch.size} at once)"


def accumulation_changed(last_start: Mapping[str, object], runtime) -> str:
    """What the start line adds where a resume keeps the global batch but accumulates otherwise than before."""
    before = last_start.get("accumulation", 1)
    return (
        f"The global batch stays {runtime.global_batch} (GLOBAL_BATCH_SIZE): the last start ran "
        f"{last_start.get('replicas')} replica(s) accumulating {before}, this one {runtime.replicas} accumulating "
        f"{runtime.accumulation} micro-batch(es) of {runtime.per_replica_batch} a step; the data order and EPOCHS "
        "are kept."
    )
