"""What reading the data can raise mid-run, told in one line: a `preprocess` that raises on some examples only
(found where tf.data runs it), and which stored image cannot be decoded (a file cut short is found while a folder
is written, train.data.local.damage; one whole in structure but damaged inside, a JPEG whose header says it is 0 pixels
wide, fails only where tf.data decodes it); and a later example whose `preprocess` output has another shape than
the first examples gave (`odd_shape`)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import tensorflow as tf

from train.data.examples import MISMATCH, PINNED_OP, shape_text
from train.data.source import Data, TrainSplit
from train.data.spec import DatasetSpec
from train.errors import TrainingError, clip, first_line
from train.model_file import RESNET_EXAMPLE

# How TensorFlow reports what a function inside tf.data's map raised: "Error in user-defined function passed to
# ParallelMapDatasetV2:56 transformation with iterator: Iterator::Root::...: assertion failed: [...]".
_IN_MAP = re.compile(r"Error in user-defined function passed to \S+ transformation with iterator: [\w:]+: (.*)")
# What TensorFlow's image decoders raise for bytes they cannot read (InvalidArgumentError's message).
DECODE_ERROR = re.compile(r"JPEG|PNG|GIF|BMP|image|Jpeg|Png|Gif|Bmp")


_DAMAGED = (tf.errors.DataLossError, tf.errors.NotFoundError, tf.errors.FailedPreconditionError)  # a file's bytes


@contextlib.contextmanager
def reading_errors(data: Data, dataset: str, model: str, latest_checkpoint: Callable[[], str | None]) -> Iterator[None]:
    """Around training and evaluation: what reading the data raised becomes a TrainingError (exit 1) in one line
    naming the intact last checkpoint. Other errors pass unchanged."""
    try:
        yield
    except tf.errors.OpError as error:
        told = _told(error, data, dataset, model, latest_checkpoint())
        if told is None:
            raise
        raise TrainingError(told) from None


def _told(error: tf.errors.OpError, data: Data, dataset: str, model: str, latest: str | None) -> str | None:
    """What to say of `error`, `latest` the last checkpoint, the first that matches: a later example whose `preprocess`
    output has another shape than the first examples gave; damage in a streamed split's files (lost bytes, a missing
    file, fewer examples than recorded); an image that cannot be decoded, by its filename; MODEL's `preprocess`
    raising on an example (an assertion, a failed decode of one file). None for any other error."""
    odd = odd_shape(error)
    if odd is not None:
        return (
            f"MODEL={model!r}: preprocess returned {odd[0]} for an example of {data.name}, where the first examples "
            f"gave {odd[1]}; the last checkpoint {latest} is intact. Make preprocess return one shape for every "
            f"example (resize or crop it to a constant size, as {RESNET_EXAMPLE} does)"
        )
    if isinstance(error, _DAMAGED) and not data.in_memory:
        return (
            f"reading the streamed {data.name} failed while training ({first_line(error, 160)}): its prepared "
            f"files are damaged; the last checkpoint {latest} is intact. Delete the dataset's directory, prepare it "
            "anew and run again to resume"
        )
    if isinstance(error, tf.errors.InvalidArgumentError) and DECODE_ERROR.search(str(error.message)):
        for split in (data.train, data.eval):
            found = undecodable(split, data.spec)
            if found:
                return (
                    f"the image {found[0]} of DATASET={dataset} cannot be decoded ({found[1]}); the last checkpoint "
                    f"{latest} is intact. Remove or replace the file and train in a new OUTPUT_DIR (the data then "
                    "differs)"
                )
    found = _IN_MAP.search(str(error))
    if found is not None and data.spec.runs_preprocess:
        return (
            f"MODEL={model!r}: preprocess raised on an example mid-run ({first_line(found.group(1), 200)}); the last "
            f"checkpoint {latest} is intact. Make preprocess take every example of the splits (or leave such examples "
            "out of the dataset), then run again to resume"
        )
    return None


def undecodable(split: TrainSplit, spec: DatasetSpec) -> tuple[str, str] | None:
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


def odd_shape(error: BaseException) -> tuple[str, str] | None:
    """(got, expected) shapes where `error` is a pinned output's ensure_shape failing on a later example."""
    text = str(error)
    match = MISMATCH.search(text)
    if PINNED_OP not in text or match is None:
        return None
    got, expected = (shape_text([int(dim) for dim in group.split(",") if dim.strip()]) for group in match.groups())
    return got, expected
