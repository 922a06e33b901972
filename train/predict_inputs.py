"""What `predict` reads: image files and folders of them, CSV and JSON Lines rows, a split of the run's DATASET.

Every input is read and checked before the first prediction is written: a file the model cannot take, a row
missing a column the signature takes, a value of the wrong type or shape is one line (SettingsError, exit 2)
naming the file and line. `gather` needs no TensorFlow (it runs before it loads); `SignatureExamples` knows the
signature. Which files are taken, and how a table's rows are read, is DATASET's readers' (train.dataset_path's
READERS, each a `Reader`): an INPUT file is read as the DATASET of its kind is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from train.dataset_path import IMAGES, Reader, Row, TableReader, reader_of
from train.errors import SettingsError, first_line

if TYPE_CHECKING:
    import tensorflow as tf
    import tensorflow_datasets as tfds

TAKEN = "image files (JPEG, PNG, GIF, BMP) or folders of them, CSV (.csv) or JSON Lines (.jsonl) files"
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

    def read(self, sources: list[InputFile]) -> list[InputExample]:
        """Every source's examples, in order, each checked. Raises SettingsError naming the file (and line)."""
        examples: list[InputExample] = []
        for source in sources:
            if not isinstance(source.reader, TableReader):
                examples.append(self._image_file(source.path))
                continue
            try:  # a table file's rows as DATASET's are read (the same TableReader), each with "file:line"
                rows = source.reader.rows(f"INPUT {source.path}", source.path.read_bytes())
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
