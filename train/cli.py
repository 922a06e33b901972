"""Train the documented Keras model on a TFDS dataset, on CPU, one GPU or all of them.

    python -m train devices                   # what TensorFlow sees, what the settings resolve to
    python -m train fit                       # train; run it again to resume from the last checkpoint
    python -m train fit --gpus 0,1 --epochs 3 # flags beat environment variables, which beat .env
    CPU_DEVICES=2 python -m train fit         # 2 replicas of MirroredStrategy on a machine without GPUs
    python -m train evaluate                  # the latest checkpoint on EVAL_SPLIT

Each command only resolves the settings and calls the library in `train.training`.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from train.settings import FIELDS, Settings, SettingsError, load_settings

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1

app = typer.Typer(
    help=__doc__.split("\n\n")[0],
    epilog="Every flag can also be set as the environment variable shown, or in a .env file.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def with_settings(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command one flag per setting, and hand it the resolved, validated `Settings`.

    Flags are declared as text and parsed by `train.settings`, so a bad value reads the same
    whether it came from a flag, the environment or `.env`: one line, exit code 2.
    """
    own = [p for p in inspect.signature(command).parameters.values() if p.name != "settings"]
    setting_params = [
        inspect.Parameter(
            field.attr,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                Optional[str],  # noqa: UP045 (typer reads this annotation at run time)
                typer.Option(
                    field.flag,
                    help=f"{field.help} (env: {field.env}; default: {field.default or 'unset'})",
                    show_default=False,
                    rich_help_panel="Settings",
                ),
            ],
        )
        for field in FIELDS
    ]

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        flags = {field.env: kwargs.pop(field.attr) for field in FIELDS}
        try:
            settings = load_settings(flags, warn=lambda message: typer.echo(f"warning: {message}", err=True))
            return command(settings, **kwargs)
        except SettingsError as error:
            _fail(str(error), EXIT_BAD_INPUT)

    del run.__wrapped__  # typer must see the signature below, not the command's own
    run.__signature__ = inspect.Signature(own + setting_params)
    run.__annotations__ = {p.name: p.annotation for p in own + setting_params}
    return run


def _print_json(payload: Any) -> None:
    typer.echo(json.dumps(payload, indent=2))


@app.command()
@with_settings
def fit(settings: Settings) -> None:
    """Train, checkpointing as it goes; resumes from OUTPUT_DIR's latest checkpoint."""
    from train.training import EXIT_PREEMPTED, TrainingError
    from train.training import fit as run_fit

    try:
        summary = run_fit(settings)
    except TrainingError as error:
        _fail(str(error), EXIT_FAILED)
    if summary["interrupted"]:
        raise typer.Exit(EXIT_PREEMPTED)


@app.command()
@with_settings
def evaluate(
    settings: Settings,
    exported: Annotated[
        bool, typer.Option(help="Evaluate OUTPUT_DIR/model.keras instead of the latest checkpoint.")
    ] = False,
) -> None:
    """Loss and accuracy on EVAL_SPLIT, printed as JSON."""
    from train.training import evaluate as run_evaluate

    _print_json(run_evaluate(settings, exported=exported))


@app.command()
@with_settings
def devices(
    settings: Settings,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Physical and logical devices, and what GPUS, STRATEGY and BATCH_SIZE resolve to."""
    from train.training import describe_devices

    report = describe_devices(settings)
    if as_json:
        _print_json(report)
        return
    width = max(map(len, report))
    for key, value in report.items():
        shown = ", ".join(map(str, value)) if isinstance(value, list) else value
        typer.echo(f"{key:<{width}}  {shown if shown != '' else '-'}")
