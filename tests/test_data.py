"""The input paths: splits in memory (rows gathered inside the step on CPUs, tf.data elsewhere) or streamed from
the TFDS files; what DATA_IN_MEMORY picks; the arrays cache. TensorFlow runs in fresh processes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import clean_env, copy_data_dir, read_summary, run_python, run_train, same_weights
from train.devices.host_memory import GIB, available_memory_bytes, fits_in_memory, memory_note

ORDER = """
import json, sys
import numpy as np
import tensorflow as tf
from train.data import load_data
from train.data.feeds import adapter, train_dataset
from train.data.source import Split
from train.devices.runtime import setup_runtime
from train.model_file import load_model_file
from train.settings import load_settings

settings = load_settings()
runtime = setup_runtime(settings)
data = load_data(settings, load_model_file(settings.model))
batch = runtime.global_batch
if isinstance(data.train, Split):
    rows = data.train.features
else:
    rows = np.concatenate([features.numpy() for features, _ in data.train.read(shuffle_files=False).batch(4096)])
index = {row.tobytes(): i for i, row in enumerate(rows)}  # an example's position in the split, from its features
assert len(index) == len(rows)
passes = len(data.train) // batch

def pipeline(start, stop):
    iterator = iter(train_dataset(runtime.strategy, data.train, batch, settings.seed, start))
    steps = []
    for _ in range(start, stop):
        parts = runtime.strategy.experimental_local_results(next(iterator)[0])
        steps.append([[index[row.tobytes()] for row in part.numpy()] for part in parts])
    return steps

result = {"replicas": runtime.replicas, "passes": passes, "in_memory": data.in_memory,
          "seen": pipeline(0, 2 * passes), "resumed": pipeline(passes // 2, 2 * passes)}
def gathered(start, stop, block, lengths=()):  # the rows each step gathers, in calls of these lengths (or `block`)
    feed = adapter(runtime.strategy, data.train).train_feed(batch, settings.seed, start, block)
    steps, call, shapes = [], 0, set()
    while len(steps) < stop - start:
        length = lengths[call % len(lengths)] if lengths else block
        args = feed.call_args(length)
        shapes.add(tuple(tuple(arg.shape) for arg in args))
        steps, call = steps + [rows_of(feed.step_args(args, step)) for step in range(length)], call + 1
    assert len(shapes) == 1  # every call's input has one shape: the step is traced once
    return steps[: stop - start]

def rows_of(step_args):  # each replica's examples: RowsFeed hands row numbers, BlocksFeed the batches themselves
    if result["feed"] == "RowsFeed":
        return step_args[2].numpy().tolist()
    return [[index[row.tobytes()] for row in part] for part in step_args[0].numpy()]

def taken(steps, block, lengths):  # what each replica's step takes from the call's input, in a graph
    feed = adapter(runtime.strategy, data.train).train_feed(batch, settings.seed, 0, block)
    jit = runtime.replicas == 1  # and compiled by XLA where fit would compile it (not mirrored on CPUs)
    take = tf.function(
        lambda args, step: runtime.strategy.run(feed.replica_batch, args=feed.step_args(args, step)), jit_compile=jit
    )
    seen, call = [], 0
    while len(seen) < steps:
        length = lengths[call % len(lengths)]
        args, call = feed.call_args(length), call + 1
        for step in range(length):
            parts = runtime.strategy.experimental_local_results(take(args, tf.constant(step))[0])
            seen.append([[index[row.tobytes()] for row in part.numpy()] for part in parts])
    return seen[:steps]

result["feed"] = type(adapter(runtime.strategy, data.train).train_feed(batch, settings.seed, 0, 5)).__name__
if result["feed"] in ("RowsFeed", "BlocksFeed"):
    result["taken"] = taken(passes, block=5, lengths=(5, 3, 1, 4))  # calls cut short, and run into the next block
    result["gathered"] = gathered(0, 2 * passes, block=5)
    result["gathered_resumed"] = gathered(passes // 2, 2 * passes, block=passes + 3)
    result["gathered_cut"] = gathered(0, 2 * passes, block=5, lengths=(5, 3, 1, 4))  # calls cut short, as fit's are
json.dump(result, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("in_memory", ["true", "false"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_every_example_once_per_pass_disjoint_replicas_and_a_resume_reads_the_same(
    tmp_path, tfds_data_dir, in_memory, replicas
):
    output = tmp_path / "order.json"
    examples, batch = 4096, 256  # a quarter of the split, read some ten times over (streamed, from its file)
    settings = {"TFDS_DATA_DIR": tfds_data_dir, "DATA_IN_MEMORY": in_memory, "CPU_DEVICES": replicas}
    env = clean_env(**settings, TRAIN_SPLIT=f"train[:{examples}]", BATCH_SIZE=batch // replicas)
    result = run_python(["-c", ORDER, str(output)], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    order = json.loads(output.read_text())
    assert order["replicas"] == replicas and order["in_memory"] == (in_memory == "true")
    passes = order["passes"]
    assert passes == examples // batch == 16
    seen = order["seen"]
    for pass_number in range(2):
        steps = seen[pass_number * passes : (pass_number + 1) * passes]
        read = [i for step in steps for part in step for i in part]
        assert all(len(step) == replicas and all(len(part) == batch // replicas for part in step) for step in steps)
        assert len(set(read)) == len(read) == examples  # once per pass, replicas disjoint
    assert seen[:passes] != seen[passes:]  # each pass in a new order
    assert order["resumed"] == seen[passes // 2 :]  # a restart mid-pass reads what the first run would have
    # On CPU devices the step gathers its batch, from the split (in memory) or from blocks of a call's batches
    # read ahead (streamed): the same batches as the tf.data pipeline.
    assert order["feed"] == ("RowsFeed" if in_memory == "true" else "BlocksFeed")
    assert order["gathered"] == seen
    assert order["taken"] == seen[:passes]  # each replica's step takes its own slice
    assert order["gathered_resumed"] == seen[passes // 2 :]  # calls longer than a pass, too
    assert order["gathered_cut"] == seen  # calls cut short, and calls that run into the next block


@pytest.mark.slow
def test_streamed_fit_learns_and_resumes_mid_pass_to_the_same_weights(tmp_path, tfds_data_dir):
    common = {
        "TFDS_DATA_DIR": tfds_data_dir, "DATA_IN_MEMORY": "false", "STEPS_PER_EPOCH": 30, "BATCH_SIZE": 64,
        "LEARNING_RATE": 0.01, "CHECKPOINT_EVERY": 1000, "TRAIN_SPLIT": "train[:4096]", "JIT_COMPILE": None,
    }  # fmt: skip
    straight = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "straight", EPOCHS=2, **common)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "DATA_IN_MEMORY=false: streaming the splits" in straight.stdout
    assert "data streamed from the TFDS files, batches read ahead a call at a time, XLA on" in straight.stdout
    summary = read_summary(tmp_path / "straight")
    assert summary["data_in_memory"] is False and summary["jit_compile"] is True
    assert summary["eval"]["accuracy"] > 0.5  # 10 classes: chance is 0.1

    first = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "resumed", EPOCHS=1, **common)
    assert first.returncode == 0, first.stderr[-3000:]
    # 30 of the split's 64 batches: the second run starts mid-pass and must skip what the first one read.
    second = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "resumed", EPOCHS=2, **common)
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = read_summary(tmp_path / "resumed")
    assert resumed["resumed_from_step"] == 30 and resumed["steps"] == summary["steps"] == 60
    assert same_weights(tmp_path / "resumed" / "model.keras", tmp_path / "straight" / "model.keras")


LOAD = """
import sys
from train.data import load_data
from train.model_file import load_model_file
from train.settings import load_settings
settings = load_settings()
data = load_data(settings, load_model_file(settings.model))
print(len(data.train), len(data.eval), float(data.train.features.sum()), int(data.eval.labels.sum()))
"""


def test_in_memory_splits_are_cached_beside_the_prepared_files_and_a_damaged_cache_is_read_anew(
    tmp_path, tfds_data_dir
):
    data_dir = tmp_path / "tensorflow_datasets"
    copy_data_dir(tfds_data_dir, data_dir)
    cache_dir = next(data_dir.glob("synthetic_clusters/*/")) / "train-arrays-cache"
    shutil.rmtree(cache_dir, ignore_errors=True)

    def load() -> str:
        result = run_python(["-c", LOAD], cwd=tmp_path, env=clean_env(TFDS_DATA_DIR=data_dir))
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout.strip().splitlines()[-1]

    from_tfds = load()
    caches = sorted(cache_dir.glob("*.npy"))
    assert [path.name.split("@")[0] for path in caches] == ["test", "train"]
    assert load() == from_tfds  # read back from the cache: the same arrays

    for path in caches:
        path.write_bytes(path.read_bytes()[:100])  # as a full disk or a crash elsewhere would leave it
    assert load() == from_tfds
    assert all(path.stat().st_size > 100_000 for path in caches)  # written anew, whole
    assert not list(cache_dir.glob("*.tmp"))


def test_data_in_memory_auto_counts_what_holding_costs_for_every_worker_on_the_host_and_says_so():
    assert fits_in_memory(4 * GIB, 16 * GIB)  # 1.5 x 4 = 6 GiB in half of 16
    assert fits_in_memory(4 * GIB, None)  # unknown: in memory
    assert not fits_in_memory(6 * GIB, 16 * GIB)  # 9 GiB: more than half
    assert not fits_in_memory(4 * GIB, 16 * GIB, workers_here=2)  # two copies on this host
    assert memory_note("auto", True, 4 * GIB, 16 * GIB, 1) is None
    note = memory_note("auto", False, 6 * GIB, 16 * GIB, 1)
    assert note.startswith("The splits need 6.0 GiB as stored, 16.0 GiB available: streaming")
    note = memory_note("auto", False, 4 * GIB, 16 * GIB, 2)
    assert note.startswith("The splits need 4.0 GiB as stored x 2 workers on this host, 16.0 GiB available")
    assert memory_note("true", False, 6 * GIB, 16 * GIB, 1).startswith("warning: DATA_IN_MEMORY=true")
    assert memory_note("false", True, 1, 16 * GIB, 1).startswith("DATA_IN_MEMORY=false: streaming")


def test_available_memory_is_the_least_of_the_host_and_the_container_headroom(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 25165824 kB\nMemAvailable: 20971520 kB\n")
    assert available_memory_bytes(tmp_path) == 20 * GIB
    cgroup = tmp_path / "sys/fs/cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.max").write_text(f"{8 * GIB}\n")
    (cgroup / "memory.current").write_text(f"{3 * GIB}\n")
    assert available_memory_bytes(tmp_path) == 5 * GIB
    (cgroup / "memory.max").write_text("max\n")  # no container limit
    assert available_memory_bytes(tmp_path) == 20 * GIB
    assert available_memory_bytes(tmp_path / "nowhere") is None
    assert available_memory_bytes() > 0  # this machine's own


def test_jit_compile_true_where_xla_cannot_compile_the_call_is_refused_before_anything_is_written(
    tmp_path, tfds_data_dir
):
    # auto strategy over 2 logical CPUs is mirrored: known only once the devices are, after TensorFlow starts.
    result = run_train(
        "fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run", CPU_DEVICES=2, JIT_COMPILE="true"
    )
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: JIT_COMPILE=true is not allowed with MirroredStrategy on CPU devices (2 replicas, CPU_DEVICES=2)"
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_default_fit_compiles_the_call_with_xla_and_mirrored_does_not(tmp_path: Path, tfds_data_dir):
    quick = {
        "TFDS_DATA_DIR": tfds_data_dir,
        "EPOCHS": 1,
        "STEPS_PER_EPOCH": 8,
        "STEPS_PER_CALL": 4,
        "JIT_COMPILE": None,
    }
    for replicas, jit in ((1, True), (2, False)):
        output_dir = tmp_path / f"run{replicas}"
        result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=output_dir, CPU_DEVICES=replicas, **quick)
        assert result.returncode == 0, result.stderr[-3000:]
        summary = read_summary(output_dir)
        assert summary["replicas"] == replicas and summary["jit_compile"] is jit and summary["data_in_memory"]
        assert f"batches gathered inside the step, XLA {'on' if jit else 'off'}" in result.stdout


UINT8 = """
import collections, hashlib, json
import numpy as np
from train.data import load_data, open_dataset
from train.model_file import load_model_file
from train.settings import load_settings
settings = load_settings()
experiment = load_model_file(settings.model)
data = load_data(settings, experiment)
features, tensor = data.train.features, data.train.tensors[0]
def examples(images, labels):
    return collections.Counter(hashlib.sha1(i.tobytes() + l.tobytes()).digest() for i, l in zip(images, labels))
streamed = open_dataset(settings, experiment).load(settings, in_memory=False).train  # the PNGs decoded chunk by chunk
read = list(streamed.batches(0, 1, settings.seed, 0, 128).as_numpy_iterator())
same = examples(features, data.train.labels) == examples(*(np.concatenate([b[k] for b in read]) for k in (0, 1)))
before = int(tensor[0, 0, 0, 0])
features[0, 0, 0, 0] ^= 1  # changed in the array: seen in the tensor only if they are the same memory
print(json.dumps({"dtype": features.dtype.name, "shape": list(features.shape), "held_bytes": data.spec.held_bytes,
                  "aligned": features.ctypes.data % 64 == 0, "shared": int(tensor[0, 0, 0, 0]) == before ^ 1,
                  "streamed_same": same}))
"""


def test_images_are_held_in_memory_as_stored_one_byte_a_value_shared_with_tensorflow_and_stream_the_same(
    tmp_path, examples_data_dir
):
    env = clean_env(TFDS_DATA_DIR=examples_data_dir, DATASET="synthetic_images", MODEL="examples.cnn")
    result = run_python(["-c", UINT8], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    held = json.loads(result.stdout.strip().splitlines()[-1])
    assert held["dtype"] == "uint8" and held["shape"] == [8192, 32, 32, 3]
    assert held["held_bytes"] == (8192 + 1024) * (32 * 32 * 3 + 8)  # what DATA_IN_MEMORY=auto counts
    assert held["aligned"] and held["shared"]  # TensorFlow's tensor is the array's memory: no copy
    assert held["streamed_same"]  # a streamed pass decodes exactly the images held in memory, each once


@pytest.mark.slow
def test_xla_compiles_a_streamed_call_and_learns_the_same(tmp_path, tfds_data_dir):
    """Streamed on a CPU device, each call is handed its blocks of batches: XLA compiles the whole call."""
    # 30 batches of 128 from a quarter of the split: one pass, and a quarter to evaluate at the end
    quick = {"TFDS_DATA_DIR": tfds_data_dir, "DATA_IN_MEMORY": "false", "EPOCHS": 1, "STEPS_PER_EPOCH": 30,
             "TRAIN_SPLIT": "train[:4096]"}  # fmt: skip
    losses, said = {}, {}
    for jit in ("true", "false"):
        result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / jit, JIT_COMPILE=jit, **quick)
        assert result.returncode == 0, result.stderr[-3000:]
        summary = read_summary(tmp_path / jit)
        assert summary["jit_compile"] is (jit == "true") and summary["data_in_memory"] is False
        losses[jit], said[jit] = summary["eval"]["loss"], result.stdout
    assert "batches read ahead a call at a time, XLA on (JIT_COMPILE=true)." in said["true"]
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-3)


REPLICA_STEP = """
import json, sys
import tensorflow as tf
from train.data import load_data
from train.data.feeds import train_dataset, PipelineFeed
from train.devices.runtime import setup_runtime
from train.model import build
from train.model_file import load_model_file
from train.settings import load_settings
from train.step import make_calls

settings = load_settings()
runtime = setup_runtime(settings)
data = load_data(settings, load_model_file(settings.model))
found = {}
for jit in (True, False):
    with runtime.strategy.scope():
        built = build(settings, load_model_file(settings.model), data.spec, runtime.strategy)
    feed = PipelineFeed(train_dataset(runtime.strategy, data.train, runtime.global_batch, settings.seed, 0))
    calls = make_calls(built, runtime.strategy, feed, runtime.global_batch, jit_compile=jit)
    for _ in range(3):
        result = calls(10)
    found[f"loss {jit}"] = result.loss
    # the replica step alone is compiled: its graph holds an XLA cluster, the iterator stays outside it
    graph = calls.function.get_concrete_function(feed.call_args(10), tf.constant(10)).graph.as_graph_def()
    functions = [function for function in graph.library.function if function.attr["_XlaMustCompile"].b]
    found[f"compiled {jit}"] = len(functions)
json.dump(found, open(sys.argv[1], "w"))
"""


def test_xla_compiles_the_replica_step_alone_under_a_tf_data_iterator_and_learns_the_same(tmp_path, tfds_data_dir):
    """What runs on GPUs and across workers (a tf.data iterator read each step, which XLA cannot compile),
    here on one CPU device: the fit path there is the blocks feed, so this builds the feed and calls itself."""
    output = tmp_path / "losses.json"
    env = clean_env(TFDS_DATA_DIR=tfds_data_dir, DATA_IN_MEMORY="false")
    result = run_python(["-c", REPLICA_STEP, str(output)], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(output.read_text())
    assert found["compiled True"] >= 1 and found["compiled False"] == 0
    assert found["loss True"] == pytest.approx(found["loss False"], rel=1e-3)
