"""TFDS in: a dataset's two splits, held in memory (train.data.in_memory) or streamed from the prepared files
(train.data.streamed), as `Data`; what they hold is the spec (train.data.spec).

Where examples go through `preprocess` or are a dict of columns (the general path, train.data.examples), a
split is its stored records: read from TFRecord files (TFDS's default format), held in memory as a
`SerializedSplit` or streamed.
"""

from __future__ import annotations

from dataclasses import dataclass

from train.data.in_memory import SerializedSplit, Split, read_serialized, read_split
from train.data.spec import DatasetSpec
from train.data.streamed import StreamedSplit, check_readable
from train.errors import SettingsError

TrainSplit = Split | SerializedSplit | StreamedSplit


@dataclass(frozen=True)
class Data:
    """The dataset's spec and its two splits, in memory or streamed."""

    spec: DatasetSpec
    train: TrainSplit
    eval: TrainSplit
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def in_memory(self) -> bool:
        return not isinstance(self.train, StreamedSplit)


def load(
    builder, spec: DatasetSpec, dataset: str, splits: tuple[str, str], in_memory: bool, notes: tuple[str, ...] = ()
) -> Data:
    """Both splits (TRAIN_SPLIT, EVAL_SPLIT) of DATASET, held in memory or streamed. Raises SettingsError."""
    splits = ((splits[0], spec.train_examples), (splits[1], spec.eval_examples))
    if in_memory and not spec.records:
        train, evaluation = (read_split(builder, spec, split, examples) for split, examples in splits)
        return Data(spec, train, evaluation, notes)
    train, evaluation = (StreamedSplit(builder, split, spec, examples) for split, examples in splits)
    for streamed in (train, evaluation):
        if spec.records and not streamed.tfrecord:
            raise SettingsError(
                f"DATASET={dataset!r} is stored as {builder.info.file_format.value}: preprocess and dicts of "
                "columns read TFRecord files (TFDS's default file_format): prepare it with file_format=tfrecord"
            )
        check_readable(streamed)
    if in_memory:
        train, evaluation = read_serialized(train), read_serialized(evaluation)
    return Data(spec, train, evaluation, notes)
