"""`python -m train tune`: an Optuna study whose trials are ordinary run directories, trained by `python -m train fit`.

    python -m train tune --trials 20 --jobs 2 --space LEARNING_RATE=1e-4..1e-2:log --space BATCH_SIZE=32|64

- Checked first, in one line each, exit 2, before any trial (`plan_tune`): the space (train.plugins.search_space),
  --jobs against --trials and GPUS, the objective's direction (train.plugins.study), the storage (held locked by
  another process for STUDY_WAIT seconds: busy, exit 75).
- The study is STUDY_DIR's (train.plugins.study.open_storage). `--jobs J` threads here each loop: claim a trial, run
  `python -m train fit` on it in a process of its own (OUTPUT_DIR=STUDY_DIR/trial-<number>, the trial's values as
  settings in its environment, TUNE_TRIAL naming the trial, GPUS its share), tell the study how it ended. Each job
  samples with its own TPE(constant_liar=True), seeded apart from the other jobs' and from earlier runs' (`_seed`).
- A trial's end, from its exit code: 0 is complete (its value: train.plugins.study.trial_value), or pruned where its
  summary.json says `"pruned": true`; 42 (stopped by SIGTERM) leaves it RUNNING, to be resumed; any other code
  fails it, with its log's last line as its "error" user attribute. FAILURES_IN_A_ROW failures stop the tune.
- Ownership: a trial's user attributes "owner" ({host, pid} of the tune running it) and "heartbeat" (time, every
  HEARTBEAT_SECONDS). A RUNNING trial is interrupted where its owner is gone: its heartbeat is older than
  STALE_SECONDS (on any host), or, on this host, its pid is no longer alive (at once). A tune claims it (owner:
  itself) and resumes its run directory from its checkpoint under the same number, once the fit that trained there
  left its lock.
- With TRACKING, each trial's fit would log under one parent run: `parent_run_environment`, the one place a tune
  adds to every trial's environment what the whole study shares, is where it is created, once, before the jobs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from train import hparams
from train.errors import EXIT_BUSY, EXIT_PREEMPTED, SettingsError, TrainingError, first_line
from train.plugins.search_space import (
    Check,
    Dimension,
    Parsers,
    checked_values,
    has_search_space,
    name_checker,
    parse_space,
)
from train.plugins.study import (
    STUDY_NAME,
    TrialRef,
    default_storage,
    objective_of,
    open_storage,
    owner_gone,
    pruner,
    report,
    storage_failure,
    this_owner,
    trial_value,
)
from train.rundir import holder, write_json

if TYPE_CHECKING:  # optuna is the tune extra's, imported where it is used
    import optuna

FAILURES_IN_A_ROW = 3
SEED_STRIDE = 1_000_003  # the sampler seed's step per trial the study holds (above any machines x jobs)
HEARTBEAT_SECONDS = 30.0
LOCK_WAIT_SECONDS = 120.0  # an interrupted trial's fit may still be saving (SIGTERM as its tune died)
BEST = "best.json"
PARENT_RUN = "mlflow_parent_run_id"  # the study's user attribute: TRACKING=mlflow's parent run of every trial
Say = Callable[[str], None]


class TuneFailed(RuntimeError):
    """FAILURES_IN_A_ROW trials failed one after another: the tune stops, exit 1, with their lines."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclasses.dataclass(frozen=True)
class Given:
    """What the resolved settings give a tune (the command reads them from its Settings)."""

    environment: dict[str, str]  # every setting as text: each trial's environment, under its own values
    parsers: Parsers  # each setting's parser, by name
    model: str
    seed: int
    monitor: str | None
    monitor_mode: str
    gpus: str | tuple[int, ...]
    study_dir: Path
    study_wait: int  # seconds the storage's first open waits for another process's lock
    workers: int = 1  # the workers TF_CONFIG names (1 where it is unset): a trial is one process, on this machine


@dataclasses.dataclass(frozen=True)
class Tune:
    """What a tune does, checked before any trial."""

    settings: Given
    space: tuple[Dimension, ...]  # empty: MODEL's search_space(trial)
    checker: Callable[[str], Check]
    trials: int
    jobs: int
    storage: str
    prune: bool
    objective: str
    direction: str
    gpus: tuple[str | None, ...]  # each job's GPUS; None: as the settings say
    index: int = 0  # this machine's among those sharing the storage (--index): its jobs' samplers seeded apart

    @property
    def study_dir(self) -> Path:
        return self.settings.study_dir


def plan_tune(
    settings: Given,
    space: list[str],
    trials: int,
    jobs: int,
    storage: str | None,
    prune: bool,
    hyperparameters: dict[str, hparams.HyperParameter] | None,
    index: int = 0,
) -> Tune:
    """Every check of a tune, in one line each (SettingsError), before any trial; then STUDY_DIR and the storage
    opened. `hyperparameters`: MODEL's HP_ settings (train.model_file.model_hyperparameters)."""
    if importlib.util.find_spec("optuna") is None:  # found, not imported: the tune extra is optional
        raise SettingsError(
            "python -m train tune needs optuna, which is not installed: make setup EXTRAS=dev,tune (the tune extra)"
        )
    if jobs > trials:
        raise SettingsError(f"--jobs {jobs} is above --trials {trials}: use --jobs {trials} or fewer")
    if settings.workers > 1:  # each trial's fit would wait for workers no one starts
        raise SettingsError(
            f"TF_CONFIG is set and names {settings.workers} workers, but a tune runs each trial as one process on this "
            "machine: unset TF_CONFIG; machines share a study through --storage and --index"
        )
    checker = name_checker(settings.parsers, hyperparameters, settings.model)
    dimensions = parse_space(space, checker)
    if not dimensions and not has_search_space(settings.model):
        raise SettingsError(
            f"nothing to search: give --space NAME=SPEC (like LEARNING_RATE=1e-4..1e-2:log), or define "
            f"search_space(trial) in MODEL={settings.model!r}"
        )
    objective, direction = objective_of(settings.monitor, settings.monitor_mode)
    shares = gpu_shares(settings.gpus, jobs)
    text = storage or default_storage(settings.study_dir)
    if storage:
        open_storage(text, settings.study_wait)  # refused (or busy) before STUDY_DIR is made
    try:
        settings.study_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SettingsError(f"STUDY_DIR={settings.study_dir} cannot be created ({error.strerror})") from None
    if not storage:
        open_storage(text, settings.study_wait)
    return Tune(settings, dimensions, checker, trials, jobs, text, prune, objective, direction, shares, index)


def gpu_shares(gpus: str | tuple[int, ...], jobs: int) -> tuple[str | None, ...]:
    """Each job's GPUS: with GPUS listing G devices, G/J each; refused where G is not a multiple of J."""
    if not isinstance(gpus, tuple):
        return (None,) * jobs
    if len(gpus) % jobs:
        listed = ",".join(map(str, gpus))
        raise SettingsError(
            f"--jobs {jobs} cannot share GPUS={listed} ({len(gpus)} devices) evenly: use a --jobs "
            f"that divides {len(gpus)}"
        )
    size = len(gpus) // jobs
    return tuple(",".join(map(str, gpus[i * size : (i + 1) * size])) for i in range(jobs))


def parent_run_environment(tune: Tune, study: optuna.Study, say: Say) -> dict[str, str]:
    """What every trial's environment gets from the study as a whole, made once before the jobs start: with
    TRACKING=mlflow, the study's parent run (train.plugins.tracking.start_parent_run; its id kept in the study, so a
    tune run again, or another machine's, nests its trials under the same run), handed to each trial as
    MLFLOW_PARENT_RUN_ID. A tracker that fails costs nothing but the nesting: one warning line. Without
    tracking, nothing."""
    if tune.settings.environment.get("TRACKING") != "mlflow":
        return {}
    from train.plugins.tracking import experiment_name, start_parent_run, tracking_uri

    run_id = study.user_attrs.get(PARENT_RUN)
    if run_id is None:
        first_trial = tune.study_dir / "trial-0"  # every trial's store and experiment are those of its folder
        uri, experiment = tracking_uri(first_trial), experiment_name(first_trial)
        try:
            run_id = start_parent_run(uri, experiment, f"study {tune.study_dir.resolve().name}")
        except Exception as error:  # whatever MLflow raises: the tune goes on, each trial tracked on its own
            say(
                f"warning: TRACKING=mlflow could not create the study's parent run at {uri} ({first_line(error)}); "
                "each trial is tracked without one"
            )
            return {}
        study.set_user_attr(PARENT_RUN, run_id)
    return {"MLFLOW_PARENT_RUN_ID": run_id}


@dataclasses.dataclass(frozen=True)
class Claim:
    """A trial this tune runs: its number and id, its settings as text, whether it resumes an interrupted one."""

    number: int
    trial_id: int
    values: dict[str, str]
    resumed: bool


def _die_with_parent() -> None:  # pragma: no cover (runs in the child, between fork and exec)
    """The trial's fit hears SIGTERM (saves, exits 42) when the job that started it dies, SIGKILL included."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Jobs:
    """--jobs J threads, each running trials in processes of their own, until --trials N have finished."""

    def __init__(self, tune: Tune, study: optuna.Study, say: Say) -> None:
        """`study`: the study as run_tune created it (its parent run is made here, once)."""
        self.tune, self.say = tune, say
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.children: set[subprocess.Popen] = set()
        self.failures: list[str] = []  # the failures in a row, "trial N: line"
        self.error: BaseException | None = None
        self.interrupted = False
        self.shared = parent_run_environment(tune, study, say)
        self.search_space = None  # MODEL's search_space(trial), where there is no --space: imported once, here
        if not tune.space:
            from train.model_file import load_model_file

            self.search_space = load_model_file(tune.settings.model).module.search_space

    def run(self) -> None:
        """Every job to its end; SIGTERM or Ctrl-C stop them (each trial saves, stays RUNNING, exit 42 after)."""
        threads = [threading.Thread(target=self._job, args=(i,), daemon=True) for i in range(self.tune.jobs)]
        previous = {s: signal.signal(s, self._interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for thread in threads:
                thread.start()
            while any(thread.is_alive() for thread in threads):
                for thread in threads:
                    thread.join(timeout=0.2)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if self.error is not None:
            raise self.error
        if len(self.failures) >= FAILURES_IN_A_ROW:  # jobs at once may fail more before they hear it: the first
            raise TuneFailed(self.failures[:FAILURES_IN_A_ROW])

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        self.interrupted = True
        self._stop_all()

    def _stop_all(self) -> None:
        self.stop.set()
        with self.lock:
            for child in self.children:
                child.send_signal(signal.SIGTERM)

    def _job(self, index: int) -> None:
        import optuna

        try:
            study = optuna.load_study(
                study_name=STUDY_NAME, storage=open_storage(self.tune.storage), pruner=pruner(self.tune.prune)
            )
            study.sampler = optuna.samplers.TPESampler(constant_liar=True, seed=self._seed(study, index))
            while not self.stop.is_set():
                with self.lock:
                    claim = self._claim(study)
                if claim is None:
                    return
                self._run(study, claim, index)
        except BaseException as error:  # a bad search_space(trial), a storage lost: the tune stops, says it
            self.error = self.error or error
            self._stop_all()

    def _seed(self, study: optuna.Study, index: int) -> int:
        """Job `index`'s sampler seed: SEED, this machine's --index and the job, so that no two jobs sample alike; and
        the trials the study holds already, so that a tune run again does not draw its first trial's values anew."""
        tune, held = self.tune, len(study.get_trials(deepcopy=False))
        return tune.settings.seed + tune.index * tune.jobs + index + SEED_STRIDE * held

    def _claim(self, study: optuna.Study) -> Claim | None:
        """An interrupted trial to resume, else a new one while fewer than --trials have finished or run."""
        from optuna.trial import TrialState

        trials = study.get_trials(deepcopy=False)
        now = time.time()
        for each in trials:
            if each.state == TrialState.RUNNING and owner_gone(each.user_attrs, now):
                study._storage.set_trial_user_attr(each._trial_id, "owner", this_owner())
                study._storage.set_trial_user_attr(each._trial_id, "heartbeat", now)
                values = each.user_attrs.get("settings") or {k: str(v) for k, v in each.params.items()}
                return Claim(each.number, each._trial_id, dict(values), resumed=True)
        counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        if sum(each.state in counted for each in trials) >= self.tune.trials:
            return None
        trial = study.ask()
        study._storage.set_trial_user_attr(trial._trial_id, "owner", this_owner())
        study._storage.set_trial_user_attr(trial._trial_id, "heartbeat", now)
        try:
            if self.search_space is None:
                values = {d.name: hparams.text(d.suggest(trial)) for d in self.tune.space}
            else:
                values = checked_values(self._space_of(trial), self.tune.checker, self.tune.settings.model)
        except BaseException as error:  # MODEL's search_space: the trial it was asked for is failed, not left RUNNING
            if storage_failure(error, self.tune.storage) is None:
                study._storage.set_trial_user_attr(trial._trial_id, "error", first_line(error, 300))
                study.tell(trial, state=TrialState.FAIL)
            raise
        trial.set_user_attr("settings", values)
        return Claim(trial.number, trial._trial_id, values, resumed=False)

    def _space_of(self, trial: optuna.Trial) -> object:
        """What MODEL's search_space(trial) returns; what it raises is the model file's error (SettingsError), save
        the storage's, which it reaches through `trial`."""
        try:
            return self.search_space(trial)
        except Exception as error:
            if storage_failure(error, self.tune.storage) is not None:
                raise
            raise SettingsError(
                f"MODEL={self.tune.settings.model!r}: search_space(trial) raised "
                f"{type(error).__name__}: {first_line(error, 300)}"
            ) from None

    def _run(self, study: optuna.Study, claim: Claim, index: int) -> None:
        tune = self.tune
        output_dir = tune.study_dir / f"trial-{claim.number}"
        log = tune.study_dir / "logs" / f"trial-{claim.number}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        ref = TrialRef(
            tune.storage, STUDY_NAME, claim.trial_id, claim.number, tune.objective, tune.direction, tune.prune
        )
        env = os.environ | tune.settings.environment | claim.values | self.shared
        env |= {"OUTPUT_DIR": str(output_dir), "TUNE_TRIAL": ref.to_env()}
        if tune.gpus[index] is not None:
            env["GPUS"] = tune.gpus[index]
        shown = ", ".join(f"{k}={v}" for k, v in claim.values.items())
        self.say(
            f"trial {claim.number}: {'resumed' if claim.resumed else 'started'} ({shown}) in {output_dir}, "
            f"its output in {log}"
        )
        beat = lambda: study._storage.set_trial_user_attr(claim.trial_id, "heartbeat", time.time())  # noqa: E731
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while claim.resumed and holder(output_dir) and time.monotonic() < deadline and not self.stop.is_set():
            time.sleep(0.5)  # the interrupted fit is still saving (it heard SIGTERM as its tune died)
        with self.lock:
            if self.stop.is_set():
                return
            with open(log, "a", encoding="utf-8") as out:
                child = subprocess.Popen(
                    [sys.executable, "-m", "train", "fit"],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,
                )
            self.children.add(child)
        while True:
            try:
                code = child.wait(timeout=HEARTBEAT_SECONDS)
                break
            except subprocess.TimeoutExpired:
                beat()
        with self.lock:
            self.children.discard(child)
            self._record(study, claim, code, output_dir, log)

    def _record(self, study: optuna.Study, claim: Claim, code: int, output_dir: Path, log: Path) -> None:
        """Tell the study how the trial ended (the module's docstring); three failures in a row stop the tune."""
        from optuna.trial import TrialState

        number = claim.number
        if code in (EXIT_PREEMPTED, EXIT_BUSY) or code < 0:  # stopped, not failed: RUNNING, resumed by a rerun
            self.say(f"trial {number}: stopped (exit {code}); run the tune again to resume it")
            self.stop.set()
            return
        error = _last_line(log) if code else None
        if not code:
            try:
                summary = json.loads((output_dir / "summary.json").read_text())
                if summary.get("pruned"):
                    study.tell(number, state=TrialState.PRUNED)
                    self.say(f"trial {number}: pruned")
                    self.failures.clear()
                    return
                value = trial_value(
                    output_dir, self.tune.objective, self.tune.direction, best=bool(self.tune.settings.monitor)
                )
                study.tell(number, value)
                self.say(f"trial {number}: complete, {self.tune.objective} {value:.6g}")
                self.failures.clear()
                return
            except (OSError, ValueError, SettingsError) as problem:
                error = first_line(problem, 300)
        study._storage.set_trial_user_attr(claim.trial_id, "error", error or f"exit {code}")
        study.tell(number, state=TrialState.FAIL)
        self.failures.append(f"trial {number} failed (exit {code}): {error}")
        self.say(self.failures[-1])
        if len(self.failures) >= FAILURES_IN_A_ROW:
            self.stop.set()
            for child in self.children:
                child.send_signal(signal.SIGTERM)


def _last_line(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return "its output could not be read"
    return next((line for line in reversed(lines) if line), "no output")


def run_tune(tune: Tune, say: Say) -> dict[str, object]:
    """Create the study (once), run the jobs, write best.json; returns {"trials": rows, "best": best.json or None}.
    Raises TuneFailed (three failures in a row), SettingsError (a study of another direction, a bad search_space),
    TrainingError (the storage failed: what it recorded is kept, and a tune run again goes on from it)."""
    try:
        return _tune(tune, say)
    except Exception as error:
        why = storage_failure(error, tune.storage)
        if why is None:
            raise
        raise TrainingError(
            f"the study's storage {tune.storage} failed ({why}): run the tune again once it is "
            "back: it goes on from what the storage holds"
        ) from None


def _tune(tune: Tune, say: Say) -> dict[str, object]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(tune.storage)
    study = optuna.create_study(storage=storage, study_name=STUDY_NAME, direction=tune.direction, load_if_exists=True)
    if study.direction.name.lower() != tune.direction:
        raise SettingsError(
            f"the study in {tune.storage} was made to {study.direction.name.lower()} and this tune would "
            f"{tune.direction} {tune.objective}: use the MONITOR and MONITOR_MODE it was made with, or another "
            "STUDY_DIR"
        )
    jobs = Jobs(tune, study, say)
    jobs.run()
    result = report(study, tune.study_dir)
    if result["best"] is not None:
        write_json(tune.study_dir / BEST, result["best"])
    result["interrupted"] = jobs.interrupted
    return result
