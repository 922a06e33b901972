"""The training loop: calls of up to STEPS_PER_CALL steps, and between them the hooks (train.hooks), on time.

A call ends early at every epoch end, phase boundary (train.phased), LOG_EVERY and CHECKPOINT_EVERY step and at
the end of training, so logging, evaluation, checkpoints, a phase's start and a requested stop all fall between
calls, at the same step on every worker (a save is a collective there).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from train.hooks import Hook
from train.phased import PhaseCalls
from train.step import TrainCalls
from train.timeline import Segment


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


class Cadence(Protocol):
    """When calls end and the loop logs and saves (STEPS_PER_CALL, LOG_EVERY, CHECKPOINT_EVERY, PROFILE_STEPS,
    EPOCHS): the settings' (train.settings.Settings), which the loop does not import."""

    steps_per_call: int
    log_every: int
    checkpoint_every: int
    profile_steps: tuple[int, int] | None
    epochs: int


def call_steps(cadence: Cadence, step: int, steps_per_epoch: int, total_steps: int, epoch_origin: int = 0) -> int:
    """The length of the call that starts at `step`: STEPS_PER_CALL, cut at the next epoch end, checkpoint,
    log step, the ends of PROFILE_STEPS or the end of training (so those happen between calls, on time).
    `epoch_origin`: a step at which an epoch ends (train.timeline: 0 unless a start re-based the epochs)."""
    boundaries = [
        total_steps,
        epoch_origin + _next_multiple(step - epoch_origin, steps_per_epoch),
        _next_multiple(step, cadence.checkpoint_every),
        _next_multiple(step, cadence.log_every),
    ]
    if cadence.profile_steps:  # the trace starts before step START and ends after step END (counted from 1)
        boundaries += [edge for edge in (cadence.profile_steps[0] - 1, cadence.profile_steps[1]) if edge > step]
    return min(cadence.steps_per_call, min(boundaries) - step)


def longest_call(cadence: Cadence, steps_per_epoch: int) -> int:
    """The most steps `call_steps` ever gives: what a feed plans ahead for (not a huge STEPS_PER_CALL).

    The first call: from step 0 every boundary is a whole period away, from any later step at most that
    (PROFILE_STEPS's two cuts only ever shorten a call).
    """
    return min(cadence.steps_per_call, steps_per_epoch, cadence.checkpoint_every, cadence.log_every)


@dataclass
class Schedule:
    """When things happen: the epochs (as the run's segment maps them to steps: train.timeline), and the steps at
    which the loop logs, evaluates and saves."""

    cadence: Cadence
    segment: Segment

    @property
    def steps_per_epoch(self) -> int:
        return self.segment.steps_per_epoch

    @property
    def total_steps(self) -> int:
        return self.segment.total_steps(self.cadence.epochs)

    def epoch_end(self, step: int) -> bool:
        return self.segment.ends_epoch(step)

    def logs(self, step: int) -> bool:
        return step % self.cadence.log_every == 0 or self.epoch_end(step) or step == self.total_steps

    def saves(self, step: int) -> bool:
        return step % self.cadence.checkpoint_every == 0 or self.epoch_end(step) or step == self.total_steps


@dataclass
class Outcome:
    step: int
    examples_per_sec: float | None
    interrupted: bool  # stopped by a hook that leaves the run to resume (a signal's), not one that finishes it
    skipped: int


class Throughput:
    """Examples per second over the calls so far, the first one (which traces the graph) and each phase's first
    left out."""

    def __init__(self, global_batch: int) -> None:
        self.global_batch, self.steps, self.seconds, self.calls = global_batch, 0, 0.0, 0

    def add(self, steps: int, seconds: float, traced: bool = False) -> None:
        """`traced`: a call of calls made anew (a phase's first), which traced its graph: left out as the first."""
        if self.calls and not traced:
            self.steps, self.seconds = self.steps + steps, self.seconds + seconds
        self.calls += 1

    @property
    def per_sec(self) -> float | None:
        return round(self.steps * self.global_batch / self.seconds, 1) if self.seconds else None


def _saved_by_every_hook(hooks: Sequence[Hook], step: int, skipped: int) -> None:
    for hook in reversed(hooks):
        hook.save(step, skipped)


def run_loop(
    calls: PhaseCalls,
    schedule: Schedule,
    start_step: int,
    skipped: int,
    hooks: Sequence[Hook],
    evaluate: Callable[[], dict[str, float | list]],
) -> Outcome:
    """Steps from `start_step` to the schedule's end; returns where it stopped and why.

    Between calls, `hooks` (train.hooks: outermost first) say whether to stop, then hear of the call, the logs,
    the epoch's end (its evaluation, `evaluate()`, is run here once for all of them) and the save, in that order;
    every hook is closed when the loop is left. A stop is checked before every call, on every worker alike (see
    train.cluster.workers).
    """
    step = saved_step = start_step
    throughput = Throughput(calls.global_batch)
    phase_calls: TrainCalls | None = None
    inward = list(reversed(hooks))  # innermost first
    try:
        while step < schedule.total_steps:
            stopping = next((hook for hook in hooks if hook.should_stop(step, saved_step, skipped)), None)
            if stopping is not None:
                if stopping.save_on_stop and saved_step != step:
                    _saved_by_every_hook(hooks, step, skipped)
                return Outcome(step, throughput.per_sec, not stopping.save_on_stop, skipped)
            steps = call_steps(
                schedule.cadence, step, schedule.steps_per_epoch, schedule.total_steps, schedule.segment.origin_step
            )
            change = calls.next_change(step)  # a phase's first step: the calls are made again from there
            steps = min(steps, change - step) if change is not None else steps
            phase_calls, previous = calls.at(step), phase_calls
            for hook in hooks:
                hook.before_call(step)
            started = time.perf_counter()
            result = phase_calls(steps)  # returns once the steps have run: it reads their metrics
            throughput.add(steps, time.perf_counter() - started, traced=phase_calls is not previous)
            step, skipped = step + steps, skipped + result.skipped
            for hook in inward:
                hook.after_call(step, result, skipped, throughput.per_sec)
            if schedule.logs(step):
                for hook in inward:
                    hook.log(step, result, throughput.per_sec)
            if schedule.epoch_end(step):
                metrics = evaluate()
                for hook in inward:
                    hook.epoch_end(schedule.segment.epochs_completed(step), step, metrics)
            if schedule.saves(step):
                _saved_by_every_hook(hooks, step, skipped)
                saved_step = step
        return Outcome(step, throughput.per_sec, False, skipped)
    finally:
        for hook in inward:
            hook.close()
