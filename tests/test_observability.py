"""What a run shows while it trains and leaves to look at: the progress bar or lines, the TensorBoard
profiler trace of PROFILE_STEPS, the HParams session of every run, and DETERMINISTIC's wiring."""

from __future__ import annotations

import os
import pty
import select
import shutil
import time

import pytest

from tests.conftest import read_summary, run_train, start_train, tensorboard_events

QUICK = {"EPOCHS": 2, "STEPS_PER_EPOCH": 20, "LOG_EVERY": 10}


def fit_on_a_terminal(cwd, timeout: float = 180, **settings) -> str:
    """`python -m train fit` with its output on a pseudo-terminal, as a user at a shell sees it."""
    leader, follower = pty.openpty()
    process = start_train("fit", cwd=cwd, stdin=follower, stdout=follower, stderr=follower, **settings)
    os.close(follower)
    output, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            output += chunk
        elif process.poll() is not None:
            break
    process.wait(timeout=30)
    os.close(leader)
    assert process.returncode == 0, output.decode(errors="replace")[-3000:]
    return output.decode(errors="replace")


def test_a_terminal_gets_a_live_bar_with_the_metrics_speed_and_time_left(tmp_path, tfds_data_dir):
    output = fit_on_a_terminal(tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run", **QUICK)
    assert "epoch 2/2" in output and "40/40" in output  # step of the total
    assert "accuracy" in output and "examples/s" in output and "ETA" in output
    assert "step      10/40" not in output  # the bar replaces the lines
    assert "epoch 1 eval: loss" in output  # what matters stays above the bar


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, tfds_data_dir):
    """One QUICK fit without a terminal, with PROFILE_STEPS=5-8 and BATCH_SIZE=64, for the tests that only read it
    (its lines, its trace, its HParams session): (folder, result)."""
    folder = tmp_path_factory.mktemp("quick")
    result = run_train("fit", cwd=folder, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=folder / "run", PROFILE_STEPS="5-8",
                       BATCH_SIZE=64, **QUICK)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, result


def test_without_a_terminal_the_lines_keep_their_format(quick_run):
    _, result = quick_run
    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["10/40", "20/40", "30/40", "40/40"]
    assert lines[1].split()[2:8] == ["epoch", "1/2", "loss", lines[1].split()[5], "accuracy", lines[1].split()[7]]
    assert lines[-1].endswith("examples/s")
    assert "\x1b[" not in result.stdout  # no terminal control codes in logs


def test_profile_steps_writes_a_tensorboard_trace_of_those_steps(tmp_path, tfds_data_dir, quick_run):
    folder, result = quick_run
    traces = list((folder / "run" / "logs" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    assert f"PROFILE_STEPS=5-8: trace written to {folder / 'run' / 'logs' / 'plugins' / 'profile'}" in result.stdout

    output_dir = tmp_path / "run"  # resumed on a copy: the shared run stays as it ended
    shutil.copytree(folder / "run", output_dir)
    again = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=output_dir, PROFILE_STEPS="5-8",
                      BATCH_SIZE=64, **{**QUICK, "EPOCHS": 3})  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "PROFILE_STEPS=5-8: those steps were trained before this start (at step 40): no trace." in again.stdout


@pytest.mark.parametrize("text", ["8-5", "0-3", "a-b", "5"])
def test_a_malformed_profile_range_is_exit_2_before_tensorflow(tmp_path, text):
    result = run_train("fit", cwd=tmp_path, fresh=True, OUTPUT_DIR=tmp_path / "run", PROFILE_STEPS=text)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: PROFILE_STEPS={text!r} is not allowed: use START-END, two step numbers from 1 with START <= END, "
        "like 100-110"
    ]


def test_every_run_writes_an_hparams_session_of_its_settings_beside_its_metrics(quick_run):
    folder, _ = quick_run
    output_dir = folder / "run"
    found = tensorboard_events(output_dir / "logs")
    assert found["hparams"]["BATCH_SIZE"] == 64 and found["hparams"]["DATASET"] == "synthetic_clusters"
    assert found["hparams"]["global_batch"] == 64 and found["hparams"]["MODEL"] == "examples.mlp"
    assert found["eval"]["accuracy"] == pytest.approx(read_summary(output_dir)["eval"]["accuracy"], abs=1e-6)


def test_deterministic_runs_on_two_replicas_end_with_the_same_weights(tmp_path, tfds_data_dir):
    hashes = []
    for name in ("first", "second"):
        result = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / name,
                           DETERMINISTIC="true", CPU_DEVICES=2, **QUICK)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        summary = read_summary(tmp_path / name)
        assert summary["deterministic"] is True and summary["replicas"] == 2
        hashes.append(summary["weights_sha256"])
    assert hashes[0] == hashes[1]


def test_deterministic_turns_xla_auto_off_where_it_would_be_on():
    """The decision itself (train.devices.runtime.choose_xla), on one CPU device gathering from memory."""
    from dataclasses import replace

    from train.devices.runtime import DevicePlan, choose_xla, resolve
    from train.settings import load_settings

    plan = DevicePlan(physical_gpus=0, visible_gpus=(), memory_growth=False, memory_limit_mb=None, cpu_devices=1,
                      notes=())  # fmt: skip
    resolution = resolve(load_settings({}, environ={}, dotenv_path="/nonexistent/.env", defaults_path=None), plan)
    assert choose_xla("auto", resolution, True, False, None)[0] is True
    off, why = choose_xla("auto", replace(resolution, deterministic=True), True, False, None)
    assert (off, why) == (False, "auto: off with DETERMINISTIC=true (not every XLA kernel is deterministic)")


def test_deterministic_with_xla_forced_on_is_refused_naming_both(tmp_path):
    result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "run", DETERMINISTIC="true", JIT_COMPILE="true")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error: JIT_COMPILE=true is not allowed with DETERMINISTIC=true")
    )


@pytest.mark.parametrize("strategy", ["one_device", "mirrored", "multi_worker"])
def test_deterministic_is_kept_by_every_strategy_s_resolution(strategy):
    """What summary.json, `devices` and the XLA decision read (train.devices.runtime.resolve), for each strategy."""
    import json

    from train.devices.runtime import DevicePlan, resolve
    from train.settings import load_settings

    environ = {"DETERMINISTIC": "true", "CPU_DEVICES": "2" if strategy == "mirrored" else "1"}
    if strategy == "multi_worker":
        cluster = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}
        environ["TF_CONFIG"] = json.dumps(cluster)
    settings = load_settings({}, environ=environ, dotenv_path="/nonexistent/.env", defaults_path=None)
    plan = DevicePlan(physical_gpus=0, visible_gpus=(), memory_growth=False, memory_limit_mb=None,
                      cpu_devices=settings.cpu_devices, notes=())  # fmt: skip
    resolution = resolve(settings, plan)
    assert (resolution.strategy_name, resolution.deterministic) == (strategy, True)


def test_an_evaluation_says_it_runs_only_when_it_takes_more_than_a_moment(monkeypatch):
    """train.progress.evaluation_notice, the moment shortened from EVALUATION_NOTICE_SECONDS to 50 ms."""
    import time

    from train import progress

    monkeypatch.setattr(progress, "EVALUATION_NOTICE_SECONDS", 0.05)
    said: list[str] = []
    with progress.evaluation_notice(said.append, "test", 2048):
        pass  # quick: nothing said
    with progress.evaluation_notice(said.append, "train", 16384):
        time.sleep(0.5)
    time.sleep(0.1)  # a timer cancelled at the first exit must not fire late
    assert said == ["evaluating train (16,384 examples)..."]
