"""Your data as you have it: DATASET as a path (a folder of images, a CSV or JSON Lines file, a prepared TFDS
folder), read without TensorFlow, so that a bad file is refused before it loads.

What the path holds is its survey (train.dataset_path: `stat` only, made when the settings were validated).
`read_image` and `read_table` read each file once: its bytes, its kind told from its first bytes, its sha256
(an image's structure checked too, train.data.intact).
The fingerprint is the files' relative paths, sizes and sha256 (`fingerprint`): the data's identity, whatever the
path is called on this host. Modification times only decide whether to read again (train.data.written).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from train.data.intact import damage
from train.dataset_path import SHOWN, Entry, Survey
from train.errors import SettingsError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".jpe", ".png", ".gif", ".bmp"}  # a file named so must be one (else refused)
MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)
INT64 = (-(2**63), 2**63 - 1)  # a whole-number column beyond this range is float32
MAX_INTEGER_CLASSES = 1000  # whole-number labels from 0 with at most this many values are classes


def image_kind(head: bytes) -> str | None:
    """jpeg, png, gif or bmp, told from a file's first bytes; None for anything else."""
    return next((kind for magic, kind in MAGIC if head.startswith(magic)), None)


@dataclass
class Read:
    """What reading the source's files gave: their sha256 (the fingerprint's parts) and what was left out."""

    files: dict[str, tuple[int, str]] = field(default_factory=dict)  # relative path -> (size, sha256)
    skipped: list[str] = field(default_factory=list)  # not images, left out
    broken: list[tuple[str, str]] = field(default_factory=list)  # (path, what is wrong): BAD_FILES decides
    missing: dict[str, int] = field(default_factory=dict)  # a table's numeric column -> its empty (or NaN) cells

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.files)


def fingerprint(files: dict[str, tuple[int, str]]) -> str:
    """The data's identity: sha256 over every file's relative path, size and content sha256."""
    digest = hashlib.sha256()
    for path in sorted(files):
        size, sha = files[path]
        digest.update(f"{path}\t{size}\t{sha}\n".encode())
    return digest.hexdigest()


def read_image(survey: Survey, entry: Entry, read: Read) -> tuple[bytes, str] | None:
    """The file's bytes and image kind, its sha256 noted in `read`; None for a file that is not an image (noted as
    skipped) or a broken one: named as an image but not one, or cut short (noted as broken, with what is wrong,
    for BAD_FILES). Raises SettingsError for a file that cannot be read."""
    path = survey.file(entry)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SettingsError(f"DATASET={survey.root}: {entry.path} cannot be read ({error.strerror})") from None
    kind = image_kind(data[:8])
    if kind is None:
        if Path(entry.path).suffix.lower() in IMAGE_SUFFIXES:
            read.broken.append((entry.path, "named as an image but not a JPEG, PNG, GIF or BMP"))
        else:
            read.skipped.append(entry.path)
        return None
    problem = damage(data, kind)
    if problem is not None:
        read.broken.append((entry.path, problem))
        return None
    read.files[entry.path] = (len(data), hashlib.sha256(data).hexdigest())
    return data, kind


# ---- tables: CSV and JSON Lines --------------------------------------------------------------------------------


def _text_of(survey: Survey, entry: Entry, read: Read) -> str:
    data = survey.file(entry).read_bytes()
    read.files[entry.path] = (len(data), hashlib.sha256(data).hexdigest())
    return decoded(f"DATASET={survey.root}: {entry.path}", data)


def decoded(name: str, data: bytes) -> str:
    """A table file's bytes as text: UTF-8, a byte-order mark dropped (a spreadsheet's export). Raises
    SettingsError naming `name` and the line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise SettingsError(f"{name} is not UTF-8 text (line {line}): save it as UTF-8") from None


def table_rows(name: str, text: str, jsonl: bool) -> Iterator[tuple[int, dict]]:
    """The rows of a CSV (a header row, then one value per column) or JSON Lines text (one object a line), each
    with its line number: the one reader of tables, for DATASET and for predict's INPUT. A row's values are as
    written (CSV: text; JSON: any JSON value). Raises SettingsError naming `name` and the line."""
    return _jsonl_rows(name, text) if jsonl else _csv_rows(name, text)


def _csv_rows(name: str, text: str) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if not header or not all(column.strip() for column in header) or _number(header[0]) is not None:
            raise SettingsError(f"{name} has no header row: its first line must name the columns, like age,fare,label")
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise SettingsError(f"{name} line {reader.line_num} has {len(row)} values, the header {len(header)} "
                                    f"columns ({','.join(header)}): every row needs one value per column")  # fmt: skip
            yield reader.line_num, dict(zip(header, row, strict=True))
    except csv.Error as error:  # a NUL byte, a cell over csv's field size limit, ...
        raise SettingsError(f"{name} line {reader.line_num} is not CSV ({error})") from None


def _jsonl_rows(name: str, text: str) -> Iterator[tuple[int, dict]]:
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise SettingsError(f"{name} line {number} is not JSON ({error.msg}): one JSON object per line") from None
        if not isinstance(row, dict):
            raise SettingsError(
                f"{name} line {number} is a JSON {type(row).__name__}, not an object: one object a line"
            )
        yield number, row


def _number(text) -> int | float | None:
    """An int or float of a cell's text (or a JSON number), None for anything else."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int | float):
        return text
    for kind in (int, float):
        try:
            return kind(text)
        except (TypeError, ValueError):
            continue
    return None


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # int64, float32 or string
    classes: tuple[str, ...] | None = None  # the label as a ClassLabel: its names
    num_classes: int | None = None

    @cached_property
    def index(self) -> dict[str, int]:
        return {name: number for number, name in enumerate(self.classes or ())}


@dataclass
class Table:
    """Rows by split, each row's values by column, typed; the label column's kind decided."""

    columns: list[Column]
    rows: dict[str, list[dict]]
    label_key: str | None


def read_table(survey: Survey, label_key: str | None, label_kind: str | None, read: Read) -> Table:
    """Every split's file read once: rows checked, columns typed from their non-empty values, the label's kind
    (`label_kind` overrides the guess: class or value; `label_key` None: LABEL_KEY=none, no label). An empty cell
    of a numeric column is missing (NaN, its column float32, counted in `read.missing`); of a text column, "".
    Raises SettingsError."""
    rows: dict[str, list[tuple[int, dict]]] = {}
    names: list[str] = []
    for split, [(entry, _)] in sorted(survey.splits.items()):
        name = str(survey.file(entry))
        text = _text_of(survey, entry, read)
        rows[split] = list(table_rows(name, text, jsonl=not entry.path.lower().endswith(".csv")))
        if not rows[split]:
            raise SettingsError(f"{name} has no rows")
        for _, row in rows[split]:
            names.extend(key for key in row if key not in names)
    if label_key is not None and label_key not in names:
        raise SettingsError(f"LABEL_KEY={label_key!r} is not a column of {survey.root}: use one of {', '.join(names)}")
    every = [(split, number, row) for split, numbered in rows.items() for number, row in numbered]
    columns = [_typed(survey, name, every, name == label_key, label_kind) for name in names]
    by_name = {column.name: column for column in columns}
    typed_rows = {split: [] for split in rows}
    for split, _, row in every:
        typed_rows[split].append({name: _value(by_name[name], row.get(name)) for name in names})
    for column in columns:
        if column.dtype == "float32" and column.name != label_key:
            count = sum(math.isnan(row[column.name]) for split_rows in typed_rows.values() for row in split_rows)
            if count:
                read.missing[column.name] = count
    return Table(columns, typed_rows, label_key)


def is_empty(value) -> bool:
    """An empty cell: nothing or only spaces (CSV), null or no such key (JSON Lines)."""
    return value is None or (isinstance(value, str) and not value.strip())


def _typed(survey: Survey, name: str, every: list, is_label: bool, label_kind: str | None) -> Column:
    values = [(split, number, row.get(name)) for split, number, row in every]
    present = [value for _, _, value in values if not is_empty(value)]
    numbers = [_number(value) for value in present]
    numeric = bool(present) and all(number is not None for number in numbers)
    if is_label and len(present) < len(values):
        empty = [f"row {number} of {split}" for split, number, value in values if is_empty(value)]
        shown = ", ".join(empty[:SHOWN]) + (", ..." if len(empty) > SHOWN else "")
        rows = f"{empty[0]} is empty" if len(empty) == 1 else f"{len(empty)} rows are empty ({shown})"
        raise SettingsError(f"DATASET={survey.root}: column {name!r} is the label but {rows}: fill the label in, or "
                            "remove the row")  # fmt: skip
    # "3" is whole, "3.0" is not; a column with an empty cell is float32, to hold it as NaN
    whole = numeric and len(present) == len(values) and all(isinstance(n, int) and INT64[0] <= n <= INT64[1]
                                                            for n in numbers)  # fmt: skip
    dtype = "int64" if whole else "float32" if numeric else "string"
    if not is_label:
        return Column(name, dtype)
    if dtype == "string":
        if label_kind == "value":
            raise SettingsError(f"LABEL_KIND=value but LABEL_KEY={name!r} holds text: use LABEL_KIND=class")
        return Column(name, "int64", classes=tuple(sorted({str(value) for value in present})))
    integers = [int(number) for number in numbers] if whole else []
    guess_class = whole and min(integers) >= 0 and len(set(integers)) <= MAX_INTEGER_CLASSES
    if label_kind == "class" or (label_kind is None and guess_class):
        if not whole or min(integers) < 0:
            raise SettingsError(f"LABEL_KIND=class but LABEL_KEY={name!r} holds values that are not whole numbers "
                                "from 0: use LABEL_KIND=value")  # fmt: skip
        return Column(name, "int64", num_classes=max(integers) + 1)
    return Column(name, "float32")


def _value(column: Column, value):
    if column.classes is not None:
        return column.index[str(value)]
    if column.dtype == "int64":
        return int(_number(value))
    if column.dtype == "float32":
        return math.nan if is_empty(value) else float(_number(value))
    return "" if value is None else str(value)
