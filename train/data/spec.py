"""What DATASET's train and eval splits hold (`DatasetSpec`), from TFDS's dataset info (`inspect`): keys,
shapes, dtypes, the label's kind, the counts, and on the general path (MODEL's `preprocess`, or a dict of
columns: train.data.examples) what the model gets, found by running it on the first stored records.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from train.data.data_settings import DataSettings
from train.data.examples import (
    BYTES_SUFFIX,
    PINNED_EXAMPLES,
    Example,
    Examples,
    InputSpec,
    named,
    no_label,
    probe,
    random_record,
)
from train.errors import SettingsError, first_line
from train.model_file import RESNET_EXAMPLE

if TYPE_CHECKING:
    import tensorflow_datasets as tfds


@dataclass(frozen=True)
class DatasetSpec:
    """What the train and eval splits hold, from TFDS's dataset info: nothing is read for it."""

    name: str  # TFDS's full name, like mnist/3.0.1
    feature_key: str
    label_key: str | None  # None: LABEL_KEY=none, the model gets its inputs alone (`label` stands in)
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
    inputs: InputSpec | None = None
    record_bytes: int = 0  # the general path: a stored record's bytes, on average
    classes: list[str] | None = None  # a ClassLabel's names (summary.json "classes"); None for other labels

    @property
    def labeled(self) -> bool:
        return self.label_key is not None

    def label(self, example: Example) -> tf.Tensor:
        """A decoded example's label; without one (LABEL_KEY=none), a uint8 0 that stands in for it on the way to
        the step, which hands the model its inputs alone (train.step)."""
        return example[self.label_key] if self.labeled else no_label()

    def pair(self, example: Example) -> tuple[tf.Tensor, tf.Tensor]:
        """(feature, label) of a decoded example, as stored."""
        return example[self.feature_key], self.label(example)

    @property
    def records(self) -> bool:
        """Whether examples take the general path: stored records, decoded and prepared one at a time."""
        return self.examples is not None

    @property
    def as_stored(self) -> bool:
        """Whether the model gets the stored feature through the engine's own Input (an image scaled to [0, 1] in
        front of it, `scale`), not what `preprocess` or a dict of columns makes of a stored record."""
        return self.examples is None

    @property
    def runs_preprocess(self) -> bool:
        """Whether MODEL's `preprocess` makes the model's inputs: it runs in tf.data and in the export's default
        signature, with the layers and tables it uses."""
        return self.examples is not None and self.examples.preprocess is not None

    @property
    def scale(self) -> float | None:
        """What the engine multiplies the stored feature by in front of the model: 1/255 for a uint8 image (to
        [0, 1]), None for the rest (passed as stored, or made by `preprocess`)."""
        return 1.0 / 255 if self.is_image else None

    @property
    def input_shape(self) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
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

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "feature": {"key": self.feature_key, "shape": list(self.feature_shape), "dtype": self.feature_dtype},
            "inputs": self.describe_inputs(),
            "scaled_to_unit_range": self.is_image,
            "label": {"key": self.label_key, "shape": list(self.label_shape), "dtype": self.label_dtype}
            if self.labeled
            else None,
            "num_classes": self.num_classes,
            "train_examples": self.train_examples,
            "eval_examples": self.eval_examples,
        }


def _split_examples(builder: tfds.core.DatasetBuilder, setting: str, split: str) -> int | None:
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


def _count(builder: tfds.core.DatasetBuilder, split: str) -> int:
    try:
        return int(builder.as_dataset(split=split).reduce(np.int64(0), lambda count, _: count + 1))
    # KeyError: the prepared dataset_info.json that lists the splits is gone
    except (tf.errors.OpError, OSError, KeyError) as error:
        raise damaged(builder, error) from None


def default_keys(builder: tfds.core.DatasetBuilder) -> tuple[str, str]:
    """The (feature, label) keys where FEATURE_KEY and LABEL_KEY are unset: the dataset's supervised keys where it
    names two, else ("image", "label"). What `inspect`, run.json's "features" and MODEL's `adapt` all read."""
    supervised = builder.info.supervised_keys
    if supervised and isinstance(supervised[0], str) and isinstance(supervised[1], str):
        return supervised[0], supervised[1]
    return "image", "label"


def _feature_keys(
    builder: tfds.core.DatasetBuilder, settings: DataSettings, preprocessed: bool = False
) -> tuple[str, str | None]:
    """(FEATURE_KEY, LABEL_KEY), given or from the dataset's supervised keys. `preprocessed`: MODEL's preprocess
    makes the inputs from whatever features it reads, so a default FEATURE_KEY need not name one."""
    default_feature, default_label = default_keys(builder)
    feature_key = settings.feature_key or default_feature
    label_key = (settings.label_key or default_label) if settings.labeled else None
    features = builder.info.features
    for setting, key in (("FEATURE_KEY", feature_key), ("LABEL_KEY", label_key)):
        if (setting == "FEATURE_KEY" and preprocessed and not settings.feature_key) or key is None:
            continue
        if key not in features:
            other = ", or LABEL_KEY=none for data without labels" if setting == "LABEL_KEY" else ""
            raise SettingsError(
                f"{setting}={key!r} is not a feature of {settings.dataset}: use one of {', '.join(features)}{other}"
            )
    return feature_key, label_key


def _fixed_tensor(
    feature: tfds.features.FeatureConnector, setting: str, key: str, dataset: str
) -> tuple[tuple[int, ...], str]:
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


def _label(
    builder: tfds.core.DatasetBuilder, dataset: str, label_key: str | None
) -> tuple[tuple[int, ...], str, int | None]:
    """The label's stored shape, dtype and `num_classes` (no_label's, for LABEL_KEY=none). Raises SettingsError."""
    import tensorflow_datasets as tfds

    if label_key is None:
        return (), "uint8", None
    label = builder.info.features[label_key]
    label_shape, label_dtype = _fixed_tensor(label, "LABEL_KEY", label_key, dataset)
    if isinstance(label, tfds.features.ClassLabel):
        return label_shape, label_dtype, int(label.num_classes)
    if len(label_shape) == 1:
        return label_shape, label_dtype, label_shape[0]  # a multi-hot vector over k classes
    if label_shape == ():
        return label_shape, label_dtype, None  # a value: regression
    raise SettingsError(
        f"LABEL_KEY={label_key!r} of {dataset} has shape {label_shape}: use a class label, a scalar "
        "value or a (k,) multi-hot vector"
    )


def _general_path(
    builder: tfds.core.DatasetBuilder,
    settings: DataSettings,
    feature_key: str,
    label_key: str | None,
    preprocess: Callable | None,
) -> Examples | None:
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
            raise SettingsError(
                f"DATASET={settings.dataset!r} has a feature {clashes[0]!r}, the name under which "
                "preprocess gets an image's stored bytes: rename it in your builder"
            )
    return Examples(builder.info.features, feature_key, label_key, preprocess, settings.model, settings.seed)


def _first_records(builder: tfds.core.DatasetBuilder, split: str) -> list[bytes]:
    """The split's first PINNED_EXAMPLES stored records where it is prepared as TFRecord files, in order, else a
    random one of its features."""
    import tensorflow_datasets as tfds

    with contextlib.suppress(Exception):  # not prepared, or not TFRecord files: a random example of the features
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


def _record_bytes(builder: tfds.core.DatasetBuilder, split: str) -> int:
    """A stored record's bytes on average, from the dataset's info (the split's bytes over its examples)."""
    info = builder.info.splits.get(re.split(r"[\[+]", split)[0]) if builder.info.splits else None
    if info is None or not info.num_examples:
        return 1
    return max(1, int(info.num_bytes) // int(info.num_examples))


def inspect(
    builder: tfds.core.DatasetBuilder, settings: DataSettings, count: bool = True, preprocess: Callable | None = None
) -> DatasetSpec:
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
    label_shape, label_dtype, num_classes = _label(builder, settings.dataset, label_key)
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
        classes=list(features[label_key].names)
        if label_key is not None and isinstance(features[label_key], tfds.features.ClassLabel)
        else None,
    )


def features_record(builder: tfds.core.DatasetBuilder, settings: DataSettings) -> dict[str, object]:
    """What `predict` on files needs of the data, recorded in run.json (its "features") so that it needs neither the
    source nor its written copy: which stored features are images (an image file is read as one), whether the label
    is one class or value (else a multi-hot vector), and a class label's names."""
    import tensorflow_datasets as tfds

    features = builder.info.features
    label_key = settings.label_key or default_keys(builder)[1]
    label = features[label_key] if label_key in features else None  # noqa: SIM401 (a FeaturesDict has no .get)
    is_class = isinstance(label, tfds.features.ClassLabel)
    return {
        "images": sorted(name for name, feature in features.items() if isinstance(feature, tfds.features.Image)),
        "label_is_class": is_class or tuple(getattr(label, "shape", ())) == (),
        "classes": list(label.names) if is_class else None,
    }


def damaged(builder: tfds.core.DatasetBuilder, error: BaseException) -> SettingsError:
    return SettingsError(
        f"DATASET={builder.info.full_name} in {builder.data_dir} cannot be read ({first_line(error, 160)}): "
        "the prepared files are incomplete or damaged; delete that directory and run again to prepare it anew"
    )
