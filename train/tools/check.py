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
from typing import Any

import tensorflow as tf

from train.data import gathers_in_step, load_data, make_feed
from train.devices.backend import TensorFlowDevices
from train.devices.runtime import choose_xla, setup_runtime
from train.errors import SettingsError
from train.model import build
from train.settings import Settings
from train.step import make_train_calls
from train.tools.probe import Trial, format_probe, probe_batch_sizes

Say = Callable[[str], None]


class _WithoutRetracingWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


def check(
    settings: Settings, start_batch: int = 16, max_batch: int = 4096, steps: int = 10, say: Say = print
) -> dict[str, Any]:
    """Trial-run real training steps at a small batch, then probe upward for the largest batch that fits."""
    runtime = setup_runtime(settings, local_only=True)  # on this host, even where TF_CONFIG names a cluster
    for note in runtime.notes:
        say(note)
    data = load_data(settings)
    for note in data.notes:
        say(note)
    built = build(settings, data.spec, runtime.strategy)
    whole_call = gathers_in_step(runtime.strategy, data.train)
    jit, why = choose_xla(settings.jit_compile, runtime, whole_call, built.convolutional, built.layer_without_xla())
    try:  # where XLA can compile the step, both are timed
        choose_xla("true", runtime, whole_call, built.convolutional, built.layer_without_xla())
        both = settings.jit_compile == "auto"
    except SettingsError:
        both = False
    gpus = [f"GPU:{i}" for i in range(len(runtime.plan.visible_gpus))]
    devices = TensorFlowDevices()
    cap = min(max_batch, len(data.train) // runtime.replicas)
    xla_rates: dict[int, dict[str, float]] = {}

    def timed(per_replica_batch: int, xla: bool) -> float:
        global_batch = runtime.with_batch(per_replica_batch).global_batch
        feed = make_feed(runtime.strategy, data.train, global_batch, settings.seed, 0, steps)
        calls = make_train_calls(built, runtime.strategy, feed, global_batch, xla)  # traced per shape
        calls(steps)  # warm-up: traces (and compiles) the graph for this shape
        for gpu in gpus:
            devices.reset_memory_stats(gpu)
        started = time.perf_counter()
        calls(steps)  # returns once the steps have finished
        return time.perf_counter() - started

    def trial(per_replica_batch: int) -> Trial:
        global_batch = runtime.with_batch(per_replica_batch).global_batch
        try:
            seconds = timed(per_replica_batch, jit)
            if both:
                other = timed(per_replica_batch, not jit)
                xla_rates[per_replica_batch] = {
                    "on" if jit else "off": steps * global_batch / seconds,
                    "off" if jit else "on": steps * global_batch / other,
                }
        except tf.errors.ResourceExhaustedError as error:
            return Trial(per_replica_batch, global_batch, fits=False, error=str(error).splitlines()[0][:120])
        peaks = tuple(devices.memory_info(gpu)["peak"] / (1 << 20) for gpu in gpus) or None
        result = Trial(
            per_replica_batch, global_batch, True, 1000 * seconds / steps, steps * global_batch / seconds, peaks
        )
        xla = xla_rates.get(per_replica_batch)
        also = f" (XLA on {xla['on']:,.0f}, off {xla['off']:,.0f})" if xla else ""
        say(f"  BATCH_SIZE={per_replica_batch:<6} fits: {result.examples_per_sec:,.0f} examples/s{also}")
        return result

    say(
        f"Trial run: {steps} steps per batch size on {runtime.replicas} replica(s) ({runtime.strategy_name}), "
        f"from BATCH_SIZE={min(start_batch, cap)} up to {cap} per replica; XLA {'on' if jit else 'off'} ({why})."
    )
    # Every trial traces the step for its own batch shape, on purpose: TensorFlow's warning about frequent
    # retracing would only alarm.
    quiet = _WithoutRetracingWarning()
    tf.get_logger().addFilter(quiet)
    try:
        probe = probe_batch_sizes(trial, start_batch, cap, current=settings.batch_size)
    finally:
        tf.get_logger().removeFilter(quiet)
    table = format_probe(probe)
    if xla_rates:
        faster = sum(rates["on"] > rates["off"] for rates in xla_rates.values())
        verdict = "on" if 2 * faster > len(xla_rates) else "off"
        agrees = "agrees" if verdict == ("on" if jit else "off") else "does NOT agree: set JIT_COMPILE=" + (
            "true" if verdict == "on" else "false")  # fmt: skip
        table += (
            f"\nXLA: faster {verdict} at {faster if verdict == 'on' else len(xla_rates) - faster} of "
            f"{len(xla_rates)} batch sizes; JIT_COMPILE=auto chose {'on' if jit else 'off'}, which {agrees}"
        )
    return {
        "resolved": runtime.describe(),
        "steps_per_trial": steps,
        "cap": cap,
        "trials": [asdict(t) for t in probe.trials],
        "largest_fit": probe.largest_fit,
        "smallest_failure": probe.smallest_failure,
        "recommended_batch_size": probe.recommended,
        "message": probe.message,
        "jit_compile": {"chosen": jit, "why": why, "measured": {str(b): r for b, r in xla_rates.items()} or None},
        "table": table,
    }
