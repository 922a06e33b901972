"""The data input: what DATASET's splits hold (`spec`), the splits in memory or streamed, both as `Data`
(`source`), and the batches the step and evaluation read (`feeds`, chosen once by `feeds.adapter`). `open_dataset`
and `Dataset.load` are what `fit` calls; `load_data` does both on one host.

Each name is imported from its home module (`from train.data.feeds import adapter`): this package re-exports
none, and imports TensorFlow only inside its functions, so that the modules without it (`local`, `written`: what
`data list|prune`, train.tools.prepared, reads) import without it. What the data reads of the settings is
`data_settings.DataSettings`; train.settings, above, is not imported here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from train.data.data_settings import DataSettings
from train.devices.host_memory import available_memory_bytes, fits_in_memory, memory_note
from train.errors import SettingsError

if TYPE_CHECKING:
    import tensorflow_datasets as tfds

    from train.data.source import Data, StreamedSplit
    from train.data.spec import DatasetSpec
    from train.data.written import Identity, LeftOut
    from train.model_file import Experiment

__all__ = ["Dataset", "load_data", "open_dataset"]


@dataclass(frozen=True)
class Dataset:
    """DATASET opened and prepared: what its splits hold (`spec`), nothing read yet; the data's identity (run.json's
    "data"), the settings it is read with (a one-split dataset's slices), and what to say about it."""

    builder: tfds.core.DatasetBuilder
    spec: DatasetSpec
    identity: Identity
    settings: DataSettings
    notes: tuple[str, ...] = ()
    adapted: dict[str, object] = field(default_factory=dict)  # what MODEL's adapt fitted (train.data.adapt.fingerprint)
    left_out: LeftOut = field(default_factory=dict)  # a folder's files not in the data (summary.json)

    def fits_in_memory(self, workers_here: int = 1) -> bool:
        """Whether both splits, as stored, fit in the memory left (for each worker this host runs)."""
        return fits_in_memory(self.spec.held_bytes, available_memory_bytes(), workers_here)

    def load(self, settings: DataSettings, in_memory: bool, workers_here: int = 1) -> Data:
        """Both splits (TRAIN_SPLIT, EVAL_SPLIT), held in memory or streamed, with what to say about that choice.
        Raises SettingsError."""
        from train.data.source import Data, StreamedSplit, read_serialized, read_split

        spec, builder = self.spec, self.builder
        available = available_memory_bytes()
        fits = fits_in_memory(spec.held_bytes, available, workers_here)
        note = memory_note(settings.data_in_memory, fits, spec.held_bytes, available, workers_here)
        pinned = tuple(spec.examples.notes) if spec.examples else ()  # outputs taken as fixed
        notes = (*self.notes, *pinned, *((note,) if note else ()))
        splits = ((settings.train_split, spec.train_examples), (settings.eval_split, spec.eval_examples))
        if in_memory and not spec.records:
            train, evaluation = (read_split(builder, spec, split, examples) for split, examples in splits)
            return Data(spec, train, evaluation, notes)
        train, evaluation = (StreamedSplit(builder, split, spec, examples) for split, examples in splits)
        for streamed in (train, evaluation):
            if spec.records and not streamed.tfrecord:
                raise SettingsError(
                    f"DATASET={settings.dataset!r} is stored as {builder.info.file_format.value}: preprocess and "
                    "dicts of columns read TFRecord files (TFDS's default file_format): prepare it with "
                    "file_format=tfrecord"
                )
            _check_readable(streamed)
        if in_memory:
            train, evaluation = read_serialized(train), read_serialized(evaluation)
        return Data(spec, train, evaluation, notes)


def _check_readable(split: StreamedSplit) -> None:
    """A streamed split's files are all there and its first example reads: found now, not steps into training.

    (Damage further inside a file still surfaces while training: `fit` ends that in one line, too.)
    """
    import tensorflow as tf

    from train.data.spec import damaged

    builder = split.builder
    try:
        instructions = builder.info.splits[split.split].file_instructions
        missing = [i.filename for i in instructions if not tf.io.gfile.exists(i.filename)]
        if missing:
            raise OSError(f"{len(missing)} file(s) missing, e.g. {missing[0].rpartition('/')[2]}")
        next(iter(split.read(shuffle_files=False).take(1)))
    except (tf.errors.OpError, OSError) as error:
        raise damaged(builder, error) from None
    except (KeyError, ValueError):  # splits not listed (tfds.testing.mock_data): reading will tell
        pass


def open_dataset(
    settings: DataSettings, experiment: Experiment, say: Callable[[str], None] = print, adapt_says: bool = True
) -> Dataset:
    """Open DATASET, prepare (or, a path, write) it if needed, run the `experiment`'s `adapt` on it (train.data.adapt)
    and read its spec, with its `preprocess` where MODEL's file defines one. `say` hears a path's writing progress
    and (`adapt_says`) adapt's lines. Raises SettingsError."""
    from train.data.adapt import run_adapt
    from train.data.opening import open_source
    from train.data.spec import inspect

    opened = open_source(settings, say)
    told = say if adapt_says else lambda line: None  # evaluate, predict: fit told them, run.json has them
    adapted = run_adapt(opened.settings, opened.builder, experiment, told)  # before preprocess is first traced
    preprocess = experiment.preprocess or opened.columns(settings)
    spec = inspect(opened.builder, opened.settings, preprocess=preprocess)
    return Dataset(opened.builder, spec, opened.identity, opened.settings, opened.notes, adapted, opened.left_out)


def load_data(settings: DataSettings, experiment: Experiment, say: Callable[[str], None] = print) -> Data:
    """One host: open DATASET (for the `experiment`, MODEL's file loaded) and hold its splits in memory
    (DATA_IN_MEMORY, or auto: if they fit) or stream them."""
    dataset = open_dataset(settings, experiment, say)
    settings = dataset.settings
    in_memory = settings.data_in_memory == "true" or (settings.data_in_memory == "auto" and dataset.fits_in_memory())
    return dataset.load(settings, in_memory)
