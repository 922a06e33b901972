"""`python -m train bench`: is the training loop near what this machine can do, and is the input the bottleneck?

In one process, with the normal settings (DATASET, BATCH_SIZE, STRATEGY, CPU_DEVICES, GPUS, STEPS_PER_CALL),
four ways of training the same model on the same data are measured in examples per second:

  1. template     the template's own fit path: `make_train_steps` + `run_steps` on `train_dataset`
  2. in_memory    the same loop fed one batch held in memory, repeated: the input pipeline's ceiling
  3. keras_fit    Keras `model.fit` at its best: a tf.data pipeline of the same arrays, the same global
                  batch, `steps_per_execution` as large as works, XLA on or off as a trial run prefers
  4. keras_numpy  the tutorials' way: numpy arrays into `model.fit` at its default batch of 32

Each contender has its own fresh model and is warmed up (traced) first. Then the contenders take turns for
`repetitions` rounds, in a rotating order; each measurement runs whole calls until `seconds_per_measurement`
have passed and counts the examples. The median over the rounds is reported, with the spread as the noise.
Ratios 1/2 (input pipeline), 1/3 (against Keras fit) and 1/4 (against the tutorials) are checked against the
goals of issue 6. Optionally: start-up times, and 1 against 2 logical CPU devices; both run subprocesses,
since TensorFlow fixes its devices once per process.
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

from train.settings import FIELDS, Settings, load_settings

SCHEMA = 1
CONTENDERS = ("template", "in_memory", "keras_fit", "keras_numpy")
LABELS = {
    "template": "1 template fit path",
    "in_memory": "2 same loop, in-memory batch",
    "keras_fit": "3 Keras fit, tf.data",
    "keras_numpy": "4 Keras fit, numpy (tutorials)",
}
RATIOS = {"1/2": ("template", "in_memory"), "1/3": ("template", "keras_fit"), "1/4": ("template", "keras_numpy")}
RATIO_GOALS = {"1/2": 0.85, "1/3": 1.2, "1/4": 10.0}
RATIO_MEANING = {
    "1/2": "input pipeline not the bottleneck",
    "1/3": "faster than Keras fit at its best",
    "1/4": "faster than the tutorials' way",
}
HELP_GOAL_SECONDS = 0.3
FIT_VS_IMPORT_GOAL = 1.6
REPLICAS_GOAL = 0.8
TUTORIAL_BATCH = 32  # Keras fit's default batch_size
KERAS_FIT_TRIAL_SECONDS = 0.75

Say = Callable[[str], None]


@dataclass
class _Contender:
    """One way of training. `measure(seconds)` trains for about that long and returns (examples, seconds)."""

    name: str
    measure: Callable[[float], tuple[int, float]]
    batch: int  # global batch
    strategy: str
    note: str
    failures: list[str] = field(default_factory=list)


# --- 1 and 2: the template's own loop ------------------------------------------------------------------------


def _loop_contender(name: str, settings: Settings, runtime, data, iterator_for: Callable[[], Any]) -> _Contender:
    """The loop exactly as `fit` runs it: STEPS_PER_CALL steps per `run_steps` call, then read the loss."""
    from train.training import _build, make_metrics, make_train_steps, run_steps

    model = _build(settings, runtime, data)
    train_loss, train_accuracy = make_metrics(runtime)
    train_steps = make_train_steps(model, runtime, train_loss, train_accuracy)
    iterator = iterator_for()
    steps, global_batch = settings.steps_per_call, runtime.global_batch

    def measure(seconds: float) -> tuple[int, float]:
        examples = 0
        started = time.perf_counter()
        while True:
            run_steps(train_steps, iterator, steps, global_batch)
            float(train_loss.result())  # waits for the call to finish, as _train_loop does
            examples += steps * global_batch
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                return examples, elapsed

    return _Contender(name, measure, global_batch, runtime.strategy_name, f"STEPS_PER_CALL={steps}")


def _in_memory_dataset(runtime, data):
    """A distributed dataset of one per-replica batch, repeated: the same `next(iterator)`, no real pipeline."""
    import tensorflow as tf

    per_replica = runtime.per_replica_batch
    features, labels = data.train.features[:per_replica], data.train.labels[:per_replica]

    def dataset_fn(context):
        del context
        return tf.data.Dataset.from_tensors((features, labels)).repeat()

    return runtime.strategy.distribute_datasets_from_function(dataset_fn)


# --- 3 and 4: Keras model.fit --------------------------------------------------------------------------------


def keras_pipeline(data, global_batch: int):
    """The tuned tf.data pipeline a Keras user would write: reshuffled every pass, whole batches, prefetched."""
    import tensorflow as tf

    split = data.train
    dataset = tf.data.Dataset.from_tensor_slices((split.features, split.labels))
    dataset = dataset.shuffle(len(split), reshuffle_each_iteration=True).batch(global_batch, drop_remainder=True)
    return dataset.repeat().prefetch(tf.data.AUTOTUNE)


def _clock(seconds: float):
    """A Keras callback that times a `model.fit` from the end of its first execution and stops it after `seconds`.

    The first execution of each `fit` call makes that call's iterator (and fills a shuffle buffer): a cost of
    measuring in slices, which one long `fit` pays once, so it is left out in Keras's favour.
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

        def on_train_batch_end(self, batch, logs=None):
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
    batch: int,
    numpy: bool,
    steps_per_execution: int = 1,
    jit_compile: bool | str = "auto",
) -> _Contender:
    """A fresh model from `build_model`, recompiled with these settings, trained by `model.fit`."""
    import keras

    from train.model import build_model

    keras.utils.set_random_seed(settings.seed)
    with strategy.scope():
        model = build_model(data.input_dim, data.num_classes, settings.learning_rate)
        config = model.get_compile_config()
        config.update(steps_per_execution=steps_per_execution, jit_compile=jit_compile)
        model.compile_from_config(config)

    if numpy:

        def fit(clock) -> None:  # the tutorials: arrays, default batch (32), shuffled every epoch
            model.fit(data.train.features, data.train.labels, epochs=10**6, verbose=0, callbacks=[clock])

    else:
        dataset = keras_pipeline(data, batch)

        def fit(clock) -> None:
            model.fit(dataset, epochs=1, steps_per_epoch=10**9, verbose=0, callbacks=[clock])

    def measure(seconds: float) -> tuple[int, float]:
        clock = _clock(seconds)
        with strategy.scope():
            fit(clock)
        if clock.ended is None or clock.started is None:
            raise RuntimeError("model.fit stopped before the measurement ended")
        return (clock.last_step - clock.first_step) * batch, clock.ended - clock.started

    note = f"steps_per_execution={steps_per_execution}, jit_compile={model.jit_compile}"
    return _Contender(name, measure, batch, strategy_name, note)


def _best_keras_fit(settings: Settings, runtime, data, say: Say) -> _Contender:
    """Keras fit at its best here: the largest steps_per_execution that runs, with XLA on or off, whichever is faster.

    Settings that crash under the runtime's strategy are skipped and said; one device only if none runs.
    """
    import tensorflow as tf

    strategies = [(runtime.strategy, runtime.strategy_name)]
    if runtime.replicas > 1:
        strategies.append((tf.distribute.OneDeviceStrategy(runtime.devices[0]), "one_device"))
    failures: list[str] = []
    for strategy, strategy_name in strategies:
        for steps_per_execution in sorted({settings.steps_per_call, 1}, reverse=True):
            ran: list[tuple[float, _Contender]] = []
            for jit_compile in (True, False):
                tried = f"{strategy_name}, steps_per_execution={steps_per_execution}, jit_compile={jit_compile}"
                try:
                    contender = _keras_contender(
                        "keras_fit",
                        settings,
                        strategy,
                        strategy_name,
                        data,
                        runtime.global_batch,
                        False,
                        steps_per_execution,
                        jit_compile,
                    )
                    contender.measure(0.2)  # traces
                    examples, seconds = contender.measure(KERAS_FIT_TRIAL_SECONDS)
                except Exception as error:  # what crashes under MirroredStrategy varies: say it, try the next
                    failures.append(f"{tried}: {type(error).__name__}: {_first_line(error)[:160]}")
                    say(f"  keras_fit trial: {tried}: crashed ({failures[-1]})")
                    continue
                ran.append((examples / seconds, contender))
                say(f"  keras_fit trial: {tried}: {examples / seconds:,.0f} examples/s")
            if ran:
                contender = max(ran, key=lambda pair: pair[0])[1]
                if failures:
                    contender.note += f"; crashed: {len(failures)} faster setting(s), see the output"
                contender.failures = failures
                return contender
    raise RuntimeError("Keras model.fit ran with no setting: " + "; ".join(failures))


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# --- start-up and replicas: subprocesses ---------------------------------------------------------------------


def _child_env(settings: Settings, **overrides: object) -> dict[str, str]:
    """This process's environment with every setting spelled out (so no .env is needed), and the package found."""
    env = {name: value for name, value in os.environ.items() if name not in {field.env for field in FIELDS}}
    env.update(settings.to_json())
    env.update({name: str(value) for name, value in overrides.items()})
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _timed_run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> float:
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()[-600:]}")
    return seconds


def measure_startup(settings: Settings, repetitions: int = 3, say: Say = print) -> dict[str, Any]:
    """Wall times of `python -m train --help`, `python -c "import tensorflow"` and a complete tiny `fit`."""
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as temporary:
        cwd = Path(temporary)
        env = _child_env(settings)
        runs: dict[str, list[float]] = {"help": [], "import_tensorflow": [], "tiny_fit": []}
        for repetition in range(repetitions):
            runs["help"].append(_timed_run([sys.executable, "-m", "train", "--help"], env, cwd))
            runs["import_tensorflow"].append(_timed_run([sys.executable, "-c", "import tensorflow"], env, cwd))
            fit_env = _child_env(settings, EPOCHS=1, STEPS_PER_EPOCH=20, OUTPUT_DIR=cwd / f"run{repetition}")
            runs["tiny_fit"].append(_timed_run([sys.executable, "-m", "train", "fit"], fit_env, cwd))
            say(
                f"  start-up round {repetition + 1}/{repetitions}: help {runs['help'][-1]:.2f} s, import tensorflow "
                f"{runs['import_tensorflow'][-1]:.2f} s, tiny fit {runs['tiny_fit'][-1]:.2f} s"
            )
    medians = {name: statistics.median(values) for name, values in runs.items()}
    return {
        "help_seconds": medians["help"],
        "import_tensorflow_seconds": medians["import_tensorflow"],
        "tiny_fit_seconds": medians["tiny_fit"],
        "tiny_fit_vs_import": medians["tiny_fit"] / medians["import_tensorflow"],
        "tiny_fit": "EPOCHS=1 STEPS_PER_EPOCH=20, evaluation and export included",
        "runs": runs,
    }


def compare_replica_counts(
    settings: Settings, repetitions: int = 3, seconds_per_measurement: float = 1.5, say: Say = print
) -> dict[str, Any]:
    """The template's path on 1 logical CPU device against MirroredStrategy on 2, each in its own process.

    Same BATCH_SIZE per replica (so 2 replicas train a global batch twice as large, as `fit` would), and the
    same global batch (BATCH_SIZE halved on 2 replicas). The processes run in the order A B B A, and the
    medians of all their measurements are compared.
    """
    half = max(1, settings.batch_size // 2)
    configs = {
        "one_device": {"CPU_DEVICES": 1, "STRATEGY": "one_device", "GPUS": "none"},
        "mirrored_2": {"CPU_DEVICES": 2, "STRATEGY": "mirrored", "GPUS": "none"},
        "mirrored_2_same_global_batch": {
            "CPU_DEVICES": 2,
            "STRATEGY": "mirrored",
            "GPUS": "none",
            "BATCH_SIZE": half,
        },
    }
    order = [*configs, *reversed(configs)]
    runs: dict[str, dict[str, list[float]]] = {name: {"template": [], "in_memory": []} for name in configs}
    described: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as temporary:
        for index, name in enumerate(order):
            out = Path(temporary) / f"{index}.json"
            argv = [sys.executable, "-m", "train.bench", "--json", str(out), "--repetitions", str(repetitions)]
            argv += ["--seconds", str(seconds_per_measurement), "--contenders", "template,in_memory", "--no-startup"]
            _timed_run(argv, _child_env(settings, **configs[name]), Path(temporary))
            child = json.loads(out.read_text())
            described[name] = child["resolved"]
            for contender in runs[name]:
                runs[name][contender] += child["contenders"][contender]["runs"]
            say(
                f"  {name} ({child['resolved']['replicas']} replica(s), global batch "
                f"{child['resolved']['global_batch']}): template "
                f"{child['contenders']['template']['examples_per_sec']:,.0f} examples/s"
            )
    medians = {name: {c: statistics.median(v) for c, v in per.items()} for name, per in runs.items()}
    base = medians["one_device"]["template"]
    return {
        "configs": {
            name: {"resolved": described[name], "examples_per_sec": medians[name], "runs": runs[name]}
            for name in configs
        },
        "mirrored_2_vs_one_device": medians["mirrored_2"]["template"] / base,
        "mirrored_2_same_global_batch_vs_one_device": medians["mirrored_2_same_global_batch"]["template"] / base,
    }


# --- the benchmark -------------------------------------------------------------------------------------------


def _goal(name: str, value: float | None, target: float, higher_is_better: bool = True) -> dict[str, Any]:
    met = None if value is None else (value >= target if higher_is_better else value < target)
    return {"goal": name, "value": value, "target": target, "comparison": ">=" if higher_is_better else "<", "met": met}


def run_benchmark(
    settings: Settings,
    repetitions: int = 5,
    seconds_per_measurement: float = 2.0,
    say: Say = print,
    include_startup: bool = True,
    compare_replicas: bool = False,
    contenders: tuple[str, ...] = CONTENDERS,
) -> dict[str, Any]:
    """Measure the contenders in this process (interleaved, warm-up excluded, medians); returns plain data.

    Sets up the devices first (`setup_runtime` must be the first TensorFlow call of the process).
    """
    unknown = set(contenders) - set(CONTENDERS)
    if unknown:
        raise ValueError(f"unknown contenders {sorted(unknown)}: use some of {', '.join(CONTENDERS)}")
    from train.data import load_data, train_dataset
    from train.runtime import setup_runtime

    runtime = setup_runtime(settings)
    for note in runtime.notes:
        say(note)
    data = load_data(settings)

    import tensorflow as tf

    say(
        f"Benchmark: {data.name}, {len(data.train)} examples of {data.input_dim} features, "
        f"{runtime.replicas} replica(s) ({runtime.strategy_name}: {', '.join(runtime.devices)}), "
        f"global batch {runtime.global_batch}, STEPS_PER_CALL={settings.steps_per_call}; "
        f"{repetitions} round(s) of {seconds_per_measurement:g} s per contender."
    )
    built: list[_Contender] = []
    for name in contenders:
        say(f"Building and warming up {name} ...")
        if name == "template":
            contender = _loop_contender(
                name,
                settings,
                runtime,
                data,
                lambda: iter(train_dataset(runtime.strategy, data.train, runtime.global_batch, settings.seed, 0)),
            )
        elif name == "in_memory":
            contender = _loop_contender(name, settings, runtime, data, lambda: iter(_in_memory_dataset(runtime, data)))
        elif name == "keras_fit":
            contender = _best_keras_fit(settings, runtime, data, say)
        else:
            contender = _keras_contender(
                name, settings, runtime.strategy, runtime.strategy_name, data, TUTORIAL_BATCH, numpy=True
            )
        contender.measure(min(0.5, seconds_per_measurement))  # warm-up: tracing and first calls, not counted
        built.append(contender)

    runs: dict[str, list[float]] = {contender.name: [] for contender in built}
    for repetition in range(repetitions):
        shift = repetition % len(built)
        for contender in built[shift:] + built[:shift]:  # a rotating order: no contender always goes first
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
            "spread": (max(values) - min(values)) / median if median else None,  # (max - min) / median
            "global_batch": contender.batch,
            "strategy": contender.strategy,
            "settings": contender.note,
            "crashed": contender.failures,
        }
    ratios = {
        name: results[a]["examples_per_sec"] / results[b]["examples_per_sec"]
        for name, (a, b) in RATIOS.items()
        if a in results and b in results
    }
    goals = [_goal(f"{name} {RATIO_MEANING[name]}", ratios.get(name), RATIO_GOALS[name]) for name in RATIOS]
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
        "goals": goals,
    }
    if include_startup:
        say("Start-up: python -m train --help, import tensorflow, a tiny fit (subprocesses) ...")
        startup = measure_startup(settings, repetitions=min(3, max(1, repetitions)), say=say)
        result["startup"] = startup
        goals.append(_goal("--help seconds", startup["help_seconds"], HELP_GOAL_SECONDS, higher_is_better=False))
        goals.append(
            _goal(
                "tiny fit / import tensorflow",
                startup["tiny_fit_vs_import"],
                FIT_VS_IMPORT_GOAL,
                higher_is_better=False,
            )
        )
    if compare_replicas:
        say("Replicas: 1 logical CPU device against MirroredStrategy on 2 (subprocesses) ...")
        replicas = compare_replica_counts(
            settings, repetitions=max(1, min(3, repetitions)), seconds_per_measurement=seconds_per_measurement, say=say
        )
        result["replicas"] = replicas
        goals.append(_goal("mirrored 2 CPU devices / one device", replicas["mirrored_2_vs_one_device"], REPLICAS_GOAL))
    return result


def format_benchmark(result: dict[str, Any]) -> str:
    """The result as a table, the ratios and the goals."""
    resolved = result["resolved"]
    lines = [
        f"{result['dataset']}: {result['train_examples']} examples x {result['input_dim']} features; "
        f"{resolved['replicas']} replica(s) ({resolved['strategy']}), global batch {resolved['global_batch']}, "
        f"STEPS_PER_CALL={result['steps_per_call']}; median of {result['repetitions']} interleaved round(s) "
        f"of {result['seconds_per_measurement']:g} s",
        "",
        f"{'contender':<32} {'examples/s':>12} {'spread':>7} {'batch':>6}  settings",
    ]
    for contender in result["contenders"].values():
        spread = f"{100 * contender['spread']:.0f}%" if contender["spread"] is not None else "-"
        strategy = "" if contender["strategy"] == resolved["strategy"] else f" [{contender['strategy']} only]"
        lines.append(
            f"{contender['label']:<32} {contender['examples_per_sec']:>12,.0f} {spread:>7} "
            f"{contender['global_batch']:>6}  {contender['settings']}{strategy}"
        )
    lines.append("(spread: (max - min) / median over the rounds)")
    if result["startup"]:
        startup = result["startup"]
        lines += [
            "",
            f"start-up: python -m train --help {startup['help_seconds']:.2f} s; import tensorflow "
            f"{startup['import_tensorflow_seconds']:.2f} s; tiny fit {startup['tiny_fit_seconds']:.2f} s "
            f"({startup['tiny_fit_vs_import']:.2f}x import)",
        ]
    if result["replicas"]:
        lines.append("")
        for name, config in result["replicas"]["configs"].items():
            r = config["resolved"]
            lines.append(
                f"{name:<30} {r['replicas']} replica(s), global batch {r['global_batch']:>5}: template "
                f"{config['examples_per_sec']['template']:>10,.0f}, in-memory "
                f"{config['examples_per_sec']['in_memory']:>10,.0f} examples/s"
            )
    lines += ["", "goals:"]
    for goal in result["goals"]:
        value = "n/a" if goal["value"] is None else f"{goal['value']:.2f}"
        verdict = {True: "met", False: "NOT met", None: "not measured"}[goal["met"]]
        lines.append(f"  {goal['goal']:<44} {value:>7}  (target {goal['comparison']} {goal['target']:g})  {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m train.bench`: the benchmark with the settings from the environment and .env."""
    parser = argparse.ArgumentParser(prog="python -m train.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--compare-replicas", action="store_true", help="also 1 vs 2 logical CPU devices")
    parser.add_argument("--no-startup", action="store_true", help="skip the start-up measurements")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    args = parser.parse_args(argv)
    settings = load_settings()
    result = run_benchmark(
        settings,
        repetitions=args.repetitions,
        seconds_per_measurement=args.seconds,
        include_startup=not args.no_startup,
        compare_replicas=args.compare_replicas,
        contenders=tuple(args.contenders.split(",")),
        say=lambda message: print(message, flush=True),
    )
    print(format_benchmark(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
