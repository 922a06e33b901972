# ruff: noqa: E501, RUF009
"""The one table of settings: each is one line of `Settings`, its name, type, default, meaning and marks.

    epochs: int = setting("5", parse.positive_int, "Number of epochs.", **W)

declares the setting EPOCHS (its environment name is the attribute's in upper case; the flag is --epochs), read
as text ("5" unless set) and made an int by `parse.positive_int`, which says in one line what is wrong with a bad
value. FIELDS, what the command line, `.env.example`, the Makefile and the workers' agreement read, comes from
this table, and so do RUN_DEFINING and WORKERS_AGREE (train.settings.layers). `check_together` holds the rules
between settings valid alone. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import train.settings.parse as parse
from train import hparams
from train.dataset_path import DELIMITERS, Csv, Source, Survey
from train.errors import SettingsError
from train.model_file import DEFAULT_MODEL, is_model_path
from train.settings.tf_config import EXAMPLE, Cluster

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")
SINGLE_HOST = ("one_device", "mirrored")
RESUME_MODES = ("auto", "never")
AUTO_TRUE_FALSE = ("auto", "true", "false")
PRECISIONS = ("auto", "off", "mixed_float16", "mixed_bfloat16")
PROGRESS_MODES = ("auto", "bar", "lines")
MONITOR_MODES = ("auto", "min", "max")
ALL_REDUCES = ("auto", "nccl", "hierarchical_copy", "reduce_to_one")
BAD_FILES_MODES = ("refuse", "skip")
NO_LABEL = "none"  # LABEL_KEY=none: no label (Settings.labeled)


@dataclass(frozen=True)
class Field:
    """One setting: its environment name, its default as text, how to parse it, what it means, and two marks.

    `defines_run`: it shapes what a step computes or which batches it reads, so a resume that changes it
    warns. `workers_agree`: every worker of a multi-worker run must have the same value (it fixes the data
    order, the math, or where the collectives of training calls and checkpoint saves fall).
    """

    env: str
    default: str
    parse: parse.Parser
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
        return hparams.flag_name(self.env)


Parsed = TypeVar("Parsed")  # what a setting's parser makes of its text: the field's type


def setting(
    default: str,
    parser: Callable[[str, str], Parsed],
    help: str,
    *,
    defines_run: bool = False,
    workers_agree: bool = False,
) -> Parsed:
    """One line of the table: a required field of `Settings` that FIELDS reads back as a `Field` (its default is
    text, parsed as any layer's text is: load_settings resolves it, the dataclass holds no default of its own).
    Typed as the value its parser makes, which load_settings puts in the field (as `dataclasses.field` is typed as
    its default): what it returns is the dataclass's field marker."""
    marks = {"defines_run": defines_run, "workers_agree": workers_agree}
    return dataclasses.field(metadata={"setting": {"default": default, "parse": parser, "help": help, **marks}})


# R: defines the run (a resume that changes it warns). W: every worker must agree on it.
R, W, RW = {"defines_run": True}, {"workers_agree": True}, {"defines_run": True, "workers_agree": True}


@dataclass(frozen=True)
class Settings:
    """Every setting, resolved and validated (train.settings.layers.load_settings makes it)."""

    # The one table of settings. `.env.example` and every command's --help are checked against it; the Makefile,
    # docker/docker.mk and scripts/test-docker-common.sh read its names from the lines `    name: type = setting(`.
    model: str = setting(
        DEFAULT_MODEL, parse.model, "build_model's home: a .py file (has / or .py) or a module name.", **RW
    )
    gpus: str | tuple[int, ...] = setting("all", parse.gpus, "GPUs to train on: all, none, or indices like 0,1.", **R)
    memory_growth: bool = setting(
        "true", parse.true_or_false, "Allocate GPU memory as needed instead of all of it up front."
    )
    gpu_memory_limit_mb: int | None = setting(
        "", parse.optional(parse.positive_int), "Cap per GPU in MiB (needs MEMORY_GROWTH=false)."
    )
    strategy: str = setting(
        "auto", parse.choice(STRATEGIES), "auto, one_device, mirrored or multi_worker (see README).", **RW
    )
    cross_device_ops: str = setting(
        "auto", parse.choice(ALL_REDUCES), "MirroredStrategy's all-reduce (auto: see docs).", **W
    )
    cpu_devices: int = setting(
        "1", parse.positive_int, "Split the CPU into N logical devices (replicas without GPUs).", **R
    )
    dataset: str = setting(
        "synthetic_clusters", parse.dataset, "TFDS name[/config][:version], or a folder or file path.", **RW
    )
    csv_delimiter: str | None = setting(
        "",
        parse.optional(parse.choice(tuple(DELIMITERS))),
        "A CSV's delimiter: comma, semicolon, tab or pipe; default: found from its first rows.",
        **RW,
    )
    tfds_data_dir: Path | None = setting(
        "", parse.optional(parse.path), "Where TFDS keeps prepared datasets (TFDS default if empty)."
    )
    data_in_memory: str = setting(
        "auto", parse.choice(AUTO_TRUE_FALSE), "auto: in memory if they fit, else streamed.", **RW
    )
    device_prefetch: int = setting("1", parse.positive_int, "GPUs: batches each replica holds ahead on its device.")
    train_split: str = setting("train", parse.required_text, "TFDS split to train on, e.g. train or train[:90%].", **RW)
    eval_split: str = setting("test", parse.required_text, "TFDS split to evaluate on.", **W)
    feature_key: str | None = setting(
        "", parse.optional(parse.required_text), "Input feature; default: supervised keys, else image.", **RW
    )
    label_key: str | None = setting(
        "",
        parse.optional(parse.required_text),
        "Label feature; none: the inputs alone; default: supervised keys, else label.",
        **RW,
    )
    label_kind: str | None = setting(
        "",
        parse.optional(parse.choice(("class", "value"))),
        "A CSV/JSONL label: class or value (default: guessed).",
        **RW,
    )
    drop_columns: tuple[str, ...] = setting(
        "", parse.names, "A CSV/JSONL's columns left out of every model, like notes,id (they never reach it).", **RW
    )
    keep_columns: tuple[str, ...] = setting(
        "", parse.names, "Columns the default table model would leave out (an ID, ...) but keeps, like id.", **RW
    )
    bad_files: str = setting(
        "refuse",
        parse.choice(BAD_FILES_MODES),
        "A folder's broken images: refuse (exit 2) or skip (leave them out).",
        **RW,
    )
    batch_size: int | None = setting(
        "128", parse.optional(parse.positive_int), "Examples per replica at once (global: x replicas).", **RW
    )  # None: GLOBAL_BATCH_SIZE is set
    global_batch_size: int | None = setting(
        "",
        parse.optional(parse.positive_int),
        "Examples per step on all replicas (in micro-batches of BATCH_SIZE).",
        **RW,
    )
    epochs: int = setting("5", parse.positive_int, "Number of epochs.", **W)
    steps_per_epoch: int | None = setting(
        "", parse.optional(parse.positive_int), "Steps per epoch; default: one pass over the split.", **RW
    )
    steps_per_call: int = setting(
        "32", parse.positive_int, "Most steps per tf.function call (cut at log, save, epoch).", **W
    )
    jit_compile: str = setting(
        "auto", parse.choice(AUTO_TRUE_FALSE), "XLA for the training step; auto: where faster.", **RW
    )
    mixed_precision: str = setting(
        "auto", parse.choice(PRECISIONS), "auto: bf16 on compute 8.0+, fp16 on 7.x, else off.", **RW
    )
    learning_rate: float = setting("0.001", parse.positive_float, "Learning rate, passed to build_model.", **RW)
    freeze: tuple[str, ...] = setting(
        "",
        parse.globs,
        "Layers frozen from step 1: comma-separated globs on layer paths (nested layers too), like backbone_*.",
        **RW,
    )
    unfreeze_at_epoch: int | None = setting(
        "",
        parse.optional(parse.positive_int),
        "The epoch (from 1) from which FREEZE's layers train; empty: never.",
        **RW,
    )
    unfreeze_learning_rate: float | None = setting(
        "",
        parse.optional(parse.positive_float),
        "The learning rate from UNFREEZE_AT_EPOCH on; default: LEARNING_RATE / 10.",
        **RW,
    )
    seed: int = setting("42", parse.non_negative_int, "Seed of weights, data order, random layers: same run.", **RW)
    deterministic: bool = setting(
        "false", parse.true_or_false, "Deterministic ops (same seed and hardware: same weights); slower.", **RW
    )
    init_from: str = setting(
        "",
        parse.optional(parse.required_text, "", "PATH|PRESET"),
        "Start from a run directory, a .keras or .weights.h5 file, or a KerasHub preset.",
        **RW,
    )
    init_layers: tuple[str, ...] = setting(
        "", parse.globs, "INIT_FROM's layers to load: comma-separated globs on layer paths (default all).", **RW
    )
    sync_batch_norm: bool = setting(
        "false",
        parse.true_or_false,
        "BatchNormalization's batch moments over every replica's batch (small batches per replica).",
        **RW,
    )
    output_dir: Path = setting("runs/default", parse.path, "Run directory: checkpoints, logs, summary, exported model.")
    study_dir: Path = setting(
        "runs/study", parse.path, "tune's study: study.db, best.json and each trial's run directory."
    )
    study_wait: int = setting(
        "10", parse.positive_int, "Seconds tune waits for a study storage another process holds locked (then exit 75)."
    )
    checkpoint_every: int = setting(
        "100", parse.positive_int, "Save a checkpoint every N steps (and at each epoch end).", **W
    )
    keep_checkpoints: int = setting("3", parse.positive_int, "How many recent checkpoints to keep.")
    monitor: str | None = setting(
        "",
        parse.optional(parse.required_text),
        "Export (and keep) the best epoch by this metric, e.g. val_accuracy.",
        **W,
    )
    monitor_mode: str = setting(
        "auto", parse.choice(MONITOR_MODES), "MONITOR's best: min, max, or auto (from its name).", **W
    )
    export_formats: tuple[str, ...] = setting(
        "", parse.formats, "After fit's export, also these formats, checked: onnx, litert (the formats extra)."
    )
    log_every: int = setting(
        "50", parse.positive_int, "Print progress and write TensorBoard scalars every N steps.", **W
    )
    tracking: str = setting(
        "none", parse.tracking, "Log params, metrics and artifacts to MLflow (mlflow: the track extra), or none."
    )
    progress: str = setting("auto", parse.choice(PROGRESS_MODES), "auto: a live bar on a terminal, else lines.")
    profile_steps: tuple[int, int] | None = setting(
        "", parse.profile_steps, "TensorBoard profiler trace of these steps, like 100-110.", **W
    )
    resume: str = setting(
        "auto", parse.choice(RESUME_MODES), "auto resumes from OUTPUT_DIR's checkpoints; never refuses them."
    )
    auto_batch: bool = setting(
        "false", parse.true_or_false, "On out-of-memory, halve BATCH_SIZE and go on from the last checkpoint."
    )
    worker_start_timeout: int = setting(
        "600", parse.positive_int, "Multi-worker: seconds to wait for all workers to join."
    )
    # Not a setting: the cluster TF_CONFIG names (from the process environment only, as TensorFlow reads it).
    cluster: Cluster | None = None
    # build_model's hyperparameters, (parameter name, value) in its order: the settings HP_<NAME> (train.hparams).
    hyperparameters: tuple[tuple[str, hparams.Value], ...] = ()
    # Not a setting: where BATCH_SIZE and GLOBAL_BATCH_SIZE came from ((name, place), ...), for the start line.
    batch_from: tuple[tuple[str, str], ...] = dataclasses.field(default=(), compare=False)
    # Not a setting: DATASET's kind, decided once by load_settings (train.dataset_path.source): a path's survey, or
    # TFDS; None where DATASET is taken as text (data=False). Derived from DATASET and the working directory: never
    # written (to_json writes its path absolute) nor compared.
    source: Source | None = dataclasses.field(default=None, compare=False, repr=False)
    # Not a setting: a table's label kind as the run's run.json records it (class or value), which a later start of
    # the run reads its data with where LABEL_KIND is unset, whatever the guess says now (train.data.opening).
    run_label_kind: str | None = None

    @property
    def labeled(self) -> bool:
        """Whether the model gets labels: LABEL_KEY=none gives it its inputs alone (a GAN's data), as Keras's
        image_dataset_from_directory(label_mode=None) does."""
        return self.label_key != NO_LABEL

    @property
    def multi_worker(self) -> bool:
        """Whether `fit` trains across workers: STRATEGY=multi_worker, or auto with TF_CONFIG naming 2+ workers."""
        if self.strategy == "multi_worker":
            return True
        return self.strategy == "auto" and self.cluster is not None and self.cluster.num_workers > 1

    def to_json(self) -> dict[str, str]:
        """The resolved settings as environment-style text, ready to paste into a `.env` (MODEL's and DATASET's
        paths absolute)."""

        def text(value: object, separator: str) -> str:
            if value is None:
                return ""
            if isinstance(value, tuple):
                return separator.join(map(str, value))
            return str(value).lower() if isinstance(value, bool) else str(value)  # as hparams.text writes it

        # GPUS=0,1 but PROFILE_STEPS=100-110: each tuple as its setting writes it
        fixed = {
            field.env: text(getattr(self, field.attr), "-" if field.attr == "profile_steps" else ",")
            for field in FIELDS
        }
        # a path is written absolute: a command on the run (--output-dir RUN) finds it from any directory
        if is_model_path(self.model):
            fixed["MODEL"] = str(Path(self.model).expanduser().absolute())
        if isinstance(self.source, Survey):
            fixed["DATASET"] = str(self.source.root.absolute())
        return fixed | {hparams.env_name(name): hparams.text(value) for name, value in self.hyperparameters}

    def typed(self) -> dict[str, bool | int | float | str]:
        """Every setting by name with its value as a number, bool or text (TensorBoard's HParams take those)."""
        values = {}
        for name, text in self.to_json().items():
            value = getattr(self, name.lower()) if name in FIELDS_BY_ENV else None
            values[name] = value if isinstance(value, bool | int | float) else text
        values.update({hparams.env_name(name): value for name, value in self.hyperparameters})
        return values

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)


# The table read back: one Field per setting, in the table's order.
FIELDS: tuple[Field, ...] = tuple(
    Field(each.name.upper(), **each.metadata["setting"])
    for each in dataclasses.fields(Settings)
    if "setting" in each.metadata
)
FIELDS_BY_ENV = {field.env: field for field in FIELDS}


def check_together(settings: Settings) -> None:
    """Settings valid alone but not together: GPU_MEMORY_LIMIT_MB, STRATEGY against TF_CONFIG, JIT_COMPILE,
    CROSS_DEVICE_OPS, DROP_COLUMNS (a table's), AUTO_BATCH. Raises SettingsError."""
    if settings.gpu_memory_limit_mb is not None and settings.memory_growth:
        raise SettingsError(
            f"GPU_MEMORY_LIMIT_MB={settings.gpu_memory_limit_mb} cannot be combined with MEMORY_GROWTH=true: "
            "set MEMORY_GROWTH=false to cap memory, or leave GPU_MEMORY_LIMIT_MB empty"
        )
    if settings.gpus == "none" and settings.gpu_memory_limit_mb is not None:
        raise SettingsError("GPU_MEMORY_LIMIT_MB is set but GPUS=none: there is no GPU to cap")
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
    _check_phases(settings)
    if settings.drop_columns and settings.source is not None and settings.source.kind != "table":
        raise SettingsError(
            f"DROP_COLUMNS={','.join(settings.drop_columns)!r} is set but DATASET={settings.dataset!r} is not a CSV "
            "or JSON Lines file, which has columns: leave DROP_COLUMNS empty"
        )
    source = settings.source
    if (
        settings.csv_delimiter
        and source is not None
        and not (isinstance(source, Survey) and isinstance(source.reader, Csv))
    ):
        raise SettingsError(
            f"CSV_DELIMITER={settings.csv_delimiter} is set but DATASET={settings.dataset!r} is not a CSV or .tsv "
            "file: leave CSV_DELIMITER empty"
        )
    if settings.multi_worker and settings.auto_batch:
        raise SettingsError(
            "AUTO_BATCH=true is not allowed with multi-worker training (every worker must change its batch "
            "together): use AUTO_BATCH=false and set BATCH_SIZE"
        )


def _check_phases(settings: Settings) -> None:
    """FREEZE, UNFREEZE_AT_EPOCH and UNFREEZE_LEARNING_RATE: none set without the one it depends on (it would be
    silently ignored). UNFREEZE_AT_EPOCH past EPOCHS is allowed: the run ends frozen, and a resume with more EPOCHS
    reaches it."""
    if settings.unfreeze_at_epoch is not None and not settings.freeze:
        raise SettingsError(
            f"UNFREEZE_AT_EPOCH={settings.unfreeze_at_epoch} is set but FREEZE is empty: it is the epoch from which "
            "FREEZE's layers train; set FREEZE (globs on layer paths, like backbone_*), or leave UNFREEZE_AT_EPOCH empty"
        )
    if settings.unfreeze_at_epoch == 1:
        raise SettingsError(
            "UNFREEZE_AT_EPOCH=1 is not allowed: FREEZE's layers would train from the first epoch, so nothing would be "
            "frozen; use 2 or more (epochs count from 1), or leave FREEZE and UNFREEZE_AT_EPOCH empty"
        )
    if settings.unfreeze_learning_rate is not None and settings.unfreeze_at_epoch is None:
        raise SettingsError(
            f"UNFREEZE_LEARNING_RATE={settings.unfreeze_learning_rate} is set but UNFREEZE_AT_EPOCH is empty: it is "
            "the learning rate from that epoch on; set UNFREEZE_AT_EPOCH, or leave UNFREEZE_LEARNING_RATE empty"
        )


def _mirrors_cpus(settings: Settings) -> bool:
    """Whether the strategy mirrors variables over several CPU devices of this host (known without TensorFlow)."""
    if settings.multi_worker:
        return False
    return settings.strategy == "mirrored" or (settings.strategy == "auto" and settings.cpu_devices > 1)
