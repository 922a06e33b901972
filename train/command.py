"""How a command of `python -m train` takes its settings and ends: one flag per setting and per build_model
hyperparameter (`settings_command`, `SettingsCommand`), the resolved `Settings` handed to it, and every error mapped
to its exit code in one line (`fail`); what the engine did not foresee is `crash`: one line, the traceback kept in
a file. No TensorFlow here.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import inspect
import os
import sys
import tempfile
import time
import traceback
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand

from train import hparams
from train.errors import EXIT_FAILED, BusyError, SettingsError, Stopped, TrainingError, first_line
from train.settings import FIELDS, FIELDS_BY_ENV, Field, Settings, load_settings, peek_hyperparameters


def fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    typer.echo(f"warning: {message}", err=True)


def end(error: Exception, settings: Settings | None) -> None:
    """A command's failure as the user sees it: a foreseen one in its line and exit code, a stop as asked, a
    command's or typer's own exit as it is, anything else `crash`. Raises typer.Exit (or what it was given)."""
    if isinstance(error, SettingsError | TrainingError | BusyError):
        fail(str(error), error.exit_code)
    if isinstance(error, Stopped):  # not an error: what was asked for, before training began
        typer.echo(str(error), err=True)
        raise typer.Exit(error.exit_code) from None
    if isinstance(error, typer.Exit | typer.Abort | typer.TyperException):
        raise error  # a command's own exit code, or typer's (click's, which typer vendors: typer.Exit is an Exception)
    crash(error, settings)  # anything the engine did not foresee: one line, the traceback kept in a file


def crash(error: Exception, settings: Settings | None) -> None:
    """A failure the engine did not foresee (a bug): exit 1 with its first line and where its full traceback was
    written, OUTPUT_DIR/crash.log where the run directory exists, else a file in the temporary folder."""
    from train.rundir import CRASH_LOG

    header = f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}, pid {os.getpid()}: {' '.join(sys.argv)}\n"
    text = header + "".join(traceback.format_exception(error))
    output_dir, cluster = (settings.output_dir, settings.cluster) if settings else (None, None)
    name = cluster.own_file(CRASH_LOG) if cluster is not None else CRASH_LOG
    places = [output_dir / name] if output_dir is not None and output_dir.is_dir() else []
    places.append(Path(tempfile.gettempdir()) / f"tf-train-crash-{os.getpid()}.log")
    for path in places:
        try:
            with open(path, "a", encoding="utf-8") as stream:
                stream.write(text)
        except OSError:
            continue
        where = f"the full traceback is in {path}"
        break
    else:  # nowhere to write it: shown rather than lost
        typer.echo(text, err=True, nl=False)
        where = "its traceback is above"
    fail(f"{type(error).__name__}: {first_line(error, 200)}. This is a bug: {where}; please report it", EXIT_FAILED)


# The --hp-* values of the command being run, by setting name (HP_WIDTH): SettingsCommand.invoke sets them,
# settings_command's commands read them (typer hands its callback only the parameters the function declares).
_HYPERPARAMETER_FLAGS: contextvars.ContextVar[dict[str, str | None] | None] = contextvars.ContextVar("hp", default=None)


def _flag_value(args: list[str], flag: str) -> str | None:
    """The value `args` give a flag, as `--flag value` or `--flag=value`: the last, as click keeps it; None."""
    value = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.partition("=")[2]
    return value


class SettingsCommand(TyperCommand):
    """A command whose flags are every setting's and build_model's hyperparameters' (--hp-width): those depend on
    MODEL, so they are found before click parses the arguments, from the MODEL they (or the environment, .env,
    the defaults) name. An --hp-* that build_model does not declare is taken too, for load_settings to refuse in
    one line naming the declared ones."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        given = {name: _flag_value(args, FIELDS_BY_ENV[name].flag) for name in ("MODEL", "OUTPUT_DIR")}
        flags = {name: value for name, value in given.items() if value is not None}
        declared = peek_hyperparameters(flags, from_run=getattr(self.callback, "from_run", False))
        help_of = {each.flag: (each.metavar, each.help) for each in declared.values()}
        for arg in args:
            flag = arg.partition("=")[0]
            if flag.startswith(hparams.flag_name(hparams.PREFIX)) and flag not in help_of:
                help_of[flag] = ("TEXT", "not a hyperparameter of MODEL's build_model")
        self.params = [param for param in self.params if not getattr(param, "hyperparameter", False)]
        text_option = next(param for param in self.params if param.name == "model")  # a setting's: optional text
        for flag, (metavar, text) in help_of.items():
            option = copy.copy(text_option)  # typer's options are made from annotations: this one is, renamed
            option.name, option.opts, option.secondary_opts = flag[2:].replace("-", "_"), [flag], []
            option.metavar, option.help, option.hyperparameter = metavar, text, True
            self.params.append(option)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context) -> None:
        found = [name for name in ctx.params if name.startswith(hparams.PREFIX.lower())]
        token = _HYPERPARAMETER_FLAGS.set({name.upper(): ctx.params.pop(name) for name in found})
        try:
            return super().invoke(ctx)
        finally:
            _HYPERPARAMETER_FLAGS.reset(token)


def _setting_parameter(field: Field) -> inspect.Parameter:
    """A setting's flag, as typer reads a command's keyword-only parameter: optional text, which `train.settings`
    parses as any layer's."""
    return inspect.Parameter(
        field.attr,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            Optional[str],  # noqa: UP045 (typer reads this annotation at run time)
            typer.Option(
                field.flag,
                metavar=field.metavar,
                help=f"{field.help} (env: {field.env}; default: {field.default or 'unset'})",
                show_default=False,
                rich_help_panel="Settings",
            ),
        ],
    )


# A command's function: typer calls it with its parameters' values (settings commands: the Settings first); it
# prints its result, or exits, and returns nothing.
Command = Callable[..., None]


def settings_command(
    app: typer.Typer,
    short_help: str,
    *,
    from_run: bool | str = False,
    data: Callable[..., bool] | None = None,
    reads: tuple[str, ...] | None = None,
) -> Callable[[Command], Command]:
    """Register a command of `app` that takes one flag per setting and is handed the resolved, validated `Settings`.

    Flags are declared as text and parsed by `train.settings`, so a bad value reads the same
    whether it came from a flag, the environment or `.env`: one line, exit code 2. `from_run`: the
    run directory's settings.json fills in what flags and the environment leave (evaluate; fit: "defining", what
    defines the run, train.settings.layers). `data`: whether the command's arguments need DATASET (default: yes);
    where not, its path is not surveyed (predict on files). `reads`: the settings it has a flag for (default: all);
    the others come from the environment, the run's settings.json and the files. The command is registered with
    `cls=SettingsCommand`, which adds build_model's hyperparameters' flags.
    """
    fields = [field for field in FIELDS if reads is None or field.env in reads]

    def register(command: Command) -> Command:
        hints = typing.get_type_hints(command, include_extras=True)  # real objects, not `from __future__` strings
        own = [
            p.replace(annotation=hints[p.name])
            for p in inspect.signature(command).parameters.values()
            if p.name != "settings"
        ]
        setting_params = [_setting_parameter(field) for field in fields]

        @functools.wraps(command)
        def run(**kwargs: object) -> None:
            flags = {field.env: kwargs.pop(field.attr) for field in fields}
            flags |= _HYPERPARAMETER_FLAGS.get() or {}
            settings = None
            if os.environ.get("TFDS_DATA_DIR") == "":  # unset, as the settings take it: TFDS's default, not the cwd
                del os.environ["TFDS_DATA_DIR"]
            try:
                needed = data is None or data(**kwargs)
                settings = load_settings(flags, warn=warn, from_run=from_run, data=needed)
                return command(settings, **kwargs)
            except Exception as error:
                end(error, settings)

        del run.__wrapped__  # typer must see the signature below, not the command's own
        run.from_run = from_run  # type: ignore[attr-defined]  # what SettingsCommand resolves MODEL from
        run.__signature__ = inspect.Signature(own + setting_params)
        run.__annotations__ = {p.name: p.annotation for p in own + setting_params}
        return app.command(short_help=short_help, cls=SettingsCommand)(run)

    return register
