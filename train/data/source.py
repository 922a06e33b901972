"""TFDS in: open DATASET, prepare it if it must be, say what its splits hold, and read them.

A split is held in memory as TFDS stores it (a uint8 image stays one byte a value) or streamed from the
prepared files. In memory, a fixed-shape feature's split is read once into one 64-byte-aligned NumPy buffer
and handed to TensorFlow without a copy (DLPack): `tf.constant` of an array costs twice its size, and
TensorFlow needs the alignment. The first read is cached beside the prepared files, so later runs load in
milliseconds. Where examples go through `preprocess` or are a dict of columns (the general path,
train.data.examples), a split in memory is its stored records: the serialized examples, images encoded.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from train.data.examples import BYTES_SUFFIX, Examples, named, probe, random_record
from train.data.opening import open_builder, prepare  # noqa: F401  (their home is opening; imported from here too)
from train.data.shapes import PINNED_EXAMPLES
from train.errors import SettingsError, first_line
from train.model_file import RESNET_EXAMPLE
from train.settings import Settings

READ_BYTES = 16 << 20  # a split is read into memory in chunks of about this many bytes (a transient copy)
SHUFFLE_BUFFER_BYTES = 256 << 20  # streamed splits: the shuffle buffer holds about this many bytes of examples
SHUFFLE_BUFFER_EXAMPLES = (1024, 65536)  # ... but at least and at most this many examples
RECORD_CHUNK = 256  # streamed splits: serialized examples read (and shared between pipelines) in chunks of this many
CACHE_DIR = "train-arrays-cache"  # inside the prepared dataset's directory: in-memory splits as read, for the next run
ALIGNMENT = 64  # bytes: what TensorFlow's kernels assume of a tensor's buffer (tf.gather aborts on less)


@dataclass(frozen=True)
class DatasetSpec:
    """What the train and eval splits hold, from TFDS's dataset info: nothing is read for it."""

    name: str  # TFDS's full name, like mnist/3.0.1
    feature_key: str
    label_key: str
    feature_shape: tuple[int, ...]  # one example's, as stored: (28, 28, 1), (32,)
    feature_dtype: str  # as stored: uint8, float32, int64, ...
    is_image: bool  # a TFDS Image of uint8: the model gets it scaled to [0, 1] (and so does the export)
    label_shape: tuple[int, ...]  # () for a class or a value, (k,) for a multi-hot vector
    label_dtype: str
    num_classes: int | None  # a ClassLabel's count, k for a (k,) label, None for a scalar value (regression)
    train_examples: int
    eval_examples: int
    # The general path (preprocess, or a dict of columns): how a stored record becomes (inputs, label), and
    # what the model gets of one example (a tf.TensorSpec, or a dict of them by Input name). None: the feature
    # as stored (scaled to [0, 1] for an image).
    examples: Examples | None = None
    inputs: Any = None
    record_bytes: int = 0  # the general path: a stored record's bytes, on average
    classes: list[str] | None = None  # a ClassLabel's names (summary.json "classes"); None for other labels

    @property
    def records(self) -> bool:
        """Whether examples take the general path: stored records, decoded and prepared one at a time."""
        return self.examples is not None

    @property
    def input_shape(self) -> Any:
        """`build_model`'s `input_shape`: a tuple, or a dict of Input name to tuple."""
        if self.inputs is None:
            return self.feature_shape
        return tf.nest.map_structure(lambda spec: tuple(spec.shape.as_list()), self.inputs)

    @property
    def example_bytes(self) -> int:
        """One example as held in memory: feature and label as stored, or its stored record."""
        if self.records:
            return self.record_bytes
        feature = int(np.prod(self.feature_shape, dtype=np.int64)) * np.dtype(self.feature_dtype).itemsize
        return feature + int(np.prod(self.label_shape, dtype=np.int64)) * np.dtype(self.label_dtype).itemsize

    def describe_inputs(self) -> str:
        """The model's input in a few words: the stored feature, or each of what `preprocess` returns."""
        if self.inputs is None:
            return f"{self.feature_key} {list(self.feature_shape)} {self.feature_dtype}"
        return ", ".join(f"{path} {spec.shape.as_list()} {spec.dtype.name}" for path, spec in named(self.inputs))

    @property
    def held_bytes(self) -> int:
        """Both splits in memory."""
        return (self.train_examples + self.eval_examples) * self.example_bytes

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "feature": {"key": self.feature_key, "shape": list(self.feature_shape), "dtype": self.feature_dtype},
            "inputs": self.describe_inputs(),
            "scaled_to_unit_range": self.is_image,
            "label": {"key": self.label_key, "shape": list(self.label_shape), "dtype": self.label_dtype},
            "num_classes": self.num_classes,
            "train_examples": self.train_examples,
            "eval_examples": self.eval_examples,
        }


class Split:
    """A split held in memory: NumPy arrays as stored, and the same memory as TensorFlow tensors on the CPU."""

    def __init__(self, features: np.ndarray, labels: np.ndarray) -> None:
        self.features = features
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    @cached_property
    def tensors(self) -> tuple[tf.Tensor, tf.Tensor]:
        """(features, labels) sharing the arrays' memory: no copy, whatever their size."""
        with tf.device("/cpu:0"):
            return _shared_tensor(self.features), _shared_tensor(self.labels)


class RecordsSplit:
    """A split held in memory as its stored records (the general path): one serialized example a row, in the
    order TFDS lists them, so row i is the example at position i of the split, as when it is streamed."""

    def __init__(self, records: tf.Tensor, spec: DatasetSpec) -> None:
        self.records, self.spec = records, spec

    def __len__(self) -> int:
        return int(self.records.shape[0])


def _shared_tensor(array: np.ndarray) -> tf.Tensor:
    if array.ctypes.data % ALIGNMENT == 0 and array.flags.c_contiguous and array.flags.writeable:
        with contextlib.suppress(Exception):  # a dtype DLPack does not carry (bool, on some versions): a copy
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    return tf.constant(array)


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous array whose buffer starts at a multiple of ALIGNMENT bytes."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(size + ALIGNMENT, np.uint8)
    offset = -raw.ctypes.data % ALIGNMENT
    return raw[offset : offset + size].view(dtype).reshape(shape)


@dataclass(frozen=True)
class StreamedSplit:
    """A split read from the prepared TFDS files as it is needed."""

    builder: Any = field(repr=False)
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
        feature_key, label_key = self.spec.feature_key, self.spec.label_key
        return dataset.map(lambda example: (example[feature_key], example[label_key]))

    @cached_property
    def files(self) -> tuple[tuple[str, int, int], ...]:
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
    def as_records(self) -> bool:
        """Whether the split is read as TFRecord files directly (TFDS's default format): batched parsing."""
        import tensorflow_datasets as tfds

        return self.builder.info.file_format == tfds.core.FileFormat.TFRECORD and bool(self.files)

    def share(self, index: int, count: int) -> tuple[tuple[tuple[str, int, int], ...], int]:
        """Input pipeline `index` of `count`'s share: its files (every count-th one), or, with fewer files than
        pipelines, every file and every count-th chunk of RECORD_CHUNK records of each. Returns (files, records
        in the share)."""
        if count == 1 or not self.as_records:
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
        self, files, seed: tf.Tensor, index: int, count: int, positions: bool = False, read: bool = True
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

        def chunks(name, skip, take, first):
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
        self, index: int, count: int, seed: int, pass_number, batch: int, places: bool = False, mine=None
    ) -> tf.data.Dataset:
        """One pass over input pipeline `index` of `count`'s share, in batches of `batch` examples as stored.

        The share is read in windows of about `shuffle_buffer` examples (a multiple of `batch`), each decoded
        at once and put in its own order drawn from (SEED, pass, pipeline, window): what a shuffle buffer does
        one example at a time, vectorised. The last window's remainder is the pass's, and waits for the next.

        `places=True`: each batch as the places in the split of its examples, `(places,)`, no file read.
        `mine`: a bool per place of the split; the pass reads every file and keeps the examples it marks (the
        rest of a pass that a run resumed in at another worker count: `remainder_marks`)."""
        seeds = tf.stack([tf.constant(seed, tf.int64), tf.cast(pass_number, tf.int64) * 1_000_003 + index])
        window = max(batch, self.shuffle_buffer // batch * batch)
        if not self.as_records:
            if places or mine is not None:
                raise ValueError(f"{self.builder.info.file_format} files: no record's place in the split is known")
            examples = self.read(shuffle_files=True, seed=seed).shard(count, index).batch(window)
        else:
            files, _ = self.share(index, count) if mine is None else (self.files, None)
            shared = mine is None and len(self.files) < count  # fewer files than pipelines: chunk by chunk
            records = self._records(files, seeds, index if shared else 0, count if shared else 1,
                                    positions=mine is not None, read=not places)  # fmt: skip
            if mine is not None:
                records = records.map(lambda chunk, at: _kept(chunk, at, tf.gather(mine, at), self.spec.records))
            if places:
                examples = records.rebatch(window).map(lambda at: (at,))
            elif self.spec.records:  # the general path shuffles the stored records (and places): decoding after
                examples = records.rebatch(window)
            else:
                examples = self._decoded(records, window)

        def shuffled_batches(number, window_examples):
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
        keys = (self.spec.feature_key, self.spec.label_key)
        serialized = features.get_serialized_info()
        specs = {key: _example_spec(serialized[key]) for key in keys}

        def decode(chunk):
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
            return tuple(values)

        if any(serialized[key].tf_dtype == tf.string for key in keys):  # decode the chunks, then make windows
            chunks = records.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            return chunks.rebatch(window)
        return records.rebatch(window).map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _kept(chunk: tf.Tensor, at: tf.Tensor, keep: tf.Tensor, with_places: bool):
    """A chunk's records (and their places, on the general path) that `keep` marks."""
    records = tf.boolean_mask(chunk, keep)
    return (records, tf.boolean_mask(at, keep)) if with_places else records


def _example_spec(info) -> tf.io.FixedLenFeature:
    """How tf.train.Example holds a TFDS tensor: float32 as floats, integers as int64, the rest as bytes."""
    dtype = info.tf_dtype
    kind = tf.string if dtype == tf.string else tf.float32 if dtype.is_floating else tf.int64
    return tf.io.FixedLenFeature(info.shape, kind)


TrainSplit = Split | RecordsSplit | StreamedSplit


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


def _split_examples(builder, setting: str, split: str) -> int | None:
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
        raise damaged(builder, error) from None


def _feature_keys(builder, settings: Settings, preprocessed: bool = False) -> tuple[str, str]:
    """(FEATURE_KEY, LABEL_KEY), given or from the dataset's supervised keys. `preprocessed`: MODEL's preprocess
    makes the inputs from whatever features it reads, so a default FEATURE_KEY need not name one."""
    supervised = builder.info.supervised_keys
    if supervised and isinstance(supervised[0], str) and isinstance(supervised[1], str):
        default_feature, default_label = supervised
    else:
        default_feature, default_label = "image", "label"
    feature_key = settings.feature_key or default_feature
    label_key = settings.label_key or default_label
    features = builder.info.features
    for setting, key in (("FEATURE_KEY", feature_key), ("LABEL_KEY", label_key)):
        if setting == "FEATURE_KEY" and preprocessed and not settings.feature_key:
            continue
        if key not in features:
            raise SettingsError(
                f"{setting}={key!r} is not a feature of {settings.dataset}: use one of {', '.join(features)}"
            )
    return feature_key, label_key


def _fixed_tensor(feature, setting: str, key: str, dataset: str) -> tuple[tuple[int, ...], str]:
    """A feature's shape and stored dtype, where it is one fixed-shape numeric tensor. Raises SettingsError."""
    shape, dtype = getattr(feature, "shape", None), getattr(feature, "np_dtype", None)
    if not isinstance(shape, tuple) or dtype is None:
        raise SettingsError(
            f"{setting}={key!r} of {dataset} is a {type(feature).__name__}, not one tensor: name a feature that is, "
            f"or define preprocess in your MODEL file to make the model's inputs from it (see {RESNET_EXAMPLE})"
        )
    if any(dim is None for dim in shape):
        raise SettingsError(
            f"{setting}={key!r} of {dataset} has a variable shape {shape}: define preprocess in your MODEL file "
            f"to crop or resize it to a fixed shape (see {RESNET_EXAMPLE})"
        )
    dtype = np.dtype(dtype)
    if dtype.kind not in "biuf":
        raise SettingsError(
            f"{setting}={key!r} of {dataset} holds {dtype.name} values: use a numeric feature, or define preprocess "
            f"in your MODEL file to make numbers of it (see {RESNET_EXAMPLE})"
        )
    return tuple(int(dim) for dim in shape), dtype.name


def _label(builder, settings: Settings, label_key: str) -> tuple[tuple[int, ...], str, int | None]:
    """The label's stored shape, dtype and `num_classes`. Raises SettingsError."""
    import tensorflow_datasets as tfds

    label = builder.info.features[label_key]
    label_shape, label_dtype = _fixed_tensor(label, "LABEL_KEY", label_key, settings.dataset)
    if isinstance(label, tfds.features.ClassLabel):
        return label_shape, label_dtype, int(label.num_classes)
    if len(label_shape) == 1:
        return label_shape, label_dtype, label_shape[0]  # a multi-hot vector over k classes
    if label_shape == ():
        return label_shape, label_dtype, None  # a value: regression
    raise SettingsError(
        f"LABEL_KEY={label_key!r} of {settings.dataset} has shape {label_shape}: use a class label, a scalar "
        "value or a (k,) multi-hot vector"
    )


def _general_path(builder, settings: Settings, feature_key: str, label_key: str, preprocess) -> Examples | None:
    """The general path's Examples where MODEL defines `preprocess` or FEATURE_KEY is a dict of columns."""
    import tensorflow_datasets as tfds

    feature = builder.info.features[feature_key] if preprocess is None else None
    if preprocess is None and not isinstance(feature, tfds.features.FeaturesDict):
        return None
    if preprocess is None:
        for column, each in feature.items():
            _fixed_tensor(each, "FEATURE_KEY", f"{feature_key}/{column}", settings.dataset)
    if preprocess is not None:
        clashes = [key + BYTES_SUFFIX for key in builder.info.features if key + BYTES_SUFFIX in builder.info.features]
        if clashes:
            raise SettingsError(f"DATASET={settings.dataset!r} has a feature {clashes[0]!r}, the name under which "
                                "preprocess gets an image's stored bytes: rename it in your builder")  # fmt: skip
    return Examples(builder.info.features, feature_key, label_key, preprocess, settings.model, settings.seed)


def _first_records(builder, split: str) -> list[bytes]:
    """The split's first PINNED_EXAMPLES stored records where it is prepared as TFRecord files, in order, else a
    random one of its features."""
    import tensorflow_datasets as tfds

    with contextlib.suppress(Exception):  # not prepared, or not TFRecords: a random example of the features
        if builder.info.file_format == tfds.core.FileFormat.TFRECORD:
            found: list[bytes] = []
            for each in builder.info.splits[split].file_instructions:  # a sliced split's files, as TFDS reads them
                records = tf.data.TFRecordDataset(each.filename).skip(each.skip).take(each.take)
                found += [record.numpy() for record in records.take(PINNED_EXAMPLES - len(found))]
                if len(found) == PINNED_EXAMPLES:
                    break
            if found:
                return found
    return [random_record(builder.info.features, np.random.default_rng(0))]


def _record_bytes(builder, split: str) -> int:
    """A stored record's bytes on average, from the dataset's info (the split's bytes over its examples)."""
    info = builder.info.splits.get(re.split(r"[\[+]", split)[0]) if builder.info.splits else None
    if info is None or not info.num_examples:
        return 1
    return max(1, int(info.num_bytes) // int(info.num_examples))


def inspect(builder, settings: Settings, count: bool = True, preprocess=None) -> DatasetSpec:
    """The spec of TRAIN_SPLIT and EVAL_SPLIT: keys, shapes, dtypes, label kind, counts, and with MODEL's
    `preprocess` (or a dict of columns) what the model gets, found by running it on one example. Raises
    SettingsError.

    `count=False`: from the dataset's info alone, for a dataset that may not be prepared (counts 0 if unlisted)."""
    import tensorflow_datasets as tfds

    train_examples = _split_examples(builder, "TRAIN_SPLIT", settings.train_split)
    eval_examples = _split_examples(builder, "EVAL_SPLIT", settings.eval_split)
    feature_key, label_key = _feature_keys(builder, settings, preprocessed=preprocess is not None)
    features = builder.info.features
    examples = _general_path(builder, settings, feature_key, label_key, preprocess)
    label_shape, label_dtype, num_classes = _label(builder, settings, label_key)
    inputs = None
    if examples is not None:
        feature_shape, feature_dtype = (), "string"  # stored records
        inputs, label = probe(examples, _first_records(builder, settings.train_split))
        label_shape, label_dtype = tuple(label.shape.as_list()), label.dtype.name
    else:
        feature = features[feature_key]
        feature_shape, feature_dtype = _fixed_tensor(feature, "FEATURE_KEY", feature_key, settings.dataset)
    if (train_examples is None or eval_examples is None) and count:  # not listed: count them (once, by reading)
        train_examples, eval_examples = (_count(builder, s) for s in (settings.train_split, settings.eval_split))
    return DatasetSpec(
        name=builder.info.full_name,
        feature_key=feature_key,
        label_key=label_key,
        feature_shape=feature_shape,
        feature_dtype=feature_dtype,
        is_image=not examples and isinstance(features[feature_key], tfds.features.Image) and feature_dtype == "uint8",
        label_shape=label_shape,
        label_dtype=label_dtype,
        num_classes=num_classes,
        train_examples=train_examples or 0,
        eval_examples=eval_examples or 0,
        examples=examples,
        inputs=inputs,
        record_bytes=_record_bytes(builder, settings.train_split) if examples is not None else 0,
        classes=list(features[label_key].names) if isinstance(features[label_key], tfds.features.ClassLabel) else None,
    )


def damaged(builder, error: BaseException) -> SettingsError:
    return SettingsError(
        f"DATASET={builder.info.full_name} in {builder.data_dir} cannot be read ({first_line(error, 160)}): "
        "the prepared files are incomplete or damaged; delete that directory and run again to prepare it anew"
    )


def read_split(builder, spec: DatasetSpec, split: str, examples: int) -> Split:
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


def _read_tfds(builder, spec: DatasetSpec, split: str, examples: int) -> tuple[np.ndarray, np.ndarray]:
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
        dataset = dataset.map(lambda example: (example[spec.feature_key], example[spec.label_key]))
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


def _cache_path(builder, split: str, spec: DatasetSpec) -> Path | None:
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


def load(builder, spec: DatasetSpec, settings: Settings, in_memory: bool, notes: tuple[str, ...] = ()) -> Data:
    """Both splits, held in memory or streamed. Raises SettingsError."""
    splits = ((settings.train_split, spec.train_examples), (settings.eval_split, spec.eval_examples))
    if in_memory and not spec.records:
        train, evaluation = (read_split(builder, spec, split, examples) for split, examples in splits)
        return Data(spec, train, evaluation, notes)
    train, evaluation = (StreamedSplit(builder, split, spec, examples) for split, examples in splits)
    for streamed in (train, evaluation):
        if spec.records and not streamed.as_records:
            raise SettingsError(
                f"DATASET={settings.dataset!r} is stored as {builder.info.file_format.value}: preprocess and dicts of "
                "columns read TFRecord files (TFDS's default file_format): prepare it with file_format=tfrecord"
            )
        _check_readable(streamed)
    if in_memory:
        train, evaluation = read_records(train), read_records(evaluation)
    return Data(spec, train, evaluation, notes)


def read_records(split: StreamedSplit) -> RecordsSplit:
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
        return RecordsSplit(tf.constant(records, tf.string), split.spec)


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
        raise damaged(builder, error) from None
    except (KeyError, ValueError):  # splits not listed (tfds.testing.mock_data): reading will tell
        pass
