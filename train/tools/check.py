"""`python -m train check`: real training steps at a small batch, then the largest batch that fits.

Nothing is written to OUTPUT_DIR: the trials train a throwaway copy of the model, through the same
`TrainCalls` as `fit` (where running out of device memory surfaces). Where XLA can compile the step,
each trial's batch is also timed with XLA on and off, so JIT_COMPILE=auto's choice can be checked for
the model at hand.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from train.data import load_data
from train.data.feeds import adapter
from train.devices.backend import TensorFlowDevices
from train.devices.runtime import choose_xla, setup_runtime
from train.errors import SettingsError, first_line
from train.model import build
from train.model_file import load_model_file
from train.settings import Settings
from train.start import run_context, steps_per_epoch
from train.step import make_calls
from train.tools.probe import Trial, format_probe, probe_batch_sizes

if TYPE_CHECKING:
    from train.data.source import Data
    from train.devices.runtime import Runtime
    from train.model import Built

Say = Callable[[str], None]


class _WithoutRetracingWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


class _Trials:
    """Real training steps at one batch size after another, timed; with both XLA and not where `both`."""

    def __init__(
        self,
        settings: Settings,
        runtime: Runtime,
        data: Data,
        built: Built,
        jit: bool,
        both: bool,
        steps: int,
        say: Say,
    ) -> None:
        self.settings, self.runtime, self.data, self.built = settings, runtime, data, built
        self.jit, self.both, self.steps, self.say = jit, both, steps, say
        self.gpus = [f"GPU:{i}" for i in range(len(runtime.plan.visible_gpus))]
        self.devices = TensorFlowDevices()
        self.xla_rates: dict[int, dict[str, float]] = {}

    def _seconds(self, per_replica_batch: int, xla: bool) -> float:
        global_batch = self.runtime.with_batch(per_replica_batch).global_batch
        feeding = adapter(self.runtime.strategy, self.data.train)
        feed = feeding.train_feed(global_batch, self.settings.seed, 0, self.steps)
        calls = make_calls(self.built, self.runtime.strategy, feed, global_batch, xla)  # traced per shape
        calls(self.steps)  # warm-up: traces (and compiles) the graph for this shape
        for gpu in self.gpus:
            self.devices.reset_memory_stats(gpu)
        started = time.perf_counter()
        calls(self.steps)  # returns once the steps have finished
        return time.perf_counter() - started

    def __call__(self, per_replica_batch: int) -> Trial:
        global_batch = self.runtime.with_batch(per_replica_batch).global_batch
        try:
            seconds = self._seconds(per_replica_batch, self.jit)
            if self.both:
                other = self._seconds(per_replica_batch, not self.jit)
                rates = (self.steps * global_batch / seconds, self.steps * global_batch / other)
                self.xla_rates[per_replica_batch] = dict(
                    zip(("on", "off") if self.jit else ("off", "on"), rates, strict=True)
                )
        except tf.errors.ResourceExhaustedError as error:
            return Trial(per_replica_batch, global_batch, fits=False, error=first_line(error, 120))
        peaks = tuple(self.devices.memory_info(gpu)["peak"] / (1 << 20) for gpu in self.gpus) or None
        speed = self.steps * global_batch / seconds
        result = Trial(per_replica_batch, global_batch, True, 1000 * seconds / self.steps, speed, peaks)
        xla = self.xla_rates.get(per_replica_batch)
        also = f" (XLA on {xla['on']:,.0f}, off {xla['off']:,.0f})" if xla else ""
        self.say(f"  BATCH_SIZE={per_replica_batch:<6} fits: {speed:,.0f} examples/s{also}")
        return result

    def xla_verdict(self) -> str | None:
        """Which was faster at most batch sizes, and whether JIT_COMPILE=auto's choice agrees."""
        if not self.xla_rates:
            return None
        faster_on, measured = sum(r["on"] > r["off"] for r in self.xla_rates.values()), len(self.xla_rates)
        verdict, count = ("on", faster_on) if 2 * faster_on > measured else ("off", measured - faster_on)
        chose = "on" if self.jit else "off"
        setting = "true" if verdict == "on" else "false"
        agrees = "agrees" if verdict == chose else f"does NOT agree: set JIT_COMPILE={setting}"
        return f"XLA: faster {verdict} at {count} of {measured} batch sizes; auto chose {chose}, which {agrees}"


def check(
    settings: Settings, start_batch: int = 16, max_batch: int = 4096, steps: int = 10, say: Say = print
) -> dict[str, Any]:
    """Trial-run real training steps at a small batch, then probe upward for the largest batch that fits."""
    runtime = setup_runtime(settings, local_only=True)  # on this host, even where TF_CONFIG names a cluster
    experiment = load_model_file(settings.model)  # MODEL's file, loaded once for the trials and passed down
    data = load_data(settings, experiment)
    for note in (*runtime.notes, *data.notes):
        say(note)
    context = run_context(settings, runtime, data, steps_per_epoch(settings, data, runtime))
    built = build(settings, experiment, data.spec, runtime.strategy, context)
    whole_call = adapter(runtime.strategy, data.train).whole_call
    jit, why = choose_xla(settings.jit_compile, runtime, whole_call, built.convolutional, built.layer_without_xla())
    try:  # where XLA can compile the step, both are timed
        choose_xla("true", runtime, whole_call, built.convolutional, built.layer_without_xla())
        both = settings.jit_compile == "auto"
    except SettingsError:
        both = False
    trials = _Trials(settings, runtime, data, built, jit, both, steps, say)
    cap = min(max_batch, len(data.train) // runtime.replicas)
    say(
        f"Trial run: {steps} steps per batch size on {runtime.replicas} replica(s) ({runtime.strategy_name}), "
        f"from BATCH_SIZE={min(start_batch, cap)} up to {cap} per replica; XLA {'on' if jit else 'off'} ({why})."
    )
    # Every trial traces the step for its own batch shape, on purpose: TensorFlow's warning about frequent
    # retracing would only alarm.
    quiet = _WithoutRetracingWarning()
    tf.get_logger().addFilter(quiet)
    try:
        probe = probe_batch_sizes(trials, start_batch, cap, current=settings.batch_size)
    finally:
        tf.get_logger().removeFilter(quiet)
    verdict = trials.xla_verdict()
    return {
        "resolved": runtime.describe(),
        "steps_per_trial": steps,
        "cap": cap,
        "trials": [asdict(t) for t in probe.trials],
        "largest_fit": probe.largest_fit,
        "smallest_failure": probe.smallest_failure,
        "recommended_batch_size": probe.recommended,
        "message": probe.message,
        "jit_compile": {
            "chosen": jit,
            "why": why,
            "measured": {str(b): r for b, r in trials.xla_rates.items()} or None,
        },
        "table": format_probe(probe) + (f"\n{verdict}" if verdict else ""),
    }
