"""Stops, kills, corrupt checkpoints, NaN, unwritable or full disks and bad input: each in a real process,
asserting both what the user sees and that nothing was lost."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    clean_env,
    copy_data_dir,
    read_summary,
    run_python,
    run_train,
    same_weights,
    start_train,
)
from train.errors import SettingsError

QUICK = {"EPOCHS": 2, "STEPS_PER_EPOCH": 40, "CHECKPOINT_EVERY": 25, "LOG_EVERY": 20, "KEEP_CHECKPOINTS": 3}
# Long enough to be stopped, killed or filled up mid-run after its first checkpoint (600 steps, 15 saves);
# epochs of 300 steps are not whole passes (512 steps), so a resume crosses a pass boundary mid-epoch.
LONG = {"BATCH_SIZE": 32, "EPOCHS": 2, "STEPS_PER_EPOCH": 300, "STEPS_PER_CALL": 4, "CHECKPOINT_EVERY": 40}
LONG |= {"LOG_EVERY": 1000}
ROOT = os.geteuid() == 0


def wait_for_checkpoint(output_dir: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not list(output_dir.glob("checkpoints/ckpt-[1-9]*.index")):
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tfds_data_dir) -> Path:
    """The reference: the LONG run, never stopped."""
    output_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = run_train("fit", cwd=output_dir.parent, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=output_dir, **LONG)
    assert result.returncode == 0, result.stderr[-3000:]
    return output_dir


@pytest.mark.slow
def test_sigterm_saves_exits_42_and_the_restart_ends_with_the_same_weights(tmp_path, tfds_data_dir, uninterrupted):
    output_dir = tmp_path / "run"
    settings = {"TFDS_DATA_DIR": tfds_data_dir, "OUTPUT_DIR": output_dir, **LONG}
    process = start_train("fit", cwd=tmp_path, **settings)
    wait_for_checkpoint(output_dir)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    took = time.monotonic() - signalled
    assert process.returncode == 42, stderr[-3000:]
    assert took < 10, f"save-and-exit took {took:.1f} s, more than docker stop's default grace"
    stopped = read_summary(output_dir)
    assert stopped["interrupted"] is True
    assert stopped["steps"] < stopped["total_steps"]
    assert stopped["checkpoint"].endswith(f"ckpt-{stopped['steps']}")
    assert "Stopped by SIGTERM" in stdout

    result = run_train("fit", cwd=tmp_path, **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = read_summary(output_dir)
    assert resumed["resumed_from_step"] == stopped["steps"]
    assert resumed["steps"] == read_summary(uninterrupted)["steps"]
    assert same_weights(output_dir / "model.keras", uninterrupted / "model.keras")


@pytest.mark.slow
def test_ctrl_c_is_acknowledged_at_once_then_saves_and_exits_42(tmp_path, tfds_data_dir):
    output_dir = tmp_path / "run"
    process = start_train("fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=output_dir, **LONG)
    wait_for_checkpoint(output_dir)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 42, stderr[-3000:]
    assert "Ctrl-C: stopping at the next safe point (after the current call, with a checkpoint)" in stderr
    assert "Stopped by SIGINT" in stdout and read_summary(output_dir)["interrupted"] is True


@pytest.mark.slow
def test_sigkill_loses_only_steps_after_the_last_checkpoint_and_ends_with_the_same_weights(
    tmp_path, tfds_data_dir, uninterrupted
):
    output_dir = tmp_path / "run"
    settings = {"TFDS_DATA_DIR": tfds_data_dir, "OUTPUT_DIR": output_dir, **LONG}
    process = start_train("fit", cwd=tmp_path, **settings)
    wait_for_checkpoint(output_dir)
    time.sleep(0.3)  # somewhere in the middle of steps or of a save
    process.kill()
    process.communicate()
    assert not (output_dir / "summary.json").exists()
    assert (output_dir / ".lock").is_file()  # the dead process's lock file stays; its lock went with it

    result = run_train("fit", cwd=tmp_path, **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(output_dir)
    assert summary["resumed_from_step"] > 0
    assert summary["steps"] == read_summary(uninterrupted)["steps"]
    assert same_weights(output_dir / "model.keras", uninterrupted / "model.keras")


def corrupt(prefix: Path) -> None:
    data = next(prefix.parent.glob(prefix.name + ".data-*"))
    data.write_bytes(data.read_bytes()[:40])  # truncated, as by a crash or a full disk


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, tfds_data_dir) -> Path:
    """One QUICK run (checkpoints 25, 50, 75 and 80 kept), trained once for the tests that damage a copy of it or
    only read it."""
    folder = tmp_path_factory.mktemp("quick")
    trained = run_train("fit", cwd=folder, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=folder / "run", **QUICK)
    assert trained.returncode == 0, trained.stderr[-3000:]
    return folder / "run"


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one_with_a_warning(tmp_path, tfds_data_dir, quick_run):
    output_dir = tmp_path / "run"
    settings = {"TFDS_DATA_DIR": tfds_data_dir, "OUTPUT_DIR": output_dir, **QUICK}
    shutil.copytree(quick_run, output_dir)
    (output_dir / "summary.json").unlink()
    corrupt(output_dir / "checkpoints" / "ckpt-80")

    result = run_train("fit", cwd=tmp_path, **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning: checkpoint ckpt-80 does not load" in result.stdout
    assert "ckpt-80 could not be loaded; resuming from the previous one, ckpt-75." in result.stdout
    summary = read_summary(output_dir)
    assert (summary["resumed_from_step"], summary["steps"]) == (75, 80)


def test_no_loadable_checkpoint_is_an_error_that_leaves_them_as_they_are(tmp_path, tfds_data_dir, quick_run):
    output_dir = tmp_path / "run"
    settings = {"TFDS_DATA_DIR": tfds_data_dir, "OUTPUT_DIR": output_dir, **QUICK}
    shutil.copytree(quick_run, output_dir)
    for index in (output_dir / "checkpoints").glob("ckpt-*.index"):
        corrupt(index.with_suffix(""))
    before = {p.name: p.read_bytes() for p in (output_dir / "checkpoints").iterdir()}

    result = run_train("fit", cwd=tmp_path, **settings)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: no checkpoint in ")
    assert "They are left as they are" in result.stderr
    assert {p.name: p.read_bytes() for p in (output_dir / "checkpoints").iterdir()} == before


def test_under_float16_loss_scaling_a_divergence_is_told_from_an_overflow(tmp_path, tfds_data_dir):
    """Every step overflows at this learning rate: each is skipped and halves the scale, until it is below 1."""
    result = run_train(
        "fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run", LEARNING_RATE="1e30",
        MIXED_PRECISION="mixed_float16", LOG_EVERY=1, STEPS_PER_EPOCH=40, EPOCHS=1,
    )  # fmt: skip
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training diverged by step "), last
    assert "float16 overflowed so often that the loss scale fell to 0.5" in last
    assert "stopped without saving these weights" in last


def test_a_float16_run_reports_its_loss_scale_and_skipped_steps_and_float32_none(tmp_path, tfds_data_dir):
    for precision in ("mixed_float16", "off"):
        output_dir = tmp_path / precision
        result = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=output_dir, EPOCHS=1,
                           STEPS_PER_EPOCH=20, MIXED_PRECISION=precision, CPU_DEVICES=2)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        summary = read_summary(output_dir)
        if precision == "off":
            assert (summary["loss_scale"], summary["skipped_steps"]) == (None, 0)
        else:
            # Keras's dynamic loss scale starts at 2^15 and grows only after 2000 good steps: 20 steps, no overflow
            assert (summary["loss_scale"], summary["skipped_steps"]) == (32768.0, 0)


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, tfds_data_dir):
    output_dir = tmp_path / "run"
    result = run_train(
        "fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=output_dir, LEARNING_RATE="1e30", LOG_EVERY=1
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the training loss became nan by step ")
    assert "stopped without saving these weights" in last
    assert [p.name for p in (output_dir / "checkpoints").glob("*.index")] == ["ckpt-0.index"]
    assert not (output_dir / "summary.json").exists()


@pytest.fixture
def small_filesystem(tmp_path):
    """A tmpfs of its own (root only), so a full or read-only disk is real, not simulated."""
    if not ROOT or not shutil.which("mount"):
        pytest.skip("needs root to mount a tmpfs")
    mounts = []

    def mount(size: str, read_only: bool = False) -> Path:
        point = tmp_path / f"fs{len(mounts)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounts.append(point)
        return point

    yield mount
    for point in mounts:
        subprocess.run(["umount", "-l", str(point)], check=False)


def test_unwritable_output_dir_is_found_before_any_device_work(tmp_path, small_filesystem):
    read_only = small_filesystem("8m", read_only=True)
    result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=read_only / "run")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: OUTPUT_DIR={read_only / 'run'} is not writable by UID {os.getuid()} (Read-only file system at "
        f"{read_only}): use another OUTPUT_DIR"
    )
    assert "No GPU found" not in result.stdout  # devices were never touched


def test_output_dir_without_permission_says_to_fix_the_owner(tmp_path, monkeypatch):
    """Root writes anywhere, so the denial is faked at the probe's `open`, the one write check_output_dir makes."""
    from train import rundir

    def denied(path, mode="r", *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(rundir, "open", denied, raising=False)
    with pytest.raises(SettingsError) as caught:
        rundir.check_output_dir(tmp_path / "run")
    assert str(caught.value) == (
        f"OUTPUT_DIR={tmp_path / 'run'} is not writable by UID {os.getuid()} (Permission denied at {tmp_path}): "
        "fix the owner or permissions (docker: build the image with this UID), or use another OUTPUT_DIR"
    )


def test_full_disk_at_start_is_found_before_any_device_work(tmp_path, small_filesystem):
    tiny = small_filesystem("512k")
    result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tiny / "run")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: OUTPUT_DIR={tiny / 'run'} is on a full filesystem: free space at {tiny}"
    assert list(tiny.iterdir()) == []


@pytest.mark.slow
def test_disk_filling_up_mid_run_ends_clearly_and_the_previous_checkpoint_still_loads(
    tmp_path, tfds_data_dir, small_filesystem
):
    disk = small_filesystem("80m")
    output_dir = disk / "run"
    settings = {"TFDS_DATA_DIR": tfds_data_dir, "OUTPUT_DIR": output_dir, **LONG}
    process = start_train("fit", cwd=tmp_path, **settings)
    wait_for_checkpoint(output_dir)
    filler = disk / "filler"
    with open(filler, "wb") as stream:  # another process takes every byte left
        try:
            while True:
                stream.write(b"\0" * (1 << 20))
                stream.flush()
        except OSError:
            pass
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: could not write checkpoint ckpt-") or last.startswith("error: could not export")
    assert "is intact: free space and run again" in last

    filler.unlink()
    result = run_train("fit", cwd=tmp_path, **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(output_dir)
    assert summary["resumed_from_step"] > 0
    assert summary["steps"] == summary["total_steps"]


@pytest.mark.parametrize(
    ("in_memory", "missing"),
    [("true", "*train.tfrecord*"), ("false", "*train.tfrecord*"), ("true", "dataset_info.json")],
)
def test_damaged_data_dir_is_a_clear_error_and_is_left_as_it_was(tmp_path, tfds_data_dir, in_memory, missing):
    data_dir = tmp_path / "data"
    copy_data_dir(tfds_data_dir, data_dir)
    shutil.rmtree(data_dir / "synthetic_clusters/1.0.0/train-arrays-cache", ignore_errors=True)
    next(data_dir.glob(f"synthetic_clusters/1.0.0/{missing}")).unlink()
    before = sorted(p.name for p in data_dir.rglob("*"))
    result = run_train(
        "fit", cwd=tmp_path, TFDS_DATA_DIR=data_dir, OUTPUT_DIR=tmp_path / "run", DATA_IN_MEMORY=in_memory
    )
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: DATASET=synthetic_clusters/1.0.0 in ")
    assert "incomplete or damaged; delete that directory and run again to prepare it anew" in last
    assert sorted(p.name for p in data_dir.rglob("*")) == before
    assert not (tmp_path / "run").exists()


def test_streamed_file_damaged_past_its_first_example_ends_training_in_one_line(tmp_path, tfds_data_dir):
    data_dir = tmp_path / "data"
    copy_data_dir(tfds_data_dir, data_dir)
    shard = next(data_dir.glob("synthetic_clusters/1.0.0/*train.tfrecord*"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # the first examples still read
    result = run_train(
        "fit", cwd=tmp_path, TFDS_DATA_DIR=data_dir, OUTPUT_DIR=tmp_path / "run", DATA_IN_MEMORY="false", EPOCHS=1
    )
    assert result.returncode == 1, result.stderr[-3000:]
    # TensorFlow's C++ log may add a line of its own after ours (its iterator going away): ours is the error.
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1
    assert errors[0].startswith("error: reading the streamed synthetic_clusters/1.0.0 failed while training (")
    assert "the last checkpoint " in errors[0] and "Traceback" not in result.stderr


FAILING_DOWNLOAD = '''
import tensorflow_datasets as tfds

class UnreachableData(tfds.core.GeneratorBasedBuilder):
    """A dataset whose download fails, as on a machine without network."""
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(4, 4, 1)), "label": tfds.features.ClassLabel(num_classes=2)}))

    def _split_generators(self, dl_manager):
        # what TFDS leaves of a download that fails: the empty folder it was going to write to
        (dl_manager.download_dir / "unreachable_data" / "images.gz.tmp.0123").mkdir(parents=True)
        raise ConnectionError("Failed to resolve 'data.example.invalid' (faked by the test)")

    def _generate_examples(self):
        yield from ()
'''


def test_failed_download_is_a_clear_error_and_leaves_the_data_dir_usable(tmp_path, tfds_data_dir):
    package = tmp_path / "builders" / "unreachable_data"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAILING_DOWNLOAD)
    data_dir = tmp_path / "data"
    copy_data_dir(tfds_data_dir, data_dir)
    before = sorted(data_dir.rglob("*"))
    script = "import sys, unreachable_data\nfrom train.cli import app\napp(sys.argv[1:], prog_name='train')\n"
    env = clean_env(TFDS_DATA_DIR=data_dir, OUTPUT_DIR=tmp_path / "run", DATASET="unreachable_data")
    env["PYTHONPATH"] += os.pathsep + str(package.parent)
    result = run_python(["-c", script, "fit"], cwd=tmp_path, env=env)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: DATASET='unreachable_data' is not prepared in {data_dir} and could not be made")
    assert "scripts/prepare-dataset.sh unreachable_data DIR, then set TFDS_DATA_DIR=DIR" in last
    assert not [p for p in data_dir.rglob("*") if "unreachable_data" in str(p)]
    lock = data_dir / ".train-local.lock"  # TFDS_DATA_DIR's lock (train/data/written.py): made once, kept
    assert sorted(p for p in data_dir.rglob("*") if p != lock) == before  # as it was
    assert run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=data_dir, OUTPUT_DIR=tmp_path / "ok", **QUICK).returncode == 0


OFFLINE_DOWNLOAD = """
import tensorflow_datasets as tfds

class OfflineData(tfds.core.GeneratorBasedBuilder):
    \"\"\"A dataset that downloads from a host that refuses (a port on 127.0.0.1 nobody listens on).\"\"\"
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(4, 4, 1)), "label": tfds.features.ClassLabel(num_classes=2)}))

    def _split_generators(self, dl_manager):
        path = dl_manager.download_and_extract({"train": "http://127.0.0.1:PORT/train.tar.gz"})
        return {"train": self._generate_examples(path)}

    def _generate_examples(self, path):
        yield from ()
"""


def test_a_download_host_that_cannot_be_reached_is_said_within_seconds(tmp_path):
    """Not TFDS's minutes of retries: a plain connect first, to a port on 127.0.0.1 that refuses."""
    from train.cluster.launch import free_ports

    package = tmp_path / "builders" / "offline_data"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(OFFLINE_DOWNLOAD.replace("PORT", str(free_ports(1)[0])))
    # TensorFlow loaded first, and the moment said (CLOCK_MONOTONIC is the machine's): the 10 s are the run's own
    script = (
        "import sys, time, tensorflow, offline_data\nprint('loaded at', time.monotonic(), file=sys.stderr)\n"
        "from train.cli import app\napp(sys.argv[1:], prog_name='train')\n"
    )
    env = clean_env(TFDS_DATA_DIR=tmp_path / "data", OUTPUT_DIR=tmp_path / "run", DATASET="offline_data")
    env["PYTHONPATH"] += os.pathsep + str(package.parent)
    result = run_python(["-c", script, "fit"], cwd=tmp_path, env=env)
    ended = time.monotonic()
    loaded = float(next(line for line in result.stderr.splitlines() if line.startswith("loaded at ")).split()[-1])
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: DATASET='offline_data' is not prepared in "), last
    assert "the download host 127.0.0.1:" in last and "cannot be reached" in last
    assert "on a machine with network run scripts/prepare-dataset.sh offline_data DIR" in last
    assert ended - loaded < 10, ended - loaded
    assert "urllib3" not in result.stderr and "Retrying" not in result.stderr


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"GPUS": "0,0"}, "error: GPUS='0,0' names a GPU twice"),
        ({"GPUS": "-1"}, "error: GPUS='-1' is not allowed"),
        ({"GPUS": "a"}, "error: GPUS='a' is not allowed"),
        ({"GPUS": " "}, "error: GPUS=' ' is not allowed"),
        (
            {"MEMORY_GROWTH": "true", "GPU_MEMORY_LIMIT_MB": "1000"},
            "error: GPU_MEMORY_LIMIT_MB=1000 cannot be combined",
        ),
        ({"BATCH_SIZE": "0"}, "error: BATCH_SIZE='0' is not allowed"),
        ({"EPOCHS": "-1"}, "error: EPOCHS='-1' is not allowed"),
        ({"STEPS_PER_EPOCH": "ten"}, "error: STEPS_PER_EPOCH='ten' is not allowed"),
        ({"CHECKPOINT_EVERY": "0"}, "error: CHECKPOINT_EVERY='0' is not allowed"),
        ({"KEEP_CHECKPOINTS": "x"}, "error: KEEP_CHECKPOINTS='x' is not allowed"),
        ({"LEARNING_RATE": "0"}, "error: LEARNING_RATE='0' is not allowed"),
        ({"STRATEGY": "tpu"}, "error: STRATEGY='tpu' is not allowed"),
    ],
)
def test_bad_input_in_a_real_process_is_one_line_exit_2_and_nothing_written(tmp_path, settings, expected):
    result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "run", **settings)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(expected)
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_malformed_dotenv_line_is_refused_and_a_typo_is_warned(tmp_path):
    (tmp_path / ".env").write_text("EPOCHS=2\nBATCHSIZE=64\nGPUS 0\n")
    result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "error: .env:3: cannot read 'GPUS 0': use NAME=value, one per line"
    assert not (tmp_path / "run").exists()

    (tmp_path / ".env").write_text("BATCHSIZE=64\nEPOCHS=0\n")
    result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "run")
    assert result.stderr.splitlines()[0] == "warning: .env: BATCHSIZE is not a setting; did you mean BATCH_SIZE?"


def test_resume_ignores_checkpoints_named_outside_the_run_directory(tmp_path, tfds_data_dir, quick_run):
    elsewhere = quick_run  # only read
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint").write_text(
        f'model_checkpoint_path: "{elsewhere}/checkpoints/ckpt-80"\n'
        f'all_model_checkpoint_paths: "{elsewhere}/checkpoints/ckpt-80"\n'
    )
    result = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run, **QUICK)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(run)["resumed_from_step"] is None  # trained from scratch, elsewhere untouched
    assert "Resuming" not in result.stdout


MODEL_WITH_CODE = """
import sys, keras
model = keras.Sequential([keras.Input((32,)), keras.layers.Lambda(lambda x: x * 2), keras.layers.Dense(10)])
model.save(sys.argv[1])
"""


def test_exported_model_with_code_is_not_loaded_with_safe_mode_off(tmp_path, tfds_data_dir):
    run = tmp_path / "run"
    run.mkdir()
    assert run_python(["-c", MODEL_WITH_CODE, str(run / "model.keras")]).returncode == 0
    result = run_train("evaluate", "--exported", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {run / 'model.keras'} cannot be loaded safely")


def test_tensorboard_is_bound_to_localhost_unless_asked():
    dry_run = subprocess.run(["make", "-n", "tensorboard"], cwd=REPO, capture_output=True, text=True)
    assert "--host 127.0.0.1" in dry_run.stdout
    dry_run = subprocess.run(
        ["make", "-n", "tensorboard", "TENSORBOARD_HOST=0.0.0.0"], cwd=REPO, capture_output=True, text=True
    )
    assert "--host 0.0.0.0" in dry_run.stdout


@pytest.mark.slow
def test_a_second_fit_on_a_run_directory_in_use_is_refused_at_once_naming_its_holder(tmp_path, tfds_data_dir):
    output_dir = tmp_path / "run"
    settings = {"TFDS_DATA_DIR": tfds_data_dir, "OUTPUT_DIR": output_dir, **LONG}
    first = start_train("fit", cwd=tmp_path, **settings)
    try:
        wait_for_checkpoint(output_dir)
        written_at_start = [output_dir / name for name in (".lock", "settings.json", "run.json")]
        before = [path.stat().st_mtime_ns for path in written_at_start]
        started = time.monotonic()
        second = run_train("fit", cwd=tmp_path, fresh=True, **settings)
        took = time.monotonic() - started
        assert second.returncode == 75, second.stderr[-3000:]
        assert second.stderr.strip().splitlines() == [
            f"error: OUTPUT_DIR={output_dir} is in use: pid {first.pid} on host {socket.gethostname()} trains in "
            "it. Nothing was written; run again once it has ended (a restart policy may retry), or use another "
            "OUTPUT_DIR"
        ]
        print(f"refused in {took:.2f} s")  # a timing is printed, not asserted
        assert [path.stat().st_mtime_ns for path in written_at_start] == before  # (checkpoints: the first run's)
        evaluated = run_train("evaluate", cwd=tmp_path, **settings)  # evaluate only reads: it may run beside
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    finally:
        first.kill()
        first.communicate()


HOLD = (
    "import sys, time; from pathlib import Path; from train.rundir import RunLock\n"
    "lock = RunLock(Path(sys.argv[1])); lock.acquire(); print('held', flush=True); time.sleep(60)"
)


def test_the_lock_is_the_kernels_one_writer_and_a_dead_holder_leaves_none(tmp_path):
    """Without TensorFlow: another process takes the lock, then is SIGKILLed (as a lost pod's process is)."""
    from train.errors import BusyError
    from train.rundir import RunLock, holder

    holding = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], env=clean_env(),
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holding.stdout.readline().strip() == "held"
        assert holder(tmp_path / "run") == f"pid {holding.pid} on host {socket.gethostname()}"
        with pytest.raises(BusyError, match=f"pid {holding.pid} on host"):
            RunLock(tmp_path / "run").acquire()
    finally:
        holding.kill()
        holding.wait()
    assert holder(tmp_path / "run") is None
    lock = RunLock(tmp_path / "run")
    lock.acquire()
    lock.release()
