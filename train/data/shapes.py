"""`preprocess`'s outputs taken as Keras takes them: a static shape with unknown dimensions (an image resized to
32x32 from a crop of its own size has the static shape (32, 32, None)) is taken at the concrete shape the first
PINNED_EXAMPLES examples give, in training and in evaluation, and pinned with `tf.ensure_shape` in the map. A
dimension that differs among those examples really varies and is refused; a later example of another shape
stops the run in one line (`odd_shape` reads TensorFlow's error for it).
"""

from __future__ import annotations

import re

import tensorflow as tf

PINNED_EXAMPLES = 32  # the first examples of the training split an output of unknown dimensions is taken at
PINNED_OP = "preprocess_output_pinned"  # the ensure_shape op's name: how its error is told from others
_MISMATCH = re.compile(r"Shape of tensor \S+ \[([^\]]*)\] is not compatible with expected shape \[([^\]]*)\]")


def shape_text(shape) -> str:
    dims = shape.as_list() if isinstance(shape, tf.TensorShape) else list(shape)
    return "(" + ", ".join("None" if dim is None else str(dim) for dim in dims) + ("," if len(dims) == 1 else "") + ")"


def unknown(paths: list[tuple[str, tf.TensorSpec]]) -> list[str]:
    """The paths whose static shape has an unknown dimension."""
    return [path for path, spec in paths if isinstance(spec, tf.TensorSpec) and not spec.shape.is_fully_defined()]


def concrete_shapes(datasets: list[tf.data.Dataset], paths: list[str], named) -> dict[str, set[tuple[int, ...]]]:
    """Each path's concrete shapes over every element of `datasets` ((inputs, label) pairs)."""
    found: dict[str, set[tuple[int, ...]]] = {path: set() for path in paths}
    for dataset in datasets:
        for inputs, label in dataset:
            for path, value in [*named(inputs), ("label", label)]:
                if path in found:
                    found[path].add(tuple(value.shape.as_list()))
    return found


def pin(pinned: dict[str, tuple[int, ...]], result: object, named) -> object:
    """(inputs, label) with each pinned output passed through `tf.ensure_shape` at its taken shape."""
    if not pinned or not (isinstance(result, tuple) and len(result) == 2):
        return result
    inputs, label = result

    def fixed(path: str, value):
        return tf.ensure_shape(value, pinned[path], name=PINNED_OP) if path in pinned else value

    if isinstance(inputs, dict):
        inputs = {key: fixed(str(key), value) for key, value in inputs.items()}
    else:
        inputs = fixed(named(inputs)[0][0], inputs)
    return inputs, fixed("label", label)


def odd_shape(error: BaseException) -> tuple[str, str] | None:
    """(got, expected) shapes where `error` is a pinned output's ensure_shape failing on a later example."""
    text = str(error)
    match = _MISMATCH.search(text)
    if PINNED_OP not in text or match is None:
        return None
    got, expected = (shape_text([int(dim) for dim in group.split(",") if dim.strip()]) for group in match.groups())
    return got, expected
