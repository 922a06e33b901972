"""The study `tune` searches in, as both sides see it: the tune that asks for trials, and the fit run as a trial.

- its storage: `sqlite:///STUDY_DIR/study.db` unless `--storage` names a database URL or `journal:PATH`, opened once
  (`open_storage`), a bad one refused in one line before any trial, one another process holds locked waited for
  STUDY_WAIT seconds, then refused as busy (exit 75);
- its objective: MONITOR if set, else val_loss, in MONITOR_MODE's direction (`objective_of`), and a trial's value:
  its last epoch's, or its best epoch's where MONITOR is set (`trial_value`, from the run's epochs.json);
- the trial a fit runs as: the environment variable TUNE_TRIAL, JSON written by the tune (`TrialRef`).

optuna is imported inside functions only (the `tune` extra): `--help` and every check stay free of it.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from train.errors import BusyError, SettingsError, first_line
from train.rundir import read_epochs

if TYPE_CHECKING:  # optuna is the tune extra's, imported where it is used
    import optuna

STALE_SECONDS = 180.0  # another host's trial whose heartbeat is older than this has lost its tune
TRIAL_ENV = "TUNE_TRIAL"  # {"storage", "study", "trial_id", "number", "objective", "direction", "prune"}: a trial's fit
JOURNAL = "journal:"  # --storage journal:PATH: optuna's journal file, for a shared filesystem without a database
STUDY_NAME = "study"  # one study per storage: what every machine's tune loads
PRUNE_AFTER = 2  # the median pruner judges a trial once this many trials have finished
SQLITE_TIMEOUT = 60  # seconds a writer waits for sqlite's lock: the jobs and their trials' reports write at once
# MONITOR_MODE=auto, before any model is built: Keras's directions for its metrics, by name. The trial checks the
# study's against the engine's own (train.keras_seams.monitor_direction) once its model is built.
RISING = ("acc", "auc", "precision", "recall", "f1", "fbeta", "iou", "r2")
FALLING = ("loss", "error", "crossentropy", "hinge", "divergence", "poisson", "logcosh")


def default_storage(study_dir: Path) -> str:
    return f"sqlite:///{study_dir.resolve() / 'study.db'}"


def open_storage(text: str, wait: int | None = None) -> optuna.storages.BaseStorage:
    """The optuna storage `text` names (a database URL or journal:PATH), opened: what cannot be is refused here in
    one line naming --storage, before any trial. `wait` (the tune's first open: STUDY_WAIT): a sqlite file another
    process holds locked is tried again until that many seconds have passed, sqlite's own wait cut to what is left
    of them, then BusyError (exit 75); without it, sqlite waits SQLITE_TIMEOUT, as the trials' writes do."""
    import optuna

    allowed = "use sqlite:///PATH, another database URL, or journal:PATH on a shared filesystem"
    deadline = time.monotonic() + (wait or 0)
    while True:
        try:
            if text.startswith(JOURNAL):
                path = Path(text[len(JOURNAL) :]).expanduser()
                if not path.parent.is_dir():
                    raise SettingsError(f"--storage {text}: the directory {path.parent} does not exist; {allowed}")
                from optuna.storages.journal import JournalFileBackend

                return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
            timeout = SQLITE_TIMEOUT if wait is None else max(deadline - time.monotonic(), 0)
            kwargs = {"connect_args": {"timeout": timeout}} if text.startswith("sqlite:") else {}
            return optuna.storages.RDBStorage(text, engine_kwargs=kwargs)
        except SettingsError:
            raise
        except Exception as error:  # a bad URL, a driver not installed, a server not there, a file not writable
            if wait is None or "database is locked" not in str(error):
                raise SettingsError(f"--storage {text} cannot be opened ({_said(error)}): {allowed}") from None
            if time.monotonic() >= deadline:
                busy = "the study's storage is busy (database is locked): another tune holds it"
                raise BusyError(f"{busy}; run again when it is done") from None
            time.sleep(0.1)  # sqlite said busy before its wait was over


def storage_failure(error: BaseException, storage: str) -> str | None:
    """What a failure of the storage `storage` says, in one line: the database's or the journal file's own error,
    not optuna's wrapping of it. None where `error` is not the storage's (optuna's StorageInternalError,
    SQLAlchemy's errors, an OSError on the journal file or its lock)."""
    import optuna

    if isinstance(error, optuna.exceptions.StorageInternalError):
        error = error.__cause__ or error
    elif isinstance(error, OSError):
        journal = str(Path(storage[len(JOURNAL) :]).expanduser()) if storage.startswith(JOURNAL) else None
        if journal is None or not str(error.filename or "").startswith(journal):
            return None
    elif not type(error).__module__.startswith("sqlalchemy"):
        return None
    return _said(error)


def _said(error: BaseException) -> str:
    return first_line(error, 300).split(" (Background on this error")[0]  # without SQLAlchemy's link to its FAQ


def objective_of(monitor: str | None, monitor_mode: str) -> tuple[str, str]:
    """(the metric, "minimize" or "maximize"): MONITOR if set, else val_loss; MONITOR_MODE's direction, or with
    auto the one its name tells (RISING, FALLING). Raises SettingsError where the name tells none."""
    name = monitor or "val_loss"
    if monitor_mode != "auto":
        return name, "maximize" if monitor_mode == "max" else "minimize"
    metric = name.removeprefix("val_").lower()
    if any(word in metric for word in FALLING):
        return name, "minimize"
    if any(word in metric for word in RISING):
        return name, "maximize"
    raise SettingsError(
        f"MONITOR={name!r}: whether it should rise or fall cannot be told from its name before the trials start: "
        "set MONITOR_MODE=max or min"
    )


def trial_value(output_dir: Path, objective: str, direction: str, best: bool) -> float:
    """A finished trial's value from its epochs.json: the last epoch's `objective`, or the best epoch's (`best`:
    MONITOR is set). Raises SettingsError where there is none."""
    epochs, problem = read_epochs(output_dir)
    if problem or not epochs:
        raise SettingsError(f"{output_dir}: no epoch was recorded ({problem or 'no epochs.json'})")
    values = [e["logs"].get(objective) for e in epochs if isinstance(e.get("logs"), dict)]
    values = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    if not values:
        raise SettingsError(f"{output_dir}: {objective} is not among its epochs' logs: set MONITOR to one of them")
    if not best:
        return values[-1]
    return max(values) if direction == "maximize" else min(values)


def pruner(prune: bool) -> optuna.pruners.BasePruner:
    """The study's pruner, the same in the tune and in each trial's fit: the median of the finished trials' values at
    the same epoch, once PRUNE_AFTER trials have finished; none with --no-prune."""
    import optuna

    return optuna.pruners.MedianPruner(n_startup_trials=PRUNE_AFTER) if prune else optuna.pruners.NopPruner()


@dataclass(frozen=True)
class TrialRef:
    """The trial a fit runs as (TUNE_TRIAL): where the study is, which trial, what it reports and whether a median
    pruner may stop it."""

    storage: str
    study: str
    trial_id: int
    number: int
    objective: str
    direction: str
    prune: bool

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> TrialRef | None:
        """TUNE_TRIAL's trial, None where the fit is not a trial. Raises SettingsError for a value not written by
        `tune`."""
        text = os.environ.get(TRIAL_ENV, "")
        if not text:
            return None
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError) as error:
            raise SettingsError(f"{TRIAL_ENV} is not a trial written by `python -m train tune` ({error})") from None

    def trial(self) -> optuna.Trial:
        """The optuna trial, with its study's median pruner (or none): what the fit reports each epoch to."""
        import optuna

        study = optuna.load_study(study_name=self.study, storage=open_storage(self.storage), pruner=pruner(self.prune))
        return optuna.trial.Trial(study, self.trial_id)


def this_owner() -> dict[str, object]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def owner_gone(attrs: dict[str, object], now: float) -> bool:
    """Whether a RUNNING trial's tune is gone (train.plugins.tune's docstring: ownership)."""
    owner, heartbeat = attrs.get("owner"), attrs.get("heartbeat")
    if isinstance(owner, dict) and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
        return False  # this tune's own
    if not isinstance(heartbeat, int | float) or now - heartbeat > STALE_SECONDS:
        return True  # on any host, a tune that stopped beating (its pid reused by another process included)
    if isinstance(owner, dict) and owner.get("host") == socket.gethostname():
        try:
            os.kill(int(owner.get("pid")), 0)  # type: ignore[arg-type]
        except ProcessLookupError:
            return True
        except (PermissionError, TypeError, ValueError):
            return False
    return False


def report(study: optuna.Study, study_dir: Path) -> dict[str, object]:
    """Every trial (number, state, params, value, steps, error) and the best complete one."""
    from optuna.trial import TrialState

    rows = []
    for each in study.get_trials(deepcopy=False):
        summary = study_dir / f"trial-{each.number}" / "summary.json"
        try:
            steps = json.loads(summary.read_text()).get("steps")
        except (OSError, ValueError):
            steps = None
        rows.append(
            {
                "number": each.number,
                "state": each.state.name.lower(),
                "params": each.params,
                "value": each.value,
                "steps": steps,
                "error": each.user_attrs.get("error"),
            }
        )
    complete = [each for each in study.get_trials(deepcopy=False) if each.state == TrialState.COMPLETE]
    best = None
    if complete:
        chosen = study.best_trial
        output_dir = study_dir / f"trial-{chosen.number}"
        best = {
            "number": chosen.number,
            "value": chosen.value,
            "params": chosen.params,
            "output_dir": str(output_dir),
            "export": str(output_dir / "saved_model"),
        }
    return {"trials": rows, "best": best}


def format_table(result: dict[str, object]) -> str:
    """The trials as a table, then the best."""
    rows = result["trials"]
    lines = [f"{'trial':>5}  {'state':<8}  {'value':>12}  {'steps':>6}  params"]
    for row in rows:  # type: ignore[union-attr]
        value = "" if row["value"] is None else f"{row['value']:.6g}"
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row["params"].items())
        lines.append(f"{row['number']:>5}  {row['state']:<8}  {value:>12}  {row['steps'] or '':>6}  {params}")
    best = result["best"]
    if best:
        lines.append(f"best: trial {best['number']}, value {best['value']:.6g}, export {best['export']}")  # type: ignore[index]
    return "\n".join(lines)
