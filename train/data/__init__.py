"""The data input: TFDS splits in memory or streamed (`source`), and the batches the step and evaluation
read (`feeds`). `open_dataset` and `Dataset.load` are what `fit` calls; `load_data` does both on one host."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from train.data.feeds import (
    BlocksFeed,
    Feed,
    PipelineFeed,
    Remainder,
    RowsFeed,
    batches_per_pass,
    distribute,
    eval_dataset,
    eval_steps,
    gathers_in_step,
    general_path,
    input_pipelines,
    make_feed,
    pass_order,
    train_dataset,
)
from train.data.source import Data, DatasetSpec, RecordsSplit, Split, StreamedSplit, TrainSplit
from train.devices.host_memory import available_memory_bytes, fits_in_memory, memory_note
from train.settings import Settings

__all__ = [
    "BlocksFeed", "Data", "Dataset", "DatasetSpec", "Feed", "PipelineFeed", "RecordsSplit", "Remainder", "RowsFeed",
    "Split",
    "StreamedSplit", "TrainSplit", "batches_per_pass", "distribute", "eval_dataset", "eval_steps", "gathers_in_step",
    "general_path", "input_pipelines",
    "load_data", "make_feed", "open_dataset", "pass_order", "train_dataset",
]  # fmt: skip


@dataclass(frozen=True)
class Dataset:
    """DATASET opened and prepared: what its splits hold (`spec`), nothing read yet."""

    builder: Any
    spec: DatasetSpec
    adapted: dict[str, Any] = field(default_factory=dict)  # what MODEL's adapt fitted (train.adapt.fingerprint)

    def fits_in_memory(self, workers_here: int = 1) -> bool:
        """Whether both splits, as stored, fit in the memory left (for each worker this host runs)."""
        return fits_in_memory(self.spec.held_bytes, available_memory_bytes(), workers_here)

    def load(self, settings: Settings, in_memory: bool, workers_here: int = 1) -> Data:
        """Both splits, held in memory or streamed, with what to say about that choice."""
        from train.data.source import load

        available = available_memory_bytes()
        fits = fits_in_memory(self.spec.held_bytes, available, workers_here)
        note = memory_note(settings.data_in_memory, fits, self.spec.held_bytes, available, workers_here)
        pinned = tuple(self.spec.examples.notes) if self.spec.examples else ()  # outputs taken as fixed
        return load(self.builder, self.spec, settings, in_memory, (*pinned, note) if note else pinned)


def open_dataset(settings: Settings) -> Dataset:
    """Open DATASET, prepare it if needed, run MODEL's `adapt` on it (train.adapt) and read its spec, with MODEL's
    `preprocess` where it defines one. Raises SettingsError."""
    from train.adapt import run_adapt
    from train.data.source import inspect, open_builder, prepare
    from train.model_file import load_model_file

    builder = open_builder(settings)
    prepare(builder, settings)
    adapted = run_adapt(settings, builder)  # before preprocess is first traced (inspect runs it)
    return Dataset(builder, inspect(builder, settings, preprocess=load_model_file(settings.model).preprocess), adapted)


def load_data(settings: Settings) -> Data:
    """One host: open DATASET and hold its splits in memory (DATA_IN_MEMORY, or auto: if they fit) or stream them."""
    dataset = open_dataset(settings)
    in_memory = settings.data_in_memory == "true" or (settings.data_in_memory == "auto" and dataset.fits_in_memory())
    return dataset.load(settings, in_memory)
