"""The general input path: one stored example at a time, decoded and made into the model's (inputs, label).

Used where the model's input is not one fixed-shape tensor as TFDS stores it: the MODEL file defines
`preprocess(example, training, seed)`, or FEATURE_KEY names a FeaturesDict of columns. The pipelines hold and
shuffle the stored records (serialized tf.train.Examples: an image stays its JPEG or PNG bytes), skip and
shard them, and only then decode and prepare each one (train.data.feeds), so a shuffle buffer holds bytes and a
resume decodes none of the examples it skips. The same `Examples.prepare` runs in training, in evaluation and,
for one batch of what a client sends, in the export (`serving_function`).

Each example's seed is `stateless_fold_in((SEED, pass), position)`: a function of the seed, the pass and the
example's place in the split, whatever the topology, the order or the step a run resumed at.

`preprocess`'s outputs taken as Keras takes them: a static shape with unknown dimensions (an image resized to
32x32 from a crop of its own size has the static shape (32, 32, None)) is taken at the concrete shape the first
PINNED_EXAMPLES examples give, in training and in evaluation, and pinned with `tf.ensure_shape` in the map. A
dimension that differs among those examples really varies and is refused; a later example of another shape
stops the run in one line (train.data.reading_errors.odd_shape reads TensorFlow's error for it).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from train.errors import SettingsError, clip, first_line
from train.model_file import RESNET_EXAMPLE

if TYPE_CHECKING:
    import keras
    import tensorflow_datasets as tfds

BYTES_SUFFIX = "_bytes"  # example["image_bytes"]: an image feature's stored bytes, beside the decoded image
EVAL_PASS = -1  # the `pass` of an evaluation's (and the export's) seeds: no training pass draws them
# A decoded example: each stored feature by name, a FeaturesDict's columns as a dict of their own.
Example = dict[str, tf.Tensor | dict[str, tf.Tensor]]
# What the model gets of one example (`preprocess`'s inputs): a tensor, or a dict of them by Input name; its spec.
Inputs = tf.Tensor | dict[str, tf.Tensor]
InputSpec = tf.TensorSpec | dict[str, tf.TensorSpec]
# A nest of tensors, specs or shapes (what `by_name` orders): dicts and tuples of them.
Structure = tf.Tensor | tf.TensorSpec | dict | tuple
PINNED_EXAMPLES = 32  # the first examples of the training split an output of unknown dimensions is taken at
PINNED_OP = "preprocess_output_pinned"  # the ensure_shape op's name: how its error is told from others
MISMATCH = re.compile(r"Shape of tensor \S+ \[([^\]]*)\] is not compatible with expected shape \[([^\]]*)\]")


def example_seed(seed: int, pass_number: int | tf.Tensor, position: int | tf.Tensor) -> tf.Tensor:
    """The (2,) int64 seed `preprocess` gets: different for every example and pass, the same wherever it runs."""
    base = tf.stack([tf.constant(seed, tf.int64), tf.cast(pass_number, tf.int64)])
    return tf.random.experimental.stateless_fold_in(base, tf.cast(position, tf.int64))


def named(structure: Inputs | InputSpec) -> list[tuple[str, tf.Tensor | tf.TensorSpec]]:
    """(name, leaf) of inputs: a dict's entries by key, a single tensor as "inputs"."""
    if isinstance(structure, dict):
        return [(str(key), value) for key, value in structure.items()]
    return [("inputs", structure)]


def by_name(structure: Structure) -> Structure:
    """`structure` with every dict's keys in name order. A prepared table's columns come back from its files in
    another order in each process (TFDS keeps its features in a protobuf map), and a model built by iterating
    `input_shape`, or calling on `inputs.items()`, would take them in that order: after a restart its weights
    would meet other columns. Only the structure changes: nothing is computed."""
    if isinstance(structure, dict):
        return {key: by_name(structure[key]) for key in sorted(structure)}
    if isinstance(structure, tuple) and not hasattr(structure, "_fields"):
        return tuple(by_name(part) for part in structure)
    return structure


@contextlib.contextmanager
def float32_policy() -> Iterator[None]:
    """Keras layers made while `preprocess` is traced compute in float32: a mixed-precision policy changes the
    model's compute, never what `preprocess` returns (a Resizing layer would otherwise give bfloat16)."""
    import keras

    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(policy)


class _Reads(dict):
    """An example that notes which features `preprocess` reads: those the export's default signature takes.
    Whatever walks the whole dict (a copy, `**example`, `.items()`) reads every feature."""

    def __init__(self, example: dict, read: set[str]) -> None:
        super().__init__(example)
        self.read = read

    def __getitem__(self, key: str) -> tf.Tensor:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: tf.Tensor | None = None) -> tf.Tensor | None:
        self.read.add(key)
        return super().get(key, default)

    def _all(self):
        self.read.update(super().keys())
        return self

    def __iter__(self):
        return super(_Reads, self._all()).__iter__()

    def keys(self):
        return super(_Reads, self._all()).keys()

    def items(self):
        return super(_Reads, self._all()).items()

    def values(self):
        return super(_Reads, self._all()).values()


def decode_image(feature: tfds.features.Image, encoded: tf.Tensor) -> tf.Tensor:
    """An Image feature's stored bytes decoded as TFDS does, but a GIF as its first frame (TFDS's decode gives
    every frame, a 4-D tensor) and a BMP too: whatever a folder of images held (train.data.local)."""
    if feature.np_dtype != np.uint8:  # TFDS's float images are bitcast PNGs: its own decode
        return feature.decode_example(encoded)
    image = tf.image.decode_image(encoded, channels=feature.shape[-1], expand_animations=False)
    image.set_shape(feature.shape)
    return image


def no_label() -> tf.Tensor:
    """What stands in for the label of data without one (LABEL_KEY=none): one byte, never given to the model."""
    return tf.zeros((), tf.uint8)


@dataclass
class Examples:
    """How one stored record becomes what the model gets.

    `features`: the dataset's TFDS FeaturesDict; `preprocess`: MODEL's, or None (then the inputs are the
    FEATURE_KEY's dict of columns as stored)."""

    features: tfds.features.FeaturesDict = field(repr=False)
    feature_key: str
    label_key: str | None  # None: LABEL_KEY=none (`preprocess` returns the inputs alone)
    preprocess: Callable | None
    model: str  # MODEL, for the messages
    seed: int = 0
    read: set[str] = field(default_factory=set)  # what `preprocess(training=False)` reads (found when traced)
    pinned: dict[str, tuple[int, ...]] = field(default_factory=dict)  # outputs of unknown dimensions, as taken
    notes: list[str] = field(default_factory=list)  # what the start says of them (`pin`)

    @property
    def images(self) -> tuple[str, ...]:
        """The top-level image features: stored encoded, decoded here (TFDS's SkipDecoding hands their bytes)."""
        import tensorflow_datasets as tfds

        return tuple(key for key, feature in self.features.items() if isinstance(feature, tfds.features.Image))

    def decode(self, record: tf.Tensor) -> Example:
        """A serialized example as TFDS decodes it, each image also as its stored bytes (`<key>_bytes`)."""
        import tensorflow_datasets as tfds

        decoders = {key: tfds.decode.SkipDecoding() for key in self.images}
        return self.with_images(self.features.deserialize_example(record, decoders=decoders))

    def with_images(self, example: Example) -> Example:
        """Images as stored bytes -> decoded (JPEG or PNG, told from the bytes), the bytes kept beside them.
        A `preprocess` that reads only the bytes costs no decoding: TensorFlow prunes what nothing uses."""
        example = dict(example)
        for key in self.images:
            if key not in example:  # not served: preprocess does not read it
                continue
            encoded = example[key]
            example[key] = decode_image(self.features[key], encoded)
            example[key + BYTES_SUFFIX] = encoded
        return example

    def call(self, example: Example, training: bool, seed: tf.Tensor) -> tuple[Inputs, tf.Tensor]:
        """(inputs, label) of a decoded example: `preprocess`'s, or the columns of FEATURE_KEY as stored; a dict's keys
        in name order (`by_name`)."""
        if self.preprocess is None:
            return by_name(example[self.feature_key]), example[self.label_key] if self.label_key else no_label()
        if not training:  # what evaluation reads is what the export's default signature will take
            example = _Reads(example, self.read)
        with float32_policy():
            result = self.preprocess(example, training, seed)
        if self.label_key is None:  # LABEL_KEY=none: the inputs alone, as Keras's fit(x) takes them
            result = (result, no_label())
        # (inputs, label) as returned; what is not is refused from the map's spec (`check_outputs`): an error raised
        # here, inside tf.data's tracing, would reach the user wrapped in autograph's stack
        return pin(self.pinned, by_name(tuple(result) if isinstance(result, list) else result))

    def prepare(
        self, record: tf.Tensor, position: tf.Tensor, pass_number: int | tf.Tensor, training: bool
    ) -> tuple[Inputs, tf.Tensor]:
        """A stored record, its place in the split and the pass -> (inputs, label)."""
        return self.call(self.decode(record), training, example_seed(self.seed, pass_number, position))

    def served(self) -> dict[str, tf.TensorSpec]:
        """What the export's default signature takes, one example: each stored feature `preprocess` reads (all of
        FEATURE_KEY's columns without it), under its own name; an image as its encoded bytes; a FeaturesDict's
        columns each under the column's name."""
        import tensorflow_datasets as tfds

        keys = self.read - {self.label_key} if self.preprocess else {self.feature_key}
        images = {image + BYTES_SUFFIX: image for image in self.images}  # an image's bytes are the image served
        served: dict[str, tf.TensorSpec] = {}
        for key in sorted({images.get(key, key) for key in keys}):
            feature = self.features[key]
            if key in self.images:
                served[key] = tf.TensorSpec((), tf.string, name=key)
            elif isinstance(feature, tfds.features.FeaturesDict):
                for column, info in feature.get_tensor_info().items():
                    served[column] = tf.TensorSpec(info.shape, info.tf_dtype, name=column)
            else:
                info = feature.get_tensor_info()
                served[key] = tf.TensorSpec(info.shape, info.tf_dtype, name=key)
        return served

    def serving_function(self, model: keras.Model, inputs_spec: InputSpec) -> tuple[Callable, list[tf.TensorSpec]]:
        """A function of a batch of what `served` lists (positional, in its order) that runs `prepare`'s
        evaluation path on each example and then `model(training=False)`; and its input signature."""
        import tensorflow_datasets as tfds

        served = self.served()
        names = list(served)
        columns = {
            name: key
            for key, feature in self.features.items()
            if isinstance(feature, tfds.features.FeaturesDict)
            for name in feature
        }
        label_info = self.features[self.label_key].get_tensor_info() if self.label_key else None

        def one(row: dict[str, tf.Tensor]):
            example: Example = {}
            for name, value in row.items():
                if name in columns and columns[name] not in row:
                    example.setdefault(columns[name], {})[name] = value
                else:
                    example[name] = value
            if label_info is not None:
                example[self.label_key] = tf.zeros(label_info.shape, label_info.tf_dtype)  # read, never used
            inputs, _ = self.call(self.with_images(example), False, example_seed(self.seed, EVAL_PASS, 0))
            return inputs

        def serve(*batch: tf.Tensor) -> tf.Tensor | dict[str, tf.Tensor]:
            prepared = tf.map_fn(one, dict(zip(names, batch, strict=True)), fn_output_signature=inputs_spec)
            return model(prepared, training=False)

        signature = [tf.TensorSpec((None, *spec.shape), spec.dtype, name=name) for name, spec in served.items()]
        return serve, signature


def check_outputs(
    examples: Examples, element_spec: tuple[InputSpec, tf.TensorSpec], training: bool, fixed: bool = True
) -> tuple[InputSpec, tf.TensorSpec]:
    """`preprocess`'s (inputs, label) spec, refused where the model cannot take it; with `fixed`, also where a
    static shape has an unknown dimension. Raises SettingsError."""
    if not (isinstance(element_spec, tuple) and len(element_spec) == 2):
        returned = f"{len(element_spec)} values" if isinstance(element_spec, tuple) else "one value"
        raise SettingsError(
            f"MODEL={examples.model!r}: preprocess(training={training}) returns {returned}, not (inputs, label) (see "
            f"{RESNET_EXAMPLE})"
        )
    inputs, label = element_spec
    where = (
        f"MODEL={examples.model!r}: preprocess(training={training})"
        if examples.preprocess
        else (f"FEATURE_KEY={examples.feature_key!r}")
    )
    if examples.label_key is None and isinstance(inputs, tuple):
        raise SettingsError(
            f"{where} returns a tuple of {len(inputs)}, but LABEL_KEY=none gives the model its inputs alone: return "
            "them alone (a tensor, or a dict of tensors keyed by the model's keras.Input names)"
        )
    if isinstance(inputs, dict) and not all(isinstance(key, str) for key in inputs):
        raise SettingsError(f"{where} returns inputs keyed by {sorted(map(repr, inputs))}: key them by Input name")
    if not isinstance(inputs, dict) and not isinstance(inputs, tf.TensorSpec):
        raise SettingsError(
            f"{where} returns inputs of type {type(inputs).__name__}: return a tensor, or a dict of tensors keyed "
            "by the model's keras.Input names"
        )
    for path, spec in [*named(inputs), ("label", label)]:
        if not isinstance(spec, tf.TensorSpec):
            raise SettingsError(f"{where} returns {path} as a {type(spec).__name__}: return tensors")
        if spec.dtype == tf.string:
            raise SettingsError(
                f"{where} returns {path} as strings (shape {tuple(spec.shape)}): a model input must be numeric "
                "(decode it in preprocess; strings cannot be copied to a GPU replica)"
            )
        if fixed and not spec.shape.is_fully_defined():
            raise variable_shape(where, path, spec)
    return inputs, label


def variable_shape(where: str, path: str, spec: tf.TensorSpec) -> SettingsError:
    return SettingsError(
        f"{where} returns {path} of variable shape {_shape(spec)}: every output needs a fixed shape (resize or crop "
        f"it to a constant size, as {RESNET_EXAMPLE} does)"
    )


def _shape(spec: tf.TensorSpec) -> str:
    return "(" + ", ".join("None" if dim is None else str(dim) for dim in spec.shape.as_list()) + ")"


def probe(examples: Examples, records: list[bytes]) -> tuple[InputSpec, tf.TensorSpec]:
    """(inputs spec, label spec) of the examples, from `preprocess` run on `records` (the first stored examples)
    in training and in evaluation: both must give the same fixed shapes and dtypes, an unknown dimension taken at
    what the examples give (`pin`). Raises SettingsError."""
    specs, datasets = _probed(examples, records, fixed=False)
    paths = unknown([*named(specs[0][0]), ("label", specs[0][1]), *named(specs[1][0]), ("label", specs[1][1])])
    if paths and examples.preprocess is not None:
        _take_shapes(examples, sorted(set(paths)), datasets, specs[0])
    specs, _ = _probed(examples, records[:1], fixed=True)
    if specs[0] != specs[1]:
        raise SettingsError(
            f"MODEL={examples.model!r}: preprocess returns {_describe(specs[0])} in training but "
            f"{_describe(specs[1])} in evaluation: return the same shapes and dtypes in both"
        )
    return specs[0]


def _probed(
    examples: Examples, records: list[bytes], fixed: bool
) -> tuple[list[tuple[InputSpec, tf.TensorSpec]], list[tf.data.Dataset]]:
    """The (inputs, label) spec in training and in evaluation, and the datasets of `records` prepared in each."""
    specs, datasets = [], []
    for training in (True, False):
        # position and pass as a pipeline's elements, as in training: nothing `preprocess` does is folded away, and
        # each example draws from its own seed, as it will in training
        stored = tf.data.Dataset.from_tensor_slices(
            (tf.constant(records), tf.range(len(records), dtype=tf.int64), tf.zeros(len(records), tf.int64))
        )
        try:
            dataset = stored.map(lambda r, p, n, training=training: examples.prepare(r, p, n, training))
            specs.append(check_outputs(examples, dataset.element_spec, training, fixed))
            next(iter(dataset))  # what only running shows: a failed decode, an assertion
        except SettingsError:
            raise
        except Exception as error:
            what = "preprocess" if examples.preprocess else f"decoding FEATURE_KEY={examples.feature_key!r}"
            raise SettingsError(
                f"MODEL={examples.model!r}: {what} (training={training}) raised {_raised(error)}"
            ) from None
        datasets.append(dataset)
    return specs, datasets


def _take_shapes(
    examples: Examples, paths: list[str], datasets: list[tf.data.Dataset], spec: tuple[InputSpec, tf.TensorSpec]
) -> None:
    """Pin each output in `paths` at the one shape the examples give in both modes, or refuse it as variable."""
    static = dict([*named(spec[0]), ("label", spec[1])])
    try:
        found = [concrete_shapes(dataset, paths) for dataset in datasets]  # in training, in evaluation
    except Exception as error:
        raise SettingsError(f"MODEL={examples.model!r}: preprocess raised {_raised(error)}") from None
    for path in paths:
        for training, shapes in zip((True, False), found, strict=True):
            if len(shapes[path] | found[0][path]) != 1:  # varies in this mode, or differs from training's
                raise variable_shape(f"MODEL={examples.model!r}: preprocess(training={training})", path, static[path])
        examples.pinned[path] = next(iter(found[0][path]))
        what = "" if path == "inputs" else f" {path}"
        examples.notes.append(
            f"preprocess returns{what} {shape_text(static[path].shape)}; the first examples give "
            f"{shape_text(examples.pinned[path])}: taken as fixed"
        )


def _raised(error: BaseException) -> str:
    """ "Type: message" of what `preprocess` raised: autograph wraps it in "in user code:" and a stack."""
    text = str(error)
    if text.startswith("in user code:"):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return clip(lines[-1], 240)  # the original "ValueError: ..." ends the wrapped message
    return f"{type(error).__name__}: {first_line(error, 240)}"


def _describe(spec: InputSpec) -> str:
    inputs, label = spec
    return ", ".join(f"{path} {_shape(s)} {s.dtype.name}" for path, s in [*named(inputs), ("label", label)])


def random_record(features: tfds.features.FeaturesDict, rng: np.random.Generator) -> bytes:
    """A serialized example of random values of the features' shapes and dtypes (images of a random size): what
    the spec is found from where the dataset is not prepared (the fork's contract test)."""
    import tensorflow_datasets as tfds

    def value(feature: tfds.features.FeatureConnector):
        if isinstance(feature, tfds.features.FeaturesDict):
            return {key: value(each) for key, each in feature.items()}
        if isinstance(feature, tfds.features.ClassLabel):
            return int(rng.integers(feature.num_classes))
        if isinstance(feature, tfds.features.Text):
            return "text"
        info = feature.get_tensor_info()
        shape = tuple(int(rng.integers(24, 48)) if dim is None else dim for dim in info.shape)
        dtype = np.dtype(info.np_dtype)
        if dtype.kind == "f":
            return rng.normal(size=shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, size=shape).astype(bool)
        return rng.integers(0, 2 if dtype != np.uint8 else 256, size=shape).astype(dtype)

    return features.serialize_example(value(features))


def shape_text(shape: tf.TensorShape | list[int | None] | tuple[int, ...]) -> str:
    dims = shape.as_list() if isinstance(shape, tf.TensorShape) else list(shape)
    return "(" + ", ".join("None" if dim is None else str(dim) for dim in dims) + ("," if len(dims) == 1 else "") + ")"


def unknown(paths: list[tuple[str, tf.TensorSpec]]) -> list[str]:
    """The paths whose static shape has an unknown dimension."""
    return [path for path, spec in paths if isinstance(spec, tf.TensorSpec) and not spec.shape.is_fully_defined()]


def concrete_shapes(dataset: tf.data.Dataset, paths: list[str]) -> dict[str, set[tuple[int, ...]]]:
    """Each path's concrete shapes over every element of `dataset` ((inputs, label) pairs)."""
    found: dict[str, set[tuple[int, ...]]] = {path: set() for path in paths}
    for inputs, label in dataset:
        for path, value in [*named(inputs), ("label", label)]:
            if path in found:
                found[path].add(tuple(value.shape.as_list()))
    return found


def pin(pinned: dict[str, tuple[int, ...]], result: object) -> object:
    """(inputs, label) with each pinned output passed through `tf.ensure_shape` at its taken shape."""
    if not pinned or not (isinstance(result, tuple) and len(result) == 2):
        return result
    inputs, label = result

    def fixed(path: str, value: tf.Tensor) -> tf.Tensor:
        return tf.ensure_shape(value, pinned[path], name=PINNED_OP) if path in pinned else value

    if isinstance(inputs, dict):
        inputs = {key: fixed(str(key), value) for key, value in inputs.items()}
    else:
        inputs = fixed(named(inputs)[0][0], inputs)
    return inputs, fixed("label", label)
