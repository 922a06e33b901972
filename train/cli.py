"""Train a Keras model (MODEL) on a TFDS dataset, on CPU, one GPU, all of them, or several machines.

    python -m train devices                   # what TensorFlow sees, what the settings resolve to
    python -m train fit                       # train; run it again to resume from the last checkpoint
    python -m train fit --gpus 0,1 --epochs 3 # flags beat environment variables, which beat .env
    CPU_DEVICES=2 python -m train fit         # 2 replicas of MirroredStrategy on a machine without GPUs
    python -m train fit --model examples/cnn.py --hp-width 64   # build_model's own settings (--help lists them)
    python -m train evaluate                  # the latest checkpoint on EVAL_SPLIT, with the run's settings
    python -m train predict photos/ rows.csv  # the run's export on files (or --split test): JSON Lines
    python -m train formats --format onnx,litert   # model.keras as ONNX and LiteRT, each checked against it
    python -m train data list --runs runs     # the prepared datasets, and which runs use each (data prune)
    python -m train tune --trials 20 --space LEARNING_RATE=1e-4..1e-2:log   # Optuna: each trial a run

Each command only resolves the settings and calls the library (`train.fit`, `train.tools`, `train.plugins`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from train.command import end, settings_command, warn
from train.errors import EXIT_FAILED, EXIT_PREEMPTED, SettingsError, TrainingError
from train.settings import FIELDS, Settings, check_run_settings
from train.settings.layers import ON_A_RUN, data_dir

app = typer.Typer(
    help=__doc__.split("\n\n")[0],
    epilog="Every flag can also be set as the environment variable shown, or in a .env file.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # plain click help: rich's help rendering made `--help` miss its start-up goal (docs/performance.md, Start-up)
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},  # as wide as the terminal, up to 120 (click's own cap is 80)
)


_ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ ")  # absl's "I0000 00:00:1796.25 7627 " (time, thread)
NO_DRIVER = "Could not find cuda drivers"  # TensorFlow's own finding: no libcuda, so no GPU to start
CUINIT_FAILED = "failed call to cuInit"  # CUDA's start-up failing, an E line: harmless where NO_DRIVER was said


_HIDDEN: list[str] = []  # what _load_tensorflow left out: the doctor (`devices`) shows it


def _load_tensorflow() -> None:
    """Import TensorFlow and start its CUDA platform, printing what their C++ start-up writes to stderr once: two of
    its libraries log the same lines (absl's notice, "Could not find cuda drivers") before TF_CPP_MIN_LOG_LEVEL
    applies. "failed call to cuInit" is left out (kept in _HIDDEN) where TensorFlow found no GPU driver: a CPU
    machine, where it alarms for nothing (level 3 would hide real errors too)."""
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    kept = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            from train.devices.backend import TensorFlowDevices

            TensorFlowDevices().physical_gpus()  # TensorFlow's import, CUDA's start-up and their lines, captured
        finally:
            sys.stderr.flush()
            os.dup2(kept, 2)
            os.close(kept)
            captured.seek(0)
            text = captured.read().decode(errors="replace")
            harmless = NO_DRIVER in text
            seen, lines = set(), []
            for line in text.splitlines(keepends=True):
                if harmless and CUINIT_FAILED in line:
                    _HIDDEN.append(line)
                elif _ABSL_PREFIX.sub("", line) not in seen:
                    seen.add(_ABSL_PREFIX.sub("", line))
                    lines.append(line)
            os.write(2, "".join(lines).encode())


# `--json PATH`, as the commands whose result scripts read offer it (`_check_json_path`, `_write_json`)
JsonPath = Annotated[Optional[Path], typer.Option("--json", help="Also write the result as JSON here.")]  # noqa: UP045


def _check_json_path(path: Path | None, flag: str = "--json") -> None:
    """`--json PATH` (or another `flag`'s file) can be written: found before minutes of work, not after them."""
    if path is None:
        return
    if path.is_dir():
        raise SettingsError(f"{flag} {path} is a directory: give a file name, like {path / 'result.json'}")
    if path.exists():  # a file, a pipe, /dev/stdout: written in place
        if not os.access(path, os.W_OK):
            raise SettingsError(f"{flag} {path} is not writable; write elsewhere")
        return
    folder = path.parent
    if not folder.is_dir():
        raise SettingsError(f"{flag} {path}: the directory {folder} does not exist; create it or write elsewhere")
    if not os.access(folder, os.W_OK):
        raise SettingsError(f"{flag} {path}: the directory {folder} is not writable; write elsewhere")


def _write_json(path: Path | None, payload: object) -> None:
    """`--json PATH`: the result for scripts, beside what was printed."""
    if path is None:
        return
    from train.rundir import write_json

    try:
        write_json(path, payload)
    except OSError as error:
        raise TrainingError(f"could not write --json {path} ({error.strerror}); the result is printed above") from None


@settings_command(app, "Train; resume from OUTPUT_DIR's latest checkpoint.", from_run="defining")
def fit(settings: Settings) -> None:
    """Train, checkpointing as it goes; resumes from OUTPUT_DIR's latest checkpoint."""
    from train.init_from import check_init_from
    from train.plugins import fit_hooks
    from train.rundir import checkpoints_newest_first, preflight, read_run
    from train.signals import StopRequest

    # the run directory's problems in the first second, before TensorFlow loads
    preflight(
        settings.output_dir,
        settings.model,
        settings.sync_batch_norm,
        settings.resume,
        settings.multi_worker,
        settings.cluster is not None and settings.cluster.is_chief,
        warn,
    )
    check_run_settings(settings.output_dir, settings, warn)  # another FREEZE or UNFREEZE_*: refused, as DATASET is
    if settings.export_formats:
        from train.formats import check_can_convert

        check_can_convert(None)  # the formats extra, before the first step
    hooks = fit_hooks(settings.tracking, settings.multi_worker)  # a tune's trial (one process), TRACKING's tracker
    check_init_from(
        settings.init_from,
        settings.init_layers,
        read_run(settings.output_dir),
        bool(checkpoints_newest_first(settings.output_dir / "checkpoints")),
    )
    with StopRequest() as stop:  # from now on, SIGTERM means "save and exit 42", even while TF loads
        _load_tensorflow()
        from train.fit import fit as run_fit

        summary = run_fit(settings, stop, hooks=hooks)
    if summary["interrupted"]:
        raise typer.Exit(EXIT_PREEMPTED)


@settings_command(app, "Score the latest checkpoint (or --exported) on EVAL_SPLIT.", from_run=True, reads=ON_A_RUN)
def evaluate(
    settings: Settings,
    exported: Annotated[
        bool, typer.Option(help="Evaluate OUTPUT_DIR/model.keras instead of the latest checkpoint.")
    ] = False,
) -> None:
    """Every compiled metric on EVAL_SPLIT, printed as JSON; the run's settings.json fills in the settings."""
    from train.rundir import check_same_model

    check_same_model(
        settings.output_dir, settings.model
    )  # another model, or a damaged run.json: before TensorFlow loads
    _load_tensorflow()
    from train.fit import evaluate as run_evaluate

    typer.echo(json.dumps(run_evaluate(settings, exported=exported), indent=2))


@settings_command(
    app,
    "Predict with the run's export: image files, folders, CSV or JSON Lines rows, a split.",
    from_run=True,
    data=lambda split=None, exported=True, **_: split is not None or not exported,  # files: the run's records
    reads=ON_A_RUN,
)
def predict(
    settings: Settings,
    inputs: Annotated[
        Optional[list[Path]],  # noqa: UP045
        typer.Argument(
            help="Image files or folders of them, CSV or JSON Lines files of rows.", metavar="INPUT", show_default=False
        ),
    ] = None,
    split: Annotated[Optional[str], typer.Option(help="Also predict this split of the run's DATASET.")] = None,  # noqa: UP045
    batch: Annotated[int, typer.Option(min=1, help="Examples per call of the model.")] = 64,
    exported: Annotated[
        bool, typer.Option("--exported/--checkpoint", help="The run's saved_model/, or its latest checkpoint.")
    ] = True,
    output: Annotated[Optional[Path], typer.Option(help="Write the JSON Lines here, not to stdout.")] = None,  # noqa: UP045
) -> None:
    """One JSON object per example, in input order: "input" and the class (with its score and every class's), the
    labels above 0.5, or the prediction; from OUTPUT_DIR's saved_model/, what a server runs."""
    from train.predict import check_run, gather

    if not inputs and split is None:
        raise SettingsError("predict needs INPUT files or folders, or --split NAME: nothing to predict")
    check_run(settings, checkpoint=not exported)  # before TensorFlow loads, as the inputs below
    sources = gather(list(inputs or []), warn=warn)
    _check_json_path(output, "--output")
    _load_tensorflow()
    from train.predict import predict as run_predict

    def open_output():
        return open(output, "w", encoding="utf-8") if output else contextlib.nullcontext(sys.stdout)

    bar = sys.stderr.isatty() and (output is not None or not sys.stdout.isatty())  # not amid lines on a terminal
    count = run_predict(
        settings, sources, split, batch, checkpoint=not exported, open_output=open_output, say=warn, bar=bar
    )
    if output is not None:
        typer.echo(f"{count} predictions written to {output}", err=True)


@settings_command(app, "Convert the run's model.keras to ONNX and LiteRT, each checked against it.", from_run=True)
def formats(
    settings: Settings,
    format: Annotated[
        str, typer.Option("--format", metavar="onnx,litert", help="Formats to write, a comma list (onnx, litert).")
    ] = "onnx,litert",
    quantize: Annotated[
        Optional[Literal["int8"]],  # noqa: UP045
        typer.Option(help="Also write the int8 model of each, its accuracy beside the float's."),
    ] = None,
    atol: Annotated[float, typer.Option(min=0.0, help="Largest difference allowed to model.keras's outputs.")] = 1e-4,
) -> None:
    """RUN/formats/model.onnx and model.tflite from RUN/model.keras, each run in its runtime and compared with it
    on up to 256 of the eval split's inputs; RUN/formats/formats.json records them."""
    from train.formats import check_can_convert, convert
    from train.rundir import RunLock, check_same_model
    from train.settings.parse import formats as parse_formats

    names = parse_formats("--format", format)
    if not names:
        raise SettingsError("--format is empty: give a comma list of onnx, litert, like onnx,litert")
    check_can_convert(settings.output_dir)
    check_same_model(settings.output_dir, settings.model)
    lock = RunLock(settings.output_dir)  # held to the end: one writer, not beside a fit still writing (exit 75)
    lock.acquire()
    _load_tensorflow()
    from train.predict import open_trained

    trained = open_trained(settings, "converted", warn, restore=False)
    convert(trained.built, trained.data, settings.output_dir, names, quantize, atol, typer.echo)


@settings_command(app, "Trial-run real steps; find the batch size that fits.")
def check(
    settings: Settings,
    start_batch: Annotated[int, typer.Option(min=1, help="Per-replica batch of the first trial.")] = 16,
    max_batch: Annotated[int, typer.Option(min=1, help="Largest per-replica batch to try.")] = 4096,
    steps: Annotated[int, typer.Option(min=1, help="Timed training steps per batch size.")] = 10,
    json_path: JsonPath = None,
) -> None:
    """Trial-run a few real steps at a small batch, then find the largest batch that fits and recommend one."""
    _check_json_path(json_path)  # before TensorFlow loads
    _load_tensorflow()
    from train.tools.check import check as run_check

    result = run_check(settings, start_batch=start_batch, max_batch=max_batch, steps=steps)
    typer.echo(result.pop("table"))
    _write_json(json_path, result)


@settings_command(app, "Measure the loop against its ceiling and Keras fit.")
def bench(
    settings: Settings,
    repetitions: Annotated[int, typer.Option(min=1, help="Interleaved rounds; the median is reported.")] = 5,
    seconds: Annotated[float, typer.Option(min=0.01, help="Seconds per measurement.")] = 1.5,
    compare_replicas: Annotated[
        bool,
        typer.Option(help="Also 1, 2, ... N GPUs (or 1 against 2 logical CPU devices), in processes of their own."),
    ] = False,
    require_gpus: Annotated[
        bool, typer.Option(help="Measure only where TensorFlow sees a GPU (make bench-gpu); else say so, exit 0.")
    ] = False,
    startup: Annotated[bool, typer.Option(help="Also time --help and a tiny fit against import tensorflow.")] = True,
    levers: Annotated[
        str, typer.Option(help="Also measure each value of: all levers, or some, like JIT_COMPILE,STEPS_PER_CALL.")
    ] = "",
    contenders: Annotated[
        str, typer.Option(help="Only these ways of training, like template,in_memory (default: all of them).")
    ] = "",
    json_path: JsonPath = None,
) -> None:
    """Examples/s of this template's loop against its input ceiling, Keras fit and the tutorials' way."""
    _check_json_path(json_path)
    from train.tools.bench import CONTENDERS, format_benchmark, parse_levers, run_benchmark

    chosen_levers = parse_levers(levers)  # a bad one before TensorFlow loads
    _load_tensorflow()
    if require_gpus:
        from train.devices.backend import TensorFlowDevices

        if not TensorFlowDevices().physical_gpus():
            typer.echo(
                "bench-gpu measures how training scales over GPUs, and TensorFlow sees none here: nothing to "
                "measure (python -m train devices says why; docs/performance.md has the GPU table to fill)"
            )
            return
    result = run_benchmark(
        settings,
        repetitions=repetitions,
        seconds_per_measurement=seconds,
        include_startup=startup,
        compare_replicas=compare_replicas,
        levers=chosen_levers,
        contenders=tuple(contenders.split(",")) if contenders else CONTENDERS,
    )
    typer.echo(format_benchmark(result))
    _write_json(json_path, result)


SPACE_HELP = (
    "A setting or HP_ name over low..high, low..high:log, int:low..high or a|b|c; repeatable (default: "
    "MODEL's search_space(trial))."
)


@settings_command(app, "Search settings and HP_ values with Optuna; each trial a run in STUDY_DIR.")
def tune(
    settings: Settings,
    space: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--space", metavar="NAME=SPEC", help=SPACE_HELP),
    ] = None,
    trials: Annotated[int, typer.Option(min=1, help="Finished trials (complete or pruned) in all.")] = 20,
    jobs: Annotated[int, typer.Option(min=1, help="Trials at once on this machine, each a process.")] = 1,
    storage: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="A database URL, or journal:PATH on a shared filesystem (default: STUDY_DIR/study.db)."),
    ] = None,
    prune: Annotated[bool, typer.Option(help="Stop weak trials early (a median pruner).")] = True,
    index: Annotated[
        int, typer.Option(min=0, help="This machine's index among those sharing --storage: seeds its samplers apart.")
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the trials and the best as JSON.")] = False,
) -> None:
    """Optuna's TPE over --space (or MODEL's search_space): each trial a run directory STUDY_DIR/trial-<number>,
    trained by `fit`; run it again to go on; the best in STUDY_DIR/best.json."""
    from train.model_file import model_hyperparameters
    from train.plugins.study import format_table
    from train.plugins.tune import Given, TuneFailed, plan_tune, run_tune

    given = Given(
        settings.to_json(),
        {field.env: field.parse for field in FIELDS},
        settings.model,
        settings.seed,
        settings.monitor,
        settings.monitor_mode,
        settings.gpus,
        settings.study_dir,
        settings.study_wait,
        settings.cluster.num_workers if settings.cluster else 1,
    )
    plan = plan_tune(given, space or [], trials, jobs, storage, prune, model_hyperparameters(settings.model), index)
    try:
        result = run_tune(plan, lambda line: typer.echo(line, err=True))
    except TuneFailed as failed:
        typer.echo(f"the tune stopped: {len(failed.lines)} trials failed in a row:", err=True)
        typer.echo("\n".join(failed.lines), err=True)
        raise typer.Exit(EXIT_FAILED) from None
    typer.echo(json.dumps({k: result[k] for k in ("trials", "best")}, indent=2) if as_json else format_table(result))
    if result["interrupted"]:
        raise typer.Exit(EXIT_PREEMPTED)


data_app = typer.Typer(
    help="The prepared datasets in TFDS_DATA_DIR: list them, and remove the copies no run uses.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)
app.add_typer(data_app, name="data", short_help="List the prepared datasets; remove the copies no run uses.")
RunsRoot = Annotated[Path, typer.Option("--runs", help="The run directories looked for under this folder.")]
DataDir = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option("--tfds-data-dir", help="Default: TFDS_DATA_DIR from the environment, .env, the TFDS default."),
]


@data_app.command("list", short_help="Each prepared dataset, its source, size, date and runs.")
def data_list(runs: RunsRoot = Path("runs"), tfds_data_dir: DataDir = None, json_path: JsonPath = None) -> None:
    """Each prepared dataset: its source, size, date, and the run directories under --runs that use it."""
    from train.tools.prepared import format_list, listed

    try:
        _check_json_path(json_path)
        root = data_dir(tfds_data_dir)
        found = listed(root, runs, warn)
        typer.echo(format_list(root, runs, found))
        _write_json(json_path, [each.to_json() for each in found])
    except Exception as error:  # one line and its exit code (train.command)
        end(error, None)


@data_app.command("prune", short_help="Remove the copies of folders and tables no run uses.")
def data_prune(
    runs: RunsRoot = Path("runs"),
    tfds_data_dir: DataDir = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
) -> None:
    """Remove the copies written from a folder or table that no run under --runs records; say what was freed."""
    from train.tools.prepared import format_pruned, prune

    try:
        root = data_dir(tfds_data_dir)
        typer.echo(format_pruned(root, runs, prune(root, runs, warn, dry_run), dry_run))
    except Exception as error:  # one line and its exit code (train.command)
        end(error, None)


@settings_command(app, "What TensorFlow sees; what the settings resolve to.")
def devices(
    settings: Settings,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (stable schema) for scripts.")] = False,
) -> None:
    """Devices, versions, GPU environment and what the settings resolve to, with diagnoses and fixes."""
    _load_tensorflow()
    for line in _HIDDEN:  # the doctor shows CUDA's start-up as it is, cuInit's failure included
        typer.echo(line.rstrip("\n"), err=True)
    from train.tools.doctor import device_report, format_report

    report = device_report(settings)
    typer.echo(json.dumps(report, indent=2) if as_json else format_report(report))
    if any(finding["severity"] == "error" for finding in report["diagnoses"]):
        raise typer.Exit(EXIT_FAILED)
