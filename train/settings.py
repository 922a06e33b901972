"""Every setting of the template: names, defaults, parsing and validation.

Nothing here imports TensorFlow, so `--help` and a bad value answer at once.

Precedence, stated once (see `load_settings`):
    command-line flag  >  process environment  >  `.env` file  >  default
"""

from __future__ import annotations

import dataclasses
import difflib
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

from train.cluster import EXAMPLE, Cluster, parse_tf_config
from train.errors import SettingsError

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")
SINGLE_HOST = ("one_device", "mirrored")
RESUME_MODES = ("auto", "never")
AUTO_TRUE_FALSE = ("auto", "true", "false")
PRECISIONS = ("auto", "off", "mixed_float16", "mixed_bfloat16")
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

    return parse


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
    # TFDS names: `name`, `name/config`, `name:1.2.3`, `name/config:1.2.3`.
    if not re.fullmatch(r"[a-z][a-z0-9_]*(/[A-Za-z0-9_.\-]+)?(:[0-9]+\.[0-9]+\.[0-9]+)?", text):
        raise SettingsError(
            f"{name}={text!r} is not allowed: use a TFDS dataset name, optionally with config and version, "
            "like mnist, or name/config:1.0.0"
        )
    return text


def _path(name: str, text: str) -> Path:
    return Path(_text(name, text)).expanduser()


def _optional_path(name: str, text: str) -> Path | None:
    return None if text == "" else _path(name, text)


@dataclass(frozen=True)
class Field:
    """One setting: its environment name, its default as text, how to parse it, and what it means."""

    env: str
    default: str
    parse: Callable[[str, str], Any]
    help: str

    @property
    def attr(self) -> str:
        return self.env.lower()

    @property
    def flag(self) -> str:
        return "--" + self.env.lower().replace("_", "-")


# The one table of settings. `.env.example` and every command's `--help` are checked against it.
FIELDS: tuple[Field, ...] = (
    Field("GPUS", "all", _gpus, "GPUs to train on: all, none, or indices like 0,1."),
    Field("MEMORY_GROWTH", "true", _bool, "Allocate GPU memory as needed instead of all of it up front."),
    Field("GPU_MEMORY_LIMIT_MB", "", _optional_positive_int, "Cap per GPU in MiB (needs MEMORY_GROWTH=false)."),
    Field("STRATEGY", "auto", _choice(STRATEGIES), "auto, one_device, mirrored or multi_worker (see README)."),
    Field("CROSS_DEVICE_OPS", "auto", _choice(ALL_REDUCES), "MirroredStrategy's all-reduce (auto: see README)."),
    Field("CPU_DEVICES", "1", _positive_int, "Split the CPU into N logical devices (multi-replica without GPUs)."),
    Field("DATASET", "synthetic_clusters", _dataset, "TFDS dataset, optionally name/config:version."),
    Field("TFDS_DATA_DIR", "", _optional_path, "Where TFDS keeps prepared datasets (TFDS default if empty)."),
    Field("DATA_IN_MEMORY", "auto", _choice(AUTO_TRUE_FALSE), "auto: splits in memory if they fit, else streamed."),
    Field("TRAIN_SPLIT", "train", _text, "TFDS split to train on, e.g. train or train[:90%]."),
    Field("EVAL_SPLIT", "test", _text, "TFDS split to evaluate on."),
    Field("FEATURE_KEY", "", _optional_text, "Input feature; default: the dataset's supervised keys, else image."),
    Field("LABEL_KEY", "", _optional_text, "Class label feature; default: supervised keys, else label."),
    Field("BATCH_SIZE", "128", _positive_int, "Examples per replica per step; global batch = this x replicas."),
    Field("EPOCHS", "5", _positive_int, "Number of epochs."),
    Field("STEPS_PER_EPOCH", "", _optional_positive_int, "Steps per epoch; default: one pass over the split."),
    Field("STEPS_PER_CALL", "32", _positive_int, "Most steps per tf.function call (cut at log, checkpoint, epoch)."),
    Field("JIT_COMPILE", "auto", _choice(AUTO_TRUE_FALSE), "XLA for the training call; auto: on for one CPU device."),
    Field("MIXED_PRECISION", "auto", _choice(PRECISIONS), "auto: mixed_float16 on GPUs of compute 7.0+, else off."),
    Field("LEARNING_RATE", "0.001", _positive_float, "Adam learning rate."),
    Field("SEED", "42", _non_negative_int, "Seed for weights and data order: same seed, same run."),
    Field("OUTPUT_DIR", "runs/default", _path, "Run directory: checkpoints, logs, summary, exported model."),
    Field("CHECKPOINT_EVERY", "100", _positive_int, "Save a checkpoint every N steps (and at each epoch end)."),
    Field("KEEP_CHECKPOINTS", "3", _positive_int, "How many recent checkpoints to keep."),
    Field("LOG_EVERY", "50", _positive_int, "Print progress and write TensorBoard scalars every N steps."),
    Field("RESUME", "auto", _choice(RESUME_MODES), "auto resumes from OUTPUT_DIR's checkpoints; never refuses them."),
    Field("AUTO_BATCH", "false", _bool, "On out-of-memory, halve BATCH_SIZE and go on from the last checkpoint."),
    Field("WORKER_START_TIMEOUT", "600", _positive_int, "Multi-worker: seconds to wait for all workers to join."),
)
FIELDS_BY_ENV = {field.env: field for field in FIELDS}


@dataclass(frozen=True)
class Settings:
    gpus: str | tuple[int, ...]
    memory_growth: bool
    gpu_memory_limit_mb: int | None
    strategy: str
    cross_device_ops: str
    cpu_devices: int
    dataset: str
    tfds_data_dir: Path | None
    data_in_memory: str
    train_split: str
    eval_split: str
    feature_key: str | None
    label_key: str | None
    batch_size: int
    epochs: int
    steps_per_epoch: int | None
    steps_per_call: int
    jit_compile: str
    mixed_precision: str
    learning_rate: float
    seed: int
    output_dir: Path
    checkpoint_every: int
    keep_checkpoints: int
    log_every: int
    resume: str
    auto_batch: bool
    worker_start_timeout: int
    # Not a setting: the cluster TF_CONFIG names (from the process environment only, as TensorFlow reads it).
    cluster: Cluster | None = None

    @property
    def multi_worker(self) -> bool:
        """Whether `fit` trains across workers: STRATEGY=multi_worker, or auto with TF_CONFIG naming 2+ workers."""
        if self.strategy == "multi_worker":
            return True
        return self.strategy == "auto" and self.cluster is not None and self.cluster.num_workers > 1

    def to_json(self) -> dict[str, Any]:
        """The resolved settings as environment-style text, ready to paste into a `.env`."""
        values = dataclasses.asdict(self)

        def text(value: Any) -> str:
            if value is None:
                return ""
            if isinstance(value, bool):
                return str(value).lower()
            if isinstance(value, tuple):
                return ",".join(map(str, value))
            return str(value)

        return {field.env: text(values[field.attr]) for field in FIELDS}

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
        if name in FIELDS_BY_ENV:
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


def load_settings(
    flags: Mapping[str, str | None] | None = None,
    environ: Mapping[str, str] | None = None,
    dotenv_path: Path | str = ".env",
    warn: Callable[[str], None] | None = None,
) -> Settings:
    """Resolve every setting: flag > environment > `.env` > default. Raises SettingsError."""
    flags = {name: value for name, value in (flags or {}).items() if value is not None}
    environ = os.environ if environ is None else environ
    dotenv = read_dotenv(Path(dotenv_path), warn)
    if warn:
        typos = _typo_warnings(dotenv, str(dotenv_path))
        # `make train EPOCH=3` arrives as an environment variable: said, not silently ignored. Closer alike than
        # in .env, which holds only settings: the environment holds everything (GPU, CHECKPOINT_DIR).
        typos += _typo_warnings(environ, "environment (or make variable)", ENVIRONMENT_TYPO_CUTOFF)
        for message in typos:
            warn(message)

    raw: dict[str, str] = {}
    for field in FIELDS:
        for layer in (flags, environ, dotenv):
            if field.env in layer:
                raw[field.env] = layer[field.env]
                break
        else:
            raw[field.env] = field.default
    values = {field.attr: _parse(field, raw[field.env]) for field in FIELDS}
    settings = Settings(**values, cluster=parse_tf_config(environ.get("TF_CONFIG")))

    if settings.gpu_memory_limit_mb is not None and settings.memory_growth:
        raise SettingsError(
            f"GPU_MEMORY_LIMIT_MB={settings.gpu_memory_limit_mb} cannot be combined with MEMORY_GROWTH=true: "
            "set MEMORY_GROWTH=false to cap memory, or leave GPU_MEMORY_LIMIT_MB empty"
        )
    if settings.gpus == "none" and settings.gpu_memory_limit_mb is not None:
        raise SettingsError("GPU_MEMORY_LIMIT_MB is set but GPUS=none: there is no GPU to cap")
    _check_combinations(settings)
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
    if settings.jit_compile == "true" and settings.data_in_memory == "false":
        raise SettingsError(
            "JIT_COMPILE=true is not allowed with DATA_IN_MEMORY=false: XLA compiles the step only where it "
            "gathers its batch from the split in memory; use JIT_COMPILE=auto or false"
        )
    if settings.jit_compile == "true" and (settings.strategy == "mirrored" or settings.multi_worker):
        raise SettingsError(
            f"JIT_COMPILE=true is not allowed with STRATEGY={settings.strategy}: XLA cannot compile a step whose "
            "variables are mirrored on several devices; use JIT_COMPILE=auto or false"
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


# What a step and its data are: changing one of these between a run's starts changes what resuming continues.
RUN_DEFINING = (
    "DATASET", "TRAIN_SPLIT", "FEATURE_KEY", "LABEL_KEY", "BATCH_SIZE", "GPUS", "CPU_DEVICES", "STRATEGY",
    "STEPS_PER_EPOCH", "SEED", "LEARNING_RATE", "MIXED_PRECISION",
)  # fmt: skip


def changed_settings(path: Path, settings: Settings) -> list[tuple[str, str, str]]:
    """(NAME, before, now) for each run-defining setting that differs from the settings.json at `path`."""
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):  # no earlier start, or a file that is not ours
        return []
    if not isinstance(before, dict):
        return []
    now = settings.to_json()
    return [(name, str(before[name]), now[name]) for name in RUN_DEFINING if before.get(name, now[name]) != now[name]]
