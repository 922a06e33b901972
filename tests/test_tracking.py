"""TRACKING=mlflow (train/plugins/tracking.py): a run and its resume as one MLflow run on a sqlite store, nested under a
parent run as `tune`'s trials are; a real `mlflow server` logged to over HTTP, then the same server stopped.

Each fit is the default tiny model for a few steps. MLflow is the track extra (make setup EXTRAS=dev,track; .ci/run
installs it): without it the file skips. Every process here runs with MLFLOW_DISABLE_TELEMETRY=true.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, needs, read_summary, run_python

pytestmark = needs("track")

FAST = {"EPOCHS": 1, "STEPS_PER_EPOCH": 4, "LOG_EVERY": 2, "TRACKING": "mlflow"}


def fit(tmp_path: Path, **settings: object) -> subprocess.CompletedProcess:
    done = run_python(["-m", "train", "fit"], cwd=tmp_path, env=clean_env(**{**FAST, **settings}))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def the_run(uri: str, experiment: str):
    """The experiment's one run (its parent, where it has one, left out)."""
    mlflow = client(uri)
    runs = mlflow.search_runs([mlflow.get_experiment_by_name(experiment).experiment_id])
    children = [run for run in runs if "mlflow.parentRunId" in run.data.tags]
    return children or runs


def test_the_params_are_every_setting_and_every_hp_flat_in_lower_case(tmp_path, monkeypatch):
    from tests.test_hparams import MODEL, load
    from train.plugins.tracking import params_of
    from train.settings import FIELDS

    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    params = params_of(load("model.py", environ={"HP_WIDTH": "128", "LEARNING_RATE": "0.01"}).to_json())
    assert set(params) == {field.attr for field in FIELDS} | {"hp_width", "hp_dropout", "hp_smooth", "hp_activation"}
    assert (params["learning_rate"], params["hp_width"], params["batch_size"]) == ("0.01", "128", "128")


@pytest.mark.slow
def test_a_fit_and_its_resume_are_one_mlflow_run_on_the_local_sqlite_store(tmp_path):
    from train.plugins.tracking import start_parent_run

    store = tmp_path / "runs" / "mlflow.db"  # the default: beside OUTPUT_DIR, named for its parent folder
    parent = start_parent_run(f"sqlite:///{store}", "runs", "study")  # as `tune` does before its trials
    fit(tmp_path, OUTPUT_DIR="runs/one", MLFLOW_PARENT_RUN_ID=parent)
    resumed = fit(tmp_path, OUTPUT_DIR="runs/one", EPOCHS=2)
    assert "warning: TRACKING" not in resumed.stdout + resumed.stderr

    runs = the_run(f"sqlite:///{store}", "runs")
    assert len(runs) == 1
    run, output_dir = runs[0], tmp_path / "runs" / "one"
    recorded = json.loads((output_dir / "run.json").read_text())
    assert recorded["mlflow_run_id"] == run.info.run_id
    said = f"Tracking to MLflow: run {run.info.run_id} (going on) of experiment runs at sqlite:///{store}."
    assert said in resumed.stdout.splitlines()
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert client(f"sqlite:///{store}").get_run(parent).info.run_name == "study"
    assert run.data.params["learning_rate"] == "0.001"
    assert run.data.params["epochs"] == "1"  # as first logged: MLflow keeps a param; the change is a tag
    assert run.data.tags["changed.epochs"] == "1 -> 2"
    assert run.data.tags["model_sha256"] == recorded["model_sha256"]
    assert run.data.tags["output_dir"] == str(output_dir)
    assert json.loads(run.data.tags["data.identity"]) == recorded["data"]

    summary, mlflow = read_summary(output_dir), client(f"sqlite:///{store}")
    history = mlflow.get_metric_history(run.info.run_id, "val_accuracy")
    assert [entry.step for entry in history] == [4, 8]  # each epoch's evaluation, at its step
    assert history[-1].value == pytest.approx(summary["eval"]["accuracy"])
    assert run.data.metrics["val_loss"] == pytest.approx(summary["eval"]["loss"])
    assert [entry.step for entry in mlflow.get_metric_history(run.info.run_id, "loss")] == [2, 4, 6, 8]
    assert {each.path for each in mlflow.list_artifacts(run.info.run_id)} == {"summary.json", "run.json"}


@pytest.mark.slow
def test_on_two_workers_only_the_chief_logs(tmp_path):
    """Two workers (one TF_CONFIG each, as the launcher starts them): one MLflow run, the chief's, whose metrics
    are the summary's; the other worker trains and logs nothing."""
    from tests.harness.runs import run_two_workers

    workers = run_two_workers(tmp_path, tmp_path, OUTPUT_DIR="runs/two", WORKER_START_TIMEOUT=120, **FAST)
    assert [code for code, _ in workers] == [0, 0], workers[0][1][-3000:] + workers[1][1][-3000:]
    assert "Tracking to MLflow" in workers[0][1] and "Tracking to MLflow" not in workers[1][1]
    store = tmp_path / "runs" / "mlflow.db"
    (run,) = the_run(f"sqlite:///{store}", "runs")
    summary = read_summary(tmp_path / "runs" / "two")
    assert (summary["workers"], run.data.params["tracking"]) == (2, "mlflow")
    assert run.data.metrics["val_loss"] == pytest.approx(summary["eval"]["loss"])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(folder: Path, port: int) -> subprocess.Popen:
    """`mlflow server` on 127.0.0.1:PORT, its sqlite store and its artifacts in `folder`; up once /health answers."""
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=folder, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except OSError:
            assert server.poll() is None, "mlflow server exited at start-up"
            time.sleep(0.5)
    stop_server(server)
    raise AssertionError("mlflow server did not answer /health within 120 s")


def stop_server(server: subprocess.Popen) -> None:
    """The server and the workers it started (its own session)."""
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@pytest.mark.slow
def test_a_tracking_server_over_http_and_the_same_server_stopped(tmp_path):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    try:
        done = fit(tmp_path, OUTPUT_DIR="runs/served", MLFLOW_TRACKING_URI=uri)
        assert "warning: TRACKING" not in done.stdout + done.stderr
        runs = the_run(uri, "runs")
        assert len(runs) == 1 and runs[0].info.status == "FINISHED"
        run = runs[0]
        served = read_summary(tmp_path / "runs" / "served")
        assert run.data.metrics["val_accuracy"] == pytest.approx(served["eval"]["accuracy"])
        assert {each.path for each in client(uri).list_artifacts(run.info.run_id)} == {"summary.json", "run.json"}
    finally:
        stop_server(server)

    down = fit(tmp_path, OUTPUT_DIR="runs/unserved", MLFLOW_TRACKING_URI=uri)  # exit 0: fit asserts it
    warnings = [line for line in (down.stdout + down.stderr).splitlines() if "TRACKING=mlflow" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"warning: TRACKING=mlflow could not start its run at {uri} (")
    assert "tracking is off for the rest of this run" in warnings[0]
    output_dir = tmp_path / "runs" / "unserved"
    assert read_summary(output_dir)["steps"] == 4
    assert (output_dir / "model.keras").is_file()
    assert "mlflow_run_id" not in json.loads((output_dir / "run.json").read_text())


def test_make_mlflow_ui_serves_the_local_store_on_localhost_only():
    dry_run = subprocess.run(["make", "-n", "mlflow-ui", "OUTPUT_DIR=/srv/runs/study/trial-1"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert '--backend-store-uri "sqlite:////srv/runs/study/mlflow.db" --host 127.0.0.1 --port 5000' in dry_run.stdout
