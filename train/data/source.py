"""TFDS in: a dataset's splits as `Data`, each in memory or streamed from the prepared files (spec: train.data.spec).

- `Split`, in memory as stored: a fixed-shape feature's split, read once into one 64-byte-aligned NumPy buffer and
  handed to TensorFlow without a copy (DLPack; `tf.constant` costs twice the size), cached beside the files.
- `SerializedSplit`, in memory on the general path (`preprocess`, or a dict of columns): the serialized examples.
- `StreamedSplit`: read through TFDS or, from TFRecord files, directly: in chunks of serialized examples shared out
  between input pipelines, shuffled in windows, parsed a chunk at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import tensorflow as tf

from train.data.examples import EVAL_PASS
from train.data.spec import DatasetSpec, damaged

if TYPE_CHECKING:
    import tensorflow_datasets as tfds

READ_BYTES = 16 << 20  # a split is read into memory in chunks of about this many bytes (a transient copy)
CACHE_DIR = "train-arrays-cache"  # inside the prepared dataset's directory: in-memory splits as read, for the next run
ALIGNMENT = 64  # bytes: what TensorFlow's kernels assume of a tensor's buffer (tf.gather aborts on less)
SHUFFLE_BUFFER_BYTES = 256 << 20  # streamed splits: the shuffle buffer holds about this many bytes of examples
SHUFFLE_BUFFER_EXAMPLES = (1024, 65536)  # ... but at least and at most this many examples
RECORD_CHUNK = 256  # streamed splits: serialized examples read (and shared between pipelines) in chunks of this many
Files = tuple[tuple[str, int, int], ...]  # (file, first record, records) of a split, as TFDS instructs
SAMPLE_BATCH = 256  # examples per batch of `Data.sample`: fixed, so its batches are alike on every topology


@dataclass(eq=False)  # compared and hashed by identity, as its arrays are large
class Split:
    """A split held in memory: NumPy arrays as stored, and the same memory as TensorFlow tensors on the CPU."""

    features: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    @cached_property
    def tensors(self) -> tuple[tf.Tensor, tf.Tensor]:
        """(features, labels) sharing the arrays' memory: no copy, whatever their size."""
        with tf.device("/cpu:0"):
            return _shared_tensor(self.features), _shared_tensor(self.labels)


class SerializedSplit:
    """A split held in memory as its stored records (the general path): one serialized example a row, in the
    order TFDS lists them, so row i is the example at position i of the split, as when it is streamed."""

    def __init__(self, records: tf.Tensor, spec: DatasetSpec) -> None:
        self.records, self.spec = records, spec

    def __len__(self) -> int:
        return int(self.records.shape[0])

    def ordered_records(self) -> tf.data.Dataset:
        """(stored record, position) of every example, in order: as StreamedSplit.ordered_records reads them."""
        return tf.data.Dataset.range(len(self)).map(lambda position: (self.records[position], position))


def _shared_tensor(array: np.ndarray) -> tf.Tensor:
    if array.ctypes.data % ALIGNMENT == 0 and array.flags.c_contiguous and array.flags.writeable:
        with contextlib.suppress(Exception):  # a dtype DLPack does not carry (bool, on some versions): a copy
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    return tf.constant(array)


def aligned_empty(shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
    """An uninitialised C-contiguous array whose buffer starts at a multiple of ALIGNMENT bytes."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(size + ALIGNMENT, np.uint8)
    offset = -raw.ctypes.data % ALIGNMENT
    return raw[offset : offset + size].view(dtype).reshape(shape)


def read_split(builder: tfds.core.DatasetBuilder, spec: DatasetSpec, split: str, examples: int) -> Split:
    """The split in memory, from the cache if it is there, else from TFDS (then cached)."""
    cache = _cache_path(builder, split, spec)
    arrays = _read_cache(cache, spec, examples)
    if arrays is None:
        arrays = _read_tfds(builder, spec, split, examples)
        _write_cache(cache, arrays)
    return Split(*arrays)


def _empty_split(spec: DatasetSpec, examples: int) -> tuple[np.ndarray, np.ndarray]:
    return (
        aligned_empty((examples, *spec.feature_shape), spec.feature_dtype),
        aligned_empty((examples, *spec.label_shape), spec.label_dtype),
    )


def _read_tfds(
    builder: tfds.core.DatasetBuilder, spec: DatasetSpec, split: str, examples: int
) -> tuple[np.ndarray, np.ndarray]:
    """Read in chunks straight into the final arrays: no list of chunks, no concatenated copy."""
    import tensorflow_datasets as tfds

    features, labels = _empty_split(spec, examples)
    filled = 0
    try:
        # Sequential reads, no read-ahead: what TFDS and tf.data buffer in parallel is memory held beside the
        # split while it is read (docs/performance.md, Memory).
        options = tf.data.Options()
        options.autotune.enabled = False
        options.threading.private_threadpool_size = 1
        # try_autocache=False: read once into the array, not also into a tf.data cache of a small split
        read_config = tfds.ReadConfig(interleave_cycle_length=1, options=options, try_autocache=False)
        dataset = builder.as_dataset(split=split, shuffle_files=False, read_config=read_config)
        dataset = dataset.map(spec.pair)
        chunk = max(1, READ_BYTES // spec.example_bytes)
        for chunk_features, chunk_labels in dataset.batch(chunk).as_numpy_iterator():
            count = len(chunk_labels)
            if filled + count > examples:
                raise OSError(f"more examples than the {examples} its info lists")
            features[filled : filled + count] = chunk_features
            labels[filled : filled + count] = chunk_labels
            filled += count
    except (tf.errors.OpError, OSError) as error:
        raise damaged(builder, error) from None
    if filled != examples:
        raise damaged(builder, OSError(f"{filled} examples read of the {examples} its info lists"))
    return features, labels


def _cache_path(builder: tfds.core.DatasetBuilder, split: str, spec: DatasetSpec) -> Path | None:
    """Where an in-memory split's arrays are kept after the first read.

    Inside the prepared dataset's own directory, so deleting that deletes the cache too. The name holds a hash
    of the split, the keys and every prepared file's name, size and mtime: a changed or missing file misses.
    """
    data_dir = Path(builder.data_dir)
    if not data_dir.is_dir():  # e.g. a gs:// data dir: no cache
        return None
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in data_dir.iterdir() if p.is_file())
    key = hashlib.sha256(repr((split, spec.feature_key, spec.label_key, files)).encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", split)
    return data_dir / CACHE_DIR / f"{safe}@{key}.npy"


_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _read_cache(path: Path | None, spec: DatasetSpec, examples: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Two .npy arrays back to back, read into aligned buffers; None when missing or not as expected."""
    if path is None or not path.is_file():
        return None
    features, labels = _empty_split(spec, examples)
    try:
        with path.open("rb") as stream:
            for array in (features, labels):
                read_header = _NPY_HEADERS.get(np.lib.format.read_magic(stream))
                if read_header is None:
                    return None
                shape, fortran, dtype = read_header(stream)
                if shape != array.shape or fortran or dtype != array.dtype:
                    return None
                if stream.readinto(memoryview(array.reshape(-1).view(np.uint8))) != array.nbytes:
                    return None
    except (OSError, ValueError):  # unreadable: read TFDS again, write it anew
        return None
    return features, labels


def _write_cache(path: Path | None, arrays: tuple[np.ndarray, np.ndarray]) -> None:
    """Best effort: a read-only data dir (a mounted volume) only means no cache. Older caches of the split go."""
    if path is None:
        return
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(exist_ok=True)
        with temporary.open("wb") as stream:
            for array in arrays:
                np.save(stream, array, allow_pickle=False)
        os.replace(temporary, path)  # whole or not at all: a concurrent reader never sees half a file
        for old in path.parent.glob(f"{path.name.split('@')[0]}@*"):
            if old != path and not old.name.endswith(".tmp"):
                old.unlink(missing_ok=True)
    except OSError:
        temporary.unlink(missing_ok=True)


def read_serialized(split: StreamedSplit) -> SerializedSplit:
    """The split's stored records in memory, in order (the general path). Raises SettingsError."""
    records = np.empty(split.examples, dtype=object)
    filled = 0
    try:
        for chunk in split.ordered_records().map(lambda record, _: record).batch(4096).as_numpy_iterator():
            records[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
    except (tf.errors.OpError, OSError, ValueError) as error:
        raise damaged(split.builder, error) from None
    if filled != split.examples:
        raise damaged(split.builder, OSError(f"{filled} examples read of the {split.examples} its info lists"))
    with tf.device("/cpu:0"):
        return SerializedSplit(tf.constant(records, tf.string), split.spec)


@dataclass(frozen=True)
class StreamedSplit:
    """A split read from the prepared TFDS files as it is needed."""

    builder: tfds.core.DatasetBuilder = field(repr=False)
    split: str
    spec: DatasetSpec
    examples: int

    def __len__(self) -> int:
        return self.examples

    @property
    def shuffle_buffer(self) -> int:
        low, high = SHUFFLE_BUFFER_EXAMPLES
        return int(min(high, max(low, SHUFFLE_BUFFER_BYTES // max(1, self.spec.example_bytes))))

    def read(self, shuffle_files: bool, seed: int = 0) -> tf.data.Dataset:
        """(feature, label) pairs as stored, through TFDS (evaluation, and formats other than TFRecord);
        with `shuffle_files`, the files in one fixed order drawn from `seed`. On the general path: (stored
        record, position) in order."""
        import tensorflow_datasets as tfds

        if self.spec.records:
            return self.ordered_records()
        # try_autocache=False: TFDS would otherwise keep a small split in memory after a pass (a streamed one too)
        read_config = tfds.ReadConfig(shuffle_seed=seed, shuffle_reshuffle_each_iteration=False, try_autocache=False)
        dataset = self.builder.as_dataset(split=self.split, shuffle_files=shuffle_files, read_config=read_config)
        return dataset.map(self.spec.pair)

    @cached_property
    def files(self) -> Files:
        """(file, first record, records) of the split: TFDS's own instructions, sliced splits included."""
        return tuple(
            (i.filename, int(i.skip), int(i.take)) for i in self.builder.info.splits[self.split].file_instructions
        )

    @cached_property
    def first_position(self) -> dict[tuple[str, int], int]:
        """Each (file, first record) of `files`: the position in the split of its first record."""
        positions, first = {}, 0
        for name, skip, take in self.files:
            positions[name, skip] = first
            first += take
        return positions

    def ordered_records(self) -> tf.data.Dataset:
        """(stored record, position) of every example, in order: evaluation's, on the general path."""
        names, skips, takes = (tf.constant(list(column)) for column in zip(*self.files, strict=True))
        files = tf.data.Dataset.from_tensor_slices((names, tf.cast(skips, tf.int64), tf.cast(takes, tf.int64)))
        records = files.flat_map(lambda name, skip, take: tf.data.TFRecordDataset(name).skip(skip).take(take))
        return tf.data.Dataset.zip(records, tf.data.Dataset.range(self.examples))

    @property
    def tfrecord(self) -> bool:
        """Whether the split is read as TFRecord files directly (TFDS's default format): batched parsing."""
        import tensorflow_datasets as tfds

        return self.builder.info.file_format == tfds.core.FileFormat.TFRECORD and bool(self.files)

    def share(self, index: int, count: int) -> tuple[Files, int]:
        """Input pipeline `index` of `count`'s share: its files (every count-th one), or, with fewer files than
        pipelines, every file and every count-th chunk of RECORD_CHUNK records of each. Returns (files, records
        in the share)."""
        if count == 1 or not self.tfrecord:
            return self.files, self.examples // count if count > 1 else self.examples
        if len(self.files) >= count:
            own_files = self.files[index::count]
            return own_files, sum(take for _, _, take in own_files)
        records = 0
        for _, _, take in self.files:
            chunks = -(-take // RECORD_CHUNK)
            ours = range(index, chunks, count)
            records += sum(min(RECORD_CHUNK, take - chunk * RECORD_CHUNK) for chunk in ours)
        return self.files, records

    def pass_batches(self, local_batch: int, count: int) -> int:
        """Batches of `local_batch` every one of `count` pipelines can make each pass: its smallest share's."""
        return min(self.share(index, count)[1] for index in range(count)) // local_batch

    def _records(
        self, files: Files, seed: tf.Tensor, index: int, count: int, positions: bool = False, read: bool = True
    ) -> tf.data.Dataset:
        """The files' serialized examples in chunks of RECORD_CHUNK, the files in an order drawn from `seed`
        (one per pass). `count` > 1 pipelines reading the same files: every count-th chunk of each file is
        pipeline `index`'s. Chunks, not records, cross tf.data's threads: each crossing has a cost of its own.

        `positions`: each record with its place in the split (on the general path always: its examples' seeds
        derive from it). `read=False`: the places alone, no file read (what a pass's order is made of)."""
        names = tf.constant([name for name, _, _ in files])
        skips = tf.constant([skip for _, skip, _ in files], tf.int64)
        takes = tf.constant([take for _, _, take in files], tf.int64)
        firsts = tf.constant([self.first_position[name, skip] for name, skip, _ in files], tf.int64)
        order = tf.random.experimental.stateless_shuffle(tf.range(len(files)), seed=seed)
        chosen = tf.data.Dataset.from_tensor_slices(
            tuple(tf.gather(each, order) for each in (names, skips, takes, firsts))
        )
        positions = positions or self.spec.records

        def chunks(name: tf.Tensor, skip: tf.Tensor, take: tf.Tensor, first: tf.Tensor) -> tf.data.Dataset:
            places = tf.data.Dataset.range(first, first + take)
            if not read:
                return places.batch(RECORD_CHUNK).shard(count, index)
            records = tf.data.TFRecordDataset(name).skip(skip).take(take)
            # a file with fewer records than its info lists (damaged, truncated) is an error, not a short pass
            records = records.apply(tf.data.experimental.assert_cardinality(take))
            if positions:
                records = tf.data.Dataset.zip(records, places)
            return records.batch(RECORD_CHUNK).shard(count, index)

        return chosen.interleave(
            chunks, cycle_length=min(len(files), 8), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )

    def batches(
        self,
        index: int,
        count: int,
        seed: int,
        pass_number: int | tf.Tensor,
        batch: int,
        places: bool = False,
        mine: tf.Tensor | None = None,
    ) -> tf.data.Dataset:
        """One pass over input pipeline `index` of `count`'s share, in batches of `batch` examples as stored, read
        in windows of about `shuffle_buffer` examples (a multiple of `batch`), each decoded at once and put in its own
        order drawn from (SEED, pass, pipeline, window): a shuffle buffer, vectorised. The last window's remainder
        is the pass's, and waits for the next. `places=True`: each batch as the places in the split of its
        examples, `(places,)`, no file read. `mine`: a bool per place of the split; the pass reads every file and
        keeps the examples it marks (a pass resumed at another worker count: `remainder_marks`)."""
        seeds = tf.stack([tf.constant(seed, tf.int64), tf.cast(pass_number, tf.int64) * 1_000_003 + index])
        window = max(batch, self.shuffle_buffer // batch * batch)
        if not self.tfrecord:
            if places or mine is not None:
                raise ValueError(f"{self.builder.info.file_format} files: no record's place in the split is known")
            examples = self.read(shuffle_files=True, seed=seed).shard(count, index).batch(window)
        else:
            files, _ = self.share(index, count) if mine is None else (self.files, None)
            shared = mine is None and len(self.files) < count  # fewer files than pipelines: chunk by chunk
            at, of = (index, count) if shared else (0, 1)
            records = self._records(files, seeds, at, of, positions=mine is not None, read=not places)
            if mine is not None:
                records = records.map(lambda chunk, at: _kept(chunk, at, tf.gather(mine, at), self.spec.records))
            if places:
                examples = records.rebatch(window).map(lambda at: (at,))
            elif self.spec.records:  # the general path shuffles the stored records (and places): decoding after
                examples = records.rebatch(window)
            else:
                examples = self._decoded(records, window)

        def shuffled_batches(number: tf.Tensor, window_examples: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, ...]:
            size = tf.shape(window_examples[-1])[0]
            order = tf.random.experimental.stateless_shuffle(
                tf.range(size), seed=tf.stack([seeds[0], seeds[1] * 65_537 + number])
            )
            # one gather per batch: [batches, batch, ...]
            rows = tf.reshape(order[: size // batch * batch], [-1, batch])
            return tuple(tf.gather(each, rows) for each in window_examples)

        windows = examples.enumerate().map(shuffled_batches, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return windows.unbatch()

    def remainder_marks(
        self, seed: int, pass_number: int, read_by: int, local_batch: int, batches: int, pipelines: int
    ) -> list[np.ndarray]:
        """What each of `pipelines` input pipelines reads of pass `pass_number` when a run that read `batches`
        batches of it on `read_by` pipelines (of `local_batch` examples each) resumes on `pipelines`: every
        example not read yet, dealt out in turn by place (a bool per place of the split, a pipeline each). The
        places read are found by replaying that pass's order, no file read."""
        read = np.zeros(self.examples, bool)
        for index in range(read_by):
            for (places,) in self.batches(index, read_by, seed, pass_number, local_batch, places=True).take(batches):
                read[places.numpy()] = True
        left = np.flatnonzero(~read)
        marks = [np.zeros(self.examples, bool) for _ in range(pipelines)]
        for index, mark in enumerate(marks):
            mark[left[index::pipelines]] = True
        return marks

    def _decoded(self, records: tf.data.Dataset, window: int) -> tf.data.Dataset:
        """Windows of (features, labels) as stored, from chunks of serialized examples: each chunk parsed at
        once (one vectorised op); an encoded feature (a PNG image) then decoded image by image inside its
        chunk, the chunks in parallel. Per-example tf.data elements cost more than decoding a small image."""
        features = self.builder.info.features
        keys = (self.spec.feature_key, self.spec.label_key) if self.spec.labeled else (self.spec.feature_key,)
        serialized = features.get_serialized_info()
        specs = {key: _example_spec(serialized[key]) for key in keys}

        def decode(chunk: tf.Tensor) -> tuple[tf.Tensor, ...]:
            parsed = tf.io.parse_example(chunk, specs)
            values = []
            for key in keys:
                value = tf.cast(parsed[key], serialized[key].tf_dtype)
                if serialized[key].tf_dtype == tf.string:  # encoded, one example at a time
                    info = features[key].get_tensor_info()
                    output = tf.TensorSpec(info.shape, info.tf_dtype)
                    values.append(tf.map_fn(features[key].decode_example, value, fn_output_signature=output))
                else:
                    values.append(features[key].decode_batch_example(value))
            if not self.spec.labeled:  # LABEL_KEY=none: what stands in for the labels (train.data.spec.no_label)
                values.append(tf.zeros(tf.shape(chunk)[:1], tf.uint8))
            return tuple(values)

        if any(serialized[key].tf_dtype == tf.string for key in keys):  # decode the chunks, then make windows
            chunks = records.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            return chunks.rebatch(window)
        return records.rebatch(window).map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _kept(chunk: tf.Tensor, at: tf.Tensor, keep: tf.Tensor, with_places: bool):
    """A chunk's records (and their places, on the general path) that `keep` marks."""
    records = tf.boolean_mask(chunk, keep)
    return (records, tf.boolean_mask(at, keep)) if with_places else records


def _example_spec(info: tfds.features.TensorInfo) -> tf.io.FixedLenFeature:
    """How tf.train.Example holds a TFDS tensor: float32 as floats, integers as int64, the rest as bytes."""
    dtype = info.tf_dtype
    kind = tf.string if dtype == tf.string else tf.float32 if dtype.is_floating else tf.int64
    return tf.io.FixedLenFeature(info.shape, kind)


@dataclass(frozen=True)
class Remainder:
    """The rest of a streamed pass that a run resumed in at another worker count: what each input pipeline reads
    of pass `pass_number` (`marks`: StreamedSplit.remainder_marks), `length` batches of it, `done` of them
    trained before this start; then the passes after it, whole."""

    pass_number: int
    marks: tuple[np.ndarray, ...] = field(repr=False)
    length: int
    done: int = 0


TrainSplit = Split | SerializedSplit | StreamedSplit


@dataclass(frozen=True)
class Data:
    """The dataset's spec and its two splits, in memory or streamed."""

    spec: DatasetSpec
    train: TrainSplit
    eval: TrainSplit
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def in_memory(self) -> bool:
        return not isinstance(self.train, StreamedSplit)

    def describe(self) -> str:
        """Where the examples are read from, in a few words: what `fit` says as it starts."""
        where = "in memory" if self.in_memory else "streamed from the TFDS files"
        if self.spec.records:
            made = "preprocessed" if self.spec.examples.preprocess else "decoded"
            where += f" as the stored records, each {made} in tf.data"
        return where

    def sample(self, n: int, labels: bool = False) -> tf.data.Dataset:
        """The MODEL file's `context.sample(n)` (train.context): the first `n` training inputs in the order TFDS
        lists them, batched, as the model gets them (`preprocess(training=False)` where there is one, as evaluation
        prepares them; else the feature as stored, an image scaled to [0, 1]); `labels`: (inputs, labels) batches."""
        split, spec = self.train, self.spec
        if spec.records:
            examples = (
                split.ordered_records()
                .take(n)
                .map(
                    lambda record, position: spec.examples.prepare(record, position, EVAL_PASS, training=False),
                    num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True,
                )
            )
        elif isinstance(split, StreamedSplit):  # the files one after another, as a split in memory is read
            import tensorflow_datasets as tfds

            config = tfds.ReadConfig(interleave_cycle_length=1, try_autocache=False)
            examples = split.builder.as_dataset(split=split.split, shuffle_files=False, read_config=config)
            examples = examples.take(n).map(lambda example: (example[spec.feature_key], example.get(spec.label_key, 0)))
        else:
            examples = tf.data.Dataset.from_tensor_slices((split.tensors[0][:n], split.tensors[1][:n]))
        if spec.scale:  # as the engine scales it in front of the model
            examples = examples.map(lambda image, label: (tf.cast(image, tf.float32) * spec.scale, label))
        return (examples if labels else examples.map(lambda inputs, _: inputs)).batch(SAMPLE_BATCH)
