"""A run's exported model in each runtime, side by side, on the same inputs: its SavedModel in TensorFlow, its ONNX
in onnxruntime and its LiteRT flatbuffer in ai-edge-litert (and their int8 variants where present). Figures, not
assertions: `make bench-formats` prints them (issue 57).

    PYTHONPATH=. .venv/bin/python scripts/bench_formats.py --output-dir RUN [--json PATH]

RUN is a run directory after `python -m train fit` and `python -m train formats --format onnx,litert`:
RUN/saved_model/, RUN/formats/model.onnx, RUN/formats/model.tflite (model.int8.onnx, model.int8.tflite too when
they are there). What each takes is what RUN/model.keras takes (read from it, by input name): the SavedModel's
`serve_inputs` signature where it has one (what `preprocess` returns), else `serving_default` (the stored feature).
The inputs are drawn once from a seeded generator in model.keras's input spec (floats in [0, 1), uint8 in
[0, 255], other integers 0 or 1, which any vocabulary holds; a dimension of no fixed size gets --free-dim), and
every runtime is handed the same arrays.

For each runtime: the per-example latency at batch 1 (the median of --repeats calls after --warmup untimed ones,
in ms, with the 10th and 90th percentiles) and the throughput at --batch (256; the median of --batch-repeats calls,
in examples/s, with the 10th and 90th percentiles). A call is feeding the inputs, running, and reading every
output back as a NumPy array: what a client of each runtime does. Everything runs on the CPU (TensorFlow's GPUs are
hidden, onnxruntime has CPUExecutionProvider), each runtime on --threads threads (default: every CPU).

The SavedModel computes a little more than the other two: its signature names the classes too (`classes`, the
class names as strings beside `scores`), as TF Serving gets them. A missing artifact is a line saying so and a row
left out; a missing module (exit 2) names the extra that brings it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import numpy as np

SETUP = "make setup EXTRAS=dev,formats"
MODULES = ("tensorflow", "keras", "onnxruntime", "ai_edge_litert")  # their distributions: the same, "_" as "-"
FORMATS_COMMAND = "python -m train formats --output-dir {run} --format onnx,litert"
ONNX_NAMES = {"float": "float32", "double": "float64", "string": "object"}  # the others are NumPy's names too

Inputs = dict[str, np.ndarray]  # model.keras's input name: a batch of it
Call = Callable[[], object]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="scripts/bench_formats.py")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/default"), help="the run (default runs/default)")
    parser.add_argument("--batch", type=int, default=256, help="the batch of the throughput (default 256)")
    parser.add_argument("--repeats", type=int, default=200, help="timed calls at batch 1 (default 200)")
    parser.add_argument("--batch-repeats", type=int, default=30, help="timed calls at --batch (default 30)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls first, at each batch (default 10)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="each runtime's threads (every CPU)")
    parser.add_argument("--free-dim", type=int, default=16, help="the size of an input dimension of no fixed size")
    parser.add_argument("--seed", type=int, default=0, help="the inputs' seed (default 0)")
    parser.add_argument("--json", type=Path, help="also write the figures and the machine's facts here")
    args = parser.parse_args(argv)
    for name in ("batch", "repeats", "batch_repeats", "threads", "free_dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


# --- The inputs: model.keras's spec, drawn once.


def input_spec(model_path: Path) -> list[tuple[str, tuple[int | None, ...], str]]:
    """(name, shape, dtype) of each input of model.keras, loaded for this alone."""
    import keras

    model = keras.saving.load_model(model_path, compile=False)  # safe_mode stays on, as the engine loads it
    return [(tensor.name, tuple(tensor.shape), str(tensor.dtype)) for tensor in model.inputs]


def draw(spec: list[tuple[str, tuple[int | None, ...], str]], batch: int, seed: int, free_dim: int) -> Inputs:
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, shape, dtype in spec:
        size = (batch, *(free_dim if dim is None else dim for dim in shape[1:]))
        kind = np.dtype(dtype) if dtype != "string" else np.dtype(object)
        if kind == np.bool_:
            inputs[name] = rng.random(size) < 0.5
        elif kind == np.uint8:
            inputs[name] = rng.integers(0, 256, size).astype(np.uint8)
        elif np.issubdtype(kind, np.integer):
            inputs[name] = rng.integers(0, 2, size).astype(kind)  # 0 or 1: an index any vocabulary holds
        elif kind == np.object_:
            inputs[name] = np.full(size, b"a", dtype=object)
        else:
            inputs[name] = rng.random(size).astype(kind)
    return inputs


def match(wanted: list[str], given: Inputs, runtime: str) -> dict[str, str]:
    """The runtime's input names to model.keras's: by name (`features:0` is `features`), or the one to the one."""
    plain = {name.split(":")[0]: name for name in wanted}
    if set(plain) == set(given):
        return {plain[name]: name for name in given}
    if len(wanted) == 1 and len(given) == 1:
        return {wanted[0]: next(iter(given))}
    raise ValueError(f"{runtime} takes {sorted(plain)}, model.keras takes {sorted(given)}")


# --- The runtimes: each opened once, then `prepare(inputs)` gives the call to time on those inputs.


class SavedModel:
    def __init__(self, path: Path, threads: int) -> None:
        import tensorflow as tf

        self.tf = tf
        loaded = tf.saved_model.load(str(path))
        self.signature = "serve_inputs" if "serve_inputs" in loaded.signatures else "serving_default"
        self.function = loaded.signatures[self.signature]
        self.wanted = self.function.structured_input_signature[1]
        self.loaded = loaded  # the signature's variables live as long as the loaded object

    def prepare(self, inputs: Inputs) -> Call:
        names = match(list(self.wanted), inputs, f"the SavedModel's {self.signature}")
        feed = {
            name: self.tf.constant(inputs[key].astype(self.wanted[name].dtype.as_numpy_dtype, copy=False))
            for name, key in names.items()
        }
        function = self.function
        return lambda: [output.numpy() for output in function(**feed).values()]


class OnnxRuntime:
    def __init__(self, path: Path, threads: int) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.signature = "-"

    def prepare(self, inputs: Inputs) -> Call:
        wanted = {each.name: onnx_dtype(each.type) for each in self.session.get_inputs()}
        names = match(list(wanted), inputs, "the ONNX model")
        feed = {name: inputs[key].astype(wanted[name], copy=False) for name, key in names.items()}
        session = self.session
        return lambda: session.run(None, feed)


def onnx_dtype(name: str) -> np.dtype:
    """`tensor(float)`'s NumPy dtype (float32)."""
    kind = name.removeprefix("tensor(").removesuffix(")")
    return np.dtype(ONNX_NAMES.get(kind, kind))


class LiteRT:
    def __init__(self, path: Path, threads: int) -> None:
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path), num_threads=threads)
        signatures = self.interpreter.get_signature_list()
        self.signature = next(iter(signatures), "-")
        if signatures:  # the inputs by their signature's names (the tensors' own are `serving_default_NAME:0`)
            self.details = self.interpreter.get_signature_runner(self.signature).get_input_details()
        else:
            self.details = {detail["name"]: detail for detail in self.interpreter.get_input_details()}

    def prepare(self, inputs: Inputs) -> Call:
        interpreter = self.interpreter
        names = match(list(self.details), inputs, "the LiteRT model")
        feed = []
        for name, key in names.items():
            detail, value = self.details[name], inputs[key]
            scale, zero_point = detail["quantization"]
            if scale and np.issubdtype(detail["dtype"], np.integer) and not np.issubdtype(value.dtype, np.integer):
                limits = np.iinfo(detail["dtype"])  # an integer-input model: the inputs quantized, untimed
                value = np.clip(np.round(value / scale + zero_point), limits.min, limits.max)
            feed.append((detail["index"], value.astype(detail["dtype"], copy=False)))
            interpreter.resize_tensor_input(detail["index"], value.shape, strict=False)
        interpreter.allocate_tensors()
        outputs = [detail["index"] for detail in interpreter.get_output_details()]

        def call() -> list[np.ndarray]:
            for index, value in feed:
                interpreter.set_tensor(index, value)
            interpreter.invoke()
            return [interpreter.get_tensor(index) for index in outputs]

        return call


# (runtime, artifact under RUN, opener, whether its absence is worth a line: the int8 variants are optional)
ROWS = (
    ("saved_model", "saved_model", SavedModel, True),
    ("onnxruntime", "formats/model.onnx", OnnxRuntime, True),
    ("litert", "formats/model.tflite", LiteRT, True),
    ("onnxruntime int8", "formats/model.int8.onnx", OnnxRuntime, False),
    ("litert int8", "formats/model.int8.tflite", LiteRT, False),
)


# --- The timing.


def timed(call: Call, warmup: int, repeats: int) -> np.ndarray:
    for _ in range(warmup):
        call()
    seconds = np.empty(repeats)
    for index in range(repeats):
        start = time.perf_counter()
        call()
        seconds[index] = time.perf_counter() - start
    return seconds


def summary(values: np.ndarray) -> dict[str, float]:
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return {"median": float(median), "p10": float(p10), "p90": float(p90)}


def measure(opener: type, path: Path, ones: Inputs, batch: Inputs, args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    runtime = opener(path, args.threads)
    load_s = time.perf_counter() - start
    latency = timed(runtime.prepare(ones), args.warmup, args.repeats) * 1000
    size = len(next(iter(batch.values())))
    throughput = size / timed(runtime.prepare(batch), args.warmup, args.batch_repeats)
    return {
        "signature": runtime.signature,
        "load_s": load_s,
        "latency_ms": summary(latency),
        "examples_per_s": summary(throughput),
    }


# --- The machine and the table.


def machine(threads: int) -> dict:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions = {module.replace("_", "-"): metadata.version(module.replace("_", "-")) for module in MODULES}
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": affinity,
        "cpu": cpu or platform.processor(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "threads": threads,
        "load_average": round(os.getloadavg()[0], 2)
        if hasattr(os, "getloadavg")
        else None,  # other work on the machine
        "versions": versions,
    }


def size_of(path: Path) -> int:
    if path.is_dir():
        return sum(each.stat().st_size for each in path.rglob("*") if each.is_file())
    return path.stat().st_size


def table(rows: list[dict], batch: int) -> str:
    heads = ("runtime", "artifact", "MB", "load s", "batch 1: ms/example (p10-p90)")
    heads += (f"batch {batch}: examples/s (p10-p90)",)
    lines = [heads]
    for row in rows:
        latency, throughput = row["latency_ms"], row["examples_per_s"]
        lines.append(
            (
                row["runtime"],
                row["artifact"],
                f"{row['bytes'] / 1e6:.2f}",
                f"{row['load_s']:.2f}",
                f"{latency['median']:.3f} ({latency['p10']:.3f}-{latency['p90']:.3f})",
                f"{throughput['median']:,.0f} ({throughput['p10']:,.0f}-{throughput['p90']:,.0f})",
            )
        )
    widths = [max(len(line[column]) for line in lines) for column in range(len(heads))]
    right = {2, 3, 4, 5}
    return "\n".join(
        "  ".join(
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    missing = [module for module in MODULES if importlib.util.find_spec(module) is None]
    if missing:
        print(f"{', '.join(missing)} not installed: {SETUP}", file=sys.stderr)
        return 2
    run = args.output_dir
    if not (run / "model.keras").is_file():
        print(f"not found: {run / 'model.keras'}: run python -m train fit --output-dir {run} first", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.set_visible_devices([], "GPU")  # like with like: every runtime on the CPU
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    spec = input_spec(run / "model.keras")
    ones = draw(spec, 1, args.seed, args.free_dim)
    batch = draw(spec, args.batch, args.seed, args.free_dim)
    facts = machine(args.threads)
    shown = ", ".join(f"{name} {dtype} {batch[name].shape[1:]}" for name, _, dtype in spec)
    print(f"bench-formats: {run}; inputs as model.keras takes them ({shown}), seeded ({args.seed}), the same for each")
    versions = ", ".join(f"{name} {version}" for name, version in facts["versions"].items())
    print(
        f"machine: {facts['cpus']} CPUs ({facts['cpus_usable']} usable) {facts['cpu']}; {facts['platform']}; "
        f"Python {facts['python']}; {versions}; on the CPU, {args.threads} threads each; load average "
        f"{facts['load_average']} before"
    )
    print(
        f"batch 1: median of {args.repeats} calls; batch {args.batch}: median of {args.batch_repeats}; "
        f"{args.warmup} untimed calls first at each"
    )

    rows, not_found, failed = [], [], []
    for name, artifact, opener, required in ROWS:
        path = run / artifact
        if not path.exists():
            if required:
                fix = (
                    FORMATS_COMMAND.format(run=run)
                    if artifact.startswith("formats/")
                    else f"python -m train fit --output-dir {run}"
                )
                not_found.append(str(path))
                print(f"not found: {path}: run {fix} first")
            continue
        try:
            figures = measure(opener, path, ones, batch, args)
        except Exception as error:  # a runtime that cannot open or run its artifact: the others still compare
            said = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
            failed.append({"runtime": name, "artifact": artifact, "error": said})
            print(f"failed: {name} on {path}: {said}")
            continue
        shown = f"{artifact}/ {figures['signature']}" if opener is SavedModel else artifact
        rows.append({"runtime": name, "artifact": shown, "bytes": size_of(path), **figures})
    if rows:
        print(table(rows, args.batch))
    if args.json:
        settings = {
            key: getattr(args, key)
            for key in ("batch", "repeats", "batch_repeats", "warmup", "threads", "free_dim", "seed")
        }
        inputs = [{"name": name, "shape": list(shape), "dtype": dtype} for name, shape, dtype in spec]
        report = {
            "run": str(run),
            "machine": facts,
            "settings": settings,
            "inputs": inputs,
            "rows": rows,
            "not_found": not_found,
            "failed": failed,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if not rows:
        print("nothing measured", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
