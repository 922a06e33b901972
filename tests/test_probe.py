"""The batch probe, and running out of memory during fit.

Out-of-memory is faked at `train.step.TrainCalls`, the seam every real training call goes
through: above a threshold it raises TensorFlow's own ResourceExhaustedError instead of running.
"""

from __future__ import annotations

import json

from tests.conftest import clean_env, read_summary, run_python, run_train
from train.tools.probe import Trial, probe_batch_sizes


def fake_trial(threshold: int, calls: list[int]):
    def trial(batch: int) -> Trial:
        calls.append(batch)
        if batch > threshold:
            return Trial(batch, 2 * batch, fits=False, error="OOM")
        return Trial(batch, 2 * batch, fits=True, step_ms=1.0, examples_per_sec=float(batch))

    return trial


def test_probe_doubles_then_narrows_to_the_threshold_and_recommends_below_it():
    calls: list[int] = []
    probe = probe_batch_sizes(fake_trial(300, calls), start=16, cap=4096)
    assert calls[:6] == [16, 32, 64, 128, 256, 512]
    assert calls[6:] == [384, 320, 288]  # narrowing between 256 (fits) and 512 (OOM)
    assert (probe.largest_fit, probe.smallest_failure) == (288, 320)
    assert probe.recommended == 224  # 80% of 288, rounded down to a multiple of 8
    assert probe.recommended < 300


def test_probe_stops_at_the_cap_when_nothing_runs_out_of_memory():
    calls: list[int] = []
    probe = probe_batch_sizes(fake_trial(10**9, calls), start=16, cap=100, current=32)
    assert calls == [16, 32, 64, 100]
    assert probe.smallest_failure is None
    # Memory set no limit, so the trials measured speed alone: the batch asked for stays (not the fastest, 100).
    assert probe.recommended == 32
    assert "nothing ran out of memory up to the cap of 100" in probe.message
    assert "measured speed only" in probe.message
    assert probe.message.endswith("Recommended BATCH_SIZE=32: keep it")


def test_probe_says_so_when_even_the_first_batch_does_not_fit():
    probe = probe_batch_sizes(fake_trial(4, []), start=16, cap=4096)
    assert probe.recommended is None
    assert probe.message.startswith("even BATCH_SIZE=16 per replica runs out of memory")


FAKE_OOM = """
import sys, tensorflow as tf
from train.step import TrainCalls
real_call = TrainCalls.__call__
LIMIT = int(sys.argv[1])  # global batch above which the fake device is out of memory

def call(self, steps):
    if self.global_batch > LIMIT:
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (faked by the test)")
    return real_call(self, steps)

TrainCalls.__call__ = call
from train.cli import app
app(sys.argv[2:], prog_name="train")
"""


def run_with_fake_oom(limit: int, *args: str, cwd, **settings):
    return run_python(["-c", FAKE_OOM, str(limit), *args], cwd=cwd, env=clean_env(**settings))


def test_check_finds_the_fake_memory_limit_on_two_replicas(tmp_path, tfds_data_dir):
    result = run_with_fake_oom(
        600, "check", "--json", str(tmp_path / "check.json"), "--steps", "2", cwd=tmp_path,
        TFDS_DATA_DIR=tfds_data_dir, CPU_DEVICES=2,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads((tmp_path / "check.json").read_text())
    assert payload["resolved"]["replicas"] == 2
    assert payload["largest_fit"] * 2 <= 600 < payload["smallest_failure"] * 2
    assert payload["recommended_batch_size"] * 2 < 600
    assert "Recommended BATCH_SIZE=" in result.stdout


def test_out_of_memory_during_fit_is_a_clear_error_with_the_checkpoint_intact(tmp_path, tfds_data_dir):
    run = tmp_path / "run"
    result = run_with_fake_oom(
        100, "fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run, BATCH_SIZE=128, EPOCHS=1
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: out of memory at BATCH_SIZE=128 per replica (global batch 128); memory:")
    assert "Lower BATCH_SIZE (e.g. 64), set MEMORY_GROWTH=true" in last
    assert (run / "checkpoints" / "ckpt-0.index").is_file()
    assert not (run / "summary.json").exists()


def test_auto_batch_halves_the_batch_and_finishes(tmp_path, tfds_data_dir):
    run = tmp_path / "run"
    settings = dict(TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run, BATCH_SIZE=128, EPOCHS=1, AUTO_BATCH="true")
    result = run_with_fake_oom(40, "fit", cwd=tmp_path, CPU_DEVICES=2, **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "AUTO_BATCH: out of memory at BATCH_SIZE=128" in result.stdout
    assert "AUTO_BATCH: out of memory at BATCH_SIZE=64" in result.stdout
    summary = read_summary(run)
    assert (summary["per_replica_batch"], summary["global_batch"]) == (16, 32)  # 128 -> 64 -> 32 -> 16
    assert summary["steps"] == summary["total_steps"] == 16384 // 32


TRAINABLE = """
import json, sys, tensorflow as tf
# the model's trainable weights, as a checkpoint saves them (under the optimizer's _trainable_variables)
values = [{key: tf.train.load_checkpoint(prefix).get_tensor(key).tolist()
           for key in tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
           if key.startswith("optimizer/_trainable_variables/")} for prefix in sys.argv[1:]]
print(json.dumps(values[0] == values[1] and bool(values[0])))
"""


def test_auto_batch_retries_from_the_weights_init_from_gave_and_applies_them_once(tmp_path, tfds_data_dir):
    """INIT_FROM (issue 45) is applied before the step-0 checkpoint, which AUTO_BATCH's retries restore."""
    common = dict(TFDS_DATA_DIR=tfds_data_dir, EPOCHS=1, STEPS_PER_EPOCH=4)
    first = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "a", BATCH_SIZE=32, **common)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "b"
    settings = dict(OUTPUT_DIR=run, BATCH_SIZE=128, AUTO_BATCH="true", INIT_FROM=tmp_path / "a", **common)
    result = run_with_fake_oom(40, "fit", cwd=tmp_path, CPU_DEVICES=2, **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "AUTO_BATCH: out of memory at BATCH_SIZE=128" in result.stdout
    assert result.stdout.count(f"INIT_FROM={tmp_path / 'a'}: ") == 1  # matched and applied once, retries or not
    summary = read_summary(run)
    assert summary["per_replica_batch"] < 128 and summary["initialized_from"]["left_out"] == {}
    same = run_python(
        ["-c", TRAINABLE, str(run / "checkpoints" / "ckpt-0"), str(tmp_path / "a" / "checkpoints" / "ckpt-4")]
    )
    assert same.returncode == 0, same.stderr[-3000:]
    assert same.stdout.strip().splitlines()[-1] == "true"  # step 0, after the retries: run A's weights


def test_check_runs_for_real_on_two_logical_cpus(tmp_path, tfds_data_dir):
    result = run_train(
        "check", "--max-batch", "256", "--steps", "2", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, CPU_DEVICES=2
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nothing ran out of memory up to the cap of 256 per replica" in result.stdout
    assert "retracing" not in result.stderr  # a new trace per batch size is the point of the trials
