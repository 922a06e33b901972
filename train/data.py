"""TFDS in, a training feed and evaluation batches out.

A split is held in memory when it fits (DATA_IN_MEMORY=auto: as float32 in at most half of the memory
available), else streamed from the prepared TFDS files. Either way the training order is a pure function
of (SEED, step), so a resumed run reads exactly the batches an uninterrupted one would, and replicas and
workers take disjoint slices of every global batch:

- in memory: pass p over the split is the permutation stateless_shuffle(range(N), seed=(SEED, p));
- streamed: pass p reads the files in one fixed shuffled order through a shuffle buffer seeded by (SEED, p).

The feed hands batches to the training step (see `make_feed`): on CPU devices the step gathers its rows
from the split in memory itself, with no tf.data in the loop; on GPUs, across workers and when streaming,
a tf.data pipeline per worker prefetches them.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from train.errors import SettingsError, first_line
from train.host_memory import available_memory_bytes, hold_in_memory
from train.settings import Settings

READ_BATCH = 8192  # examples per read when loading a split into memory
GATHER_BATCHES = 32  # training batches gathered by one op in the in-memory tf.data pipeline
SHUFFLE_BUFFER_BYTES = 256 << 20  # streamed splits: the shuffle buffer holds about this many bytes of examples
SHUFFLE_BUFFER_EXAMPLES = (1024, 65536)  # ... but at least and at most this many examples
CACHE_DIR = "train-arrays-cache"  # inside the prepared dataset's directory: in-memory splits as read, for the next run


@dataclass(frozen=True)
class Split:
    """A split held in memory."""

    features: np.ndarray  # float32, [examples, input_dim]
    labels: np.ndarray  # int64, [examples]

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class StreamedSplit:
    """A split read from the prepared TFDS files as it is needed, normalised batch by batch."""

    builder: Any = field(repr=False)
    split: str
    feature_key: str
    label_key: str
    examples: int
    input_dim: int
    example_bytes: int  # of one example's feature as stored

    def __len__(self) -> int:
        return self.examples

    @property
    def shuffle_buffer(self) -> int:
        low, high = SHUFFLE_BUFFER_EXAMPLES
        return int(min(high, max(low, SHUFFLE_BUFFER_BYTES // max(1, self.example_bytes))))

    def read(self, shuffle_files: bool, seed: int = 0) -> tf.data.Dataset:
        """(feature as stored, label) pairs; with `shuffle_files`, the files in one fixed order drawn from `seed`."""
        import tensorflow_datasets as tfds

        read_config = tfds.ReadConfig(shuffle_seed=seed, shuffle_reshuffle_each_iteration=False)
        dataset = self.builder.as_dataset(split=self.split, shuffle_files=shuffle_files, read_config=read_config)
        return dataset.map(lambda example: (example[self.feature_key], example[self.label_key]))


TrainSplit = Split | StreamedSplit


@dataclass(frozen=True)
class Data:
    name: str
    num_classes: int
    input_dim: int
    train: TrainSplit
    eval: TrainSplit
    notes: tuple[str, ...] = ()

    @property
    def in_memory(self) -> bool:
        return isinstance(self.train, Split)


def normalise(raw, input_dim: int):
    """Features as the MLP takes them: float32, flattened; image bytes scaled to [0, 1]. NumPy or TensorFlow."""
    if isinstance(raw, np.ndarray):
        features = raw.reshape(len(raw), input_dim).astype(np.float32)
        if raw.dtype == np.uint8:
            features /= 255.0
        return features
    features = tf.reshape(tf.cast(raw, tf.float32), [-1, input_dim])
    return features / 255.0 if raw.dtype == tf.uint8 else features


def _open_builder(settings: Settings):
    import tensorflow_datasets as tfds

    import train.synthetic_clusters  # noqa: F401  (registers the default dataset)

    data_dir = str(settings.tfds_data_dir) if settings.tfds_data_dir else None
    try:
        return tfds.builder(settings.dataset, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        name = settings.dataset.split("/")[0].split(":")[0]
        close = difflib.get_close_matches(name, tfds.list_builders(), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "see tfds.list_builders() for the known names"
        raise SettingsError(f"DATASET={settings.dataset!r} is not a TFDS dataset: {hint}") from None
    except Exception as error:  # unknown config or version: TFDS raises several types
        raise SettingsError(f"DATASET={settings.dataset!r} cannot be opened: {first_line(error)}") from None


def _directories(root: Path, depth: int) -> set[Path]:
    """Folders at most `depth` levels below `root` (root included, if it exists)."""
    found = set()
    for directory, subdirectories, _ in os.walk(root):
        found.add(Path(directory))
        if len(Path(directory).relative_to(root).parts) >= depth:
            subdirectories.clear()  # the downloads' extracted archives can be large trees: not walked
    return found


def _prepare(builder, settings: Settings) -> None:
    """Make sure the data is on disk: generated locally, or downloaded once if it must be.

    A failed preparation leaves no dataset behind: TFDS prepares into a temporary directory and keeps what
    it downloaded (a retry goes on from there), and the empty folders it made for it are removed here.
    """
    if tf.io.gfile.exists(builder.data_dir):  # prepared: what download_and_prepare would only say, too
        return
    data_dir = Path(str(builder.data_dir_root))  # str: TFDS's own path type, which may name a bucket
    # The dataset's own folder and the downloads, where TFDS makes folders (dataset/version/.tmp,
    # downloads/dataset/file.tmp.ID) before it knows that the download fails.
    roots = (data_dir / Path(str(builder.data_dir)).relative_to(data_dir).parts[0], data_dir / "downloads")

    def folders() -> set[Path]:
        return _directories(roots[0], depth=4) | _directories(roots[1], depth=2)

    before = folders()
    try:
        builder.download_and_prepare()
    except Exception as error:
        made = folders() - before
        for directory in sorted(made, key=lambda path: len(path.parts), reverse=True):  # the deepest first
            with contextlib.suppress(OSError):  # not empty: a file in it is kept
                directory.rmdir()
        raise SettingsError(
            f"DATASET={settings.dataset!r} is not prepared in {data_dir} and could not be made "
            f"({type(error).__name__}: {first_line(error, 200)}): on a machine with network run "
            f"scripts/prepare-dataset.sh {settings.dataset} DIR, then set TFDS_DATA_DIR=DIR"
        ) from None


def _check_split(builder, setting: str, split: str) -> int | None:
    """The number of examples of the split (TFDS split syntax, like train[:90%]), None where the dataset's
    info does not list its splits (tfds.testing.mock_data). Raises SettingsError."""
    known = list(builder.info.splits.keys())
    base = re.split(r"[\[+]", split)[0]
    if not known:
        return None
    if base not in known:
        raise SettingsError(
            f"{setting}={split!r} is not a split of {builder.info.full_name}: use one of {', '.join(known)}"
        )
    try:
        examples = int(builder.info.splits[split].num_examples)
    except Exception as error:  # a malformed slice: TFDS raises several types
        raise SettingsError(f"{setting}={split!r} cannot be read: {first_line(error, 200)}") from None
    if examples == 0:
        raise SettingsError(f"{setting}={split!r} of {builder.info.full_name} has no examples")
    return examples


def _count(builder, split: str) -> int:
    try:
        return int(builder.as_dataset(split=split).reduce(np.int64(0), lambda count, _: count + 1))
    # KeyError: the prepared dataset_info.json that lists the splits is gone
    except (tf.errors.OpError, OSError, KeyError) as error:
        raise _damaged(builder, error) from None


def _feature_keys(builder, settings: Settings) -> tuple[str, str]:
    supervised = builder.info.supervised_keys
    if supervised and isinstance(supervised[0], str) and isinstance(supervised[1], str):
        default_feature, default_label = supervised
    else:
        default_feature, default_label = "image", "label"
    feature_key = settings.feature_key or default_feature
    label_key = settings.label_key or default_label
    features = builder.info.features
    for setting, key in (("FEATURE_KEY", feature_key), ("LABEL_KEY", label_key)):
        if key not in features:
            raise SettingsError(
                f"{setting}={key!r} is not a feature of {settings.dataset}: use one of {', '.join(features)}"
            )
    return feature_key, label_key


def _damaged(builder, error: BaseException) -> SettingsError:
    return SettingsError(
        f"DATASET={builder.info.full_name} in {builder.data_dir} cannot be read ({first_line(error, 160)}): "
        "the prepared files are incomplete or damaged; delete that directory and run again to prepare it anew"
    )


def _read_split(builder, split: str, feature_key: str, label_key: str, input_dim: int) -> Split:
    cache = _cache_path(builder, split, feature_key, label_key)
    arrays = _read_cache(cache)
    if arrays is None:
        arrays = _read_tfds(builder, split, feature_key, label_key)
        _write_cache(cache, arrays)
    raw, labels = arrays
    return Split(features=normalise(raw, input_dim), labels=labels.astype(np.int64))


def _read_tfds(builder, split: str, feature_key: str, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        dataset = builder.as_dataset(split=split, shuffle_files=False)
        dataset = dataset.map(lambda example: (example[feature_key], example[label_key])).batch(READ_BATCH)
        chunks = [(features.numpy(), labels.numpy()) for features, labels in dataset]
    except (tf.errors.OpError, OSError) as error:
        raise _damaged(builder, error) from None
    return np.concatenate([features for features, _ in chunks]), np.concatenate([labels for _, labels in chunks])


def _cache_path(builder, split: str, feature_key: str, label_key: str) -> Path | None:
    """Where an in-memory split's arrays are kept after the first read: reading them back takes milliseconds.

    Inside the prepared dataset's own directory, so deleting that deletes the cache too. The name holds a hash
    of the split, the keys and every prepared file's name, size and mtime: a changed or missing file misses.
    """
    data_dir = Path(builder.data_dir)
    if not data_dir.is_dir():  # e.g. a gs:// data dir: no cache
        return None
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in data_dir.iterdir() if p.is_file())
    key = hashlib.sha256(repr((split, feature_key, label_key, files)).encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", split)
    return data_dir / CACHE_DIR / f"{safe}@{key}.npz"


def _read_cache(path: Path | None) -> tuple[np.ndarray, np.ndarray] | None:
    if path is None or not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return arrays["features"], arrays["labels"]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):  # unreadable: read TFDS again, write it anew
        return None


def _write_cache(path: Path | None, arrays: tuple[np.ndarray, np.ndarray]) -> None:
    """Best effort: a read-only data dir (a mounted volume) only means no cache. Older caches of the split go."""
    if path is None:
        return
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(exist_ok=True)
        with temporary.open("wb") as stream:
            np.savez(stream, features=arrays[0], labels=arrays[1])
        os.replace(temporary, path)  # whole or not at all: a concurrent reader never sees half a file
        for old in path.parent.glob(f"{path.name.split('@')[0]}@*.npz"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        temporary.unlink(missing_ok=True)


def load_data(settings: Settings) -> Data:
    """Open DATASET, prepare it if needed, and hold both splits in memory or stream them. Raises SettingsError."""
    builder = _open_builder(settings)
    _prepare(builder, settings)
    train_examples = _check_split(builder, "TRAIN_SPLIT", settings.train_split)
    eval_examples = _check_split(builder, "EVAL_SPLIT", settings.eval_split)
    feature_key, label_key = _feature_keys(builder, settings)

    label_feature = builder.info.features[label_key]
    num_classes = getattr(label_feature, "num_classes", None)
    if not num_classes:
        raise SettingsError(f"LABEL_KEY={label_key!r} of {settings.dataset} is not a class label (tfds ClassLabel)")
    feature = builder.info.features[feature_key]
    if any(dim is None for dim in feature.shape):
        raise SettingsError(
            f"FEATURE_KEY={feature_key!r} has a variable shape {feature.shape}: the MLP needs a fixed shape"
        )
    input_dim = int(np.prod(feature.shape))

    if train_examples is None or eval_examples is None:  # not listed: count them (once, by reading)
        train_examples, eval_examples = (
            _count(builder, split) for split in (settings.train_split, settings.eval_split)
        )
    needed = (train_examples + eval_examples) * (4 * input_dim + 8)
    in_memory, note = hold_in_memory(settings.data_in_memory, needed, available_memory_bytes())
    if in_memory:
        train = _read_split(builder, settings.train_split, feature_key, label_key, input_dim)
        evaluation = _read_split(builder, settings.eval_split, feature_key, label_key, input_dim)
    else:
        example_bytes = input_dim * np.dtype(feature.np_dtype).itemsize
        train, evaluation = (
            StreamedSplit(builder, split, feature_key, label_key, examples, input_dim, example_bytes)
            for split, examples in ((settings.train_split, train_examples), (settings.eval_split, eval_examples))
        )
        for streamed in (train, evaluation):
            _check_readable(streamed)
    return Data(builder.info.full_name, int(num_classes), input_dim, train, evaluation, (note,) if note else ())


def _check_readable(split: StreamedSplit) -> None:
    """A streamed split's files are all there and its first example reads: found now, not steps into training.

    (Damage further inside a file still surfaces while training: `fit` ends that in one line, too.)
    """
    builder = split.builder
    try:
        instructions = builder.info.splits[split.split].file_instructions
        missing = [i.filename for i in instructions if not tf.io.gfile.exists(i.filename)]
        if missing:
            raise OSError(f"{len(missing)} file(s) missing, e.g. {Path(missing[0]).name}")
        next(iter(split.read(shuffle_files=False).take(1)))
    except (tf.errors.OpError, OSError) as error:
        raise _damaged(builder, error) from None
    except (KeyError, ValueError):  # splits not listed (tfds.testing.mock_data): reading will tell
        pass


def batches_per_pass(split: TrainSplit, global_batch: int, setting: str = "TRAIN_SPLIT") -> int:
    """Whole global batches in one pass over the split (the remainder waits for the next pass)."""
    batches = len(split) // global_batch
    if batches == 0:
        raise SettingsError(
            f"{setting} has {len(split)} examples, fewer than one global batch of {global_batch}: lower BATCH_SIZE"
        )
    return batches


def pass_order(examples: int, seed: int, pass_number) -> tf.Tensor:
    """The order of an in-memory split's examples in pass `pass_number`: the same in a graph and eagerly."""
    seeds = tf.stack([tf.constant(seed, tf.int64), tf.cast(pass_number, tf.int64)])
    return tf.random.experimental.stateless_shuffle(tf.range(examples, dtype=tf.int64), seed=seeds)


def train_dataset(strategy, split: TrainSplit, global_batch: int, seed: int, start_step: int):
    """Per-replica training batches from `start_step` on, forever, as a distributed tf.data dataset.

    The k-th global batch of a pass is cut into per-replica slices, replica r taking slice r. A restart at
    step s rebuilds the plan and skips s batches: of indices in memory; of examples read, when streaming.
    """
    passes_batches = batches_per_pass(split, global_batch)
    first_pass, offset = divmod(start_step, passes_batches)
    replicas = strategy.num_replicas_in_sync
    per_replica = global_batch // replicas
    if isinstance(split, StreamedSplit):
        return distribute(strategy, _streamed(split, replicas, per_replica, passes_batches, seed, first_pass, offset))
    with tf.device("/cpu:0"):
        features = tf.constant(split.features)
        labels = tf.constant(split.labels)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = replicas // context.num_input_pipelines  # replicas fed by this input pipeline
        first_replica = context.input_pipeline_id * local

        def pass_indices(pass_number):
            order = pass_order(len(split), seed, pass_number)
            plan = tf.reshape(order[: passes_batches * global_batch], [passes_batches, replicas, per_replica])
            mine = plan[:, first_replica : first_replica + local, :]
            return tf.data.Dataset.from_tensor_slices(tf.reshape(mine, [passes_batches * local, per_replica]))

        indices = tf.data.Dataset.range(first_pass, np.iinfo(np.int64).max).flat_map(pass_indices).skip(offset * local)
        # One gather per GATHER_BATCHES batches, then handed out one by one: tf.data's cost is per element.
        blocks = indices.batch(GATHER_BATCHES).map(
            lambda index: (tf.gather(features, index), tf.gather(labels, index)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        return blocks.unbatch().prefetch(tf.data.AUTOTUNE)

    return distribute(strategy, dataset_fn)


def _streamed(
    split: StreamedSplit, replicas: int, per_replica: int, passes_batches: int, seed: int, first_pass: int, offset: int
):
    """The dataset_fn of a streamed split: every input pipeline reads the same global batches, keeps its slices.

    Each worker reads the whole stream (and drops the others' rows): simple and exactly the order of one
    worker; the cost is reading (workers - 1) times more, which matters only once reading is the bottleneck.
    """
    examples = split.read(shuffle_files=True, seed=seed)

    def one_pass(pass_number):
        shuffled = examples.shuffle(split.shuffle_buffer, seed=tf.constant(seed, tf.int64) * 1_000_003 + pass_number)
        return shuffled.batch(replicas * per_replica, drop_remainder=True).take(passes_batches)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = replicas // context.num_input_pipelines
        first_replica = context.input_pipeline_id * local

        def mine(raw, labels):  # after batching: one vectorised op per batch, not one per example
            features = tf.reshape(normalise(raw, split.input_dim), [replicas, per_replica, split.input_dim])
            labels = tf.reshape(tf.cast(labels, tf.int64), [replicas, per_replica])
            return features[first_replica : first_replica + local], labels[first_replica : first_replica + local]

        batches = tf.data.Dataset.range(first_pass, np.iinfo(np.int64).max).flat_map(one_pass).skip(offset)
        return batches.map(mine, num_parallel_calls=tf.data.AUTOTUNE).unbatch().prefetch(tf.data.AUTOTUNE)

    return dataset_fn


def distribute(strategy, dataset_fn):
    """The per-replica datasets as `strategy.run` takes them.

    On GPUs, tf.distribute's default: one input pipeline per worker, prefetched to every GPU. On CPU devices
    that MultiDeviceIterator costs more per step than a small model's step itself (measured by `python -m
    train bench`), so each replica gets a plain tf.data iterator on the host: one replica takes the dataset
    as it is, several take one pipeline each (PER_REPLICA) without a copy to the device they already share.
    """
    if _on_gpus(strategy) or isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return strategy.distribute_datasets_from_function(dataset_fn)
    if strategy.num_replicas_in_sync == 1:
        return dataset_fn(tf.distribute.InputContext())
    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_fetch_to_device=False,
    )
    return strategy.distribute_datasets_from_function(dataset_fn, options)


def _on_gpus(strategy) -> bool:
    return any("GPU" in device.upper() for device in strategy.extended.worker_devices)


class RowsFeed:
    """An in-memory split on CPU devices: no tf.data in the loop. The step gathers its own rows.

    The host plans whole passes (`pass_order`, as [batches, replicas, per_replica] row numbers). A call takes
    a window of the passes it can reach, the same tensor for every call that starts in the same pass and of
    one shape (so the step is traced once), and the index of its first step in it; every step of the call
    gathers its replica's batch from the split inside the compiled function. A tf.data iterator read once per
    step cost more than the small model's step itself, and so did planning each call's rows on the host
    (measured by `python -m train bench`).
    """

    compilable = True  # everything the step reads is a tensor: XLA can compile the whole call

    def __init__(self, split: Split, replicas: int, global_batch: int, seed: int, start_step: int, block: int):
        self.passes_batches = batches_per_pass(split, global_batch)
        self.shape = (replicas, global_batch // replicas)
        self.seed, self.step, self.block, self.examples = seed, start_step, block, len(split)
        # The passes a call of up to `block` steps can touch, from any step of its first pass.
        self.passes_per_window = -(-(self.passes_batches - 1 + block) // self.passes_batches)
        # int32 row numbers where they fit: the XLA-compiled call ran about 5% faster than with int64 (bench).
        self.index_type = np.int32 if len(split) <= np.iinfo(np.int32).max else np.int64
        with tf.device("/cpu:0"):
            self.features = tf.constant(split.features)
            self.labels = tf.constant(split.labels)
        self._plans: dict[int, np.ndarray] = {}
        self._window_pass: int | None = None
        self._window: tf.Tensor | None = None

    def _pass_plan(self, pass_number: int) -> np.ndarray:
        plan = self._plans.get(pass_number)
        if plan is None:
            order = pass_order(self.examples, self.seed, pass_number).numpy()
            whole = self.passes_batches * self.shape[0] * self.shape[1]
            plan = order[:whole].astype(self.index_type).reshape(self.passes_batches, *self.shape)
        return plan

    def call_args(self, steps: int) -> tuple[tf.Tensor, ...]:
        """The next `steps` steps' input (at most `block`); moves on by `steps`."""
        if not 0 < steps <= self.block:
            raise ValueError(f"a call of {steps} steps: RowsFeed plans calls of 1 to {self.block} steps")
        first_pass, first_batch = divmod(self.step, self.passes_batches)
        if first_pass != self._window_pass:  # once a pass: the next window, reusing the plans it shares
            passes = range(first_pass, first_pass + self.passes_per_window)
            self._plans = {number: self._pass_plan(number) for number in passes}
            with tf.device("/cpu:0"):
                self._window = tf.constant(np.concatenate([self._plans[number] for number in passes]))
            self._window_pass = first_pass
        self.step += steps
        return self.features, self.labels, self._window, tf.constant(first_batch, tf.int32)

    @staticmethod
    def step_args(call_args, step):
        features, labels, window, first_batch = call_args
        # tf.gather, not window[first_batch + step]: XLA takes a slice's start as a compile-time constant
        # where it can, and compiled the call anew for every value of first_batch.
        return features, labels, tf.gather(window, first_batch + step)

    @staticmethod
    def replica_batch(features, labels, rows):
        mine = rows[tf.distribute.get_replica_context().replica_id_in_sync_group]
        return tf.gather(features, mine), tf.gather(labels, mine)


class PipelineFeed:
    """A distributed tf.data dataset: one `next()` per step, inside the call."""

    compilable = False  # XLA cannot compile an iterator's get_next

    def __init__(self, distributed) -> None:
        self.iterator = iter(distributed)

    def call_args(self, steps: int) -> tuple[Any, ...]:
        del steps  # the iterator moves on by itself
        return (self.iterator,)

    @staticmethod
    def step_args(call_args, step):
        del step
        return next(call_args[0])

    @staticmethod
    def replica_batch(features, labels):
        return features, labels


Feed = RowsFeed | PipelineFeed


def gathers_in_step(strategy, split: TrainSplit) -> bool:
    """Whether the feed is a `RowsFeed`: an in-memory split on the CPU devices of one host."""
    host_cpus = not _on_gpus(strategy) and not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    return isinstance(split, Split) and host_cpus


def make_feed(strategy, split: TrainSplit, global_batch: int, seed: int, start_step: int, block: int) -> Feed:
    """Rows gathered by the step for an in-memory split on one host's CPU devices; a tf.data pipeline otherwise."""
    if gathers_in_step(strategy, split):
        return RowsFeed(split, strategy.num_replicas_in_sync, global_batch, seed, start_step, block)
    return PipelineFeed(train_dataset(strategy, split, global_batch, seed, start_step))


def eval_dataset(split: TrainSplit, batch: int) -> tf.data.Dataset:
    """Every example of the split once, in order, last batch partial."""
    if isinstance(split, StreamedSplit):
        batches = split.read(shuffle_files=False).batch(batch)
        batches = batches.map(lambda raw, labels: (normalise(raw, split.input_dim), tf.cast(labels, tf.int64)))
    else:
        batches = tf.data.Dataset.from_tensor_slices((split.features, split.labels)).batch(batch)
    return batches.prefetch(tf.data.AUTOTUNE)
