"""`python -m train bench`: how near is the training loop to what this machine can do, and what holds it back?

In one process, with the normal settings (MODEL, DATASET, BATCH_SIZE, STRATEGY, CPU_DEVICES, GPUS, STEPS_PER_CALL,
and LOG_EVERY, CHECKPOINT_EVERY, STEPS_PER_EPOCH where they cut calls short), these ways of training the same model
on the same data are measured in examples per second (train.tools.contenders builds each from the engine's public
parts; the benchmark never reaches inside the engine):

  1  template           the template's own path: `make_calls` on `adapter`'s feed, in the calls `fit` makes,
                        XLA as `fit` decides (without what `fit` does between calls: logging, checkpoints, evaluation)
  1a accumulated        the same at the same micro-batch, each step accumulating ACCUMULATION of them (GLOBAL_BATCH_SIZE
                        with BATCH_SIZE): a global batch ACCUMULATION times larger, one optimizer update a step
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
against the goals in docs/performance.md; 1/2b and 2b/2 say whether a gap is the pipeline's work or tf.data's iterator,
1/2c and 2c/2 whether it is the template's input (its gather and plan, or its tf.data pipeline) or that the
batch changes at all (a batch that never changes stays hot in cache, and XLA may keep work on it out of the loop).
Optionally, in subprocesses (TensorFlow fixes its devices once per process): start-up times, and one logical
CPU device against MirroredStrategy on two.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.dataset_path import Survey
from train.errors import SettingsError, TrainingError
from train.settings import FIELDS, Settings

if TYPE_CHECKING:
    from train.data.source import Data
    from train.devices.runtime import Runtime
    from train.model_file import Experiment

SCHEMA = 1
CONTENDERS = (
    "template",
    "accumulated",
    "in_memory",
    "in_memory_dataset",
    "in_memory_batches",
    "keras_fit",
    "keras_numpy",
    "streamed",
    "tuned_tfdata",
    "streamed_input",
    "tuned_tfdata_input",
)
LABELS = {
    "template": "1  template fit path",
    "accumulated": "1a same, 4 micro-batches a step",
    "in_memory": "2  same loop, batch in memory",
    "in_memory_dataset": "2b same, via tf.data iterator",
    "in_memory_batches": "2c new batch a step, no gather",
    "keras_fit": "3  Keras fit, tf.data, best",
    "keras_numpy": "4  Keras fit, numpy, batch 32",
    "streamed": "5  template fit path, streamed",
    "tuned_tfdata": "6  same step, tuned tf.data of TFDS",
    "streamed_input": "5i 5's input alone, no step",
    "tuned_tfdata_input": "6i 6's input alone, no step",
}
RATIOS = {
    "1a/1": ("accumulated", "template"),
    "1/2": ("template", "in_memory"),
    "1/3": ("template", "keras_fit"),
    "1/4": ("template", "keras_numpy"),
    "1/2b": ("template", "in_memory_dataset"),
    "2b/2": ("in_memory_dataset", "in_memory"),
    "1/2c": ("template", "in_memory_batches"),
    "2c/2": ("in_memory_batches", "in_memory"),
    "5/1": ("streamed", "template"),
    "5/6": ("streamed", "tuned_tfdata"),
    "5i/6i": ("streamed_input", "tuned_tfdata_input"),
}
# The goals by what the data is (docs/performance.md): the documented MLP on vectors, and the CNN example on
# images, where the step, not the input, dominates.
RATIO_GOALS = {
    "vectors": {"1/2": 0.85, "1/3": 1.2, "1/4": 10.0, "5/1": 0.5, "1a/1": 0.85},
    "images": {"1/2": 0.9, "1/3": 1.1, "5/6": 1.0, "1a/1": 0.85},
    # The general path (MODEL's preprocess, e.g. examples/resnet.py on photos of any size): the input pipeline
    # against a tuned tf.data pipeline running the same preprocess over the same files.
    "preprocess": {"5i/6i": 1.0, "5/6": 1.0},
}
# Rows that train on arrays of the stored feature: not there on the general path, whose inputs are made by
# preprocess in tf.data (its rows 1, 5, 6, 5i and 6i are measured).
ARRAY_ROWS = ("in_memory", "in_memory_dataset", "in_memory_batches", "keras_fit", "keras_numpy")
RATIO_MEANING = {
    "1a/1": "accumulating 4 micro-batches costs little per example",
    "1/2": "the input pipeline is not the bottleneck",
    "1/3": "faster than Keras fit at its best",
    "1/4": "faster than the tutorials' way",
    "1/2b": "the pipeline's own work (gather, order), given the iterator (and 1's XLA, if on)",
    "2b/2": "a tf.data iterator, one get_next per step (and no XLA: it cannot compile one)",
    "1/2c": "the shuffled gather and its plan, given a new batch each step",
    "2c/2": "a new batch each step against one that never changes",
    "5/1": "streamed from the TFDS files against in memory",
    "5/6": "the template's streaming against a tuned tf.data pipeline",
    "5i/6i": "the same, the two pipelines alone (no step)",
}
ACCUMULATION = 4  # row 1a's micro-batches a step (issue: within 15% of accumulation 1 at the same micro-batch)
HELP_GOAL_SECONDS = 0.3
FIT_VS_IMPORT_GOAL = 1.6
REPLICAS_GOAL = 0.8
KERAS_TRIAL_SECONDS = 0.75
LAID_OUT_BYTES = 512 << 20  # row 2c copies one call's batches; above this it is left out rather than risk memory
TINY_FIT = {"EPOCHS": 1, "STEPS_PER_EPOCH": 20}
# Odd, so the median is one real round: the first tiny fit of a session often ran 30-40% slower (cold caches).
STARTUP_ROUNDS = 3

Say = Callable[[str], None]


# --- start-up and replicas: subprocesses ---------------------------------------------------------------------


def _child_env(settings: Settings, **overrides: object) -> dict[str, str]:
    """This environment with every setting spelled out (so no .env is needed) and this package importable."""
    env = {name: value for name, value in os.environ.items() if name not in {f.env for f in FIELDS}}
    env.update({name: value for name, value in settings.to_json().items() if value != ""})  # empty: unset
    # a path: the children run in a folder of their own, and read the same files wherever they run
    if isinstance(settings.source, Survey):
        env["DATASET"] = str(Path(settings.dataset).expanduser().resolve())
    env.update({name: str(value) for name, value in overrides.items()})
    package_root = str(Path(__file__).resolve().parents[2])  # the folder that holds train/
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


def _bench_argv(out: Path, repetitions: int, seconds: float, contenders: str) -> list[str]:
    """`python -m train bench` measuring only these contenders in a process of its own, its result as JSON."""
    return [
        sys.executable,
        "-m",
        "train",
        "bench",
        "--json",
        str(out),
        "--repetitions",
        str(repetitions),
        "--seconds",
        str(seconds),
        "--contenders",
        contenders,
        "--no-startup",
    ]


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


def scaling_configs(visible_gpus: int) -> dict[str, dict[str, Any]]:
    """The device counts to compare at a fixed per-replica batch (weak scaling), as settings for a process each.

    On GPUs 1, 2, 4, ... and all of them. On CPU 1 and 2 logical devices, and one device without XLA (which
    a mirrored step cannot have): a check of the multi-replica path, since the logical devices share the cores.
    """
    if visible_gpus:
        counts = sorted({1, visible_gpus, *(2**i for i in range(1, 10) if 2**i < visible_gpus)})
        return {
            f"{k}_gpu{'s' if k > 1 else ''}": {"GPUS": ",".join(map(str, range(k))), "STRATEGY": "auto"} for k in counts
        }
    return {
        "1_cpu": {"GPUS": "none", "CPU_DEVICES": 1, "STRATEGY": "one_device"},
        "1_cpu_without_xla": {"GPUS": "none", "CPU_DEVICES": 1, "STRATEGY": "one_device", "JIT_COMPILE": "false"},
        "2_cpus": {"GPUS": "none", "CPU_DEVICES": 2, "STRATEGY": "mirrored"},
    }


def compare_replica_counts(
    settings: Settings, visible_gpus: int, repetitions: int = 2, seconds_per_measurement: float = 1.5, say: Say = print
) -> dict[str, Any]:
    """The template's path on 1, 2, ... N devices at BATCH_SIZE per replica, each in its own process: examples/s,
    per replica, and the scaling efficiency against one device. The processes run in the order A B C C B A,
    to even out drift (A B C only, for a short form with one repetition)."""
    configs = scaling_configs(visible_gpus)
    rows = ("template", "in_memory", "accumulated")  # accumulated: bench-gpu's accumulation row per device count
    runs: dict[str, dict[str, list[float]]] = {name: {row: [] for row in rows} for name in configs}
    resolved: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as temporary:
        order = [*configs, *reversed(configs)] if repetitions > 1 else list(configs)
        for index, name in enumerate(order):
            out = Path(temporary) / f"{index}.json"
            argv = _bench_argv(out, repetitions, seconds_per_measurement, ",".join(rows))
            _timed_run(argv, _child_env(settings, **configs[name]), Path(temporary))
            child = json.loads(out.read_text())
            resolved[name] = child["resolved"]
            for contender, values in runs[name].items():
                values += child["contenders"][contender]["runs"]
            shown = child["resolved"]
            rate = child["contenders"]["template"]["examples_per_sec"]
            say(f"  {name}: {shown['replicas']} replica(s), global batch {shown['global_batch']}: template {rate:,.0f}")
    medians = {name: {c: statistics.median(v) for c, v in per.items()} for name, per in runs.items()}
    first = next(iter(configs))
    scaling = []
    for name in configs:
        replicas, rate = resolved[name]["replicas"], medians[name]["template"]
        efficiency = rate / (replicas * medians[first]["template"])
        scaling.append(
            {
                "config": name,
                "replicas": replicas,
                "examples_per_sec": rate,
                "per_replica": rate / replicas,
                "efficiency": efficiency,
            }
        )
    result = {
        "devices": "gpu" if visible_gpus else "cpu",
        "configs": {
            name: {"resolved": resolved[name], "examples_per_sec": medians[name], "runs": runs[name]}
            for name in configs
        },
        "scaling": scaling,
    }
    if not visible_gpus:
        two = medians["2_cpus"]["template"]
        result["mirrored_2_vs_one_device"] = two / medians["1_cpu"]["template"]
        # XLA cannot compile the mirrored step: the same step on one device, XLA off, is the like-for-like figure.
        result["mirrored_2_vs_one_device_without_xla"] = two / medians["1_cpu_without_xla"]["template"]
    return result


CALL_CUTTING = ("LOG_EVERY", "CHECKPOINT_EVERY")  # settings that end a call early (see call_steps)
LEVERS = (
    "STEPS_PER_CALL",
    "JIT_COMPILE",
    "MIXED_PRECISION",
    "DATA_IN_MEMORY",
    "CROSS_DEVICE_OPS",
    "DEVICE_PREFETCH",
    "SYNC_BATCH_NORM",
)
# SYNC_BATCH_NORM's lever needs a model with BatchNormalization (the default MLP has none): the ResNet example on its
# offline photos, mirrored, at a small batch per replica (where synchronised statistics matter)
BATCH_NORM_MODEL = Path(__file__).resolve().parents[2] / "examples" / "resnet.py"


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
        # GPUs only: how far tf.distribute copies ahead to each device (no effect on CPU devices)
        "DEVICE_PREFETCH": [{"DEVICE_PREFETCH": value} for value in ("1", "2", "4")],
        "SYNC_BATCH_NORM": [
            {
                **mirrored,
                "MODEL": str(BATCH_NORM_MODEL),
                "DATASET": "synthetic_photos",
                "TRAIN_SPLIT": "train",
                "EVAL_SPLIT": "test",
                "BATCH_SIZE": "16",
                "GLOBAL_BATCH_SIZE": "",
                "SYNC_BATCH_NORM": value,
            }
            for value in ("false", "true")
        ],
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
                argv = _bench_argv(out, repetitions, seconds_per_measurement, "template")
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


def build_contenders(
    settings: Settings,
    experiment: Experiment,
    runtime: Runtime,
    data: Data,
    streamed: Data | None,
    names: tuple[str, ...],
    trial_seconds: float,
    say: Say,
) -> list:
    """Each contender named, made and warmed up (tracing and first calls, not counted), each model from the
    `experiment` (MODEL's file, loaded once). `streamed`: the same splits streamed (the data of 5 and 6), or None."""
    from train.data.source import Split
    from train.loop import longest_call
    from train.start import steps_per_epoch
    from train.tools import contenders as c

    longest = longest_call(settings, steps_per_epoch(settings, data, runtime))  # fit's longest call
    made = []
    for name in CONTENDERS:
        if name not in names:
            continue
        if data.spec.records and name in ARRAY_ROWS:
            say(f"  {name} left out: it trains on arrays of the stored feature, and preprocess makes the inputs")
            continue
        say(f"Building and warming up {name} ...")
        if name == "template":
            contender = c.loop_contender(name, settings, experiment, runtime, data)
            say(f"  the template: {contender.note}")
        elif name == "accumulated":
            contender = c.loop_contender(name, settings, experiment, c.accumulating(runtime, ACCUMULATION), data)
        elif name == "in_memory":
            contender = c.loop_contender(
                name, settings, experiment, runtime, data, lambda: c.SameBatchFeed(runtime, data)
            )
        elif name == "in_memory_batches":
            if c.laid_out_bytes(runtime, data, longest) > LAID_OUT_BYTES:
                say(f"  left out: one call's batches take more than {LAID_OUT_BYTES >> 20} MiB laid out")
                continue
            contender = c.loop_contender(
                name, settings, experiment, runtime, data, lambda: c.LaidOutBatchesFeed(runtime, data, longest)
            )
        elif name == "in_memory_dataset":
            contender = c.loop_contender(
                name, settings, experiment, runtime, data, lambda: c.same_batch_dataset_feed(runtime, data)
            )
        elif name in ("streamed", "tuned_tfdata"):
            if streamed is None:
                say(f"  left out: {name} needs the splits streamed, and they could not be")
                continue
            tuned = (lambda: c.tuned_tfdata_feed(runtime, streamed, settings.seed)) if name == "tuned_tfdata" else None
            contender = c.loop_contender(
                name, settings.replace(data_in_memory="false"), experiment, runtime, streamed, tuned
            )
        elif name in ("streamed_input", "tuned_tfdata_input"):
            if streamed is None:
                say(f"  left out: {name} needs the splits streamed, and they could not be")
                continue
            contender = c.input_contender(name, settings, runtime, streamed, tuned=name == "tuned_tfdata_input")
        elif not isinstance(data.train, Split):
            say(f"  left out: the splits are streamed, and {name} takes them from memory")
            continue
        elif name == "keras_fit":
            contender = c.best_keras_fit(settings, experiment, runtime, data, trial_seconds, say)
        else:
            context = c.run_context(settings, runtime, data, c.steps_per_epoch(settings, data, runtime))
            contender = c.keras_contender(
                name, settings, experiment, runtime.strategy, runtime.strategy_name, data, True, 0, context=context
            )
        contender.measure(min(0.5, trial_seconds))
        made.append(contender)
    return made


def measure_rounds(contenders: list, repetitions: int, seconds: float, say: Say) -> dict[str, Any]:
    """Interleaved rounds in a rotating order (none always first or last); the median and spread of each."""
    runs: dict[str, list[float]] = {contender.name: [] for contender in contenders}
    per_cpu_second: dict[str, list[float]] = {contender.name: [] for contender in contenders}
    for repetition in range(repetitions):
        shift = repetition % len(contenders)
        for contender in contenders[shift:] + contenders[:shift]:
            cpu = time.process_time()  # every thread of this process: the CPU the examples cost
            examples, elapsed = contender.measure(seconds)
            runs[contender.name].append(examples / elapsed)
            per_cpu_second[contender.name].append(examples / max(time.process_time() - cpu, 1e-9))
        say(f"  round {repetition + 1}/{repetitions}: " + ", ".join(f"{n} {v[-1]:,.0f}" for n, v in runs.items()))
    results = {}
    for contender in contenders:
        values = runs[contender.name]
        median = statistics.median(values)
        results[contender.name] = {
            "label": LABELS[contender.name],
            "examples_per_sec": median,
            "examples_per_cpu_sec": statistics.median(per_cpu_second[contender.name]),
            "runs": values,
            # (max - min) / median of the rounds; one round has none (not 0%)
            "spread": (max(values) - min(values)) / median if len(values) > 1 else None,
            "global_batch": contender.batch,
            "strategy": contender.strategy,
            "settings": contender.note,
            "crashed": contender.crashed,
        }
    return results


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
        raise SettingsError(f"--contenders {','.join(unknown)} is not a contender: use some of {', '.join(CONTENDERS)}")
    import tensorflow as tf

    from train.data import load_data
    from train.devices.runtime import setup_runtime
    from train.model_file import load_model_file

    runtime = setup_runtime(settings)
    experiment = load_model_file(settings.model)  # MODEL's file, loaded once for every contender and passed down
    data = load_data(settings, experiment)
    for note in (*runtime.notes, *data.notes):
        say(note)
    if runtime.accumulation > 1:  # the rows compare ways of taking one batch at once: row 1a is the accumulating one
        say(
            f"The settings accumulate {runtime.accumulation} micro-batches a step: every row but 1a runs at the "
            f"micro-batch, {runtime.per_replica_batch} per replica, one a step."
        )
        runtime = runtime.with_batch(runtime.per_replica_batch)
    spec = data.spec
    say(
        f"Benchmark: {data.name}, {len(data.train)} examples of {spec.describe_inputs()}; "
        f"MODEL={settings.model}; {runtime.replicas} replica(s) "
        f"({runtime.strategy_name}: {', '.join(runtime.devices)}), "
        f"global batch {runtime.global_batch}, STEPS_PER_CALL={settings.steps_per_call}; {repetitions} round(s) of "
        f"{seconds_per_measurement:g} s each."
    )
    streamed = None
    if {"streamed", "tuned_tfdata", "streamed_input", "tuned_tfdata_input"} & set(contenders):
        from train.tools.contenders import streamed as streamed_splits

        streamed = data if not data.in_memory else streamed_splits(settings, experiment)
    trial = min(KERAS_TRIAL_SECONDS, seconds_per_measurement)
    made = build_contenders(settings, experiment, runtime, data, streamed, contenders, trial, say)
    results = measure_rounds(made, repetitions, seconds_per_measurement, say)
    made.clear()  # their tf.data pipelines' threads, which would compete with the subprocesses' measurements
    gc.collect()
    ratios = {
        name: results[a]["examples_per_sec"] / results[b]["examples_per_sec"]
        for name, (a, b) in RATIOS.items()
        if a in results and b in results
    }
    kind = "preprocess" if spec.records else "images" if spec.is_image else "vectors"
    goals = [
        _goal(f"{name} {RATIO_MEANING[name]} ({kind})", ratios.get(name), target)
        for name, target in RATIO_GOALS[kind].items()
    ]
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "dataset": data.name,
        "model": settings.model,
        "train_examples": len(data.train),
        "feature": {"shape": list(spec.feature_shape), "dtype": spec.feature_dtype},
        "inputs": spec.describe_inputs(),
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
        "shares": None,
        "goals": goals,
    }
    if streamed is not None and "streamed" in contenders:
        from train.tools.contenders import reading_per_share

        say("Reading per worker: each of 1, 2 and 4 workers reads its share of the streamed split ...")
        result["shares"] = reading_per_share(streamed, settings.seed, runtime.global_batch)
    _in_subprocesses(
        result, settings, runtime, repetitions, seconds_per_measurement, say, include_startup, compare_replicas, levers
    )
    return result


def _in_subprocesses(
    result: dict[str, Any],
    settings: Settings,
    runtime: Runtime,
    repetitions: int,
    seconds: float,
    say: Say,
    startup: bool,
    replicas: bool,
    levers: tuple[str, ...],
) -> None:
    """The measurements that need processes of their own (TensorFlow fixes its devices once per process)."""
    goals = result["goals"]
    if startup:
        say("Start-up: python -m train --help, import tensorflow, a tiny fit (subprocesses) ...")
        result["startup"] = measured = measure_startup(
            settings, repetitions=max(1, min(STARTUP_ROUNDS, repetitions)), say=say
        )
        goals.append(_goal("python -m train --help, seconds", measured["help_seconds"], HELP_GOAL_SECONDS, False))
        goals.append(_goal("tiny fit / import tensorflow", measured["tiny_fit_vs_import"], FIT_VS_IMPORT_GOAL, False))
    if replicas:
        gpus = len(runtime.plan.visible_gpus)
        devices = f"{gpus} GPUs" if gpus else "2 logical CPU devices"
        say(f"Replicas: 1 to {devices} at BATCH_SIZE per replica (subprocesses) ...")
        result["replicas"] = measured = compare_replica_counts(
            settings, gpus, max(1, min(2, repetitions)), seconds, say
        )
        if not gpus:
            goals.append(
                _goal("mirrored on 2 CPU devices / one device", measured["mirrored_2_vs_one_device"], REPLICAS_GOAL)
            )
    if levers:
        say(f"Levers: {', '.join(levers)}, one subprocess per value ...")
        result["levers"] = compare_levers(
            settings, levers, bool(runtime.plan.visible_gpus), max(1, min(2, repetitions)), seconds, say
        )


def format_benchmark(result: dict[str, Any]) -> str:
    """The result as a table, the ratios and the goals, met or not."""
    resolved = result["resolved"]
    inputs = result.get("inputs") or f"{result['feature']['shape']} {result['feature']['dtype']}"
    lines = [
        f"{result['dataset']}: {result['train_examples']} examples of {inputs}; MODEL={result['model']}; "
        f"{resolved['replicas']} replica(s) ({resolved['strategy']}), global batch {resolved['global_batch']}, "
        f"STEPS_PER_CALL={result['steps_per_call']}; TensorFlow {result['tensorflow']}",
        f"median of {result['repetitions']} interleaved round(s) of {result['seconds_per_measurement']:g} s; "
        "spread = (max - min) / median",
        "",
        f"{'':<32} {'examples/s':>12} {'spread':>7} {'batch':>6} {'per CPU-s':>10}  settings",
    ]
    crashes = []
    for contender in result["contenders"].values():
        where = "" if contender["strategy"] == resolved["strategy"] else f"  [{contender['strategy']} only]"
        spread = "-" if contender["spread"] is None else f"{100 * contender['spread']:.0f}%"
        per_cpu = contender.get("examples_per_cpu_sec")
        per_cpu = "-" if per_cpu is None else f"{per_cpu:,.0f}"
        lines.append(
            f"{contender['label']:<32} {contender['examples_per_sec']:>12,.0f} {spread:>7} "
            f"{contender['global_batch']:>6} {per_cpu:>10}  {contender['settings']}{where}"
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
        lines += _scaling_lines(result["replicas"])
    if result.get("shares"):
        lines += ["", "reading a streamed split per worker (each its share, its input pipeline timed alone):"]
        for count, workers in result["shares"].items():
            shares = ", ".join(f"{w['share_examples']:,}" for w in workers)
            rates = ", ".join(f"{w['examples_per_sec']:,.0f}" if w["examples_per_sec"] else "-" for w in workers)
            lines.append(f"  {count} worker(s): examples read each {shares}; examples/s each {rates}")
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
    lines += ["", "goals (docs/performance.md):"]
    for goal in result["goals"]:
        value = "n/a" if goal["value"] is None else f"{goal['value']:.2f}"
        verdict = {True: "met", False: "NOT met", None: "not measured"}[goal["met"]]
        lines.append(f"  {goal['goal']:<46} {value:>6}  target {goal['comparison']} {goal['target']:<5g} {verdict}")
    return "\n".join(lines)


def _scaling_lines(replicas: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "replicas at BATCH_SIZE per replica (separate processes; template / batch in memory / accumulating "
        f"{ACCUMULATION}; efficiency = examples/s per replica against one device):",
    ]
    rows = {row["config"]: row for row in replicas["scaling"]}
    for name, config in replicas["configs"].items():
        rates, row = config["examples_per_sec"], rows[name]
        lines.append(
            f"  {name:<18} {row['replicas']:>3} replica(s), global batch {config['resolved']['global_batch']:>6}: "
            f"{rates['template']:>12,.0f} / {rates['in_memory']:>12,.0f} / {rates.get('accumulated', 0):>12,.0f}; "
            f"per replica {row['per_replica']:>11,.0f}, "
            f"efficiency {row['efficiency']:.2f}"
        )
    if "mirrored_2_vs_one_device_without_xla" in replicas:
        lines.append(
            "  2 CPU devices / one without XLA (XLA cannot compile a mirrored step): "
            f"{replicas['mirrored_2_vs_one_device_without_xla']:.2f}"
        )
    return lines


def parse_levers(text: str) -> tuple[str, ...]:
    """`--levers` as given: empty for none, `all`, or comma-separated names. Raises SettingsError."""
    if text in ("", "none"):
        return ()
    levers = LEVERS if text == "all" else tuple(text.split(","))
    unknown = sorted(set(levers) - set(LEVERS))
    if unknown:
        raise SettingsError(f"--levers {','.join(unknown)} is not a lever: use all or some of {', '.join(LEVERS)}")
    return levers
