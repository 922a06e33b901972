"""TRACKING: where a run's params, metrics, tags and artifacts go besides its run directory: a hook (train.hooks).

`none` tracks nothing (no hook). `mlflow` is `MlflowTracking`, a hook on the chief alone (`chief_only`): it logs to
MLFLOW_TRACKING_URI (unset: `sqlite:///<OUTPUT_DIR's parent>/mlflow.db`) under MLFLOW_EXPERIMENT_NAME
(unset: that folder's name), one MLflow run per run directory: its id is run.json's "mlflow_run_id", and a resume
logs to the same MLflow run. MLflow refuses to change a logged param: a resume logs the params not logged yet, and
each changed value as the tag `changed.<name>` ("before -> now").

A tracker that fails never costs the training: one warning line, then tracking is off for the rest of the run.
MLflow's own retries (7 tries with backoff, 120 s a call) are bounded to a few seconds unless the user set
MLFLOW_HTTP_REQUEST_MAX_RETRIES or MLFLOW_HTTP_REQUEST_TIMEOUT (`bound_retries`).

No TensorFlow here, and mlflow is imported inside functions only (the track extra; TRACKING=mlflow without it is
refused before TensorFlow loads, by train.settings.parse.tracking). The run reaches it through the hook interface
alone (train.hooks: `RunInfo`, the metrics at each log and epoch's end, the summary); `start_parent_run` is for
`tune`, before its trials start.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from train.errors import first_line
from train.hooks import CallResult, Hook, Json, Metrics, RunInfo
from train.model_file import model_fingerprint

if TYPE_CHECKING:
    from mlflow import MlflowClient

PARENT_RUN = "MLFLOW_PARENT_RUN_ID"  # set by `tune` for each trial: the study's run, which the trial's nests under
# MLflow's own variables, bounded where the user has not set them: a tracker that cannot reach its store costs
# seconds, not minutes (MLflow's defaults: 7 retries with backoff, 120 s a call). No retry: its first failure ends the
# tracking anyway, and urllib3 would warn of each retry on a line of its own.
BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
BATCH = 100  # MLflow's limit of params (and tags) in one log_batch call


def bound_retries() -> None:
    """MLflow's HTTP retries and timeout bounded to a few seconds in all, where the user has not set them; before
    any client is made (MLflow reads them at each request)."""
    for name, value in BOUNDS.items():
        os.environ.setdefault(name, value)


def tracking_uri(output_dir: Path) -> str:
    """MLFLOW_TRACKING_URI, or the local store beside the run directory: `sqlite:///<OUTPUT_DIR's parent>/mlflow.db`."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{output_dir.resolve().parent / 'mlflow.db'}"


def experiment_name(output_dir: Path) -> str:
    """MLFLOW_EXPERIMENT_NAME, or the name of OUTPUT_DIR's parent folder (runs/default: runs)."""
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or output_dir.resolve().parent.name or "Default"


def _client(uri: str) -> MlflowClient:
    bound_retries()
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _experiment_id(client: MlflowClient, uri: str, name: str) -> str:
    """The experiment named `name`, created where it is not. A local sqlite store keeps its artifacts beside it,
    in mlartifacts/ (not in the working directory, MLflow's default there)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return client.create_experiment(name, artifact_location=location)


def start_parent_run(tracking_uri: str, experiment: str, name: str) -> str:
    """A new run named `name` in `experiment` at `tracking_uri` (the store and the experiment created where they
    are not), for `tune` to call once before its trials start: each trial's run nests under it (PARENT_RUN). Its
    id. Raises what MLflow raises."""
    client = _client(tracking_uri)
    run = client.create_run(_experiment_id(client, tracking_uri, experiment), run_name=name)
    return run.info.run_id


def git_commit(where: Path) -> str | None:
    """The commit checked out at `where`, where it is in a git work tree (and git is installed)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def params_of(settings: dict[str, str]) -> dict[str, str]:
    """Every setting and every HP_ (`settings`: as settings.json has them), flat, named in lower case."""
    return {name.lower(): value for name, value in settings.items()}


def tags_of(run: RunInfo) -> dict[str, str]:
    """The data's identity, the MODEL file's sha256, the commit (where there is one) and OUTPUT_DIR."""
    identity = json.dumps(run.data, sort_keys=True, default=str)
    tags = {
        "dataset": run.settings["DATASET"],
        "data.identity": identity if len(identity) <= 5000 else identity[:4990] + " ...",
        "model": run.settings["MODEL"],
        "model_sha256": model_fingerprint(run.settings["MODEL"]),
        "output_dir": str(run.output_dir.resolve()),
    }
    commit = git_commit(Path.cwd())
    return tags | ({"mlflow.source.git.commit": commit} if commit else {})


def _why(error: Exception) -> str:
    """What went wrong, short: a connection's own reason ([Errno 111] Connection refused) where MLflow wraps one in
    its request's story, else the message's first line, cut at 200 characters."""
    text = first_line(error)
    reason = re.search(r"\[Errno -?[0-9]+\][^'\")]*", text)
    if reason:
        return reason.group(0).strip()
    return text if len(text) <= 200 else text[:197] + "..."


def _chunks(items: list, size: int = BATCH) -> Iterator[list]:
    for index in range(0, len(items), size):
        yield items[index : index + size]


class MlflowTracking(Hook):
    """TRACKING=mlflow, on the chief: the run's params and tags at `run_begin`, the training metrics at every log
    step and evaluation's at every epoch's end (named as epochs.json names them: val_ for evaluation's), the run's
    files at `run_end`. Each call to MLflow goes through `_call`: the first that fails says one warning line and
    turns tracking off for the rest of the run."""

    chief_only = True

    def __init__(self) -> None:
        self.run_id, self.client, self.logged_step = None, None, -1
        self.on = True  # until a call fails

    def _call(self, what: str, work: Callable[[], object]) -> object:
        if not self.on:
            return None
        try:
            return work()
        except Exception as error:  # any failure of the tracker, never the training's: said once, then off
            self.say(
                f"warning: TRACKING=mlflow could not {what} at {self.uri} ({_why(error)}); tracking is off for the "
                "rest of this run, which goes on"
            )
            self.on = False
            return None

    def run_begin(self, run: RunInfo) -> Json:
        """The MLflow run begun, or run.json's taken up: its id, run.json's "mlflow_run_id" (kept there by a start
        whose tracking is off or fails, so a later start goes on with it)."""
        self.uri, self.experiment = tracking_uri(run.output_dir), experiment_name(run.output_dir)
        self.say, self.output_dir = run.say, run.output_dir
        recorded = run.recorded.get("mlflow_run_id")
        recorded_run = recorded if isinstance(recorded, str) else None
        self.client = self._call("open the store", lambda: _client(self.uri))
        self.run_id = self._call("start its run", lambda: self._take_up(run, recorded_run))
        if self.run_id:
            went_on = " (going on)" if recorded_run else ""
            self.say(f"Tracking to MLflow: run {self.run_id}{went_on} of experiment {self.experiment} at {self.uri}.")
        return {"mlflow_run_id": self.run_id} if self.run_id else {}

    def _take_up(self, run: RunInfo, recorded_run: str | None) -> str:
        """run.json's MLflow run, resumed, or a new one; the params not logged yet, and the changed ones as tags."""
        from mlflow.entities import Param, RunTag

        client, params, tags = self.client, params_of(run.settings), tags_of(run)
        logged: dict[str, str] | None = None
        if recorded_run:
            found = client.get_run(recorded_run)  # an id this store does not hold raises: said, and tracking is off
            client.update_run(recorded_run, status="RUNNING")
            run_id, logged = recorded_run, found.data.params
        else:
            parent = os.environ.get(PARENT_RUN)
            run_tags = {"mlflow.parentRunId": parent} if parent else {}
            experiment_id = _experiment_id(client, self.uri, self.experiment)
            run_id = client.create_run(experiment_id, tags=run_tags, run_name=run.output_dir.name).info.run_id
        logged = logged or {}
        new = [Param(name, value) for name, value in params.items() if name not in logged]
        changed = {
            f"changed.{name}": f"{logged[name]} -> {value}"
            for name, value in params.items()
            if name in logged and logged[name] != value
        }
        run_tags = [RunTag(name, value) for name, value in (tags | changed).items()]
        for params_part in _chunks(new):
            client.log_batch(run_id, params=params_part)
        for tags_part in _chunks(run_tags):
            client.log_batch(run_id, tags=tags_part)
        return run_id

    def log(self, step: int, result: CallResult, examples_per_sec: float | None) -> None:
        if step != self.logged_step:  # an epoch's end and the end of training may log the same step
            self._metrics(step, result.metrics)
            self.logged_step = step

    def epoch_end(self, epoch: int, step: int, metrics: Metrics) -> None:
        self._metrics(step, {f"val_{name}": value for name, value in metrics.items()})

    def _metrics(self, step: int, metrics: Metrics) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = []
        for name, value in metrics.items():
            each = enumerate(value) if isinstance(value, list) else [(None, value)]
            values += [
                Metric(name if index is None else f"{name}/{index}", float(number), now, step)
                for index, number in each
                if isinstance(number, float | int)
            ]
        if values:
            self._call("log metrics", lambda: self.client.log_batch(self.run_id, metrics=values))

    def run_end(self, summary: Json | None) -> None:
        if self.run_id is None:  # never begun (the start was refused), or tracking went off as it began
            return
        for path in (self.output_dir / "summary.json", self.output_dir / "run.json"):
            if summary is not None and path.is_file():
                self._call(f"log {path.name}", lambda path=path: self.client.log_artifact(self.run_id, str(path)))
        status = "FAILED" if summary is None else "KILLED" if summary.get("interrupted") else "FINISHED"
        self._call("end its run", lambda: self.client.set_terminated(self.run_id, status=status))
