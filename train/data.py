"""TFDS in, ready-to-train arrays and a distributed input pipeline out.

A split is read once, normalised and flattened in one vectorised pass, and held in memory.
The training order is a pure function of (SEED, step): every pass over the split is a
stateless shuffle seeded by the pass number, so a resumed run reads exactly the batches an
uninterrupted one would, and replicas and workers take disjoint slices of every global batch.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from train.errors import SettingsError, first_line
from train.settings import Settings

READ_BATCH = 8192  # examples per read when loading a split into memory
GATHER_BATCHES = 32  # training batches gathered by one op in the input pipeline


@dataclass(frozen=True)
class Split:
    features: np.ndarray  # float32, [examples, input_dim]
    labels: np.ndarray  # int64, [examples]

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class Data:
    name: str
    num_classes: int
    input_dim: int
    train: Split
    eval: Split


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


def _prepare(builder, settings: Settings) -> None:
    """Make sure the data is on disk: generated locally, or downloaded once if it must be."""
    try:
        builder.download_and_prepare()
    except Exception as error:
        data_dir = Path(builder.data_dir).parent.parent if settings.tfds_data_dir is None else settings.tfds_data_dir
        raise SettingsError(
            f"DATASET={settings.dataset!r} is not prepared in {data_dir} and could not be made "
            f"({type(error).__name__}: {first_line(error)[:200]}): on a machine with network run "
            f"scripts/prepare-dataset.sh {settings.dataset} DIR, then set TFDS_DATA_DIR=DIR"
        ) from None


def _check_split(builder, setting: str, split: str) -> None:
    known = list(builder.info.splits.keys())
    base = re.split(r"[\[+]", split)[0]
    if known and base not in known:
        raise SettingsError(
            f"{setting}={split!r} is not a split of {builder.info.full_name}: use one of {', '.join(known)}"
        )


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


def _read_split(builder, split: str, feature_key: str, label_key: str) -> Split:
    try:
        dataset = builder.as_dataset(split=split, shuffle_files=False)
        dataset = dataset.map(lambda example: (example[feature_key], example[label_key])).batch(READ_BATCH)
        chunks = [(features.numpy(), labels.numpy()) for features, labels in dataset]
    except (tf.errors.OpError, OSError) as error:
        raise SettingsError(
            f"DATASET={builder.info.full_name} in {builder.data_dir} cannot be read ({first_line(error)[:160]}): "
            "the prepared files are incomplete or damaged; delete that directory and run again to prepare it anew"
        ) from None
    if not chunks:
        raise SettingsError(f"split {split!r} of {builder.info.full_name} has no examples")
    raw = np.concatenate([features for features, _ in chunks])
    labels = np.concatenate([labels for _, labels in chunks]).astype(np.int64)
    features = raw.reshape(len(raw), -1).astype(np.float32)
    if raw.dtype == np.uint8:  # images: bytes to [0, 1]
        features /= 255.0
    return Split(features=features, labels=labels)


def load_data(settings: Settings) -> Data:
    """Open DATASET, prepare it if needed, and read both splits into memory. Raises SettingsError."""
    builder = _open_builder(settings)
    _prepare(builder, settings)
    _check_split(builder, "TRAIN_SPLIT", settings.train_split)
    _check_split(builder, "EVAL_SPLIT", settings.eval_split)
    feature_key, label_key = _feature_keys(builder, settings)

    label_feature = builder.info.features[label_key]
    num_classes = getattr(label_feature, "num_classes", None)
    if not num_classes:
        raise SettingsError(f"LABEL_KEY={label_key!r} of {settings.dataset} is not a class label (tfds ClassLabel)")
    shape = builder.info.features[feature_key].shape
    if any(dim is None for dim in shape):
        raise SettingsError(f"FEATURE_KEY={feature_key!r} has a variable shape {shape}: the MLP needs a fixed shape")

    return Data(
        name=builder.info.full_name,
        num_classes=int(num_classes),
        input_dim=int(np.prod(shape)),
        train=_read_split(builder, settings.train_split, feature_key, label_key),
        eval=_read_split(builder, settings.eval_split, feature_key, label_key),
    )


def batches_per_pass(split: Split, global_batch: int, setting: str = "TRAIN_SPLIT") -> int:
    """Whole global batches in one pass over the split (the remainder waits for the next pass)."""
    batches = len(split) // global_batch
    if batches == 0:
        raise SettingsError(
            f"{setting} has {len(split)} examples, fewer than one global batch of {global_batch}: lower BATCH_SIZE"
        )
    return batches


def train_dataset(strategy, split: Split, global_batch: int, seed: int, start_step: int):
    """Per-replica training batches from `start_step` on, forever, as a distributed dataset.

    Pass p over the split uses the permutation stateless_shuffle(range(N), seed=(SEED, p));
    its k-th global batch is cut into per-replica slices, replica r taking slice r. The whole
    plan is index arithmetic, so a restart at step s rebuilds it and skips s batches of indices.
    """
    passes_batches = batches_per_pass(split, global_batch)
    first_pass, offset = divmod(start_step, passes_batches)
    replicas = strategy.num_replicas_in_sync
    per_replica = global_batch // replicas
    with tf.device("/cpu:0"):
        features = tf.constant(split.features)
        labels = tf.constant(split.labels)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = replicas // context.num_input_pipelines  # replicas fed by this input pipeline
        first_replica = context.input_pipeline_id * local

        def pass_indices(pass_number):
            order = tf.random.experimental.stateless_shuffle(
                tf.range(len(split), dtype=tf.int64), seed=tf.stack([tf.constant(seed, tf.int64), pass_number])
            )
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


def distribute(strategy, dataset_fn):
    """The per-replica datasets as `strategy.run` takes them.

    On GPUs, tf.distribute's default: one input pipeline per worker, prefetched to every GPU. On CPU devices
    that MultiDeviceIterator costs more per step than a small model's step itself (measured by `python -m
    train bench`), so each replica gets a plain tf.data iterator on the host: one replica takes the dataset
    as it is, several take one pipeline each (PER_REPLICA) without a copy to the device they already share.
    """
    on_gpus = any("GPU" in device.upper() for device in strategy.extended.worker_devices)
    if on_gpus or isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):  # one pipeline per worker
        return strategy.distribute_datasets_from_function(dataset_fn)
    if strategy.num_replicas_in_sync == 1:
        return dataset_fn(tf.distribute.InputContext())
    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_fetch_to_device=False,
    )
    return strategy.distribute_datasets_from_function(dataset_fn, options)


def eval_dataset(split: Split, batch: int) -> tf.data.Dataset:
    """Every example of the split once, in order, last batch partial."""
    return tf.data.Dataset.from_tensor_slices((split.features, split.labels)).batch(batch).prefetch(tf.data.AUTOTUNE)
