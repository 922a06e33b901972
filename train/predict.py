"""`python -m train predict`: a run's model on files or a split, one JSON object per example (JSON Lines); and
`open_trained`, the one way `evaluate` and `predict` open a trained run.

    python -m train predict --output-dir runs/default photos/             # every image under photos/, sorted
    python -m train predict --output-dir runs/default rows.csv --output predictions.jsonl
    python -m train predict --output-dir runs/default --split test        # a split of the run's DATASET

It runs the run's `saved_model/` `serving_default`, what a server runs (`preprocess(training=False)` included),
so what it predicts is what a server would; `--checkpoint` runs the latest checkpoint through the same function
instead. Each line has "input" (the file, `file:line` for a row, `split[index]`) and, after train.outputs'
named outputs: "class", "score" and "scores" for a class label; "labels" (the classes above 0.5) and "scores"
for a multi-hot one; "prediction" for a value; else each output under its own name.

Every input is read and checked before the first prediction is written: a file the model cannot take, a row
missing a column the signature takes, a value of the wrong type or shape is one line (SettingsError, exit 2)
naming the file and line. `gather` needs no TensorFlow (it runs before it loads); `SignatureExamples` knows the
signature. Which files are taken, and how a table's rows are read, is DATASET's readers' (train.dataset_path's
READERS, each a `Reader`): an INPUT file is read as the DATASET of its kind is. `open_trained`
opens a run directory for `evaluate` (train.fit) and `predict --checkpoint` alike; nothing here trains: no module
of the loop or the step is imported (import-linter's `predict-trains-not`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from train.data import open_dataset
from train.data.adapt import check_recorded
from train.dataset_path import IMAGES, Reader, Row, TableReader, reader_of
from train.devices.runtime import Runtime, setup_runtime
from train.errors import SettingsError, first_line
from train.model_file import load_model_file
from train.outputs import CLASSES, OUTPUTS, SCORES
from train.rundir import check_same_model, read_run, restore_newest
from train.settings import Settings

if TYPE_CHECKING:  # importing this module loads no TensorFlow: the command line checks the run before it loads
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from train.data import Dataset
    from train.data.source import Data
    from train.model import Built

    Batch = dict[str, tf.Tensor | np.ndarray]  # the signature's inputs for a batch, by name
    Outputs = dict[str, np.ndarray]  # what the signature returns for a batch, by name
    Serve = Callable[[Batch], dict[str, tf.Tensor]]

Json = dict[str, object]  # run.json's, read back and checked; a line of predictions, written
Say = Callable[[str], None]

SAVED_MODEL = "saved_model"
THRESHOLD = 0.5  # a multi-hot class is one of the "labels" above this probability


def check_run(settings: Settings, checkpoint: bool) -> None:
    """What the run directory must hold for `predict`, found before TensorFlow loads. Raises SettingsError."""
    if checkpoint:
        check_same_model(settings.output_dir, settings.model)  # the checkpoint's weights fit the MODEL that made them
        return
    if not (settings.output_dir / SAVED_MODEL / "saved_model.pb").is_file():
        raise SettingsError(
            f"OUTPUT_DIR={settings.output_dir} has no {SAVED_MODEL}/ export: run fit to its end (it exports there), "
            "or predict --checkpoint with the latest checkpoint"
        )


@dataclass(frozen=True)
class Trained:
    """A run directory opened as fit left it: this host's runtime at the run's precision, DATASET (checked to be the
    data it trained on) and its splits, and MODEL's model built, with the latest checkpoint's weights (`restored`,
    its path) or none (None: the caller loads the export)."""

    runtime: Runtime
    dataset: Dataset
    data: Data
    built: Built
    restored: str | None


def open_trained(settings: Settings, doing: str, say: Say, restore: bool = True) -> Trained:
    """The run in OUTPUT_DIR, opened for `evaluate` or `predict` (`doing`: "evaluated", "predicted") as fit opened
    it: run.json's precision, DATASET as fit reads it (DATA_IN_MEMORY's auto included), the model built with the
    facts fit gave it (train.start.run_context's, for the only process), then (`restore`) the newest checkpoint that
    loads, its averaged weights in place. The caller has checked that MODEL made the run (check_same_model). Raises
    SettingsError for changed data or adapted state, or no checkpoint."""
    from train.checkpoints import make_checkpoint
    from train.context import Context
    from train.data.feeds import adapter
    from train.data.opening import check_same_data, with_run_label_kind
    from train.exportable import use_averaged_weights
    from train.model import build

    runtime = setup_runtime(settings, local_only=True)  # on this host, even where TF_CONFIG names a cluster
    recorded = read_run(settings.output_dir)
    experiment = load_model_file(settings.model)  # MODEL's file, loaded once for this command and passed down
    dataset = open_dataset(with_run_label_kind(settings, recorded), experiment, say, adapt_says=False)
    check_same_data(dataset.settings, recorded.get("data"), dataset.identity, doing)  # changed files: refused
    check_recorded(settings, recorded, dataset.adapted)  # the vocabularies it trained with
    if settings.mixed_precision == "auto" and recorded.get("precision"):
        runtime = runtime.with_precision(recorded["precision"])  # the run's, as fit settled it
    settings = dataset.settings  # a dataset with one split: TRAIN_SPLIT and EVAL_SPLIT slice it
    in_memory = settings.data_in_memory == "true" or (settings.data_in_memory == "auto" and dataset.fits_in_memory())
    data = dataset.load(settings, in_memory)
    steps = settings.steps_per_epoch or adapter(runtime.strategy, data.train).pass_batches(runtime.global_batch)
    context = Context(
        global_batch=runtime.global_batch,
        replicas=runtime.replicas,
        workers=runtime.workers,
        steps_per_epoch=steps,
        epochs=settings.epochs,
        seed=settings.seed,
        precision=runtime.precision,
        output_dir=settings.output_dir,
        _sample=data.sample,
    )
    built = build(settings, experiment, data.spec, runtime.strategy, context)
    if not restore:
        return Trained(runtime, dataset, data, built, None)
    restored = restore_newest(make_checkpoint(built), settings.output_dir / "checkpoints", say)
    if not restored:
        raise SettingsError(f"OUTPUT_DIR={settings.output_dir} has no checkpoint: run fit first")
    use_averaged_weights(built)  # the weights fit evaluated and exported, where the optimizer averages them
    return Trained(runtime, dataset, data, built, restored)


TAKEN = "image files (JPEG, PNG, GIF, BMP) or folders of them, CSV (.csv, .tsv) or JSON Lines (.jsonl) files"
Value = bytes | np.ndarray  # an input's value: an image's stored bytes, or an array of the spec's dtype and shape


@dataclass(frozen=True)
class InputFile:
    """One INPUT file and the reader of its kind: an image file (IMAGES) or a table's (a TableReader)."""

    path: Path
    reader: Reader


def _reader(path: Path) -> Reader | None:
    """The reader of a file's kind, by its name; else IMAGES for an image by its first bytes (one without a suffix),
    or None."""
    reader = reader_of(path)
    if isinstance(reader, TableReader) or reader is IMAGES:
        return reader
    try:
        with open(path, "rb") as stream:
            return IMAGES if IMAGES.image(stream.read(8)) is not None else None
    except OSError:
        return None


def gather(paths: list[Path], warn: Callable[[str], None] = lambda message: None) -> list[InputFile]:
    """INPUT paths as sources, in order: a folder's images searched recursively, in sorted order (what is not an
    image there is left out, and said). Raises SettingsError for a path missing, unreadable or of no kind taken."""
    sources: list[InputFile] = []
    for path in paths:
        if not path.exists():
            raise SettingsError(f"INPUT {path} does not exist: give {TAKEN}")
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
            images = [p for p in files if _reader(p) is IMAGES]
            if not images:
                raise SettingsError(f"INPUT {path} is a folder with no image files (JPEG, PNG, GIF, BMP) in it")
            if len(images) < len(files):
                other = next(p for p in files if p not in set(images))
                warn(f"INPUT {path}: {len(files) - len(images)} files that are not images left out (like {other})")
            sources.extend(InputFile(p, IMAGES) for p in images)
            continue
        if not os.access(path, os.R_OK):
            raise SettingsError(f"INPUT {path} is not readable")
        reader = _reader(path)
        if reader is None:
            raise SettingsError(f"INPUT {path} is none of what predict takes: {TAKEN}")
        sources.append(InputFile(path, reader))
    return sources


@dataclass(frozen=True)
class InputExample:
    """One example: where it came from ("file", "file:line", "split[index]") and a value per signature input."""

    input: str
    values: dict[str, Value]


class SignatureExamples:
    """Sources read into examples for one signature: `inputs` is its name -> tf.TensorSpec (batch axis first);
    `images` names the inputs that take an image (stored bytes as a string, or decoded uint8 pixels)."""

    def __init__(self, inputs: dict[str, tf.TensorSpec], images: set[str]) -> None:
        self.inputs, self.images = inputs, images

    def read(self, sources: list[InputFile], delimiter: str | None = None) -> list[InputExample]:
        """Every source's examples, in order, each checked; a CSV's read as DATASET's is (its dialect found, or
        `delimiter`: CSV_DELIMITER). Raises SettingsError naming the file (and line)."""
        examples: list[InputExample] = []
        for source in sources:
            if not isinstance(source.reader, TableReader):
                examples.append(self._image_file(source.path))
                continue
            try:  # a table file's rows as DATASET's are read (the same TableReader), each with "file:line"
                name, data = f"INPUT {source.path}", source.path.read_bytes()
                rows = source.reader.rows(name, data, source.reader.dialect(name, data, delimiter))
            except OSError as error:
                raise SettingsError(f"INPUT {source.path} cannot be read ({error.strerror})") from None
            examples.extend(self._row(source.path, f"{source.path}:{number}", row) for number, row in rows)
        return examples

    def split(self, builder: tfds.core.DatasetBuilder, split: str) -> Iterator[InputExample]:
        """A split of the run's DATASET, its examples as stored, each signature input by its name (an image as its
        bytes where the signature takes them). Raises SettingsError where the split cannot be read."""
        import tensorflow as tf
        import tensorflow_datasets as tfds

        skip = {name: tfds.decode.SkipDecoding() for name in self.images if self.inputs[name].dtype == tf.string}
        try:
            dataset = builder.as_dataset(split=split, shuffle_files=False, decoders=skip or None)
        except Exception as error:  # an unknown split, a dataset not prepared: TFDS raises several types
            raise SettingsError(
                f"--split {split!r} of DATASET={builder.info.full_name} in {builder.data_dir} cannot be read: "
                f"{first_line(error, 200)}"
            ) from None
        names = list(self.inputs)
        missing = [name for name in names if _column(dataset.element_spec, name) is None]
        if missing:
            raise SettingsError(f"--split {split!r}: the model takes {missing[0]!r}, which the dataset does not store")
        return (
            InputExample(f"{split}[{index}]", {name: _column(stored, name) for name in names})
            for index, stored in enumerate(tfds.as_numpy(dataset))
        )

    def _image_file(self, path: Path) -> InputExample:
        if set(self.inputs) != self.images or len(self.images) != 1:
            names = ", ".join(self.inputs)
            what = f"one image, but the model takes {names}" if self.images else "an image, but the model takes none"
            raise SettingsError(
                f"INPUT {path} is {what}: give rows of a CSV or JSON Lines file with a column for each of {names} "
                "(an image as its file's path)"
            )
        (name,) = self.images
        return InputExample(str(path), {name: self._image(path, name, str(path))})

    def _image(self, path: Path, name: str, where: str) -> Value:
        """An image file as the signature takes it: its bytes (checked to decode), or its uint8 pixels."""
        import tensorflow as tf

        try:
            data = path.read_bytes()
        except OSError as error:
            raise SettingsError(f"{where}: cannot read {path} ({error.strerror})") from None
        spec = self.inputs[name]
        channels = int(spec.shape[-1]) if spec.dtype != tf.string and spec.shape[-1] is not None else 0
        try:
            pixels = tf.io.decode_image(data, channels=channels, expand_animations=False)
        except (tf.errors.InvalidArgumentError, ValueError) as error:
            cause = first_line(error, 120)
            raise SettingsError(f"{where}: {path} is not an image TensorFlow can decode ({cause})") from None
        if spec.dtype == tf.string:
            return data
        wanted = tuple(spec.shape[1:])
        if not tf.TensorShape(pixels.shape).is_compatible_with(wanted):
            raise SettingsError(
                f"{where}: {path} is an image of {'x'.join(map(str, pixels.shape))}, but the model takes "
                f"{'x'.join('any' if d is None else str(d) for d in wanted)} images, as the dataset stores them: "
                "resize it first"
            )
        return pixels.numpy()

    def _row(self, path: Path, where: str, row: Row) -> InputExample:
        lacking = [repr(name) for name in sorted(self.inputs) if name not in row]
        if lacking:
            columns = f"column {lacking[0]}" if len(lacking) == 1 else f"columns {', '.join(lacking)}"
            takes = ", ".join(sorted(self.inputs))
            raise SettingsError(f"{where}: no {columns}, which the model takes (it takes {takes})")
        values, bad = {}, []
        for name, spec in self.inputs.items():
            if name in self.images:  # a path to the image, relative to the file's folder
                image = Path(str(row[name]))
                values[name] = self._image(image if image.is_absolute() else path.parent / image, name, where)
                continue
            try:
                values[name] = _value(row[name], spec, f"column {name!r}")
            except SettingsError as error:  # every bad column of the row, in one line
                bad.append(str(error))
        if bad:
            raise SettingsError(f"{where}: {'; '.join(bad)}")
        return InputExample(where, values)


def _column(stored: dict, name: str) -> np.ndarray | np.generic | bytes | None:
    """A stored feature by name, or a column of a dict feature by its own name, as tfds.as_numpy gives it (an
    array, a NumPy scalar, or the bytes of a string); None where the dataset stores none (of an element_spec: its
    tf.TensorSpec)."""
    if name in stored:
        return stored[name]
    return next((value[name] for value in stored.values() if isinstance(value, dict) and name in value), None)


def _value(given: object, spec: tf.TensorSpec, where: str) -> Value:
    """A CSV cell (text; a vector as a JSON list) or a JSON value as the spec's dtype and shape. An empty cell (or
    null) is "" as text, NaN as a float: missing, as an empty cell of DATASET is (train.data.local)."""
    import tensorflow as tf

    from train.data.local import is_empty

    if spec.dtype == tf.string:
        return b"" if given is None else given if isinstance(given, bytes) else str(given).encode()
    if is_empty(given) and spec.shape.rank == 1:  # one value a row
        if not spec.dtype.is_floating:
            raise SettingsError(
                f"{where} is empty, but the model takes {_a(spec.dtype.name)} there, which cannot be missing (the "
                "training data had no empty cell in it): fill it in"
            )
        return np.asarray(np.nan, dtype=spec.dtype.as_numpy_dtype)
    value = given
    if isinstance(given, str):
        text = given.strip()
        try:
            value = json.loads(text) if text.startswith("[") else text
            if spec.dtype == tf.bool and isinstance(value, str):
                value = {"true": True, "false": False, "1": True, "0": False}[value.lower()]
        except (json.JSONDecodeError, KeyError):
            raise SettingsError(f"{where} is {given!r}, not {_a(spec.dtype.name)}") from None
    try:
        array = np.asarray(value, dtype=spec.dtype.as_numpy_dtype)
    except (ValueError, TypeError, OverflowError):
        raise SettingsError(f"{where} is {given!r}, not {_a(spec.dtype.name)}") from None
    wanted = tf.TensorShape(spec.shape[1:])
    if not wanted.is_compatible_with(array.shape):
        raise SettingsError(f"{where} has shape {array.shape}, but the model takes {tuple(wanted.as_list())}")
    return array


def _a(dtype: str) -> str:
    """A dtype's name with its article: "an int64", "a float32"."""
    return f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype}"


def _signature(settings: Settings, built: Built | None) -> tuple[dict[str, tf.TensorSpec], Serve]:
    """What predicts: the export's `serving_default` (`built` None), or the checkpoint's weights (open_trained's
    model) through the export's default function. Returns its inputs (name -> tf.TensorSpec) and the function of a
    batch of them, which holds what it runs alive (the loaded SavedModel, the model)."""
    import tensorflow as tf

    if built is not None:
        from train.exportable import serving_endpoints

        _, function, specs = serving_endpoints(built)[0]
        serve = tf.function(function, input_signature=specs)
        return {spec.name: spec for spec in specs}, lambda batch: serve(*[batch[spec.name] for spec in specs])
    path = settings.output_dir / SAVED_MODEL
    try:
        loaded = tf.saved_model.load(str(path))
        signature = loaded.signatures["serving_default"]
    except (OSError, KeyError, ValueError, tf.errors.OpError) as error:
        raise SettingsError(f"{path} cannot be loaded: {first_line(error, 200)}; run fit to its end again") from None
    return dict(signature.structured_input_signature[1]), lambda batch: loaded.signatures["serving_default"](**batch)


def _batch(examples: list[InputExample], inputs: dict[str, tf.TensorSpec]) -> Batch:
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


def predict(
    settings: Settings,
    sources: list[InputFile],
    split: str | None,
    batch: int,
    checkpoint: bool,
    open_output: Callable[[], TextIO],
    say: Say,
    bar: bool = False,
) -> int:
    """Predict every example of `sources` (then of `split`), in order, `batch` at a time, on the first device the
    settings choose; each checked before `open_output()` is called and the first line written. `bar`: a progress
    bar on stderr. Returns how many were predicted. Raises SettingsError (exit 2) for an input the model cannot
    take."""
    import tensorflow as tf

    from train.data.opening import check_same_data, open_source, with_run_label_kind
    from train.data.spec import features_record

    if checkpoint:
        trained = open_trained(settings, "predicted", say)
        runtime, opened, built = trained.runtime, trained.dataset, trained.built
        features = features_record(opened.builder, opened.settings)
    else:  # the export on files needs the run's records alone (a run from before they were kept: the data's own)
        runtime, recorded = setup_runtime(settings, local_only=True), read_run(settings.output_dir)
        opened = built = None
        features = recorded.get("features")
        if split is not None or not isinstance(features, dict):
            opened = open_source(with_run_label_kind(settings, recorded), say)  # a split, or the data's description
            check_same_data(opened.settings, recorded.get("data"), opened.identity, "predicted")
            features = features_record(opened.builder, opened.settings)
    inputs, serve = _signature(settings, built)
    reading = SignatureExamples(inputs, {name for name in inputs if name in features["images"]})
    examples: Iterable[InputExample] = reading.read(sources, settings.csv_delimiter)
    total = len(examples)
    if split is not None:
        examples = itertools.chain(examples, reading.split(opened.builder, split))
        total += _split_size(opened.builder, split)
    is_class = bool(features["label_is_class"])
    written = 0
    with tf.device(runtime.devices[0]), open_output() as output, _progress(total, bar) as advance:
        for chunk in _chunks(examples, batch):
            outputs = {name: value.numpy() for name, value in serve(_batch(chunk, inputs)).items()}
            for row, example in enumerate(chunk):
                output.write(json.dumps({"input": example.input, **describe(outputs, row, is_class)}) + "\n")
            written += len(chunk)
            advance(len(chunk))
    return written


def _split_size(builder: tfds.core.DatasetBuilder, split: str) -> int:
    try:
        return int(builder.info.splits[split].num_examples)
    except Exception:  # not listed (or not prepared): the split says so when it is read
        return 0


@contextlib.contextmanager
def _progress(total: int, shown: bool) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr (`shown`), transient; else nothing. Yields what advances it by a count."""
    if not shown:
        yield lambda count: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("predicting", total=total or None)
        yield lambda count: bar.advance(task, count)
