"""`python -m train bench`: how near is the training loop to what this machine can do, and what holds it back?

In one process, with the normal settings (DATASET, BATCH_SIZE, STRATEGY, CPU_DEVICES, GPUS, STEPS_PER_CALL, and
LOG_EVERY, CHECKPOINT_EVERY, STEPS_PER_EPOCH where they cut calls short), these ways of training the same model on
the same data are measured in examples per second:

  1  template           the template's own path: `make_train_steps` + `run_steps` on `make_feed`, in the calls
                        `fit` makes (without what `fit` does between them: logging, checkpoints, evaluation)
  2  in_memory          the same loop and step (XLA as in 1) fed one batch held in memory: no input at all, the ceiling
  2b in_memory_dataset  that batch repeated by tf.data, distributed as `train_dataset` is: the iterator alone
  2c in_memory_batches  a new batch each step, the call's batches laid out one after another: no gather, no plan
                        (left out when that block would take more than LAID_OUT_BYTES)
  3  keras_fit          Keras `model.fit` at its best: tf.data of the same arrays, the same global batch, the
                        largest `steps_per_execution` that runs, XLA on or off as a trial run prefers
  4  keras_numpy        the tutorials' way: numpy arrays into `model.fit` at its default batch of 32

Every contender has its own fresh model and is warmed up (traced) before it is timed. Then they take turns
for `repetitions` rounds in a rotating order; each measurement runs whole calls until `seconds_per_measurement`
have passed and counts the examples. The median over the rounds is reported, and the spread as the noise.
Ratios 1/2 (is the input the bottleneck?), 1/3 (against Keras fit) and 1/4 (against the tutorials) are checked
against the goals in README (How fast); 1/2b and 2b/2 say whether a gap is the pipeline's work or tf.data's iterator,
1/2c and 2c/2 whether it is the template's input (its gather and plan, or its tf.data pipeline) or that the
batch changes at all (a batch that never changes stays hot in cache, and XLA may keep work on it out of the loop).
Optionally, in subprocesses (TensorFlow fixes its devices once per process): start-up times, and one logical
CPU device against MirroredStrategy on two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.errors import SettingsError, TrainingError, first_line
from train.settings import FIELDS, Settings, load_settings

SCHEMA = 1
CONTENDERS = ("template", "in_memory", "in_memory_dataset", "in_memory_batches", "keras_fit", "keras_numpy")
LABELS = {
    "template": "1  template fit path",
    "in_memory": "2  same loop, batch in memory",
    "in_memory_dataset": "2b same, via tf.data iterator",
    "in_memory_batches": "2c new batch a step, no gather",
    "keras_fit": "3  Keras fit, tf.data, best",
    "keras_numpy": "4  Keras fit, numpy, batch 32",
}
RATIOS = {
    "1/2": ("template", "in_memory"),
    "1/3": ("template", "keras_fit"),
    "1/4": ("template", "keras_numpy"),
    "1/2b": ("template", "in_memory_dataset"),
    "2b/2": ("in_memory_dataset", "in_memory"),
    "1/2c": ("template", "in_memory_batches"),
    "2c/2": ("in_memory_batches", "in_memory"),
}
RATIO_GOALS = {"1/2": 0.85, "1/3": 1.2, "1/4": 10.0}
RATIO_MEANING = {
    "1/2": "the input pipeline is not the bottleneck",
    "1/3": "faster than Keras fit at its best",
    "1/4": "faster than the tutorials' way",
    "1/2b": "the pipeline's own work (gather, order), given the iterator (and 1's XLA, if on)",
    "2b/2": "a tf.data iterator, one get_next per step (and no XLA: it cannot compile one)",
    "1/2c": "the shuffled gather and its plan, given a new batch each step",
    "2c/2": "a new batch each step against one that never changes",
}
HELP_GOAL_SECONDS = 0.3
FIT_VS_IMPORT_GOAL = 1.6
REPLICAS_GOAL = 0.8
TUTORIAL_BATCH = 32  # Keras fit's default batch_size
KERAS_TRIAL_SECONDS = 0.75
LAID_OUT_BYTES = 512 << 20  # row 2c copies one call's batches; above this it is left out rather than risk memory
TINY_FIT = {"EPOCHS": 1, "STEPS_PER_EPOCH": 20}
# Odd, so the median is one real round: the first tiny fit of a session often ran 30-40% slower (cold caches).
STARTUP_ROUNDS = 3

Say = Callable[[str], None]


@dataclass
class _Contender:
    """One way of training. `measure(seconds)` trains for about that long and returns (examples, seconds)."""

    name: str
    measure: Callable[[float], tuple[int, float]]
    batch: int  # global batch
    strategy: str
    note: str
    crashed: list[str] = field(default_factory=list)


# --- 1, 2, 2b and 2c: the template's own loop --------------------------------------------------------------------


def _loop_contender(name: str, settings: Settings, runtime, data, feed, jit_compile: bool) -> _Contender:
    """The loop as `fit` runs it: calls as long as `fit` makes them (STEPS_PER_CALL, cut at epoch ends,
    CHECKPOINT_EVERY and LOG_EVERY), each returning the loss (which waits for the call)."""
    from train.training import _build, _steps_per_epoch, call_steps, make_metrics, make_train_steps, run_steps

    model = _build(settings, runtime, data)
    train_loss, train_accuracy = make_metrics(runtime)
    train_steps = make_train_steps(model, runtime, train_loss, train_accuracy, feed, jit_compile)
    steps_per_epoch, global_batch = _steps_per_epoch(settings, data, runtime), runtime.global_batch
    step = 0  # goes on from one measurement to the next, as a run's step does

    def measure(seconds: float) -> tuple[int, float]:
        nonlocal step
        examples = 0
        started = time.perf_counter()
        while True:
            steps = call_steps(settings, step, steps_per_epoch, sys.maxsize)
            run_steps(train_steps, feed, steps, global_batch)  # returns the loss, as _train_loop reads it
            examples, step = examples + steps * global_batch, step + steps
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                return examples, elapsed

    note = f"STEPS_PER_CALL={settings.steps_per_call}, XLA {'on' if jit_compile else 'off'}"
    return _Contender(name, measure, global_batch, runtime.strategy_name, note)


class _SameBatchFeed:
    """A feed that is no input at all: every step of every call trains on the same batch, handed over once.

    Replica r gets rows [r * per_replica, (r + 1) * per_replica) of the train split. Inside the compiled call
    the step only slices its replica's part: what the step costs when its input costs nothing.
    """

    compilable = True

    def __init__(self, runtime, data) -> None:
        import tensorflow as tf

        shape = (runtime.replicas, runtime.per_replica_batch)
        features, labels = _first_rows(data, runtime.global_batch)
        self.batch = tf.constant(features.reshape(*shape, -1)), tf.constant(labels.reshape(shape))

    def call_args(self, steps: int):
        return self.batch

    @staticmethod
    def step_args(call_args, step):
        return call_args

    @staticmethod
    def replica_batch(features, labels):
        import tensorflow as tf

        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return features[replica], labels[replica]


class _LaidOutBatchesFeed(_SameBatchFeed):
    """A new batch every step with no input work: the call's batches, taken in order from the split and laid
    out one after another in memory, handed over once; step k of a call slices batch k."""

    def __init__(self, runtime, data, block: int) -> None:
        import numpy as np
        import tensorflow as tf

        shape = (block, runtime.replicas, runtime.per_replica_batch)
        count = block * runtime.global_batch
        features, labels = _first_rows(data, count)
        if len(labels) < count:  # a split shorter than one call: its rows again, in order
            rows = np.resize(np.arange(len(labels)), count)
            features, labels = features[rows], labels[rows]
        self.batch = tf.constant(features.reshape(*shape, -1)), tf.constant(labels.reshape(shape))

    @staticmethod
    def step_args(call_args, step):
        features, labels = call_args
        return features[step], labels[step]


def laid_out_bytes(runtime, data, block: int) -> int:
    """What row 2c holds: the features of one call's batches as float32 (the arrays are copied about twice)."""
    return block * runtime.global_batch * data.input_dim * 4


def _first_rows(data, count: int):
    """The first `count` training examples as NumPy arrays, in memory or read from the stream."""
    from train.data import Split, eval_dataset

    if isinstance(data.train, Split):
        return data.train.features[:count], data.train.labels[:count]
    features, labels = next(iter(eval_dataset(data.train, count)))
    return features.numpy(), labels.numpy()


def _same_batch_dataset(runtime, data):
    """One per-replica batch repeated, distributed as `train_dataset` is: tf.data's machinery without the work."""
    import tensorflow as tf

    from train.data import distribute

    per_replica = runtime.per_replica_batch
    features, labels = _first_rows(data, runtime.global_batch)

    def dataset_fn(context):
        start = context.input_pipeline_id * (runtime.replicas // context.num_input_pipelines) * per_replica
        batch = (features[start : start + per_replica], labels[start : start + per_replica])
        return tf.data.Dataset.from_tensors(batch).repeat()

    return distribute(runtime.strategy, dataset_fn)


# --- 3 and 4: Keras model.fit --------------------------------------------------------------------------------


def keras_pipeline(data, global_batch: int):
    """The tuned tf.data pipeline for `model.fit`: indices reshuffled every pass, batched, then one gather.

    (Measured against shuffling examples one by one before batching, it was as fast or faster.)
    """
    import tensorflow as tf

    split = data.train
    with tf.device("/cpu:0"):
        features, labels = tf.constant(split.features), tf.constant(split.labels)
    indices = tf.data.Dataset.range(len(split)).shuffle(len(split), reshuffle_each_iteration=True)
    batches = indices.batch(global_batch, drop_remainder=True).repeat()
    batches = batches.map(lambda index: (tf.gather(features, index), tf.gather(labels, index)), tf.data.AUTOTUNE)
    return batches.prefetch(tf.data.AUTOTUNE)


def _clock(seconds: float):
    """A Keras callback: times `model.fit` from the end of its first execution on, and stops it after `seconds`.

    The first execution of every `fit` call makes that call's iterator: a cost of measuring in slices, which
    one long `fit` pays once, so it is left out, in Keras's favour.
    """
    import keras

    class Clock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.started: float | None = None
            self.ended: float | None = None
            self.first_step = self.last_step = 0

        def _step(self) -> int:
            return int(self.model.optimizer.iterations.numpy())

        def on_train_batch_end(self, batch, logs=None):  # synchronous: fit waited for the execution
            now = time.perf_counter()
            if self.started is None:
                self.started, self.first_step = now, self._step()
            elif now - self.started >= seconds:
                self.ended, self.last_step = now, self._step()
                self.model.stop_training = True

    return Clock()


def _keras_contender(
    name: str,
    settings: Settings,
    strategy,
    strategy_name: str,
    data,
    numpy: bool,
    global_batch: int,
    steps_per_execution: int = 1,
    jit_compile: bool | None = None,
) -> _Contender:
    """A fresh model from `build_model`, trained by `model.fit`; recompiled with these settings unless `numpy`."""
    import keras

    from train.model import build_model

    keras.utils.set_random_seed(settings.seed)
    with strategy.scope():
        model = build_model(data.input_dim, data.num_classes, settings.learning_rate)
        if not numpy:  # the tutorials keep the compile defaults
            config = model.get_compile_config()
            config.update(steps_per_execution=steps_per_execution, jit_compile=jit_compile)
            model.compile_from_config(config)

    if numpy:
        batch = TUTORIAL_BATCH

        def fit(clock) -> None:  # arrays, default batch size, shuffled every epoch
            model.fit(data.train.features, data.train.labels, epochs=10**6, verbose=0, callbacks=[clock])

    else:
        batch = global_batch
        dataset = keras_pipeline(data, batch)

        def fit(clock) -> None:
            model.fit(dataset, epochs=1, steps_per_epoch=10**9, shuffle=False, verbose=0, callbacks=[clock])

    def measure(seconds: float) -> tuple[int, float]:
        clock = _clock(seconds)
        with strategy.scope():
            fit(clock)
        if clock.ended is None or clock.started is None:
            raise TrainingError("model.fit stopped before the measurement ended")
        return (clock.last_step - clock.first_step) * batch, clock.ended - clock.started

    note = f"steps_per_execution={model.steps_per_execution}, jit_compile={model.jit_compile}"
    return _Contender(name, measure, batch, strategy_name, note)


def _best_keras_fit(settings: Settings, runtime, data, trial_seconds: float, say: Say) -> _Contender:
    """Keras fit at its best here: the largest steps_per_execution that runs, XLA on or off, whichever is faster.

    A setting that crashes under the runtime's strategy is said and skipped; one device only if none runs.
    """
    import tensorflow as tf

    strategies = [(runtime.strategy, runtime.strategy_name)]
    if runtime.replicas > 1:
        strategies.append((tf.distribute.OneDeviceStrategy(runtime.devices[0]), "one_device"))
    crashed: list[str] = []
    for strategy, strategy_name in strategies:
        for steps_per_execution in sorted({settings.steps_per_call, 1}, reverse=True):
            ran: list[tuple[float, _Contender]] = []
            for jit_compile in (True, False):
                tried = f"{strategy_name}, steps_per_execution={steps_per_execution}, jit_compile={jit_compile}"
                try:
                    contender = _keras_contender(
                        "keras_fit", settings, strategy, strategy_name, data, False, runtime.global_batch,
                        steps_per_execution, jit_compile,
                    )  # fmt: skip
                    contender.measure(min(0.2, trial_seconds))  # traces
                    examples, seconds = contender.measure(trial_seconds)
                except Exception as error:  # what crashes under MirroredStrategy varies: say it, try the next
                    crashed.append(f"{tried}: {type(error).__name__}: {first_line(error, 160)}")
                    say(f"  keras_fit trial: {crashed[-1]}")
                    continue
                ran.append((examples / seconds, contender))
                say(f"  keras_fit trial: {tried}: {examples / seconds:,.0f} examples/s")
            if ran:
                contender = max(ran, key=lambda pair: pair[0])[1]
                contender.crashed = crashed
                return contender
    raise TrainingError("Keras model.fit crashed with every setting: " + "; ".join(crashed))


# --- start-up and replicas: subprocesses ---------------------------------------------------------------------


def _child_env(settings: Settings, **overrides: object) -> dict[str, str]:
    """This environment with every setting spelled out (so no .env is needed) and this package importable."""
    env = {name: value for name, value in os.environ.items() if name not in {f.env for f in FIELDS}}
    env.update(settings.to_json())
    env.update({name: str(value) for name, value in overrides.items()})
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


class SubprocessFailed(TrainingError):
    def __init__(self, argv: list[str], returncode: int, last_line: str) -> None:
        super().__init__(f"the benchmark's subprocess `{' '.join(argv[1:])}` exited with {returncode}: {last_line}")
        self.last_line = last_line


def _timed_run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 900) -> float:
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SubprocessFailed(argv, result.returncode, (result.stderr.strip().splitlines() or ["(no output)"])[-1])
    return seconds


def measure_startup(settings: Settings, repetitions: int = STARTUP_ROUNDS, say: Say = print) -> dict[str, Any]:
    """Wall times of `python -m train --help`, `python -c "import tensorflow"` and a complete tiny `fit`.

    Interleaved rounds, medians. The tiny fit trains EPOCHS=1 STEPS_PER_EPOCH=20 into a temporary OUTPUT_DIR
    with the same dataset (TFDS_DATA_DIR), evaluation and export included: everything a run does, once.
    """
    runs: dict[str, list[float]] = {"help": [], "import_tensorflow": [], "tiny_fit": []}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as temporary:
        cwd = Path(temporary)
        env = _child_env(settings)
        for repetition in range(repetitions):
            runs["help"].append(_timed_run([sys.executable, "-m", "train", "--help"], env, cwd))
            runs["import_tensorflow"].append(_timed_run([sys.executable, "-c", "import tensorflow"], env, cwd))
            fit_env = _child_env(settings, **TINY_FIT, OUTPUT_DIR=cwd / f"run{repetition}")
            runs["tiny_fit"].append(_timed_run([sys.executable, "-m", "train", "fit"], fit_env, cwd))
            say(
                f"  start-up round {repetition + 1}/{repetitions}: --help {runs['help'][-1]:.2f} s, "
                f"import tensorflow {runs['import_tensorflow'][-1]:.2f} s, tiny fit {runs['tiny_fit'][-1]:.2f} s"
            )
    medians = {name: statistics.median(values) for name, values in runs.items()}
    return {
        "help_seconds": medians["help"],
        "import_tensorflow_seconds": medians["import_tensorflow"],
        "tiny_fit_seconds": medians["tiny_fit"],
        "tiny_fit_vs_import": medians["tiny_fit"] / medians["import_tensorflow"],
        "tiny_fit": " ".join(f"{name}={value}" for name, value in TINY_FIT.items()) + ", evaluation and export",
        "runs": runs,
    }


REPLICA_CONFIGS = {
    "one_device": {"GPUS": "none", "CPU_DEVICES": 1, "STRATEGY": "one_device"},
    "one_device_without_xla": {"GPUS": "none", "CPU_DEVICES": 1, "STRATEGY": "one_device", "JIT_COMPILE": "false"},
    "mirrored_2": {"GPUS": "none", "CPU_DEVICES": 2, "STRATEGY": "mirrored"},
    "mirrored_2_same_global_batch": {"GPUS": "none", "CPU_DEVICES": 2, "STRATEGY": "mirrored", "BATCH_SIZE": None},
}


def compare_replica_counts(
    settings: Settings, repetitions: int = 2, seconds_per_measurement: float = 1.5, say: Say = print
) -> dict[str, Any]:
    """The template's path on one logical CPU device (XLA as JIT_COMPILE=auto gives, and off) against
    MirroredStrategy on two, each in its own process.

    `mirrored_2` keeps BATCH_SIZE per replica (a global batch twice as large, as `CPU_DEVICES=2 fit` does);
    `mirrored_2_same_global_batch` halves it. The processes run in the order A B C C B A, to even out drift
    (A B C only, for a short form with one repetition).
    """
    configs = {name: dict(config) for name, config in REPLICA_CONFIGS.items()}
    configs["mirrored_2_same_global_batch"]["BATCH_SIZE"] = max(1, settings.batch_size // 2)
    runs: dict[str, dict[str, list[float]]] = {name: {"template": [], "in_memory": []} for name in configs}
    resolved: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as temporary:
        order = [*configs, *reversed(configs)] if repetitions > 1 else list(configs)
        for index, name in enumerate(order):
            out = Path(temporary) / f"{index}.json"
            argv = [sys.executable, "-m", "train.bench", "--json", str(out), "--repetitions", str(repetitions)]
            argv += ["--seconds", str(seconds_per_measurement), "--contenders", "template,in_memory", "--no-startup"]
            _timed_run(argv, _child_env(settings, **configs[name]), Path(temporary))
            child = json.loads(out.read_text())
            resolved[name] = child["resolved"]
            for contender, values in runs[name].items():
                values += child["contenders"][contender]["runs"]
            say(
                f"  {name}: {child['resolved']['replicas']} replica(s), global batch "
                f"{child['resolved']['global_batch']}: template "
                f"{child['contenders']['template']['examples_per_sec']:,.0f} examples/s"
            )
    medians = {name: {c: statistics.median(v) for c, v in per.items()} for name, per in runs.items()}
    one = medians["one_device"]["template"]
    return {
        "configs": {
            name: {"resolved": resolved[name], "examples_per_sec": medians[name], "runs": runs[name]}
            for name in configs
        },
        "mirrored_2_vs_one_device": medians["mirrored_2"]["template"] / one,
        # XLA cannot compile the mirrored step: the same step on one device, XLA off, is the like-for-like figure.
        "mirrored_2_vs_one_device_without_xla": (
            medians["mirrored_2"]["template"] / medians["one_device_without_xla"]["template"]
        ),
        "mirrored_2_same_global_batch_vs_one_device": medians["mirrored_2_same_global_batch"]["template"] / one,
    }


CALL_CUTTING = ("LOG_EVERY", "CHECKPOINT_EVERY")  # settings that end a call early (see call_steps)
LEVERS = ("STEPS_PER_CALL", "JIT_COMPILE", "MIXED_PRECISION", "DATA_IN_MEMORY", "CROSS_DEVICE_OPS")


def lever_variants(on_gpus: bool) -> dict[str, list[dict[str, str]]]:
    """Each lever's values to compare, as settings that override the user's for one subprocess each."""
    mirrored = {"STRATEGY": "mirrored", "JIT_COMPILE": "auto"}
    if not on_gpus:
        mirrored.update(GPUS="none", CPU_DEVICES="2")
    all_reduces = ("auto", "nccl", "hierarchical_copy", "reduce_to_one") if on_gpus else ("auto", "hierarchical_copy")
    precisions = ("off", "mixed_bfloat16", *(("mixed_float16",) if on_gpus else ()))
    return {
        "STEPS_PER_CALL": [
            *({"STEPS_PER_CALL": value} for value in ("1", "8", "32", "128")),
            # fit cuts calls at LOG_EVERY and CHECKPOINT_EVERY too: 128 counts only where those are further apart
            {"STEPS_PER_CALL": "128", **{name: "1280" for name in CALL_CUTTING}},
        ],
        "JIT_COMPILE": [{"JIT_COMPILE": value} for value in ("false", "true")],
        "MIXED_PRECISION": [{"MIXED_PRECISION": value} for value in precisions],
        "DATA_IN_MEMORY": [{"DATA_IN_MEMORY": value, "JIT_COMPILE": "auto"} for value in ("true", "false")],
        "CROSS_DEVICE_OPS": [{**mirrored, "CROSS_DEVICE_OPS": value} for value in all_reduces],
    }


def _variant_label(lever: str, overrides: dict[str, str]) -> str:
    """LEVER=value, and the call-cutting settings the variant changes with it."""
    extra = [f"{name}={overrides[name]}" for name in CALL_CUTTING if name in overrides]
    return " ".join([f"{lever}={overrides[lever]}", *extra])


def compare_levers(
    settings: Settings,
    levers: tuple[str, ...],
    on_gpus: bool,
    repetitions: int = 2,
    seconds_per_measurement: float = 1.5,
    say: Say = print,
) -> dict[str, Any]:
    """The template's path with each value of each lever, one subprocess per value (devices and the dtype
    policy are fixed per process). Values run in the order A B C C B A (A B C for one repetition); a value
    the settings refuse here (JIT_COMPILE=true under MirroredStrategy, say) is reported with its error."""
    variants = lever_variants(on_gpus)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-levers-") as temporary:
        for lever in levers:
            values = variants[lever]
            labels = [_variant_label(lever, overrides) for overrides in values]  # "value" alone can repeat
            runs: dict[int, list[float]] = {index: [] for index in range(len(values))}
            errors: dict[int, str] = {}
            resolved: dict[int, Any] = {}
            order = [*range(len(values)), *reversed(range(len(values)))] if repetitions > 1 else range(len(values))
            for index in order:
                if index in errors:
                    continue
                out = Path(temporary) / f"{lever}-{index}.json"
                argv = [sys.executable, "-m", "train.bench", "--json", str(out), "--repetitions", str(repetitions)]
                argv += ["--seconds", str(seconds_per_measurement), "--contenders", "template", "--no-startup"]
                try:
                    _timed_run(argv, _child_env(settings, **values[index]), Path(temporary))
                except SubprocessFailed as error:
                    errors[index] = error.last_line
                    say(f"  {labels[index]}: {errors[index]}")
                    continue
                child = json.loads(out.read_text())
                runs[index] += child["contenders"]["template"]["runs"]
                resolved[index] = {
                    "strategy": child["resolved"]["strategy"],
                    "replicas": child["resolved"]["replicas"],
                    "precision": child["resolved"]["precision"],
                    "cross_device_ops": child["resolved"]["cross_device_ops"],
                    "template": child["contenders"]["template"]["settings"],
                }
                say(f"  {labels[index]}: {runs[index][-1]:,.0f} examples/s")
            results[lever] = [
                {
                    "value": values[index][lever],
                    "label": labels[index],
                    "overrides": values[index],
                    "examples_per_sec": statistics.median(runs[index]) if runs[index] else None,
                    "runs": runs[index],
                    "resolved": resolved.get(index),
                    "error": errors.get(index),
                }
                for index in range(len(values))
            ]
    return results


# --- the benchmark -------------------------------------------------------------------------------------------


def _goal(name: str, value: float | None, target: float, at_least: bool = True) -> dict[str, Any]:
    met = None if value is None else (value >= target if at_least else value < target)
    return {"goal": name, "value": value, "target": target, "comparison": ">=" if at_least else "<", "met": met}


def run_benchmark(
    settings: Settings,
    repetitions: int = 5,
    seconds_per_measurement: float = 1.5,
    say: Say = print,
    include_startup: bool = True,
    compare_replicas: bool = False,
    contenders: tuple[str, ...] = CONTENDERS,
    levers: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Measure the contenders in this process (interleaved, warm-up excluded, medians); returns plain data.

    It sets up the devices first: call it before any other TensorFlow work in the process.
    """
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown or not contenders:
        raise SettingsError(f"unknown contenders {unknown}: use some of {', '.join(CONTENDERS)}")
    from train.data import PipelineFeed, load_data, make_feed
    from train.runtime import setup_runtime
    from train.training import _steps_per_epoch, describe_feed, jit_compile_for, longest_call

    runtime = setup_runtime(settings)
    for note in runtime.notes:
        say(note)
    data = load_data(settings)
    for note in data.notes:
        say(note)
    if not data.in_memory and {"keras_fit", "keras_numpy"} & set(contenders):
        contenders = tuple(c for c in contenders if c not in ("keras_fit", "keras_numpy"))
        say("The splits are streamed: Keras fit (3 and 4), which takes them from memory here, is left out.")
    import tensorflow as tf

    jit_compile = jit_compile_for(settings, runtime, data.train)

    say(
        f"Benchmark: {data.name}, {len(data.train)} examples x {data.input_dim} features; {runtime.replicas} "
        f"replica(s) ({runtime.strategy_name}: {', '.join(runtime.devices)}), global batch {runtime.global_batch}, "
        f"STEPS_PER_CALL={settings.steps_per_call}; {repetitions} round(s) of {seconds_per_measurement:g} s each."
    )

    block = longest_call(settings, _steps_per_epoch(settings, data, runtime))  # the longest call fit makes

    def template_feed():
        return make_feed(runtime.strategy, data.train, runtime.global_batch, settings.seed, 0, block)

    built: list[_Contender] = []
    for name in CONTENDERS:
        if name not in contenders:
            continue
        say(f"Building and warming up {name} ...")
        if name == "template":
            feed = template_feed()
            say(f"  the template's feed: {describe_feed(data, feed)}, XLA {'on' if jit_compile else 'off'}")
            contender = _loop_contender(name, settings, runtime, data, feed, jit_compile)
        elif name == "in_memory":
            contender = _loop_contender(name, settings, runtime, data, _SameBatchFeed(runtime, data), jit_compile)
        elif name == "in_memory_batches":
            if laid_out_bytes(runtime, data, block) > LAID_OUT_BYTES:
                say(f"  left out: one call's batches take more than {LAID_OUT_BYTES >> 20} MiB laid out")
                continue
            feed = _LaidOutBatchesFeed(runtime, data, block)
            contender = _loop_contender(name, settings, runtime, data, feed, jit_compile)
        elif name == "in_memory_dataset":
            feed = PipelineFeed(_same_batch_dataset(runtime, data))
            contender = _loop_contender(name, settings, runtime, data, feed, False)
        elif name == "keras_fit":
            contender = _best_keras_fit(settings, runtime, data, min(KERAS_TRIAL_SECONDS, seconds_per_measurement), say)
        else:
            contender = _keras_contender(name, settings, runtime.strategy, runtime.strategy_name, data, True, 0)
        contender.measure(min(0.5, seconds_per_measurement))  # warm-up: tracing and first calls, not counted
        built.append(contender)

    runs: dict[str, list[float]] = {contender.name: [] for contender in built}
    for repetition in range(repetitions):
        shift = repetition % len(built)
        for contender in built[shift:] + built[:shift]:  # rotating: no contender always runs first or last
            examples, seconds = contender.measure(seconds_per_measurement)
            runs[contender.name].append(examples / seconds)
        say(f"  round {repetition + 1}/{repetitions}: " + ", ".join(f"{n} {v[-1]:,.0f}" for n, v in runs.items()))

    results: dict[str, Any] = {}
    for contender in built:
        values = runs[contender.name]
        median = statistics.median(values)
        results[contender.name] = {
            "label": LABELS[contender.name],
            "examples_per_sec": median,
            "runs": values,
            # (max - min) / median of the rounds; one round has none (not 0%)
            "spread": (max(values) - min(values)) / median if len(values) > 1 else None,
            "global_batch": contender.batch,
            "strategy": contender.strategy,
            "settings": contender.note,
            "crashed": contender.crashed,
        }
    ratios = {
        name: results[a]["examples_per_sec"] / results[b]["examples_per_sec"]
        for name, (a, b) in RATIOS.items()
        if a in results and b in results
    }
    goals = [_goal(f"{name} {RATIO_MEANING[name]}", ratios.get(name), target) for name, target in RATIO_GOALS.items()]
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "dataset": data.name,
        "train_examples": len(data.train),
        "input_dim": data.input_dim,
        "resolved": runtime.describe(),
        "steps_per_call": settings.steps_per_call,
        "tensorflow": tf.__version__,
        "repetitions": repetitions,
        "seconds_per_measurement": seconds_per_measurement,
        "contenders": results,
        "ratios": ratios,
        "startup": None,
        "replicas": None,
        "levers": None,
        "goals": goals,
    }
    if include_startup:
        say("Start-up: python -m train --help, import tensorflow, a tiny fit (subprocesses) ...")
        startup = measure_startup(settings, repetitions=max(1, min(STARTUP_ROUNDS, repetitions)), say=say)
        result["startup"] = startup
        goals.append(_goal("python -m train --help, seconds", startup["help_seconds"], HELP_GOAL_SECONDS, False))
        goals.append(_goal("tiny fit / import tensorflow", startup["tiny_fit_vs_import"], FIT_VS_IMPORT_GOAL, False))
    if compare_replicas:
        say("Replicas: one logical CPU device against MirroredStrategy on two (subprocesses) ...")
        replicas = compare_replica_counts(
            settings, repetitions=max(1, min(2, repetitions)), seconds_per_measurement=seconds_per_measurement, say=say
        )
        result["replicas"] = replicas
        goals.append(
            _goal("mirrored on 2 CPU devices / one device", replicas["mirrored_2_vs_one_device"], REPLICAS_GOAL)
        )
    if levers:
        say(f"Levers: {', '.join(levers)}, one subprocess per value ...")
        result["levers"] = compare_levers(
            settings, levers, bool(runtime.plan.visible_gpus), max(1, min(2, repetitions)), seconds_per_measurement, say
        )
    return result


def format_benchmark(result: dict[str, Any]) -> str:
    """The result as a table, the ratios and the goals, met or not."""
    resolved = result["resolved"]
    lines = [
        f"{result['dataset']}: {result['train_examples']} examples x {result['input_dim']} features; "
        f"{resolved['replicas']} replica(s) ({resolved['strategy']}), global batch {resolved['global_batch']}, "
        f"STEPS_PER_CALL={result['steps_per_call']}; TensorFlow {result['tensorflow']}",
        f"median of {result['repetitions']} interleaved round(s) of {result['seconds_per_measurement']:g} s; "
        "spread = (max - min) / median",
        "",
        f"{'':<32} {'examples/s':>12} {'spread':>7} {'batch':>6}  settings",
    ]
    crashes = []
    for contender in result["contenders"].values():
        where = "" if contender["strategy"] == resolved["strategy"] else f"  [{contender['strategy']} only]"
        spread = "-" if contender["spread"] is None else f"{100 * contender['spread']:.0f}%"
        lines.append(
            f"{contender['label']:<32} {contender['examples_per_sec']:>12,.0f} {spread:>7} "
            f"{contender['global_batch']:>6}  {contender['settings']}{where}"
        )
        crashes += [f"  {contender['label'].split()[0]} crashed: {line}" for line in contender["crashed"]]
    lines += crashes
    if result["ratios"]:
        lines += ["", "ratios:"]
        for name, value in result["ratios"].items():
            lines.append(f"  {name:<5} {value:>7.2f}  {RATIO_MEANING[name]}")
    if result["startup"]:
        startup = result["startup"]
        lines += [
            "",
            f"start-up: python -m train --help {startup['help_seconds']:.2f} s; import tensorflow "
            f"{startup['import_tensorflow_seconds']:.2f} s; tiny fit ({startup['tiny_fit']}) "
            f"{startup['tiny_fit_seconds']:.2f} s = {startup['tiny_fit_vs_import']:.2f}x import",
        ]
    if result["replicas"]:
        lines += ["", "replicas (separate processes, template path / batch in memory):"]
        for name, config in result["replicas"]["configs"].items():
            rates = config["examples_per_sec"]
            lines.append(
                f"  {name:<29} {config['resolved']['replicas']} replica(s), global batch "
                f"{config['resolved']['global_batch']:>5}: {rates['template']:>10,.0f} / {rates['in_memory']:>10,.0f}"
            )
        lines.append(
            "  same global batch, mirrored_2 / one_device: "
            f"{result['replicas']['mirrored_2_same_global_batch_vs_one_device']:.2f}"
        )
        lines.append(
            "  mirrored_2 / one_device without XLA (XLA cannot compile a mirrored step): "
            f"{result['replicas']['mirrored_2_vs_one_device_without_xla']:.2f}"
        )
    if result.get("levers"):
        lines += ["", "levers (the template's path, one subprocess per value; x = against the first value):"]
        width = max(len(value["label"]) for values in result["levers"].values() for value in values)
        for values in result["levers"].values():
            first = values[0]["examples_per_sec"]
            for value in values:
                rate = value["examples_per_sec"]
                if rate is None:
                    lines.append(f"  {value['label']:<{width}} not run: {value['error']}")
                    continue
                against = f"{rate / first:5.2f}x" if first else "     "
                resolved = value["resolved"]
                lines.append(
                    f"  {value['label']:<{width}} {rate:>12,.0f}  {against}  "
                    f"{resolved['strategy']}, {resolved['precision']}, {resolved['template']}"
                )
    lines += ["", "goals (README, How fast):"]
    for goal in result["goals"]:
        value = "n/a" if goal["value"] is None else f"{goal['value']:.2f}"
        verdict = {True: "met", False: "NOT met", None: "not measured"}[goal["met"]]
        lines.append(f"  {goal['goal']:<46} {value:>6}  target {goal['comparison']} {goal['target']:<5g} {verdict}")
    return "\n".join(lines)


def parse_levers(text: str) -> tuple[str, ...]:
    """`--levers` as given: empty for none, `all`, or comma-separated names. Raises SettingsError."""
    if text in ("", "none"):
        return ()
    levers = LEVERS if text == "all" else tuple(text.split(","))
    unknown = sorted(set(levers) - set(LEVERS))
    if unknown:
        raise SettingsError(f"--levers {','.join(unknown)} is not a lever: use all or some of {', '.join(LEVERS)}")
    return levers


def main(argv: list[str] | None = None) -> int:
    """`python -m train.bench`: the benchmark with the settings from the environment and .env (no flags)."""
    parser = argparse.ArgumentParser(prog="python -m train.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    parser.add_argument("--repetitions", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=1.5, help="seconds per measurement (default 1.5)")
    parser.add_argument("--compare-replicas", action="store_true", help="also 1 against 2 logical CPU devices")
    parser.add_argument("--no-startup", action="store_true", help="skip the start-up measurements")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset")
    parser.add_argument("--levers", default="", help=f"all, or some of {','.join(LEVERS)}: each value measured")
    args = parser.parse_args(argv)
    try:
        result = run_benchmark(
            load_settings(),
            repetitions=args.repetitions,
            seconds_per_measurement=args.seconds,
            say=lambda message: print(message, flush=True),
            include_startup=not args.no_startup,
            compare_replicas=args.compare_replicas,
            contenders=tuple(args.contenders.split(",")),
            levers=parse_levers(args.levers),
        )
    except (SettingsError, TrainingError) as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    print(format_benchmark(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
