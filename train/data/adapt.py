"""MODEL's `adapt(context)`: the state of the layers `preprocess` uses, fitted once a process on the raw data.

    adapt(context)            called once in each process, before `preprocess` is first traced and before
                              `build_model`; `context.examples(n)`, `context.label_key` and `context.seed` are
                              what it reads
    context.examples(n)       the first n stored training examples as TFDS decodes them: dicts of every feature,
                              strings as strings, batched like `context.sample` (a feature of its own size as a
                              ragged batch), in the split's stored order: the same on every worker and start
    context.label_key         the label's feature (LABEL_KEY, else the dataset's supervised keys, else "label"):
                              what `adapt` leaves out of the inputs (examples/mlp_table.py)
    context.keep_columns      KEEP_COLUMNS: the columns a model would leave out (an ID) that it keeps
    context.say(line)         a line at the start, as the engine's own (how each column is taken)

What `adapt` returns, where it is a dict of JSON values (what it decided: examples/mlp_table.py's kind of each
column), is recorded with the fingerprint, under "adapt" (run.json's "adapted").

The layers and tables `preprocess` uses are found among the MODEL file's module globals (a layer, a
`tf.lookup` table, or a list, tuple or dict of them): `resources` hands them to the export, which must track
them, and `fingerprint` says what they hold (vocabularies and bins by hash, a Normalization's statistics as
numbers), recorded in run.json and compared between workers and starts (`difference`). TensorFlow is imported
only inside the functions that need it: train.agreement compares fingerprints without it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from train.errors import SettingsError, first_line

if TYPE_CHECKING:
    from types import ModuleType

    import keras
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from train.data.data_settings import DataSettings
    from train.model_file import Experiment

    Resource = keras.layers.Layer | tf.saved_model.experimental.TrackableResource  # a layer, or a tf.lookup table

Json = dict[str, object]
Say = Callable[[str], None]
Fingerprint = dict[str, Json]  # by resource: {"layer": class, "vocabulary"/"bins": {size, sha256}, "mean", ...}

EXAMPLES_BATCH = 256  # examples per batch of `examples`: as `context.sample` batches (train.data.source.SAMPLE_BATCH)
FLOAT_RTOL = 1e-6  # a Normalization's statistics: their last bits differ between CPUs and GPUs
STATISTICS = ("mean", "variance")

_adapted: dict[tuple[str, str, str], Fingerprint] = {}  # (MODEL, dataset, split) -> fingerprint: once a process


@dataclass(frozen=True)
class AdaptContext:
    """What `adapt(context)` gets: SEED, the label's feature, and the stored training examples (`examples(n)`).
    The topology is not decided yet when it runs (it runs before the data is read)."""

    seed: int
    _examples: Callable[[int], tf.data.Dataset] | None = field(default=None, repr=False, compare=False)
    label_key: str = "label"
    _keep_columns: tuple[str, ...] = ()
    say: Say = field(default=print, repr=False, compare=False)
    _read: list[str] = field(default_factory=list, repr=False, compare=False)  # what adapt asked of the context

    @property
    def keep_columns(self) -> tuple[str, ...]:
        self._read.append("keep_columns")  # KEEP_COLUMNS that no adapt reads is refused, never ignored
        return self._keep_columns

    def examples(self, n: int) -> tf.data.Dataset:
        """The first `n` stored training examples (all of them where the split holds fewer), batched.
        Raises ValueError for an `n` under 1."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"context.examples(n) takes a whole number of examples, 1 or more, not {n!r}")
        return self._examples(n)


def stored_examples(builder: tfds.core.DatasetBuilder, split: str) -> Callable[[int], tf.data.Dataset]:
    """`examples(n)` over TFDS's `split` of `builder`: the files one after another, no shuffle, as decoded."""

    def examples(n: int) -> tf.data.Dataset:
        import tensorflow as tf
        import tensorflow_datasets as tfds

        config = tfds.ReadConfig(interleave_cycle_length=1, try_autocache=False)
        dataset = builder.as_dataset(split=split, shuffle_files=False, read_config=config)
        # ragged_batch batches a fixed-shape feature as a dense tensor, one of its own size as a ragged one
        return dataset.take(n).ragged_batch(EXAMPLES_BATCH).prefetch(tf.data.AUTOTUNE)

    return examples


def run_adapt(
    settings: DataSettings, builder: tfds.core.DatasetBuilder, experiment: Experiment, say: Say = print
) -> Fingerprint:
    """Call the `experiment`'s `adapt` (MODEL's, once a process for this dataset and split; `say` hears its lines)
    and return the fingerprint of what the layers `preprocess` uses hold, with what it returned. Raises
    SettingsError for an `adapt` that fails."""
    from train.data.examples import float32_policy
    from train.data.spec import default_keys

    returned, kept = None, False
    key = (settings.model, str(getattr(builder, "data_dir", "")), f"{builder.info.full_name}:{settings.train_split}")
    # Layers made at import or in adapt compute in float32, as those made while preprocess is traced: a
    # mixed-precision policy (set before this on a resume or in evaluate) changes the model, not its inputs
    with float32_policy():
        if key not in _adapted and experiment.adapt is not None:
            context = AdaptContext(
                settings.seed,
                stored_examples(builder, settings.train_split),
                settings.label_key or default_keys(builder)[1],
                settings.keep_columns,
                say,
            )
            try:
                returned = experiment.adapt(context)
            except Exception as error:
                raise SettingsError(
                    f"MODEL={experiment.text!r}: adapt(context) raised {type(error).__name__}: {first_line(error, 240)}"
                ) from None
            kept = bool(context._read)
    if key not in _adapted and settings.keep_columns and not kept:
        raise SettingsError(
            f"KEEP_COLUMNS={','.join(settings.keep_columns)!r}: no adapt(context) of MODEL={experiment.text!r} reads "
            "context.keep_columns: unset KEEP_COLUMNS, or read it in adapt as examples/mlp_table.py does"
        )
    if key not in _adapted:
        _adapted[key] = fingerprint(resources(experiment.module))
        if isinstance(returned, dict):  # what adapt decided, recorded beside what its layers hold
            _adapted[key]["adapt"] = {"layer": "adapt(context)", "returned": returned}
    return _adapted[key]


def resources(module: ModuleType | None) -> dict[str, Resource]:
    """The Keras layers and `tf.lookup` tables among `module`'s globals (and in a list, tuple or dict global),
    by where they are found ("VOCAB", "LOOKUPS[0]"): what the fingerprint reads and (built) the export tracks."""
    import keras
    import tensorflow as tf

    def wanted(value: object) -> bool:  # any global of MODEL's module
        return isinstance(value, (keras.layers.Layer, tf.saved_model.experimental.TrackableResource))  # a table

    found: dict[str, Resource] = {}
    for name, value in sorted(vars(module).items()) if module is not None else ():
        if name.startswith("__") or isinstance(value, type):
            continue
        if isinstance(value, (list, tuple)):
            found |= {f"{name}[{i}]": each for i, each in enumerate(value) if wanted(each)}
        elif isinstance(value, dict):
            found |= {f"{name}[{key!r}]": each for key, each in value.items() if wanted(each)}
        elif wanted(value):
            found[name] = value
    return found


def fingerprint(found: dict[str, Resource]) -> Fingerprint:
    """What each adapted layer holds: {name: {"layer": class, "vocabulary"/"bins": {size, sha256}, "mean": [...],
    "variance": [...]}}; layers without such state are left out."""
    import numpy as np

    def digest(values: Sequence[str | bytes | float]) -> Json:
        text = "\n".join(v.decode() if isinstance(v, bytes) else str(v) for v in values)
        return {"size": len(values), "sha256": hashlib.sha256(text.encode()).hexdigest()}

    state: Fingerprint = {}
    for name, layer in found.items():
        entry: Json = {}
        if callable(getattr(layer, "get_vocabulary", None)):  # TextVectorization, StringLookup, IntegerLookup
            entry["vocabulary"] = digest(list(layer.get_vocabulary()))
        if getattr(layer, "bin_boundaries", None) is not None:  # Discretization
            entry["bins"] = digest([repr(float(b)) for b in layer.bin_boundaries])
        for statistic in STATISTICS:  # Normalization, once adapted or given
            value = getattr(layer, statistic, None)
            if value is not None and type(layer).__name__ == "Normalization":
                entry[statistic] = np.asarray(value, np.float64).reshape(-1).tolist()
        if entry:
            state[name] = {"layer": type(layer).__name__, **entry}
    return state


def difference(recorded: Fingerprint, now: Fingerprint) -> str | None:
    """What differs between two fingerprints, in words (the first difference), or None: vocabularies and bins
    exactly, statistics within FLOAT_RTOL."""
    for name in sorted(set(recorded) | set(now)):
        before, after = recorded.get(name), now.get(name)
        if before is None or after is None:
            return f"{name} is {'new' if before is None else 'gone'}"
        where = f"{name} ({after['layer']})"
        for kind in ("vocabulary", "bins"):
            if before.get(kind) != after.get(kind):
                return f"{where} has another {kind}: {_sized(after.get(kind))} against {_sized(before.get(kind))}"
        for statistic in STATISTICS:
            a, b = after.get(statistic) or [], before.get(statistic) or []
            if len(a) != len(b) or not all(math.isclose(x, y, rel_tol=FLOAT_RTOL) for x, y in zip(a, b, strict=True)):
                return f"{where} has another {statistic} (beyond rtol {FLOAT_RTOL})"
    return None


def _sized(state: object) -> str:
    """A vocabulary's or bins' digest in words (`state`: what a fingerprint records, or nothing)."""
    return (
        "none"
        if not isinstance(state, dict) or not state
        else f"{state['size']} entries, sha256 {state['sha256'][:12]}"
    )


def check_recorded(settings: DataSettings, recorded: Json, now: Fingerprint) -> None:
    """This start's adapted state against the one run.json records. Raises SettingsError where they differ."""
    if "adapted" not in recorded:
        return
    differs = difference(recorded["adapted"], now)
    if differs:
        raise SettingsError(
            f"MODEL={settings.model!r}: adapt gave other state than this run's first start: {differs} (the "
            f"training data of {settings.dataset} changed, or adapt did): restore the data, or train a new run in "
            "another OUTPUT_DIR"
        )
