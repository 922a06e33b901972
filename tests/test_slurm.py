"""Slurm: scripts/slurm/ (train.sbatch, task.sh, tf_config.py) under a fake Slurm, workers on 127.0.0.1 only.

What is faked, each at a seam the real scripts go through: `scontrol` (`show hostnames` prints
FAKE_HOSTS, `requeue ID` is written to a log instead of requeueing), `srun` (starts SLURM_NTASKS local
tasks in Slurm's block layout with SLURM_PROCID, SLURM_LOCALID, SLURMD_NODENAME set, passes SIGTERM on
as srun does, and exits with the highest task exit code as srun does), and the SLURM_* variables
sbatch would set. The requeue-decision tests also fake the training itself (`python -m train fit`
exits with a chosen code); the end-to-end test trains for real.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, read_summary

SLURM = REPO / "scripts" / "slurm"
SETTINGS = {"BATCH_SIZE": 16, "EPOCHS": 2, "STEPS_PER_EPOCH": 100, "STEPS_PER_CALL": 4}
SETTINGS |= {"CHECKPOINT_EVERY": 40, "LOG_EVERY": 50, "WORKER_START_TIMEOUT": 60}

FAKE_SCONTROL = """#!/bin/sh
# fake scontrol: `show hostnames LIST` prints FAKE_HOSTS, or else LIST's comma-separated names (no
# bracket ranges); `requeue ID` is logged to FAKE_SLURM_LOG
case "$1" in
    show)
        if [ -n "$FAKE_HOSTS" ]; then printf '%s\\n' $FAKE_HOSTS; else echo "$3" | tr , '\\n'; fi ;;
    requeue) echo "requeue $2" >> "$FAKE_SLURM_LOG" ;;
    *) echo "fake scontrol: '$*' is not faked" >&2; exit 1 ;;
esac
"""

FAKE_SRUN = f"""#!{sys.executable}
# fake srun: SLURM_NTASKS local tasks in block layout; SIGTERM passed on; exit code the highest task's
import os, signal, subprocess, sys
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args.pop(0)
hosts = os.environ["FAKE_HOSTS"].split()
counts = [int(n) for n in os.environ["SLURM_TASKS_PER_NODE"].split(",")]
tasks = []
for node, (host, count) in enumerate(zip(hosts, counts)):
    for local in range(count):
        env = dict(os.environ, SLURM_PROCID=str(len(tasks)), SLURM_LOCALID=str(local), SLURM_NODEID=str(node),
                   SLURMD_NODENAME=host)
        tasks.append(subprocess.Popen(args, env=env))
with open(os.environ["FAKE_SLURM_LOG"] + ".pids", "w") as pids:
    pids.write(" ".join(str(t.pid) for t in tasks))
signal.signal(signal.SIGTERM, lambda *_: [t.send_signal(signal.SIGTERM) for t in tasks if t.poll() is None])
codes = [t.wait() for t in tasks]
sys.exit(max(c if c >= 0 else 128 - c for c in codes))
"""

FAKE_TRAINING = f"""#!/bin/sh
# fake python for `-m train fit` only: print TF_CONFIG, exit FAKE_EXIT; anything else is the real python
if [ "$1" = "-m" ]; then echo "TF_CONFIG=${{TF_CONFIG-unset}}"; exit "${{FAKE_EXIT:-0}}"; fi
exec {sys.executable} "$@"
"""


def load_tf_config():
    spec = importlib.util.spec_from_file_location("slurm_tf_config", SLURM / "tf_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tf_config = load_tf_config()


def consecutive_free_ports(count: int) -> int:
    """A port P such that P .. P+count-1 are free on 127.0.0.1 now (task K on a node listens on P+K)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        sockets = [socket.socket() for _ in range(count)]
        try:
            for offset, sock in enumerate(sockets):
                sock.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError("no consecutive free ports")


@pytest.fixture
def fake_slurm(tmp_path):
    """A directory of fakes and the environment sbatch would give a 2-task job on one node, 127.0.0.1."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "slurm.log"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_HOSTS": "127.0.0.1", "FAKE_SLURM_LOG": str(log),
        "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "node1",
        "SLURM_TASKS_PER_NODE": "2", "SLURM_SUBMIT_DIR": str(tmp_path), "PYTHON": sys.executable,
        "WORKER_PORT": str(consecutive_free_ports(2)),
    }  # fmt: skip
    return bin_dir, env, log


def fake_training(bin_dir: Path) -> str:
    path = bin_dir / "fake-python"
    path.write_text(FAKE_TRAINING)
    path.chmod(0o755)
    return str(path)


def sbatch(tmp_path: Path, env: dict[str, str], **settings: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SLURM / "train.sbatch")], cwd=tmp_path, env=clean_env(**env, **settings),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def requeues(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("requeue")] if log.exists() else []


# --- TF_CONFIG from Slurm, no TensorFlow -------------------------------------------------------------


def test_tasks_per_node_expands_slurms_compressed_form():
    assert tf_config.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tf_config.tasks_per_node("1") == [1]


def test_task_i_is_worker_i_in_block_order_with_a_port_per_task_on_a_node():
    config = tf_config.tf_config(["a", "b"], [2, 2], 3, 2222)
    assert config == {
        "cluster": {"worker": ["a:2222", "a:2223", "b:2222", "b:2223"]},
        "task": {"type": "worker", "index": 3},
    }


def run_tf_config(bin_dir: Path, **environ: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_HOSTS": "gpu-a gpu-b", "SLURM_JOB_NODELIST": "gpu-[a-b]"}
    return subprocess.run(
        [sys.executable, str(SLURM / "tf_config.py")], env=env | environ, capture_output=True, text=True, timeout=30
    )


def test_the_script_expands_the_node_list_with_scontrol_one_worker_per_node(fake_slurm):
    result = run_tf_config(fake_slurm[0], SLURM_NTASKS="2", SLURM_PROCID="1", SLURM_TASKS_PER_NODE="1(x2)")
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    assert config["cluster"]["worker"] == ["gpu-a:2222", "gpu-b:2222"] and config["task"]["index"] == 1
    port = run_tf_config(fake_slurm[0], SLURM_NTASKS="2", SLURM_PROCID="0", SLURM_TASKS_PER_NODE="1(x2)",
                         WORKER_PORT="3000")  # fmt: skip
    assert json.loads(port.stdout)["cluster"]["worker"] == ["gpu-a:3000", "gpu-b:3000"]


def test_inside_srun_the_steps_nodes_and_tasks_win_over_the_jobs(fake_slurm):
    step = {"SLURM_STEP_NODELIST": "gpu-b,gpu-c", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "FAKE_HOSTS": ""}
    job = {"SLURM_JOB_NODELIST": "gpu-a,gpu-b,gpu-c", "SLURM_TASKS_PER_NODE": "1(x3)"}
    result = run_tf_config(fake_slurm[0], SLURM_NTASKS="2", SLURM_PROCID="0", **job, **step)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["cluster"]["worker"] == ["gpu-b:2222", "gpu-c:2222"]


@pytest.mark.parametrize(
    ("environ", "start"),
    [
        (
            {"SLURM_NTASKS": "2", "SLURM_PROCID": "2"},
            "error: SLURM_PROCID='2' is not allowed: use an integer from 0 to 1",
        ),
        ({"SLURM_NTASKS": "two"}, "error: SLURM_NTASKS='two' is not allowed"),
        ({"SLURM_TASKS_PER_NODE": "2(x)"}, "error: SLURM_TASKS_PER_NODE='2(x)' is not allowed: use Slurm's form"),
        ({"SLURM_TASKS_PER_NODE": "3(x2)"}, "error: SLURM_TASKS_PER_NODE='3(x2)' does not fit 2 tasks on the 2 node"),
        ({"WORKER_PORT": "70000"}, "error: WORKER_PORT='70000' is not allowed: use an integer from 1 to 65535"),
        ({"SLURMD_NODENAME": "gpu-b"}, "error: SLURM_PROCID=0 runs on gpu-b, but the block layout puts it on gpu-a"),
    ],
)
def test_a_wrong_slurm_variable_is_one_line_naming_it_and_exit_2(fake_slurm, environ, start):
    base = {"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_TASKS_PER_NODE": "1(x2)"}
    result = run_tf_config(fake_slurm[0], **base | environ)
    assert result.returncode == 2
    assert result.stderr.startswith(start) and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_outside_slurm_the_script_says_it_needs_srun(tmp_path):
    result = run_tf_config(tmp_path, SLURM_NTASKS="2", SLURM_PROCID="0", SLURM_TASKS_PER_NODE="1(x2)")
    assert result.returncode == 2 and result.stderr.startswith("error: scontrol is not on PATH")


# --- the per-task wrapper and the batch script's decisions, training faked --------------------------------


def run_task(env: dict[str, str], **settings: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SLURM / "task.sh")], env=clean_env(**env, **settings), capture_output=True, text=True, timeout=60
    )


def test_one_task_trains_on_its_host_without_the_tf_config_of_the_submitting_shell(fake_slurm):
    bin_dir, env, _ = fake_slurm
    result = run_task(env | {"PYTHON": fake_training(bin_dir), "SLURM_NTASKS": "1", "SLURM_PROCID": "0"},
                      TF_CONFIG='{"cluster": {}}')  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "TF_CONFIG=unset"


def test_a_task_that_does_not_see_the_probe_file_says_output_dir_must_be_shared(fake_slurm, tmp_path):
    bin_dir, env, _ = fake_slurm
    missing = tmp_path / "run" / ".slurm-shared-check-4242"
    task = {"SLURM_PROCID": "1", "SLURMD_NODENAME": "127.0.0.1", "TRAIN_SHARED_PROBE": str(missing)}  # as srun sets
    result = run_task(env | task | {"PYTHON": fake_training(bin_dir)}, OUTPUT_DIR=tmp_path / "run")
    assert result.returncode == 2 and result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: [slurm task 1/2 on 127.0.0.1] OUTPUT_DIR={tmp_path / 'run'} is not the storage")
    assert last.endswith(
        "OUTPUT_DIR must be shared storage (NFS, Lustre, GPFS, ...) mounted at the same path on every node"
    )


@pytest.mark.parametrize(
    ("code", "requeued"),
    [(42, True), (75, True), (0, False), (1, False), (2, False)],
    ids=["stopped-42", "busy-75", "done-0", "failed-1", "bad-input-2"],
)
def test_the_batch_script_requeues_on_42_and_75_only(fake_slurm, tmp_path, code, requeued):
    bin_dir, env, log = fake_slurm
    result = sbatch(
        tmp_path, env | {"PYTHON": fake_training(bin_dir), "FAKE_EXIT": str(code)}, OUTPUT_DIR=tmp_path / "run"
    )
    assert result.returncode == code, result.stderr
    assert requeues(log) == (["requeue 4242"] if requeued else [])
    assert result.stdout.count("TF_CONFIG={") == 2  # both tasks got one (srun --label would prefix them)
    assert not list((tmp_path / "run").glob(".slurm-shared-check-*")), "the probe file was left behind"


def test_the_batch_script_stops_requeueing_after_max_requeues(fake_slurm, tmp_path):
    bin_dir, env, log = fake_slurm
    env |= {"PYTHON": fake_training(bin_dir), "FAKE_EXIT": "42", "SLURM_RESTART_COUNT": "3", "MAX_REQUEUES": "3"}
    result = sbatch(tmp_path, env, OUTPUT_DIR=tmp_path / "run")
    assert result.returncode == 42 and requeues(log) == []
    assert "not requeued: MAX_REQUEUES=3 requeues reached" in result.stderr


def test_the_batch_script_needs_output_dir(fake_slurm, tmp_path):
    result = sbatch(tmp_path, fake_slurm[1])
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: OUTPUT_DIR is not set: set it to a directory on storage every node mounts at the same path"
    )


# --- two real workers -------------------------------------------------------------------------------------


def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_from_slurm_saves_exits_42_requeues_and_the_requeued_job_resumes_to_the_full_step_count(
    fake_slurm, tmp_path, tfds_data_dir
):
    _, env, log = fake_slurm
    run = tmp_path / "run"
    settings = {**SETTINGS, "OUTPUT_DIR": run, "TFDS_DATA_DIR": tfds_data_dir, "TMPDIR": tmp_path}
    output = tmp_path / "job.log"
    with open(output, "wb") as stream:
        job = subprocess.Popen(["bash", str(SLURM / "train.sbatch")], cwd=tmp_path, env=clean_env(**env, **settings),
                               stdout=stream, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: list(run.glob("checkpoints/ckpt-[1-9]*.index")), timeout=90)
        # What --signal=TERM@180 and preemption do: SIGTERM to every task (and, on preemption, the batch shell).
        tasks = [int(pid) for pid in Path(f"{log}.pids").read_text().split()]
        for pid in [*tasks, job.pid]:
            os.kill(pid, signal.SIGTERM)
        assert job.wait(timeout=60) == 42, output.read_text()[-3000:]
    finally:
        job.kill()
    assert requeues(log) == ["requeue 4242"]
    assert "exit 42 (stopped after saving a checkpoint): requeueing" in output.read_text()
    stopped = read_summary(run)
    assert stopped["interrupted"] and stopped["workers"] == 2 and 0 < stopped["steps"] < 200

    again = sbatch(tmp_path, env | {"SLURM_RESTART_COUNT": "1"}, **settings)  # what the requeue starts
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    summary = read_summary(run)
    assert summary["resumed_from_step"] == stopped["steps"]
    assert summary["steps"] == summary["total_steps"] == 200 and not summary["interrupted"]
    assert requeues(log) == ["requeue 4242"]


# --- tune.sbatch: an array job, each element `python -m train tune` against one shared storage ----------------

FAKE_TUNE = """#!/bin/sh
# fake python for `-m train tune` only: print its arguments and STUDY_DIR, exit FAKE_EXIT
echo "args: $*"; echo "STUDY_DIR=$STUDY_DIR"; exit "${FAKE_EXIT:-0}"
"""


def tune_sbatch(tmp_path: Path, fake_slurm, code: int, **env: str) -> subprocess.CompletedProcess:
    bin_dir, slurm_env, _ = fake_slurm
    (bin_dir / "fake-tune").write_text(FAKE_TUNE)
    (bin_dir / "fake-tune").chmod(0o755)
    env = slurm_env | {"PYTHON": str(bin_dir / "fake-tune"), "FAKE_EXIT": str(code), "SLURM_ARRAY_JOB_ID": "4242",
                       "SLURM_ARRAY_TASK_ID": "3"} | env  # fmt: skip
    return subprocess.run(["bash", str(SLURM / "tune.sbatch"), "--trials", "8", "--space", "BATCH_SIZE=32|64"],
                          cwd=tmp_path, env=clean_env(**env), capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize(("code", "requeued"), [(42, True), (0, False), (1, False), (2, False)])
def test_the_tune_array_element_runs_tune_on_the_shared_study_and_requeues_on_42_only(fake_slurm, tmp_path, code,
                                                                                      requeued):  # fmt: skip
    result = tune_sbatch(tmp_path, fake_slurm, code, STUDY_DIR=str(tmp_path / "study"))
    assert result.returncode == code, result.stderr
    study = tmp_path / "study"
    assert result.stdout.splitlines() == [
        f"args: -m train tune --storage journal:{study}/study.journal --index 3 --jobs 1 --trials 8 --space "
        "BATCH_SIZE=32|64",
        f"STUDY_DIR={study}",
    ]
    assert requeues(fake_slurm[2]) == (["requeue 4242_3"] if requeued else [])


def test_the_tune_array_element_needs_study_dir(fake_slurm, tmp_path):
    result = tune_sbatch(tmp_path, fake_slurm, 0)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "error: STUDY_DIR is not set: set it to a directory on storage every node mounts at the same path"
    ]
