"""A run's own settings: the settings.json it was started with, what defines it, what its workers agree on.

`read_run_settings` reads OUTPUT_DIR/settings.json (evaluate's layer, train.settings.layers; the resume check,
train.rundir). `changed_settings` is what a resume changes of RUN_DEFINING; `agreed_settings` is what every worker
of a multi-worker run compares (train.agreement). Both lists come from the table's marks. No TensorFlow.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from train import hparams
from train.dataset_path import Survey
from train.errors import SettingsError, first_line
from train.run_files import RUN_SETTINGS
from train.settings.table import FIELDS, FIELDS_BY_ENV, Settings


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


def check_run_settings(output_dir: Path, warn: Callable[[str], None]) -> None:
    """A damaged settings.json is said to `warn`, not refused: which settings changed since the run's last start
    cannot be said, and this start writes it anew (before TensorFlow loads, after train.rundir.preflight)."""
    _, problem = read_run_settings(output_dir / RUN_SETTINGS)
    if problem:
        warn(
            f"{output_dir / RUN_SETTINGS} {problem}: which settings changed since the run's last start cannot be "
            "said; this start writes it anew"
        )


PHASE_SETTINGS = ("FREEZE", "UNFREEZE_AT_EPOCH", "UNFREEZE_LEARNING_RATE")  # the phases' (train.phases)


def check_same_phase_settings(output_dir: Path, settings: Settings) -> None:
    """FREEZE, UNFREEZE_AT_EPOCH and UNFREEZE_LEARNING_RATE define the run's phases: another value than the run's
    settings.json (unset where it has none: a run from before them had one phase) is refused before TensorFlow
    loads, as another DATASET is. (What MODEL's phases() returns is compared with run.json's "phases" once the model
    is built: train.start.check_same_phases.) Raises SettingsError."""
    path = output_dir / RUN_SETTINGS
    before, problem = read_run_settings(path)
    if problem or not path.is_file():
        return
    now = settings.to_json()
    changed = [f"{name}={now[name] or '(unset)'}, the run's {before.get(name) or '(unset)'}" for name in PHASE_SETTINGS
               if before.get(name, "") != now[name]]  # fmt: skip
    if changed:
        raise SettingsError(
            f"{'; '.join(changed)}: OUTPUT_DIR={output_dir} was trained with other phases, and they define the run. "
            "Set them back to the run's, or use another OUTPUT_DIR"
        )


def run_layer(path: Path, warn: Callable[[str], None] | None) -> dict[str, str]:
    """A run's settings.json as a layer; a damaged one is said (as fit says it) and left out."""
    settings, problem = read_run_settings(path)
    if problem and warn:
        warn(f"{path} {problem}: the run's settings are not known; evaluating with the flags, the environment, "
             ".env and the defaults alone")  # fmt: skip
    return settings


# What a step and its data are: changing one of these between a run's starts changes what resuming continues.
RUN_DEFINING = tuple(field.env for field in FIELDS if field.defines_run)
# What `fit --output-dir RUN` takes from the run's settings.json (train.settings.layers): what defines the run and
# how long it trains, and not this machine's (its devices, strategy, precision, XLA, memory), which come from the
# host it runs on now.
MACHINE = ("GPUS", "CPU_DEVICES", "STRATEGY", "CROSS_DEVICE_OPS", "DATA_IN_MEMORY", "JIT_COMPILE", "MIXED_PRECISION")
RUN_LAYER_OF_FIT = tuple(name for name in (*RUN_DEFINING, "EPOCHS", "EVAL_SPLIT", "MONITOR", "MONITOR_MODE")
                         if name not in MACHINE)  # fmt: skip
# What every worker of a multi-worker run must have alike (compared by train.cluster.workers before training).
WORKERS_AGREE = tuple(field.env for field in FIELDS if field.workers_agree)


def agreed_settings(settings: Settings) -> dict[str, str]:
    """The settings every worker must have alike, as text: WORKERS_AGREE's and build_model's hyperparameters."""
    text = settings.to_json()
    if isinstance(settings.source, Survey):  # a path can differ between hosts: the workers compare its fingerprint
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
    return [(name, str(before[name]), now[name]) for name in defining if before.get(name, now[name]) != now[name]]
