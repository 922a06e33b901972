"""A split held in memory: as TFDS stores it (`Split`: a uint8 image stays one byte a value), or on the general
path as its stored records (`SerializedSplit`: the serialized examples, images encoded).

A fixed-shape feature's split is read once into one 64-byte-aligned NumPy buffer and handed to TensorFlow
without a copy (DLPack): `tf.constant` of an array costs twice its size, and TensorFlow needs the alignment.
The first read is cached beside the prepared files, so later runs load in milliseconds. A `SerializedSplit`
is read from the split's TFRecord files, in order (`read_serialized`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import tensorflow as tf

from train.data.spec import DatasetSpec, damaged

if TYPE_CHECKING:
    from train.data.streamed import StreamedSplit

READ_BYTES = 16 << 20  # a split is read into memory in chunks of about this many bytes (a transient copy)
CACHE_DIR = "train-arrays-cache"  # inside the prepared dataset's directory: in-memory splits as read, for the next run
ALIGNMENT = 64  # bytes: what TensorFlow's kernels assume of a tensor's buffer (tf.gather aborts on less)


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
