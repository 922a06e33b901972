"""Where a setting's text comes from: the layers, read and resolved in one order, then parsed by the table.

The precedence is stated once: `load_settings`'s docstring says it, and `_layers` (with `_add_run_layer`) is it.

`read_dotenv` reads a `.env` strictly, `likely_typos` finds names that look like a setting but are not one, and
`peek_hyperparameters` finds build_model's settings (HP_<NAME>, train.hparams) before the flags are parsed.

A run's own settings, at the end: `read_run_settings` reads OUTPUT_DIR/settings.json (evaluate's layer; the resume
check, train.rundir). `changed_settings` is what a resume changes of RUN_DEFINING; `agreed_settings` is what every
worker of a multi-worker run compares (train.agreement). Both lists come from the table's marks. Nothing here
imports TensorFlow.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from train import dataset_path, hparams
from train.errors import SettingsError, first_line
from train.model_file import model_for_data, model_hyperparameters
from train.run_files import RUN_SETTINGS
from train.settings.parse import Parser
from train.settings.table import FIELDS, FIELDS_BY_ENV, Field, Settings, check_together
from train.settings.tf_config import parse_tf_config


def read_dotenv(path: Path, warn: Callable[[str], None] | None = None) -> dict[str, str]:
    """Read a `.env` file strictly: a line python-dotenv cannot parse is an error with its line number.

    A name set twice keeps its last value, as python-dotenv and Docker read it; `warn` hears of it.
    """
    if not path.is_file():
        return {}
    # python-dotenv's own parser: its public API only warns about a malformed line and carries on, and a typo that
    # silently drops a setting is what this template refuses to do. Imported here: `--help` reads no .env.
    from dotenv.parser import parse_stream

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


def _value(field: Field, text: str, parser: Parser | None = None) -> object:
    """The setting's value, by its parser (or `parser`). Raises SettingsError."""
    try:
        return (parser or field.parse)(field.env, text)
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


def data_dir(flag: Path | None) -> Path:
    """TFDS_DATA_DIR as fit reads it, for the data commands (`data list|prune`, which resolve no other setting):
    the flag, the environment, .env, project/defaults.env; an empty value is unset; TFDS's own default last."""
    defaults = project_defaults_path()
    layers = [os.environ, read_dotenv(Path(".env")), read_dotenv(defaults) if defaults else {}]
    given = [str(flag) if flag else "", *(layer.get("TFDS_DATA_DIR", "") for layer in layers)]
    return Path(next((value.strip() for value in given if value.strip()), dataset_path.DEFAULT_DATA_DIR)).expanduser()


def load_settings(
    flags: Mapping[str, str | None] | None = None,
    environ: Mapping[str, str] | None = None,
    dotenv_path: Path | str = ".env",
    warn: Callable[[str], None] | None = None,
    defaults_path: Path | str | None = "project",
    from_run: bool | str = False,
    data: bool = True,
) -> Settings:
    """Resolve every setting. Raises SettingsError. The precedence, highest first:

        command-line flag > environment > [the run's settings.json] > .env > project/defaults.env > default

    A setting set empty in the environment is unset there (`docker run -e TFDS_DATA_DIR=`): the layers below decide.
    `from_run` (evaluate, predict: True): the settings.json of the OUTPUT_DIR the layers above it and below it
    resolve to supplies what neither a flag nor the environment sets, so evaluate scores the run as it was trained.
    `from_run="defining"` (fit): only what defines the run (RUN_LAYER_OF_FIT); the machine's settings come from this
    host. A value of .env or project/defaults.env that the run's layer overrides is said in one warning line.
    `data=False` (predict on files through the export): DATASET is taken as text, its path not surveyed (no
    Settings.source).
    `defaults_path`: the fork's defaults file ("project": the `project` package's `defaults.env`; None: none).
    """
    flags = {name: value for name, value in (flags or {}).items() if value is not None}
    environ = os.environ if environ is None else environ
    files = _read_files(dotenv_path, defaults_path, warn)
    say = warn or (lambda _: None)  # what would be said, where no one hears it
    typos = [message for where, values in files for message in _typo_warnings(values, where)]
    # `make train EPOCH=3` arrives as an environment variable: said, not silently ignored. Closer alike than
    # in .env, which holds only settings: the environment holds everything (GPU, CHECKPOINT_DIR).
    typos += _typo_warnings(environ, "environment (or make variable)", ENVIRONMENT_TYPO_CUTOFF)
    for message in typos:
        say(message)
    layers, places = _layers(flags, environ, files)
    if from_run:
        output_dir = _value(FIELDS_BY_ENV["OUTPUT_DIR"], _resolve("OUTPUT_DIR", layers))
        _add_run_layer(layers, places, output_dir / RUN_SETTINGS, warn, defining=from_run == "defining")
        for message in _overridden_by_run(layers, places):
            say(message)

    values, source = {}, None
    for field in FIELDS:  # in the table's order: the first bad value is the one told
        values[field.attr] = _value(field, _resolve(field.env, layers))
        if field.env == "DATASET" and data:  # DATASET's kind, decided once: Settings.source (not `data`: DATASET as
            source = _value(field, values["dataset"], dataset_path.source)  # text: a path moved since is no error)
    # the documented MLP on a table's columns: behind their preprocessing (FEATURE_KEY set: on that one column)
    # (not `data`: the run's settings.json already names the model it trained)
    table = source is not None and source.kind == dataset_path.TableReader.kind and not values["feature_key"]
    values["model"] = model_for_data(values["model"], table)
    batch_from = _batch_sizes(values, layers, places)
    declared = model_hyperparameters(values["model"])
    for message in _hyperparameter_hints(declared, dict(files)):
        say(message)
    resolved = hparams.resolve(declared, zip(places, layers, strict=True), values["model"])
    cluster = parse_tf_config(environ.get("TF_CONFIG"))
    settings = Settings(**values, cluster=cluster, hyperparameters=resolved, batch_from=batch_from, source=source)
    check_together(settings)
    return settings


def _read_files(
    dotenv_path: Path | str, defaults_path: Path | str | None, warn: Callable[[str], None] | None = None
) -> list[tuple[str, dict[str, str]]]:
    """`.env` and the fork's defaults file ("project": the `project` package's `defaults.env`; None: none), each
    as (where it is, its values)."""
    dotenv = read_dotenv(Path(dotenv_path), warn)
    if defaults_path == "project":
        defaults_path = project_defaults_path()
    project = read_dotenv(Path(defaults_path), warn) if defaults_path else {}
    return [(str(dotenv_path), dotenv), (str(defaults_path), project)]


def _layers(
    flags: Mapping[str, str], environ: Mapping[str, str], files: Iterable[tuple[str, Mapping[str, str]]]
) -> tuple[list[Mapping[str, str]], list[str]]:
    """The layers a setting's text is looked up in, highest first, as load_settings's docstring orders them (a
    run's settings.json: `_add_run_layer`; the table's default: `_resolve`), and where each comes from."""
    environ = {name: value for name, value in environ.items() if value != "" or name not in FIELDS_BY_ENV}
    chosen = [("a flag", flags), ("the environment", environ), *files]
    return [layer for _, layer in chosen], [where for where, _ in chosen]


def _add_run_layer(
    layers: list[Mapping[str, str]],
    places: list[str],
    path: Path,
    warn: Callable[[str], None] | None,
    defining: bool = False,
) -> None:
    """A run's settings.json: below the flags and the environment, above the files, never with this machine's
    settings (MACHINE: its devices and strategy are this host's, as a run trained on 2 workers is evaluated on one).
    `defining` (fit's): only what defines the run, and a damaged file left to fit's preflight to refuse; else a
    damaged one is said (as fit says it) and left out."""
    settings, problem = read_run_settings(path)
    if problem and warn and not defining:
        warn(
            f"{path} {problem}: the run's settings are not known; evaluating with the flags, the environment, "
            ".env and the defaults alone"
        )
    layer = {name: value for name, value in settings.items() if name not in MACHINE}
    if defining:
        layer = {
            name: value for name, value in layer.items() if name in RUN_LAYER_OF_FIT or name.startswith(hparams.PREFIX)
        }
        batch = ("BATCH_SIZE", "GLOBAL_BATCH_SIZE")  # one choice: a flag's or the environment's replaces both
        if any(layer_above.get(name, "").strip() for layer_above in layers[:2] for name in batch):
            layer = {name: value for name, value in layer.items() if name not in batch}
    layers.insert(2, layer)
    places.insert(2, str(path))


def _overridden_by_run(layers: list[Mapping[str, str]], places: list[str]) -> list[str]:
    """One line naming the values of .env and project/defaults.env that the run's settings.json (layer 2)
    overrides: said, not silently ignored."""
    overridden = []
    for name, value in layers[2].items():
        below = next(
            (
                (where, layer[name])
                for where, layer in zip(places, layers, strict=True)
                if name in layer and layer is not layers[2]
            ),
            None,
        )
        if below and below[0] in places[3:] and below[1] != value:  # not a flag's or the environment's
            overridden.append(f"{below[0]}'s {name}={below[1]!r}")
    if not overridden:
        return []
    return [
        f"{', '.join(overridden)}: the run's {places[2]} sets otherwise, and the run's value counts (a flag or "
        "the environment can set another)"
    ]


def _batch_sizes(
    values: dict[str, object], layers: list[Mapping[str, str]], places: list[str]
) -> tuple[tuple[str, str], ...]:
    """BATCH_SIZE and GLOBAL_BATCH_SIZE, each from the highest layer that sets it (they may come from different
    ones: a fork's project/defaults.env BATCH_SIZE, what fits its GPU, under a flag's GLOBAL_BATCH_SIZE, what the
    recipe needs). Both: BATCH_SIZE is the most one replica takes at once, a step in micro-batches (train.batches).
    GLOBAL_BATCH_SIZE alone: `batch_size` is None (the global batch divided by the replicas). Returns
    where each that is set came from, ((name, place), ...)."""
    found = []
    for name in ("BATCH_SIZE", "GLOBAL_BATCH_SIZE"):  # an empty value (`GLOBAL_BATCH_SIZE=`) sets nothing
        setting = (
            (layer[name], where) for layer, where in zip(layers, places, strict=True) if layer.get(name, "").strip()
        )
        given = next(setting, None)
        values[name.lower()] = _value(FIELDS_BY_ENV[name], given[0]) if given else None
        if given:
            found.append((name, given[1]))
    if values["global_batch_size"] is None and values["batch_size"] is None:
        values["batch_size"] = int(FIELDS_BY_ENV["BATCH_SIZE"].default)
        found.insert(0, ("BATCH_SIZE", "the default"))
    return tuple(found)


def peek_hyperparameters(
    flags: Mapping[str, str],
    dotenv_path: Path | str = ".env",
    defaults_path: Path | str | None = "project",
    from_run: bool | str = False,
) -> dict[str, hparams.HyperParameter]:
    """build_model's hyperparameters for the MODEL that `flags` (MODEL, OUTPUT_DIR), the environment, [the run's
    settings.json,] .env and the defaults resolve to: the flags a command offers (--hp-width). Raises nothing:
    where it cannot be known, none (load_settings then says why)."""
    try:
        layers, places = _layers(flags, os.environ, _read_files(dotenv_path, defaults_path))
        if from_run:
            path = Path(_resolve("OUTPUT_DIR", layers)).expanduser() / RUN_SETTINGS
            _add_run_layer(layers, places, path, None, defining=from_run == "defining")
        return model_hyperparameters(_resolve("MODEL", layers)) or {}
    except Exception:  # a bad .env, MODEL or folder: load_settings says it in one line
        return {}


def _hyperparameter_hints(
    declared: Mapping[str, hparams.HyperParameter] | None, files: Mapping[str, Mapping[str, str]]
) -> list[str]:
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


PHASE_SETTINGS = ("FREEZE", "UNFREEZE_AT_EPOCH", "UNFREEZE_LEARNING_RATE")  # the phases' (train.phases)


def check_run_settings(output_dir: Path, settings: Settings, warn: Callable[[str], None]) -> None:
    """fit's look at the run's settings.json before TensorFlow loads (after train.rundir.preflight). A damaged one is
    said to `warn`, not refused: which settings changed since the run's last start cannot be said, and this start
    writes it anew. FREEZE, UNFREEZE_AT_EPOCH and UNFREEZE_LEARNING_RATE define the run's phases: another value than
    the file's (unset where it has none: a run from before them had one phase) is refused, as another DATASET is.
    (What MODEL's phases() returns is compared with run.json's "phases" once the model is built:
    train.start.check_same_phases.) Raises SettingsError."""
    path = output_dir / RUN_SETTINGS
    before, problem = read_run_settings(path)
    if problem:
        warn(
            f"{path} {problem}: which settings changed since the run's last start cannot be said; this start "
            "writes it anew"
        )
    if problem or not path.is_file():
        return
    now = settings.to_json()
    changed = [
        f"{name}={now[name] or '(unset)'}, the run's {before.get(name) or '(unset)'}"
        for name in PHASE_SETTINGS
        if before.get(name, "") != now[name]
    ]
    if changed:
        raise SettingsError(
            f"{'; '.join(changed)}: OUTPUT_DIR={output_dir} was trained with other phases, and they define the run. "
            "Set them back to the run's, or use another OUTPUT_DIR"
        )


# What a step and its data are: changing one of these between a run's starts changes what resuming continues.
RUN_DEFINING = tuple(field.env for field in FIELDS if field.defines_run)
# What `fit --output-dir RUN` takes from the run's settings.json (train.settings.layers): what defines the run and
# how long it trains, and not this machine's (its devices, strategy, precision, XLA, memory), which come from the
# host it runs on now.
MACHINE = ("GPUS", "CPU_DEVICES", "STRATEGY", "CROSS_DEVICE_OPS", "DATA_IN_MEMORY", "JIT_COMPILE", "MIXED_PRECISION")
RUN_LAYER_OF_FIT = tuple(
    name for name in (*RUN_DEFINING, "EPOCHS", "EVAL_SPLIT", "MONITOR", "MONITOR_MODE") if name not in MACHINE
)
# What evaluate and predict read (their --help lists these alone): the run, its data, this machine's devices and the
# batch. What only training reads (EPOCHS, LEARNING_RATE, MONITOR, ...) they take from the run's settings.json.
ON_A_RUN = (
    *("MODEL", "OUTPUT_DIR", "DATASET", "TFDS_DATA_DIR", "DEVICE_PREFETCH", "TRAIN_SPLIT"),
    *("EVAL_SPLIT", "FEATURE_KEY", "LABEL_KEY", "LABEL_KIND", "BAD_FILES", "BATCH_SIZE", "GLOBAL_BATCH_SIZE", "SEED"),
    *(*MACHINE, "MEMORY_GROWTH", "GPU_MEMORY_LIMIT_MB", "DETERMINISTIC"),
)
# What every worker of a multi-worker run must have alike (compared by train.cluster.workers before training).
WORKERS_AGREE = tuple(field.env for field in FIELDS if field.workers_agree)


def agreed_settings(settings: Settings) -> dict[str, str]:
    """The settings every worker must have alike, as text: WORKERS_AGREE's and build_model's hyperparameters."""
    text = settings.to_json() | {"MODEL": settings.model}  # as given (to_json's is absolute): its code is compared
    # a path can differ between hosts: the workers compare its fingerprint
    if isinstance(settings.source, dataset_path.Survey):
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
        defining = tuple(name for name in defining if name != "BATCH_SIZE")  # only how many micro-batches make a step
    # a path an older run recorded relative (MODEL, DATASET) is the same path written absolute now
    return [
        (name, str(before[name]), now[name])
        for name in defining
        if before.get(name, now[name]) != now[name] and os.path.abspath(before[name]) != now[name]
    ]
