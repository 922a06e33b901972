"""Which stored image cannot be decoded: what a run says when one stops it mid-training (a file cut short is found
while a folder is written, train.data.intact; one whole in structure but damaged inside, a JPEG whose header says
it is 0 pixels wide, fails only where tf.data decodes it)."""

from __future__ import annotations

import re

import tensorflow as tf

from train.errors import clip

# What TensorFlow's image decoders raise for bytes they cannot read (InvalidArgumentError's message).
DECODE_ERROR = re.compile(r"JPEG|PNG|GIF|BMP|image|Jpeg|Png|Gif|Bmp")


def undecodable(split, spec) -> tuple[str, str] | None:
    """(the example's `filename`, or its place in the split, and the decoder's message) of the first stored image
    in the split that does not decode; None where every one does. Reads the whole split once, in order."""
    if spec.examples is None or not spec.examples.images:
        return None
    keys = spec.examples.images
    features = {key: tf.io.FixedLenFeature([], tf.string) for key in keys}
    named = "filename" in spec.examples.features
    if named:
        features["filename"] = tf.io.FixedLenFeature([], tf.string)
    records = split.ordered_records().map(lambda record, _: record)
    for place, record in enumerate(records):
        example = tf.io.parse_single_example(record, features)
        for key in keys:
            try:
                tf.image.decode_image(example[key], channels=3, expand_animations=False)
                if tf.io.is_jpeg(example[key]):
                    tf.image.extract_jpeg_shape(example[key])
            except tf.errors.InvalidArgumentError as error:
                where = example["filename"].numpy().decode() if named else f"example {place}"
                message = re.sub(r"\{\{.*?\}\}\s*", "", str(error.message)).splitlines()[0]  # TF's node names out
                return where, clip(message, 120)
    return None
