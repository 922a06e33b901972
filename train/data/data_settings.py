"""The settings the data reads, declared where they are read: `DataSettings`, which the run's Settings
(train.settings) has, so that data/ takes them without importing the settings package (which sits above it).

A function of data/ that needs one or two of them takes those values; what opens DATASET and reads its spec takes
this whole group. No TensorFlow here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Self, runtime_checkable

from train.dataset_path import Source


@runtime_checkable
class DataSettings(Protocol):
    """DATASET, its kind (`source`) and how it is read: its splits, keys, label kind, columns dropped and kept,
    broken files, memory; MODEL and SEED for the general path's examples; OUTPUT_DIR for a refusal's words.
    `replace` gives a copy with some of them changed (a one-split dataset's slices), of the caller's own type."""

    @property
    def dataset(self) -> str: ...
    @property
    def source(self) -> Source | None: ...  # DATASET's kind, decided once (train.dataset_path.source)
    @property
    def csv_delimiter(self) -> str | None: ...  # CSV_DELIMITER's word (train.dataset_path.DELIMITERS), None: found
    @property
    def tfds_data_dir(self) -> Path | None: ...
    @property
    def data_in_memory(self) -> str: ...
    @property
    def train_split(self) -> str: ...
    @property
    def eval_split(self) -> str: ...
    @property
    def feature_key(self) -> str | None: ...
    @property
    def label_key(self) -> str | None: ...
    @property
    def label_kind(self) -> str | None: ...
    @property
    def run_label_kind(self) -> str | None: ...  # the kind a run's run.json recorded (train.data.opening)
    @property
    def drop_columns(self) -> tuple[str, ...]: ...
    @property
    def keep_columns(self) -> tuple[str, ...]: ...
    @property
    def labeled(self) -> bool: ...
    @property
    def bad_files(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def output_dir(self) -> Path: ...

    def replace(self, **changes: str) -> Self: ...
