"""`python -m train predict`: a run's model on files or a split, one JSON object per example (JSON Lines).

    python -m train predict --output-dir runs/default photos/             # every image under photos/, sorted
    python -m train predict --output-dir runs/default rows.csv --output predictions.jsonl
    python -m train predict --output-dir runs/default --split test        # a split of the run's DATASET

It runs the run's `saved_model/` `serving_default`, what a server runs (`preprocess(training=False)` included),
so what it predicts is what a server would; `--checkpoint` runs the latest checkpoint through the same function
instead. Each line has "input" (the file, `file:line` for a row, `split[index]`) and, after train.outputs'
named outputs: "class", "score" and "scores" for a class label; "labels" (the classes above 0.5) and "scores"
for a multi-hot one; "prediction" for a value; else each output under its own name.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO, TypeVar

from train.errors import SettingsError, first_line
from train.outputs import CLASSES, OUTPUTS, SCORES
from train.predict_inputs import InputExample, InputFile, SignatureExamples
from train.rundir import check_same_model
from train.settings import Settings

if TYPE_CHECKING:  # importing this module loads no TensorFlow: the command line checks the run before it loads
    import numpy as np
    import tensorflow as tf

    from train.data import Dataset
    from train.data.opening import Opened
    from train.model_file import Experiment

    Batch = dict[str, tf.Tensor | np.ndarray]  # the signature's inputs for a batch, by name
    Outputs = dict[str, np.ndarray]  # what the signature returns for a batch, by name

Json = dict[str, object]  # run.json's, read back and checked; a line of predictions, written
Opening = TypeVar("Opening", "Dataset", "Opened")  # DATASET opened with its spec (for a model) or without

SAVED_MODEL = "saved_model"
THRESHOLD = 0.5  # a multi-hot class is one of the "labels" above this probability


def check_run(settings: Settings, checkpoint: bool) -> None:
    """What the run directory must hold for `predict`, found before TensorFlow loads. Raises SettingsError."""
    if checkpoint:
        check_same_model(
            settings.output_dir, settings.model
        )  # the checkpoint's weights fit the MODEL file that made them
        return
    if not (settings.output_dir / SAVED_MODEL / "saved_model.pb").is_file():
        raise SettingsError(
            f"OUTPUT_DIR={settings.output_dir} has no {SAVED_MODEL}/ export: run fit to its end (it exports there), "
            "or predict --checkpoint with the latest checkpoint"
        )


@dataclass
class Predictor:
    """The signature's inputs (name -> tf.TensorSpec) and a function of a batch of them to the outputs (NumPy)."""

    inputs: dict[str, tf.TensorSpec]
    call: Callable[[Batch], Outputs]
    keep: object = None  # what the function needs alive (the loaded SavedModel, or the model built)


def _exported(settings: Settings) -> Predictor:
    import tensorflow as tf

    path = settings.output_dir / SAVED_MODEL
    try:
        loaded = tf.saved_model.load(str(path))
        signature = loaded.signatures["serving_default"]
    except (OSError, KeyError, ValueError, tf.errors.OpError) as error:
        raise SettingsError(f"{path} cannot be loaded: {first_line(error, 200)}; run fit to its end again") from None
    inputs = dict(signature.structured_input_signature[1])
    return Predictor(inputs, lambda batch: {k: v.numpy() for k, v in signature(**batch).items()}, loaded)


def _from_checkpoint(settings: Settings, experiment: Experiment, runtime, dataset, say: Callable[[str], None]
                     ) -> Predictor:  # fmt: skip
    """The latest checkpoint's weights in the model fit builds from the `experiment` (MODEL's file, loaded once),
    through the export's default function."""
    import tensorflow as tf

    from train.checkpoints import make_checkpoint
    from train.exportable import serving_endpoints, use_averaged_weights
    from train.model import build
    from train.rundir import read_run, restore_newest
    from train.start import run_context, steps_per_epoch

    precision = read_run(settings.output_dir).get("precision")  # the run's, as evaluate builds it
    if settings.mixed_precision == "auto" and precision:
        runtime = runtime.with_precision(precision)
    settings = dataset.settings
    in_memory = settings.data_in_memory == "true" or (settings.data_in_memory == "auto" and dataset.fits_in_memory())
    data = dataset.load(settings, in_memory)
    context = run_context(settings, runtime, data, steps_per_epoch(settings, data, runtime))
    built = build(settings, experiment, data.spec, runtime.strategy, context)
    if not restore_newest(make_checkpoint(built), settings.output_dir / "checkpoints", say):
        raise SettingsError(f"OUTPUT_DIR={settings.output_dir} has no checkpoint: run fit first")
    use_averaged_weights(built)
    _, function, signature = serving_endpoints(built)[0]
    serve = tf.function(function, input_signature=signature)
    names = [spec.name for spec in signature]

    def call(batch: Batch) -> Outputs:
        return {k: v.numpy() for k, v in serve(*[batch[name] for name in names]).items()}

    return Predictor({spec.name: spec for spec in signature}, call, built)


def _dataset(settings: Settings, recorded: Json, experiment: Experiment, say: Callable[[str], None]) -> Dataset:
    """The run's DATASET opened as fit opens it, with its spec, for the checkpoint's model (train.data). Raises
    SettingsError, as `_source` does."""
    from train.data import open_dataset

    return _unchanged(open_dataset(settings, experiment, say), recorded)


def _source(settings: Settings, recorded: Json, say: Callable[[str], None]) -> Opened:
    """The run's DATASET opened as fit opens it (train.data.opening): its builder, for a split or the data's own
    description. Raises SettingsError where its source changed since the run was trained on it."""
    from train.data.opening import open_source

    return _unchanged(open_source(settings, say), recorded)


def _unchanged(opened: Opening, recorded: Json) -> Opening:
    """`opened` (a Dataset or an Opened), refused where its data changed since the run was trained on it."""
    from train.data.opening import check_same_data

    check_same_data(opened.settings, recorded.get("data"), opened.identity, "predicted")
    return opened


def _split_examples(builder, split: str, predictor: Predictor, images: set[str]) -> Iterator[InputExample]:
    """The split's examples as stored, each signature input by its name (an image as its bytes where the
    signature takes them). Raises SettingsError where the split cannot be read."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    decoders = {name: tfds.decode.SkipDecoding() for name in images if predictor.inputs[name].dtype == tf.string}
    try:
        dataset = builder.as_dataset(split=split, shuffle_files=False, decoders=decoders or None)
    except Exception as error:  # an unknown split, a dataset not prepared: TFDS raises several types
        raise SettingsError(
            f"--split {split!r} of DATASET={builder.info.full_name} in {builder.data_dir} cannot be read: "
            f"{first_line(error, 200)}"
        ) from None
    names = list(predictor.inputs)
    missing = [name for name in names if not _stored(dataset.element_spec, name)]
    if missing:
        raise SettingsError(f"--split {split!r}: the model takes {missing[0]!r}, which the dataset does not store")
    return (
        InputExample(f"{split}[{index}]", {name: _column(stored, name) for name in names})
        for index, stored in enumerate(tfds.as_numpy(dataset))
    )


def _stored(element_spec: dict, name: str) -> bool:
    return name in element_spec or any(isinstance(s, dict) and name in s for s in element_spec.values())


def _column(stored: dict, name: str) -> np.ndarray | np.generic | bytes:
    """A stored feature by name, or a column of a dict feature by its own name: as tfds.as_numpy gives it (an
    array, a NumPy scalar, or the bytes of a string)."""
    if name in stored:
        return stored[name]
    return next(value[name] for value in stored.values() if isinstance(value, dict) and name in value)


def _batch(examples: list[InputExample], inputs: dict[str, tf.TensorSpec]) -> Batch:
    import numpy as np
    import tensorflow as tf

    batch = {}
    for name, spec in inputs.items():
        values = [example.values[name] for example in examples]
        batch[name] = tf.constant(values, tf.string) if spec.dtype == tf.string else np.stack(values)
    return batch


def describe(outputs: Outputs, row: int, is_class: bool) -> Json:
    """One example's outputs as its JSON line has them (the module's docstring)."""
    if SCORES in outputs and CLASSES in outputs:
        names = [name.decode() for name in outputs[CLASSES][row]]
        scores = [float(score) for score in outputs[SCORES][row]]
        by_name = dict(zip(names, scores, strict=True))
        if is_class:
            top = max(range(len(scores)), key=scores.__getitem__)
            return {"class": names[top], "score": scores[top], "scores": by_name}
        return {"labels": [name for name, score in by_name.items() if score > THRESHOLD], "scores": by_name}
    if set(outputs) == {OUTPUTS}:
        return {"prediction": outputs[OUTPUTS][row].tolist()}
    return {name: _plain(value[row]) for name, value in outputs.items()}


def _plain(value: np.ndarray | np.generic) -> object:
    listed = value.tolist()
    if isinstance(listed, bytes):
        return listed.decode(errors="replace")
    if isinstance(listed, list) and listed and isinstance(listed[0], bytes):
        return [each.decode(errors="replace") for each in listed]
    return listed


def _chunks(examples: Iterable[InputExample], size: int) -> Iterator[list[InputExample]]:
    iterator = iter(examples)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def predict(settings: Settings, sources: list[InputFile], split: str | None, batch: int, checkpoint: bool,
            open_output: Callable[[], TextIO], say: Callable[[str], None], bar: bool = False) -> int:  # fmt: skip
    """Predict every example of `sources` (then of `split`), in order, `batch` at a time, on the first device the
    settings choose; each checked before `open_output()` is called and the first line written. `bar`: a progress
    bar on stderr. Returns how many were predicted. Raises SettingsError (exit 2) for an input the model cannot
    take."""
    import tensorflow as tf

    from train.data.spec import features_record
    from train.devices.runtime import setup_runtime
    from train.model_file import load_model_file
    from train.rundir import read_run

    runtime = setup_runtime(settings, local_only=True)
    recorded = read_run(settings.output_dir)
    # The data is opened only for what needs it: a split, or the checkpoint's model. Files through the export need
    # the run's records alone (a run from before they were kept: the data's own description, opened).
    experiment = load_model_file(settings.model) if checkpoint else None  # once, for the checkpoint's model
    opened: Dataset | Opened | None = None
    if experiment is not None:
        opened = _dataset(settings, recorded, experiment, say)
    elif split is not None or not isinstance(recorded.get("features"), dict):
        opened = _source(settings, recorded, say)
    features = features_record(opened.builder, opened.settings) if opened is not None else recorded["features"]
    predictor = _from_checkpoint(settings, experiment, runtime, opened, say) if checkpoint else _exported(settings)
    images = {name for name in predictor.inputs if name in features["images"]}
    examples: Iterable[InputExample] = SignatureExamples(predictor.inputs, images).read(sources)
    total = len(examples)
    if split is not None:
        examples = itertools.chain(examples, _split_examples(opened.builder, split, predictor, images))
        total += _split_size(opened.builder, split)
    is_class = bool(features["label_is_class"])
    written = 0
    with tf.device(runtime.devices[0]), open_output() as output, _progress(total, bar) as advance:
        for chunk in _chunks(examples, batch):
            outputs = predictor.call(_batch(chunk, predictor.inputs))
            for row, example in enumerate(chunk):
                output.write(json.dumps({"input": example.input, **describe(outputs, row, is_class)}) + "\n")
            written += len(chunk)
            advance(len(chunk))
    return written


def _split_size(builder, split: str) -> int:
    try:
        return int(builder.info.splits[split].num_examples)
    except Exception:  # not listed (or not prepared): the split says so when it is read
        return 0


class _progress:
    """A progress bar on stderr (`shown`), transient; else nothing."""

    def __init__(self, total: int, shown: bool) -> None:
        self.total, self.shown, self.bar = total, shown, None

    def __enter__(self) -> Callable[[int], None]:
        if not self.shown:
            return lambda count: None
        from rich.console import Console
        from rich.progress import Progress

        self.bar = Progress(console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task("predicting", total=self.total or None)
        return lambda count: self.bar.advance(task, count)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
