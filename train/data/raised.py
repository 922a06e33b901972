"""A `preprocess` that raises on some examples only: found mid-run, where tf.data runs it, and said in one line."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import tensorflow as tf

from train.data.spec import DatasetSpec
from train.errors import TrainingError, first_line

# How TensorFlow reports what a function inside tf.data's map raised: "Error in user-defined function passed to
# ParallelMapDatasetV2:56 transformation with iterator: Iterator::Root::...: assertion failed: [...]".
_IN_MAP = re.compile(r"Error in user-defined function passed to \S+ transformation with iterator: [\w:]+: (.*)")


@contextlib.contextmanager
def preprocess_raised(spec: DatasetSpec, model: str, latest_checkpoint: Callable[[], str | None]) -> Iterator[None]:
    """Around training: what MODEL's `preprocess` raised on an example (an assertion, a failed decode of one file)
    becomes a TrainingError (exit 1) naming it and the intact last checkpoint. Other errors pass unchanged."""
    try:
        yield
    except tf.errors.OpError as error:
        found = _IN_MAP.search(str(error))
        if found is None or spec.examples is None or spec.examples.preprocess is None:
            raise
        raise TrainingError(
            f"MODEL={model!r}: preprocess raised on an example mid-run ({first_line(found.group(1), 200)}); the last "
            f"checkpoint {latest_checkpoint()} is intact. Make preprocess take every example of the splits (or "
            "leave such examples out of the dataset), then run again to resume"
        ) from None
