"""Find the per-replica batch that fits: double until a step runs out of memory or a cap, then narrow.

Pure logic over a `trial(batch) -> Trial` function; `train.tools.check` supplies the real one, which runs
real training steps through the same `TrainCalls` as `fit`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

HEADROOM = 0.8  # recommend 80% of the largest batch that fit: fragmentation, other processes, eval
BATCH_CAVEAT = "for speed and memory only: a larger batch takes fewer steps per epoch, so tune LEARNING_RATE with it"
NARROWING_TRIALS = 3


@dataclass(frozen=True)
class Trial:
    per_replica_batch: int
    global_batch: int
    fits: bool
    step_ms: float | None = None
    examples_per_sec: float | None = None
    peak_memory_mb: tuple[float, ...] | None = None  # per visible GPU; None where the device does not report it
    error: str | None = None


@dataclass(frozen=True)
class Probe:
    trials: tuple[Trial, ...]
    largest_fit: int | None
    smallest_failure: int | None
    recommended: int | None
    message: str


def _round_down(batch: float) -> int:
    return max(1, int(batch) // 8 * 8 if batch >= 8 else int(batch))


def probe_batch_sizes(trial: Callable[[int], Trial], start: int, cap: int, current: int | None = None) -> Probe:
    """Trials from `start` up to `cap`; `current` (BATCH_SIZE) is what to keep where memory set no limit."""
    trials: list[Trial] = []
    largest_fit = smallest_failure = None
    batch = min(start, cap)
    while True:
        result = trial(batch)
        trials.append(result)
        if not result.fits:
            smallest_failure = batch
            break
        largest_fit = batch
        if batch >= cap:
            break
        batch = min(batch * 2, cap)

    if largest_fit is not None and smallest_failure is not None:
        for _ in range(NARROWING_TRIALS):
            middle = (largest_fit + smallest_failure) // 2
            if middle in (largest_fit, smallest_failure):
                break
            result = trial(middle)
            trials.append(result)
            if result.fits:
                largest_fit = middle
            else:
                smallest_failure = middle

    if largest_fit is None:
        return Probe(
            tuple(trials),
            None,
            smallest_failure,
            None,
            f"even BATCH_SIZE={batch} per replica runs out of memory: free the GPU (nvidia-smi shows who holds it), "
            "set MEMORY_GROWTH=true, or use a smaller model",
        )
    if smallest_failure is not None:
        recommended = _round_down(largest_fit * HEADROOM)
        message = (
            f"largest batch that fit: {largest_fit} per replica; out of memory at {smallest_failure}. "
            f"Recommended BATCH_SIZE={recommended} ({int(HEADROOM * 100)}% of the largest, for headroom; "
            f"{BATCH_CAVEAT})"
        )
    else:
        # No failure: memory set no limit (always so on CPU). The trials then measured speed alone, and a
        # larger batch is fewer steps an epoch and another learning rate: keep the batch that was asked for.
        fastest = max((t for t in trials if t.fits), key=lambda t: t.examples_per_sec or 0.0)
        recommended = current or fastest.per_replica_batch
        message = (
            f"nothing ran out of memory up to the cap of {largest_fit} per replica (on CPU memory is not the limit, "
            f"so these trials measured speed only; the fastest was {fastest.per_replica_batch}). "
            f"Recommended BATCH_SIZE={recommended}: keep it"
        )
    return Probe(tuple(trials), largest_fit, smallest_failure, recommended, message)


def format_probe(probe: Probe) -> str:
    lines = [f"{'per replica':>11} {'global':>8} {'fits':>5} {'step ms':>9} {'examples/s':>12}  peak memory MiB"]
    for t in sorted(probe.trials, key=lambda t: t.per_replica_batch):
        step_ms = f"{t.step_ms:.2f}" if t.step_ms is not None else "-"
        speed = f"{t.examples_per_sec:,.0f}" if t.examples_per_sec is not None else "-"
        memory = ", ".join(f"{m:.0f}" for m in t.peak_memory_mb) if t.peak_memory_mb else "not reported"
        lines.append(
            f"{t.per_replica_batch:>11} {t.global_batch:>8} {'yes' if t.fits else 'OOM':>5} {step_ms:>9} {speed:>12}  "
            f"{memory if t.fits else (t.error or '')}"
        )
    return "\n".join([*lines, "", probe.message])
