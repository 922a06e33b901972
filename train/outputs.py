"""What the export's signatures return, named as TF Serving's classification and regression APIs name them.

    a class label      scores  float32 [batch, k]  probabilities (a softmax where the model gives logits)
                       classes string  [batch, k]  the class names, in the order of `scores`
    a multi-hot label  scores  float32 [batch, k]  each class's probability (a sigmoid where it gives logits)
                       classes string  [batch, k]
    a value            outputs                     the model's prediction
    anything else      the model's own output names (no label: LABEL_KEY=none; several outputs; not one score
                       per class)

Class names are the TFDS ClassLabel's; where the dataset has none, the class indices as text.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING

from train.errors import SettingsError

if TYPE_CHECKING:  # importing this module loads no TensorFlow: `predict` reads these names before it loads
    import keras
    import tensorflow as tf

    from train.data.spec import DatasetSpec

    # What a model returns for a batch: one tensor, or one per output (a dict by name, or a list or tuple)
    ModelOutput = tf.Tensor | dict[str, tf.Tensor] | list[tf.Tensor] | tuple[tf.Tensor, ...]

SCORES = "scores"  # tf.saved_model.CLASSIFY_OUTPUT_SCORES
CLASSES = "classes"  # tf.saved_model.CLASSIFY_OUTPUT_CLASSES
OUTPUTS = "outputs"  # tf.saved_model.REGRESS_OUTPUTS


def label_kind(spec: DatasetSpec) -> str:
    """ "class" (one of num_classes), "multi_hot" (a (k,) vector), "value" (regression) or "none" (LABEL_KEY=none)."""
    if not spec.labeled:
        return "none"
    if spec.label_shape == () and spec.num_classes is not None:
        return "class"
    if len(spec.label_shape) == 1:
        return "multi_hot"
    return "value"


def class_names(spec: DatasetSpec) -> tuple[str, ...]:
    """The k class names of the label: the ClassLabel's, else "0" ... "k-1"."""
    if spec.classes:
        return tuple(spec.classes)
    count = spec.num_classes if spec.num_classes is not None else spec.label_shape[0]
    return tuple(str(index) for index in range(count))


def gives_logits(network: keras.Model) -> bool:
    """Whether the compiled loss takes logits (`from_logits=True`): then the scores need an activation."""
    loss = network.loss
    config = loss.get_config() if hasattr(loss, "get_config") else {}
    return bool(config.get("from_logits", False))


def _own_names(network: keras.Model, output: ModelOutput) -> dict[str, tf.Tensor]:
    """Outputs under the model's own names: a dict's keys, a functional model's output names (its output layers'),
    a Sequential's last layer's name, else output_<i>."""
    import keras

    if isinstance(output, dict):
        return dict(output)
    values = list(output) if isinstance(output, list | tuple) else [output]
    names = getattr(network, "output_names", None) or []
    if not names and isinstance(network, keras.Sequential) and network.layers:  # Keras names no Sequential output
        names = [network.layers[-1].name]
    if len(names) != len(values) or len(set(names)) != len(names):
        names = [f"output_{index}" for index in range(len(values))]
    return dict(zip(names, values, strict=True))


def name_outputs(
    network: keras.Model, spec: DatasetSpec, with_classes: bool = True
) -> Callable[[ModelOutput], dict[str, tf.Tensor]]:
    """A function of the model's output (a batch) to the signature's named outputs (the module's table), in Keras
    ops, so it names a functional model's outputs too; without `classes` (`with_classes`: ONNX and LiteRT carry
    numbers alone, train.formats)."""
    import keras
    import tensorflow as tf

    kind = label_kind(spec)
    logits = gives_logits(network)
    names = class_names(spec) if kind in ("class", "multi_hot") else ()

    def named(output: ModelOutput) -> dict[str, tf.Tensor]:
        if kind == "none":  # no label to name them after: the model's own names
            return _own_names(network, output)
        if isinstance(output, dict | list | tuple) and len(output) != 1:
            return _own_names(network, output)
        if isinstance(output, dict | list | tuple):
            output = next(iter(output.values())) if isinstance(output, dict) else output[0]
        if kind == "value":
            return {OUTPUTS: output}
        if len(output.shape) != 2 or output.shape[-1] != len(names):  # not one score per class
            return _own_names(network, output)
        scores = keras.ops.cast(output, "float32")
        if logits:
            scores = keras.ops.softmax(scores) if kind == "class" else keras.ops.sigmoid(scores)
        if not with_classes:
            return {SCORES: scores}
        classes = tf.tile(tf.constant(names, tf.string)[tf.newaxis], [tf.shape(scores)[0], 1])
        return {SCORES: scores, CLASSES: classes}

    return named


def check_output(model: str, network: keras.Model, output: keras.KerasTensor, spec: DatasetSpec) -> None:
    """What Keras builds without a word but cannot train as meant: an output no gradient flows through (an integer
    one), and under sparse categorical cross-entropy one whose last axis is not one score per class (wider trains
    a classifier of classes the data lacks; 1 trains to NaN). Raises SettingsError."""
    import keras

    if not hasattr(output, "shape"):  # several outputs: Keras's own checks only
        return
    if not keras.backend.is_float_dtype(output.dtype):
        raise SettingsError(
            f"MODEL={model!r}: its output is {output.dtype}, through which no gradient flows: end the model "
            "with a floating-point output (no cast to an integer type inside it)"
        )
    loss = keras.losses.get(network.loss) if isinstance(network.loss, str) else network.loss
    sparse = getattr(loss, "fn", loss) is keras.losses.sparse_categorical_crossentropy
    classes = spec.num_classes
    if sparse and classes is not None and spec.label_shape == () and output.shape[-1] != classes:
        scores = f"{output.shape[-1]} class{'es' if output.shape[-1] != 1 else ''}"
        raise SettingsError(
            f"MODEL={model!r}: its output {tuple(output.shape)} scores {scores}, but each label of "
            f"{spec.name} (LABEL_KEY={spec.label_key!r}) is one of {classes} (0-{classes - 1}) under sparse "
            "categorical cross-entropy: end the model with num_classes units, like Dense(num_classes, "
            "activation='softmax')"
        )


def output_shape(network: keras.Model) -> str:
    """The model's one output's shape in words: `model.outputs`, since a Sequential model, what the general path
    trains as it is, has no `.output` of its own ("never been called")."""
    with suppress(Exception):  # a subclassed model (no Inputs), several outputs
        (output,) = network.outputs
        return str(tuple(output.shape))
    return "(unknown shape)"


def label_words(spec: DatasetSpec) -> str:
    """A label of `spec` in words, for a refusal."""
    if spec.label_shape == () and spec.num_classes is not None:
        return f"a class of {spec.num_classes}"
    if spec.label_shape == ():
        return f"a {spec.label_dtype} value"
    return f"{spec.label_dtype} of shape {spec.label_shape}"
