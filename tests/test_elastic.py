"""A run resumed on other hardware: GLOBAL_BATCH_SIZE keeps the global batch, and with it the data order and
the math; without it, EPOCHS still counts passes over the data. TensorFlow runs in processes of their own."""

from __future__ import annotations

import json

import pytest

from tests.conftest import clean_env, read_summary, run_python, run_train
from tests.harness.runs import back_to, moved_copy, relative_difference

# The global batches a run reads from step START on (each one's examples, by their place in the split, every
# replica's slice in replica order), as `fit` makes them on these devices.
ORDER = """
import json, sys
import numpy as np
from train.data import load_data
from train.data.feeds import train_dataset
from train.data.source import Split
from train.devices.runtime import setup_runtime
from train.model_file import load_model_file
from train.settings import load_settings

settings = load_settings()
runtime = setup_runtime(settings)
data = load_data(settings, load_model_file(settings.model))
if isinstance(data.train, Split):
    rows = data.train.features
else:
    rows = np.concatenate([features.numpy() for features, _ in data.train.read(shuffle_files=False).batch(4096)])
index = {row.tobytes(): i for i, row in enumerate(rows)}
start, steps = int(sys.argv[2]), int(sys.argv[3])
iterator = iter(train_dataset(runtime.strategy, data.train, runtime.global_batch, settings.seed, start))
batches = []
for _ in range(steps):
    parts = runtime.strategy.experimental_local_results(next(iterator)[0])
    batches.append([index[row.tobytes()] for part in parts for row in part.numpy()])
json.dump({"replicas": runtime.replicas, "global_batch": runtime.global_batch, "batches": batches},
          open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("in_memory", ["true", "false"])
def test_with_global_batch_size_one_and_two_devices_read_the_same_global_batches(tmp_path, tfds_data_dir, in_memory):
    """From a step in the middle of a pass (and on into the next), the global batches 2 replicas read are those
    1 device reads: in memory, and streamed (one input pipeline per worker, whatever its devices)."""
    read = {}
    for replicas in (1, 2):
        output = tmp_path / f"order{replicas}.json"
        env = clean_env(TFDS_DATA_DIR=tfds_data_dir, DATA_IN_MEMORY=in_memory, CPU_DEVICES=replicas,
                        GLOBAL_BATCH_SIZE=1024, BATCH_SIZE=None)  # fmt: skip
        result = run_python(["-c", ORDER, str(output), "10", "12"], cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        read[replicas] = json.loads(output.read_text())
        assert (read[replicas]["replicas"], read[replicas]["global_batch"]) == (replicas, 1024)
    assert read[1]["batches"] == read[2]["batches"]  # steps 10-21: the rest of pass 0 (16 batches) and pass 1
    assert len({i for batch in read[1]["batches"][:6] for i in batch}) == 6 * 1024


# 3 epochs of 40 steps, a checkpoint at each epoch's end (all kept): a run stopped at step 40, in the middle of a
# pass (64 batches of 256), is an uninterrupted run's copy taken back to its ckpt-40 (moved_copy)
ELASTIC = {"GLOBAL_BATCH_SIZE": 256, "BATCH_SIZE": None, "STEPS_PER_EPOCH": 40, "CHECKPOINT_EVERY": 40,
           "KEEP_CHECKPOINTS": 20, "LEARNING_RATE": 0.003}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)], ids=["2 -> 1 replicas", "1 -> 2 replicas"])
def test_a_run_resumed_on_another_replica_count_ends_where_the_uninterrupted_one_does(
    tmp_path, tfds_data_dir, before, after
):
    common = {**ELASTIC, "TFDS_DATA_DIR": tfds_data_dir, "EPOCHS": 3, "JIT_COMPILE": None}  # XLA decided per start
    straight = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "straight", CPU_DEVICES=before, **common)
    assert straight.returncode == 0, straight.stderr[-3000:]
    # Step 40 is in the middle of a pass (64 batches of 256): the resumed run must read on from there.
    moved_copy(tmp_path / "straight", tmp_path / "moved")
    moved = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "moved", CPU_DEVICES=after, **common)
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert "the global batch is" not in moved.stdout  # kept: nothing to warn of
    said = f"This start runs {after} replica(s) on 1 worker(s), the last one {before} on 1: chosen again"
    assert said in moved.stdout
    reference, summary = read_summary(tmp_path / "straight"), read_summary(tmp_path / "moved")
    assert (summary["steps"], summary["global_batch"], summary["replicas"]) == (120, 256, after)
    for name, value in reference["eval"].items():
        assert abs(summary["eval"][name] - value) <= 0.002, name
    assert relative_difference(tmp_path / "straight", tmp_path / "moved") < 1e-3
    starts = summary["starts"]
    assert [(s["first_step"], s["replicas"], s["global_batch"]) for s in starts] == [(0, before, 256), (40, after, 256)]
    # XLA is chosen again on the new devices: on for one CPU device, off mirrored over two
    assert [s["xla"] for s in starts] == [before == 1, after == 1]


@pytest.mark.slow
def test_two_workers_resumed_on_one_end_where_the_two_do(tmp_path, tfds_data_dir):
    from tests.test_multi_worker import WORKERS_MODEL, run_workers

    (tmp_path / "straight").mkdir()
    common = {**ELASTIC, **WORKERS_MODEL, "EPOCHS": 3, "STEPS_PER_CALL": 8}
    straight = run_workers(tmp_path / "straight", [{}, {}], tfds_data_dir, **common)
    assert [code for code, _ in straight] == [0, 0], straight[0][1][-3000:]
    moved_copy(tmp_path / "straight" / "run", tmp_path / "moved" / "run")  # 2 workers stopped at step 40
    moved = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "moved" / "run", TFDS_DATA_DIR=tfds_data_dir,
                      **common)  # fmt: skip
    assert moved.returncode == 0, moved.stderr[-3000:]
    reference, summary = read_summary(tmp_path / "straight" / "run"), read_summary(tmp_path / "moved" / "run")
    assert (reference["workers"], summary["workers"], summary["steps"]) == (2, 1, 120)
    for name, value in reference["eval"].items():
        assert abs(summary["eval"][name] - value) <= 0.002, name
    assert relative_difference(tmp_path / "straight" / "run", tmp_path / "moved" / "run") < 1e-3
    assert [s["workers"] for s in summary["starts"]] == [2, 1]


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1)], ids=["1 -> 2 devices", "2 -> 1 devices"])
def test_without_global_batch_size_epochs_still_count_passes_and_no_epoch_is_evaluated_twice(
    tmp_path, tfds_data_dir, before, after
):
    """The fault probe's cases: 3 epochs of the default split, stopped mid-epoch 1, resumed at the other
    global batch: 3 passes in all, each epoch's evaluation once, and a warning that names both batches."""
    run = tmp_path / "run"
    common = {"TFDS_DATA_DIR": tfds_data_dir, "OUTPUT_DIR": run, "EPOCHS": 3, "CHECKPOINT_EVERY": 40,
              "KEEP_CHECKPOINTS": 20}  # fmt: skip
    first = run_train("fit", cwd=tmp_path, CPU_DEVICES=before, **{**common, "EPOCHS": 1})  # its ckpt-40 is enough
    assert first.returncode == 0, first.stderr[-3000:]
    back_to(run, 40)  # 40 steps of 128 x `before` examples: in epoch 1
    resumed = run_train("fit", cwd=tmp_path, CPU_DEVICES=after, **common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    old, new = 128 * before, 128 * after
    warning = next(line for line in resumed.stdout.splitlines() if "the global batch is" in line)
    assert f"the global batch is {new} on this start, {old} before it" in warning and "GLOBAL_BATCH_SIZE" in warning
    assert [line.split()[1] for line in resumed.stdout.splitlines() if line.endswith(" eval:") or " eval: " in line
            ][:3] == ["1", "2", "3"]  # fmt: skip
    summary = read_summary(run)
    assert summary["resumed_from_step"] == 40
    assert summary["epochs_completed"] == 3 and summary["steps"] == summary["total_steps"]
    assert 40 * old + (summary["steps"] - 40) * new == 3 * 16_384  # EPOCHS x the split, in all
    assert [(s["first_step"], s["global_batch"]) for s in summary["starts"][-1:]] == [(40, new)]


def test_a_global_batch_that_does_not_divide_by_the_replicas_is_refused_before_anything_is_written(tmp_path):
    result = run_train("fit", cwd=tmp_path, GLOBAL_BATCH_SIZE=255, BATCH_SIZE=None, CPU_DEVICES=2,
                       OUTPUT_DIR=tmp_path / "run")  # fmt: skip
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: GLOBAL_BATCH_SIZE=255 does not divide by the 2 replicas") and "254 or 256" in error
    assert not (tmp_path / "run").exists()


# A streamed pass read by 2 workers for READ batches, then resumed on 1: what the 2 read (their own input
# pipelines, reading the files), and what the 1 reads first (the rest of that pass), each example by its place.
REMAINDER = """
import json, sys
import numpy as np
import tensorflow as tf
from train.data import load_data
from train.data.feeds import train_dataset
from train.data.source import Remainder
from train.devices.runtime import setup_runtime
from train.model_file import load_model_file
from train.settings import load_settings

settings = load_settings()
runtime = setup_runtime(settings)
data = load_data(settings, load_model_file(settings.model))
split, batch, seed = data.train, runtime.global_batch, settings.seed
rows = np.concatenate([features.numpy() for features, _ in split.read(shuffle_files=False).batch(4096)])
index = {row.tobytes(): i for i, row in enumerate(rows)}
read_batches, pass_number = int(sys.argv[2]), 1
read = [index[row.tobytes()] for worker in range(2) for features, _ in
        split.batches(worker, 2, seed, pass_number, batch // 2).take(read_batches) for row in features.numpy()]
marks = split.remainder_marks(seed, pass_number, 2, batch // 2, read_batches, 1)
length = int(marks[0].sum()) // batch
pass_batches = split.pass_batches(batch, 1)
remainder = Remainder(pass_number, tuple(marks), length)
start = (pass_number + 1) * pass_batches
iterator = iter(train_dataset(runtime.strategy, split, batch, seed, start, remainder=remainder))
rest = [index[row.tobytes()] for _ in range(length) for row in next(iterator)[0].numpy()]
following = [index[row.tobytes()] for _ in range(pass_batches) for row in next(iterator)[0].numpy()]
json.dump({"examples": len(rows), "read": read, "rest": rest, "following": following, "batch": batch},
          open(sys.argv[1], "w"))
"""


def test_a_streamed_pass_resumed_on_fewer_workers_reads_every_unread_example_once(tmp_path, tfds_data_dir):
    output = tmp_path / "remainder.json"
    env = clean_env(TFDS_DATA_DIR=tfds_data_dir, DATA_IN_MEMORY="false", GLOBAL_BATCH_SIZE=1024, BATCH_SIZE=None)
    result = run_python(["-c", REMAINDER, str(output), "5"], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(output.read_text())
    read, rest, batch, examples = found["read"], found["rest"], found["batch"], found["examples"]
    assert len(read) == 5 * batch and len(set(read)) == len(read)  # what the 2 workers had read of the pass
    assert not set(read) & set(rest) and len(set(rest)) == len(rest)  # the rest: none again, none twice
    assert examples - len(read) - len(rest) < batch  # every example not yet read, but for less than a batch
    following = found["following"]  # the next pass, whole, in the 1 worker's order
    assert len(set(following)) == len(following) == examples // batch * batch


@pytest.mark.slow
def test_streamed_two_workers_resumed_on_one_mid_pass_finish_that_pass_then_train_the_rest(tmp_path, tfds_data_dir):
    from tests.test_multi_worker import WORKERS_MODEL, run_workers

    common = {**ELASTIC, **WORKERS_MODEL, "STEPS_PER_EPOCH": None, "EPOCHS": 2, "DATA_IN_MEMORY": "false",
              "CHECKPOINT_EVERY": 20, "KEEP_CHECKPOINTS": 20, "STEPS_PER_CALL": 4}  # fmt: skip
    first = run_workers(tmp_path, [{}, {}], tfds_data_dir, **{**common, "EPOCHS": 1})  # pass 0: its ckpt-20 is enough
    assert [code for code, _ in first] == [0, 0], first[0][1][-3000:]
    run = tmp_path / "run"
    back_to(run, 20)  # 20 of the pass's 64 global batches of 256
    resumed = run_train("fit", cwd=tmp_path, OUTPUT_DIR=run, TFDS_DATA_DIR=tfds_data_dir, **common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = "The run stopped in pass 0 after 20 of its batches on 2 worker(s); on 1 it reads first the 11,264 "
    assert said in resumed.stdout
    summary = read_summary(run)
    # 11,264 examples left of pass 0: 44 steps of 256, then pass 1 whole (64 steps); each epoch evaluated once
    assert (summary["steps"], summary["epochs_completed"], summary["resumed_from_step"]) == (128, 2, 20)
    assert [line.split()[1] for line in resumed.stdout.splitlines() if " eval: " in line] == ["1", "2"]


@pytest.mark.slow
def test_one_worker_resumed_on_two_ends_where_the_one_does(tmp_path, tfds_data_dir):
    from tests.test_multi_worker import WORKERS_MODEL, run_workers

    common = {**ELASTIC, **WORKERS_MODEL, "EPOCHS": 3, "STEPS_PER_CALL": 8}
    straight = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "straight", TFDS_DATA_DIR=tfds_data_dir,
                         **common)  # fmt: skip
    assert straight.returncode == 0, straight.stderr[-3000:]
    moved_copy(tmp_path / "straight", tmp_path / "run")  # 1 worker stopped at step 40
    moved = run_workers(tmp_path, [{}, {}], tfds_data_dir, **common)  # the same OUTPUT_DIR: tmp_path / "run"
    assert [code for code, _ in moved] == [0, 0], moved[0][1][-3000:]
    reference, summary = read_summary(tmp_path / "straight"), read_summary(tmp_path / "run")
    assert (reference["workers"], summary["workers"], summary["steps"], summary["resumed_from_step"]) == (1, 2, 120, 40)
    for name, value in reference["eval"].items():
        assert abs(summary["eval"][name] - value) <= 0.002, name
    assert relative_difference(tmp_path / "straight", tmp_path / "run") < 1e-3
    assert [s["workers"] for s in summary["starts"]] == [1, 2]
