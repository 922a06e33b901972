"""Every setting of the template: names, defaults, parsing and validation.

Nothing here imports TensorFlow, so `--help` and a bad value answer at once.

Precedence, stated once (see `load_settings`):
    command-line flag  >  process environment  >  `.env` file  >  project/defaults.env  >  default

Besides the fixed table (FIELDS), MODEL's build_model declares its own settings: its keyword-only parameters with
defaults, HP_<NAME> (train.hparams), read from the file's syntax tree and resolved through the same layers.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# python-dotenv's own parser: its public API only warns about a malformed line and carries on,
# and a typo that silently drops a setting is what this template refuses to do.
from dotenv.parser import parse_stream

from train import hparams
from train.cluster.tf_config import EXAMPLE, Cluster, parse_tf_config
from train.errors import SettingsError, first_line

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")
SINGLE_HOST = ("one_device", "mirrored")
RESUME_MODES = ("auto", "never")
AUTO_TRUE_FALSE = ("auto", "true", "false")
PRECISIONS = ("auto", "off", "mixed_float16", "mixed_bfloat16")
PROGRESS_MODES = ("auto", "bar", "lines")
MONITOR_MODES = ("auto", "min", "max")
ALL_REDUCES = ("auto", "nccl", "hierarchical_copy", "reduce_to_one")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _positive_int(name: str, text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text) or int(text) == 0:
        raise SettingsError(f"{name}={text!r} is not allowed: use a whole number of 1 or more")
    return int(text)


def _non_negative_int(name: str, text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise SettingsError(f"{name}={text!r} is not allowed: use a whole number of 0 or more")
    return int(text)


def _optional_positive_int(name: str, text: str) -> int | None:
    return None if text == "" else _positive_int(name, text)


def _positive_float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise SettingsError(f"{name}={text!r} is not allowed: use a number greater than 0, e.g. 0.001")
    return value


def _bool(name: str, text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise SettingsError(f"{name}={text!r} is not allowed: use true or false")


def _choice(allowed: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        if text not in allowed:
            raise SettingsError(f"{name}={text!r} is not allowed: use one of {', '.join(allowed)}")
        return text

    parse.metavar = "|".join(allowed)  # type: ignore[attr-defined]
    return parse


def _label_kind(name: str, text: str) -> str | None:
    """LABEL_KIND: class or value; empty: guessed from the label column (train.data.local)."""
    return None if text == "" else _choice(("class", "value"))(name, text)


_label_kind.metavar = "class|value"  # type: ignore[attr-defined]


def _gpus(name: str, text: str) -> str | tuple[int, ...]:
    """`all`, `none`, or distinct GPU indices like `0,1`."""
    if text in ("all", "none"):
        return text
    allowed = "use all, none, or distinct GPU indices without spaces, like 0 or 0,1"
    if not re.fullmatch(r"[0-9]+(,[0-9]+)*", text):
        raise SettingsError(f"{name}={text!r} is not allowed: {allowed}")
    indices = tuple(int(part) for part in text.split(","))
    if len(set(indices)) != len(indices):
        raise SettingsError(f"{name}={text!r} names a GPU twice: {allowed}")
    return indices


def _text(name: str, text: str) -> str:
    if text.strip() != text or text == "":
        raise SettingsError(f"{name}={text!r} is not allowed: use a non-empty value without surrounding spaces")
    return text


def _optional_text(name: str, text: str) -> str | None:
    return None if text == "" else _text(name, text)


def _dataset(name: str, text: str) -> str:
    # A path (train.data.local: a folder of images, a CSV or JSON Lines file, a prepared TFDS folder), checked for
    # what `stat` tells before TensorFlow loads; else a TFDS name: `name`, `name/config`, `name:1.2.3`, ...
    from train.data import local

    if local.is_path(text):
        local.survey(text)
        return text
    if not re.fullmatch(r"[a-z][a-z0-9_]*(/[A-Za-z0-9_.\-]+)?(:[0-9]+\.[0-9]+\.[0-9]+)?", text):
        raise SettingsError(
            f"{name}={text!r} is not allowed: use a TFDS dataset name, optionally with config and version, "
            "like mnist, or name/config:1.0.0, or a path (./photos, /data/table.csv)"
        )
    return text


DEFAULT_MODEL = "examples.mlp"  # the documented model: Dense(64, relu) -> Dense(num_classes, softmax)
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def is_model_path(text: str) -> bool:
    """MODEL names a file when it has a / or ends in .py; otherwise it is a module name."""
    return "/" in text or text.endswith(".py")


def model_source(text: str) -> Path | None:
    """The file MODEL names (a path, or a module's source), None where it cannot be found. Imports nothing but a
    module's parent packages (their `__init__`), so no TensorFlow."""
    if is_model_path(text):
        path = Path(text).expanduser()
        return path if path.is_file() else None
    if not _MODULE.fullmatch(text):
        return None
    try:
        spec = importlib.util.find_spec(text)
    except (ImportError, ValueError):  # a parent package that does not exist
        return None
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def model_fingerprint(text: str) -> str:
    """sha256 of MODEL's code: its syntax tree, so comments and formatting may change but the code may not.

    Raises SettingsError for a file that is gone, cannot be read or does not parse: the file, the line, the message.
    """
    return hashlib.sha256(ast.dump(model_tree(text)).encode()).hexdigest()


def model_hyperparameters(text: str) -> dict[str, hparams.HyperParameter] | None:
    """build_model's hyperparameters by setting name (HP_WIDTH), from MODEL's syntax tree (None: the file has no
    `def build_model` to read). Raises SettingsError as `model_fingerprint` does, and for a keyword-only parameter
    that cannot be a setting."""
    return hparams.declared(model_tree(text), text)


def model_tree(text: str) -> ast.Module:
    """MODEL's syntax tree, parsed once per version of the file (validation, the fingerprint and the hyperparameters
    all read it). Raises SettingsError as `model_fingerprint` says."""
    source = model_source(text)
    if source is None:
        raise SettingsError(f"MODEL={text!r} is no longer a file (from {Path.cwd()}): put it back, or set MODEL again")
    try:
        stat = source.stat()
        return _parsed(str(source), stat.st_mtime_ns, stat.st_size)
    except OSError as error:
        raise SettingsError(f"MODEL={text!r}: {source} cannot be read ({error.strerror})") from None
    except SyntaxError as error:  # IndentationError, a null byte and text that is not UTF-8 included
        where = f"{source}, line {error.lineno}" if error.lineno else str(source)
        raise SettingsError(f"MODEL={text!r} does not parse: {where}: {error.msg}") from None
    except (RecursionError, MemoryError, ValueError) as error:  # nesting too deep for the parser, and the like
        raise SettingsError(f"MODEL={text!r} does not parse: {source}: {type(error).__name__}") from None


@functools.lru_cache(maxsize=8)
def _parsed(path: str, mtime_ns: int, size: int) -> ast.Module:
    """(keyed on the file's version: a file changed between two reads is parsed again)"""
    del mtime_ns, size
    return ast.parse(Path(path).read_bytes(), filename=path)  # bytes: Python's own rules for the encoding


def _model(name: str, text: str) -> str:
    text = _text(name, text)
    if model_source(text) is not None:
        model_fingerprint(text)  # a file that cannot be read or does not parse: one line now, not a traceback later
        return text
    if is_model_path(text):
        raise SettingsError(
            f"{name}={text!r} is not a file (from {Path.cwd()}): give a .py file that defines build_model, "
            f"or a module name like {DEFAULT_MODEL}"
        )
    raise SettingsError(
        f"{name}={text!r} is not an importable module: give a module name like {DEFAULT_MODEL} or project.model, "
        "or a .py file path (with a / or ending in .py)"
    )


def _path(name: str, text: str) -> Path:
    return Path(_text(name, text)).expanduser()


def _optional_path(name: str, text: str) -> Path | None:
    return None if text == "" else _path(name, text)


def _profile_steps(name: str, text: str) -> tuple[int, int] | None:
    """`start-end`, global steps counted from 1, both ends inclusive (100-110); empty: no profiling."""
    if text == "":
        return None
    allowed = "use START-END, two step numbers from 1 with START <= END, like 100-110"
    match = re.fullmatch(r"([0-9]+)-([0-9]+)", text)
    if not match:
        raise SettingsError(f"{name}={text!r} is not allowed: {allowed}")
    start, end = int(match.group(1)), int(match.group(2))
    if start < 1 or end < start:
        raise SettingsError(f"{name}={text!r} is not allowed: {allowed}")
    return start, end


for _parse, _metavar in (
    (_positive_int, "N"), (_non_negative_int, "N"), (_optional_positive_int, "N"), (_positive_float, "X"),
    (_bool, "true|false"), (_gpus, "all|none|0,1"), (_text, "TEXT"), (_optional_text, "TEXT"),
    (_dataset, "NAME|PATH"), (_path, "PATH"), (_optional_path, "PATH"), (_model, "FILE|MODULE"),
    (_profile_steps, "START-END"),
):  # fmt: skip
    _parse.metavar = _metavar  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Field:
    """One setting: its environment name, its default as text, how to parse it, what it means, and two marks.

    `defines_run`: it shapes what a step computes or which batches it reads, so a resume that changes it
    warns. `workers_agree`: every worker of a multi-worker run must have the same value (it fixes the data
    order, the math, or where the collectives of training calls and checkpoint saves fall).
    """

    env: str
    default: str
    parse: Callable[[str, str], Any]
    help: str
    defines_run: bool = False
    workers_agree: bool = False

    @property
    def metavar(self) -> str:
        """The form of the value, for --help: N, X, true|false, PATH, the choices, ..."""
        return getattr(self.parse, "metavar", "TEXT")

    @property
    def attr(self) -> str:
        return self.env.lower()

    @property
    def flag(self) -> str:
        return "--" + self.env.lower().replace("_", "-")


# The one table of settings. `.env.example` and every command's `--help` are checked against it.
# R: defines the run (a resume that changes it warns). W: every worker must agree on it.
R, W, RW = {"defines_run": True}, {"workers_agree": True}, {"defines_run": True, "workers_agree": True}
FIELDS: tuple[Field, ...] = (
    Field("MODEL", DEFAULT_MODEL, _model, "build_model's home: a .py file (has / or .py) or a module name.", **RW),
    Field("GPUS", "all", _gpus, "GPUs to train on: all, none, or indices like 0,1.", **R),
    Field("MEMORY_GROWTH", "true", _bool, "Allocate GPU memory as needed instead of all of it up front."),
    Field("GPU_MEMORY_LIMIT_MB", "", _optional_positive_int, "Cap per GPU in MiB (needs MEMORY_GROWTH=false)."),
    Field("STRATEGY", "auto", _choice(STRATEGIES), "auto, one_device, mirrored or multi_worker (see README).", **RW),
    Field("CROSS_DEVICE_OPS", "auto", _choice(ALL_REDUCES), "MirroredStrategy's all-reduce (auto: see docs).", **W),
    Field("CPU_DEVICES", "1", _positive_int, "Split the CPU into N logical devices (replicas without GPUs).", **R),
    Field("DATASET", "synthetic_clusters", _dataset, "TFDS name[/config][:version], or a folder or file path.", **RW),
    Field("TFDS_DATA_DIR", "", _optional_path, "Where TFDS keeps prepared datasets (TFDS default if empty)."),
    Field("DATA_IN_MEMORY", "auto", _choice(AUTO_TRUE_FALSE), "auto: in memory if they fit, else streamed.", **RW),
    Field("DEVICE_PREFETCH", "1", _positive_int, "GPUs: batches each replica holds ahead on its device."),
    Field("TRAIN_SPLIT", "train", _text, "TFDS split to train on, e.g. train or train[:90%].", **RW),
    Field("EVAL_SPLIT", "test", _text, "TFDS split to evaluate on.", **W),
    Field("FEATURE_KEY", "", _optional_text, "Input feature; default: supervised keys, else image.", **RW),
    Field("LABEL_KEY", "", _optional_text, "Label feature; default: supervised keys, else label.", **RW),
    Field("LABEL_KIND", "", _label_kind, "A CSV/JSONL label: class or value (default: guessed).", **RW),
    Field("BATCH_SIZE", "128", _optional_positive_int, "Examples per replica at once (global: x replicas).", **RW),
    Field("GLOBAL_BATCH_SIZE", "", _optional_positive_int, "Examples per step on all replicas (accumulates).", **RW),
    Field("EPOCHS", "5", _positive_int, "Number of epochs.", **W),
    Field("STEPS_PER_EPOCH", "", _optional_positive_int, "Steps per epoch; default: one pass over the split.", **RW),
    Field("STEPS_PER_CALL", "32", _positive_int, "Most steps per tf.function call (cut at log, save, epoch).", **W),
    Field("JIT_COMPILE", "auto", _choice(AUTO_TRUE_FALSE), "XLA for the training step; auto: where faster.", **RW),
    Field("MIXED_PRECISION", "auto", _choice(PRECISIONS), "auto: bf16 on compute 8.0+, fp16 on 7.x, else off.", **RW),
    Field("LEARNING_RATE", "0.001", _positive_float, "Learning rate, passed to build_model.", **RW),
    Field("SEED", "42", _non_negative_int, "Seed of weights, data order, random layers: same run.", **RW),
    Field("DETERMINISTIC", "false", _bool, "Deterministic ops (same seed and hardware: same weights); slower.", **RW),
    Field("OUTPUT_DIR", "runs/default", _path, "Run directory: checkpoints, logs, summary, exported model."),
    Field("CHECKPOINT_EVERY", "100", _positive_int, "Save a checkpoint every N steps (and at each epoch end).", **W),
    Field("KEEP_CHECKPOINTS", "3", _positive_int, "How many recent checkpoints to keep."),
    Field("MONITOR", "", _optional_text, "Export (and keep) the best epoch by this metric, e.g. val_accuracy.", **W),
    Field("MONITOR_MODE", "auto", _choice(MONITOR_MODES), "MONITOR's best: min, max, or auto (from its name).", **W),
    Field("LOG_EVERY", "50", _positive_int, "Print progress and write TensorBoard scalars every N steps.", **W),
    Field("PROGRESS", "auto", _choice(PROGRESS_MODES), "auto: a live bar on a terminal, else lines."),
    Field("PROFILE_STEPS", "", _profile_steps, "TensorBoard profiler trace of these steps, like 100-110.", **W),
    Field("RESUME", "auto", _choice(RESUME_MODES), "auto resumes from OUTPUT_DIR's checkpoints; never refuses them."),
    Field("AUTO_BATCH", "false", _bool, "On out-of-memory, halve BATCH_SIZE and go on from the last checkpoint."),
    Field("WORKER_START_TIMEOUT", "600", _positive_int, "Multi-worker: seconds to wait for all workers to join."),
)  # fmt: skip
FIELDS_BY_ENV = {field.env: field for field in FIELDS}


@dataclass(frozen=True)
class Settings:
    model: str
    gpus: str | tuple[int, ...]
    memory_growth: bool
    gpu_memory_limit_mb: int | None
    strategy: str
    cross_device_ops: str
    cpu_devices: int
    dataset: str
    tfds_data_dir: Path | None
    data_in_memory: str
    device_prefetch: int
    train_split: str
    eval_split: str
    feature_key: str | None
    label_key: str | None
    label_kind: str | None
    batch_size: int | None  # None: GLOBAL_BATCH_SIZE is set
    global_batch_size: int | None
    epochs: int
    steps_per_epoch: int | None
    steps_per_call: int
    jit_compile: str
    mixed_precision: str
    learning_rate: float
    seed: int
    deterministic: bool
    output_dir: Path
    checkpoint_every: int
    keep_checkpoints: int
    monitor: str | None
    monitor_mode: str
    log_every: int
    progress: str
    profile_steps: tuple[int, int] | None
    resume: str
    auto_batch: bool
    worker_start_timeout: int
    # Not a setting: the cluster TF_CONFIG names (from the process environment only, as TensorFlow reads it).
    cluster: Cluster | None = None
    # build_model's hyperparameters, (parameter name, value) in its order: the settings HP_<NAME> (train.hparams).
    hyperparameters: tuple[tuple[str, Any], ...] = ()
    # Not a setting: where BATCH_SIZE and GLOBAL_BATCH_SIZE came from ((name, place), ...), for the start line.
    batch_from: tuple[tuple[str, str], ...] = dataclasses.field(default=(), compare=False)

    @property
    def multi_worker(self) -> bool:
        """Whether `fit` trains across workers: STRATEGY=multi_worker, or auto with TF_CONFIG naming 2+ workers."""
        if self.strategy == "multi_worker":
            return True
        return self.strategy == "auto" and self.cluster is not None and self.cluster.num_workers > 1

    def to_json(self) -> dict[str, Any]:
        """The resolved settings as environment-style text, ready to paste into a `.env`."""
        values = dataclasses.asdict(self)

        def text(value: Any, separator: str) -> str:
            if value is None:
                return ""
            if isinstance(value, bool):
                return str(value).lower()
            if isinstance(value, tuple):
                return separator.join(map(str, value))
            return str(value)

        # GPUS=0,1 but PROFILE_STEPS=100-110: each tuple as its setting writes it
        fixed = {field.env: text(values[field.attr], "-" if field.attr == "profile_steps" else ",") for field in FIELDS}
        return fixed | {hparams.env_name(name): hparams.text(value) for name, value in self.hyperparameters}

    def typed(self) -> dict[str, Any]:
        """Every setting by name with its value as a number, bool or text (TensorBoard's HParams take those)."""
        values = {}
        for name, text in self.to_json().items():
            value = getattr(self, name.lower()) if name in FIELDS_BY_ENV else None
            values[name] = value if isinstance(value, bool | int | float) else text
        values.update({hparams.env_name(name): value for name, value in self.hyperparameters})
        return values

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def read_dotenv(path: Path, warn: Callable[[str], None] | None = None) -> dict[str, str]:
    """Read a `.env` file strictly: a line python-dotenv cannot parse is an error with its line number.

    A name set twice keeps its last value, as python-dotenv and Docker read it; `warn` hears of it.
    """
    if not path.is_file():
        return {}
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    with path.open(encoding="utf-8") as stream:
        for binding in parse_stream(stream):
            if binding.error or (binding.key is not None and binding.value is None):
                line = binding.original.string.rstrip("\n")
                raise SettingsError(
                    f"{path}:{binding.original.line}: cannot read {line!r}: use NAME=value, one per line"
                )
            if binding.key is None:
                continue
            key, value = binding.key, binding.value
            if warn and key in values and values[key] != value:
                warn(
                    f"{path}:{binding.original.line}: {key}={value!r} sets {key} again (line {lines[key]}: "
                    f"{values[key]!r}); the last one counts"
                )
            values[key], lines[key] = value, binding.original.line
    return values


ENVIRONMENT_TYPO_CUTOFF = 0.9  # EPOCH for EPOCHS (0.91) and MEMORY_GROW (0.92) warn; GPU for GPUS (0.86) does not


def likely_typos(names: Iterable[str], cutoff: float = 0.8) -> dict[str, str]:
    """Names that are not settings but look like one, each with the setting it resembles (`BATCHSIZE`: `BATCH_SIZE`).

    `cutoff`: how alike (difflib's ratio) a name must be beyond differing only in case and underscores.
    """
    known = list(FIELDS_BY_ENV)
    squashed = {env.replace("_", ""): env for env in known}
    typos = {}
    for name in names:
        if name in FIELDS_BY_ENV or name.startswith(hparams.PREFIX):  # HP_ names: build_model's, checked apart
            continue
        guess = squashed.get(name.upper().replace("_", "")) or next(
            iter(difflib.get_close_matches(name.upper(), known, n=1, cutoff=cutoff)), None
        )
        if guess:
            typos[name] = guess
    return typos


def _typo_warnings(names: Iterable[str], where: str, cutoff: float = 0.8) -> list[str]:
    return [
        f"{where}: {name} is not a setting; did you mean {guess}?"
        for name, guess in likely_typos(names, cutoff).items()
    ]


def _parse(field: Field, text: str) -> Any:
    try:
        return field.parse(field.env, text)
    except SettingsError as error:
        if text == "" and field.default:  # `GPUS=` is a value, not "unset": say how to get the default
            raise SettingsError(f"{error}; or leave {field.env} out for its default, {field.default}") from None
        raise


def project_defaults_path() -> Path | None:
    """`project/defaults.env`: the fork's own defaults, committed with its model (found where `project` imports)."""
    try:
        spec = importlib.util.find_spec("project")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "defaults.env"


RUN_SETTINGS = "settings.json"  # in OUTPUT_DIR: the settings a run was started with


def load_settings(
    flags: Mapping[str, str | None] | None = None,
    environ: Mapping[str, str] | None = None,
    dotenv_path: Path | str = ".env",
    warn: Callable[[str], None] | None = None,
    defaults_path: Path | str | None = "project",
    from_run: bool = False,
) -> Settings:
    """Resolve every setting. Raises SettingsError. The precedence, highest first:

        command-line flag > environment > [the run's settings.json] > .env > project/defaults.env > default

    `from_run` (evaluate): the settings.json of the OUTPUT_DIR the layers above it and below it resolve to
    supplies what neither a flag nor the environment sets, so evaluate scores the run as it was trained.
    `defaults_path`: the fork's defaults file ("project": the `project` package's `defaults.env`; None: none).
    """
    flags = {name: value for name, value in (flags or {}).items() if value is not None}
    environ = os.environ if environ is None else environ
    dotenv = read_dotenv(Path(dotenv_path), warn)
    if defaults_path == "project":
        defaults_path = project_defaults_path()
    project = read_dotenv(Path(defaults_path), warn) if defaults_path else {}
    if warn:
        typos = _typo_warnings(dotenv, str(dotenv_path))
        typos += _typo_warnings(project, str(defaults_path))
        # `make train EPOCH=3` arrives as an environment variable: said, not silently ignored. Closer alike than
        # in .env, which holds only settings: the environment holds everything (GPU, CHECKPOINT_DIR).
        typos += _typo_warnings(environ, "environment (or make variable)", ENVIRONMENT_TYPO_CUTOFF)
        for message in typos:
            warn(message)
    layers = [flags, environ, dotenv, project]
    places = ["a flag", "the environment", str(dotenv_path), str(defaults_path)]  # where each layer comes from
    if from_run:
        output_dir = _parse(FIELDS_BY_ENV["OUTPUT_DIR"], _resolve("OUTPUT_DIR", layers))
        layers.insert(2, _run_settings(output_dir / RUN_SETTINGS, warn))
        places.insert(2, str(output_dir / RUN_SETTINGS))

    values = {field.attr: _parse(field, _resolve(field.env, layers)) for field in FIELDS}
    batch_from = _batch_sizes(values, layers, places)
    declared = model_hyperparameters(values["model"])
    if warn:
        for message in _hyperparameter_hints(declared, {str(dotenv_path): dotenv, str(defaults_path): project}):
            warn(message)
    hyperparameters = hparams.resolve(declared, zip(places, layers, strict=True), values["model"])
    settings = Settings(**values, cluster=parse_tf_config(environ.get("TF_CONFIG")), hyperparameters=hyperparameters,
                        batch_from=batch_from)  # fmt: skip

    if settings.gpu_memory_limit_mb is not None and settings.memory_growth:
        raise SettingsError(
            f"GPU_MEMORY_LIMIT_MB={settings.gpu_memory_limit_mb} cannot be combined with MEMORY_GROWTH=true: "
            "set MEMORY_GROWTH=false to cap memory, or leave GPU_MEMORY_LIMIT_MB empty"
        )
    if settings.gpus == "none" and settings.gpu_memory_limit_mb is not None:
        raise SettingsError("GPU_MEMORY_LIMIT_MB is set but GPUS=none: there is no GPU to cap")
    _check_combinations(settings)
    return settings


def _batch_sizes(
    values: dict[str, Any], layers: Iterable[Mapping[str, str]], places: Iterable[str]
) -> tuple[tuple[str, str], ...]:
    """BATCH_SIZE and GLOBAL_BATCH_SIZE, each from the highest layer that sets it (they may come from different
    ones: a fork's project/defaults.env BATCH_SIZE, what fits its GPU, under a flag's GLOBAL_BATCH_SIZE, what the
    recipe needs). Both: BATCH_SIZE is the most one replica takes at once, and a step accumulates (train.batches).
    GLOBAL_BATCH_SIZE alone: `batch_size` is None (the global batch divided by the replicas). Returns
    where each that is set came from, ((name, place), ...)."""
    layers, places = list(layers), list(places)
    found = []
    for name in ("BATCH_SIZE", "GLOBAL_BATCH_SIZE"):  # an empty value (`GLOBAL_BATCH_SIZE=`) sets nothing
        setting = (
            (layer[name], where) for layer, where in zip(layers, places, strict=True) if layer.get(name, "").strip()
        )
        given = next(setting, None)
        values[name.lower()] = _parse(FIELDS_BY_ENV[name], given[0]) if given else None
        if given:
            found.append((name, given[1]))
    if values["global_batch_size"] is None and values["batch_size"] is None:
        values["batch_size"] = int(FIELDS_BY_ENV["BATCH_SIZE"].default)
        found.insert(0, ("BATCH_SIZE", "the default"))
    return tuple(found)


def peek_hyperparameters(
    flags: Mapping[str, str], dotenv_path: Path | str = ".env", defaults_path: Path | str | None = "project",
    from_run: bool = False,
) -> dict[str, hparams.HyperParameter]:  # fmt: skip
    """build_model's hyperparameters for the MODEL that `flags` (MODEL, OUTPUT_DIR), the environment, [the run's
    settings.json,] .env and the defaults resolve to: the flags a command offers (--hp-width). Raises nothing:
    where it cannot be known, none (load_settings then says why)."""
    try:
        if defaults_path == "project":
            defaults_path = project_defaults_path()
        layers = [flags, os.environ, read_dotenv(Path(dotenv_path)), read_dotenv(Path(defaults_path or "/nonexistent"))]
        if from_run:
            layers.insert(2, read_run_settings(Path(_resolve("OUTPUT_DIR", layers)).expanduser() / RUN_SETTINGS)[0])
        return model_hyperparameters(_resolve("MODEL", layers)) or {}
    except Exception:  # a bad .env, MODEL or folder: load_settings says it in one line
        return {}


def _hyperparameter_hints(declared: Mapping[str, Any] | None, files: Mapping[str, Mapping[str, str]]) -> list[str]:
    """`WIDTH=128` in .env or project/defaults.env, where build_model declares `width`: said, not ignored."""
    return [
        f"{where}: {name} is not a setting; did you mean {hparams.env_name(name)} (build_model's {name.lower()})?"
        for where, values in files.items()
        for name in values
        if name not in FIELDS_BY_ENV and hparams.env_name(name) in (declared or {})
    ]


def _resolve(name: str, layers: Iterable[Mapping[str, str]]) -> str:
    """The text of a setting: the first layer that sets it, else its default."""
    for layer in layers:
        if name in layer:
            return layer[name]
    return FIELDS_BY_ENV[name].default


def read_run_settings(path: Path) -> tuple[dict[str, str], str | None]:
    """A run's settings.json: the settings it holds ({NAME: text}), and what is wrong with the file ("is damaged
    (...)", "cannot be read (...)"), None where nothing is (or there is no file). Raises nothing."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, None
    except OSError as error:
        return {}, f"cannot be read ({error.strerror})"
    except ValueError as error:  # not JSON, or not UTF-8
        return {}, f"is damaged (not JSON: {first_line(error, 100)})"
    if not isinstance(saved, dict):
        return {}, f"is damaged (a JSON {type(saved).__name__}, not an object)"
    settings = {
        name: value for name, value in saved.items() if name in FIELDS_BY_ENV or name.startswith(hparams.PREFIX)
    }
    wrong = [name for name, value in settings.items() if not isinstance(value, str)]
    if wrong:
        return {}, f"is damaged ({wrong[0]}: {settings[wrong[0]]!r} is not text)"
    return settings, None


def _run_settings(path: Path, warn: Callable[[str], None] | None) -> dict[str, str]:
    """A run's settings.json as a layer; a damaged one is said (as fit says it) and left out."""
    settings, problem = read_run_settings(path)
    if problem and warn:
        warn(f"{path} {problem}: the run's settings are not known; evaluating with the flags, the environment, "
             ".env and the defaults alone")  # fmt: skip
    return settings


def _check_combinations(settings: Settings) -> None:
    """Settings valid alone but not together: STRATEGY against TF_CONFIG, JIT_COMPILE, AUTO_BATCH."""
    cluster = settings.cluster
    if cluster is not None and settings.strategy in SINGLE_HOST:
        raise SettingsError(
            f"STRATEGY={settings.strategy} trains on this host only, but TF_CONFIG is set and names "
            f"{cluster.num_workers} worker(s): use STRATEGY=multi_worker (or auto), or unset TF_CONFIG"
        )
    if settings.strategy == "multi_worker" and cluster is None:
        raise SettingsError(
            "STRATEGY=multi_worker needs TF_CONFIG, which is not set: set it on every worker, like "
            f"TF_CONFIG='{EXAMPLE}', or start the workers with scripts/launch-workers.sh N"
        )
    if settings.jit_compile == "true" and settings.gpus == "none" and _mirrors_cpus(settings):
        raise SettingsError(
            f"JIT_COMPILE=true is not allowed with MirroredStrategy on CPU devices (GPUS=none, STRATEGY="
            f"{settings.strategy}, CPU_DEVICES={settings.cpu_devices}): XLA cannot compile a step whose variables "
            "are mirrored on several CPU devices; use JIT_COMPILE=auto or false"
        )
    if settings.deterministic and settings.jit_compile == "true":
        raise SettingsError(
            "JIT_COMPILE=true is not allowed with DETERMINISTIC=true: not every XLA kernel is deterministic; use "
            "JIT_COMPILE=auto (off while DETERMINISTIC=true) or false, or DETERMINISTIC=false"
        )
    if settings.cross_device_ops != "auto" and (settings.strategy == "one_device" or settings.multi_worker):
        raise SettingsError(
            f"CROSS_DEVICE_OPS={settings.cross_device_ops} is not allowed with "
            f"STRATEGY={settings.strategy if settings.strategy != 'auto' else 'auto (multi-worker)'}: it chooses "
            "MirroredStrategy's all-reduce; use CROSS_DEVICE_OPS=auto"
        )
    if settings.multi_worker and settings.auto_batch:
        raise SettingsError(
            "AUTO_BATCH=true is not allowed with multi-worker training (every worker must change its batch "
            "together): use AUTO_BATCH=false and set BATCH_SIZE"
        )


def _mirrors_cpus(settings: Settings) -> bool:
    """Whether the strategy mirrors variables over several CPU devices of this host (known without TensorFlow)."""
    if settings.multi_worker:
        return False
    return settings.strategy == "mirrored" or (settings.strategy == "auto" and settings.cpu_devices > 1)


# What a step and its data are: changing one of these between a run's starts changes what resuming continues.
RUN_DEFINING = tuple(field.env for field in FIELDS if field.defines_run)
# What every worker of a multi-worker run must have alike (compared by train.cluster.workers before training).
WORKERS_AGREE = tuple(field.env for field in FIELDS if field.workers_agree)


def agreed_settings(settings: Settings) -> dict[str, str]:
    """The settings every worker must have alike, as text: WORKERS_AGREE's and build_model's hyperparameters."""
    from train.data.local import is_path

    text = settings.to_json()
    if is_path(settings.dataset):  # a path can differ between hosts: the workers compare the data's fingerprint
        text["DATASET"] = "(a path: its data's fingerprint is compared)"
    return {name: text[name] for name in WORKERS_AGREE} | {
        hparams.env_name(name): text[hparams.env_name(name)] for name, _ in settings.hyperparameters
    }


def changed_settings(path: Path, settings: Settings) -> list[tuple[str, str, str]]:
    """(NAME, before, now) for each run-defining setting that differs from the settings.json at `path` (none for
    a first start or a damaged file: preflight says that)."""
    before, _ = read_run_settings(path)
    if not before:
        return []
    now = settings.to_json()
    defining = (*RUN_DEFINING, *(hparams.env_name(name) for name, _ in settings.hyperparameters))  # each defines it
    if now["GLOBAL_BATCH_SIZE"] and before.get("GLOBAL_BATCH_SIZE") == now["GLOBAL_BATCH_SIZE"]:
        defining = tuple(name for name in defining if name != "BATCH_SIZE")  # only how many a step accumulates
    return [(name, str(before[name]), now[name]) for name in defining if before.get(name, now[name]) != now[name]]
