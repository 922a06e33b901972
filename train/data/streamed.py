"""A split streamed from its prepared files as it is needed (`StreamedSplit`): read through TFDS, or, where
TFDS prepared it as TFRecord files (its default format), read from them directly, in chunks of serialized
examples shared out between input pipelines, shuffled in windows, and parsed a chunk at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from train.data.spec import DatasetSpec, damaged

if TYPE_CHECKING:
    import tensorflow_datasets as tfds

SHUFFLE_BUFFER_BYTES = 256 << 20  # streamed splits: the shuffle buffer holds about this many bytes of examples
SHUFFLE_BUFFER_EXAMPLES = (1024, 65536)  # ... but at least and at most this many examples
RECORD_CHUNK = 256  # streamed splits: serialized examples read (and shared between pipelines) in chunks of this many


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
    def tfrecord(self) -> bool:
        """Whether the split is read as TFRecord files directly (TFDS's default format): batched parsing."""
        import tensorflow_datasets as tfds

        return self.builder.info.file_format == tfds.core.FileFormat.TFRECORD and bool(self.files)

    def share(self, index: int, count: int) -> tuple[tuple[tuple[str, int, int], ...], int]:
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
        if not self.tfrecord:
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
        keys = (self.spec.feature_key, self.spec.label_key) if self.spec.labeled else (self.spec.feature_key,)
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


def _example_spec(info) -> tf.io.FixedLenFeature:
    """How tf.train.Example holds a TFDS tensor: float32 as floats, integers as int64, the rest as bytes."""
    dtype = info.tf_dtype
    kind = tf.string if dtype == tf.string else tf.float32 if dtype.is_floating else tf.int64
    return tf.io.FixedLenFeature(info.shape, kind)


def check_readable(split: StreamedSplit) -> None:
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
