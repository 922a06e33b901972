"""Your data as you have it: DATASET as a path (a folder of images, a CSV or JSON Lines file, a prepared TFDS
folder), read without TensorFlow, so that a bad file is refused before it loads.

What the path holds is its survey (train.dataset_path: `stat` only, made when the settings were validated).
`read_image` and `read_table` read each file once, as the survey's reader (train.dataset_path's READERS) reads
it: its bytes, its kind told from its first bytes (an image) or its rows (a table), its sha256
(an image's structure checked too, `damage`).
The fingerprint is the files' relative paths, sizes and sha256 (`fingerprint`): the data's identity, whatever the
path is called on this host. Modification times only decide whether to read again (train.data.written).

Whether an image file is whole (`damage`) is told from its structure without decoding it: a file cut short (a copy
or download that stopped) would otherwise be found only when a batch reaches it, mid-training. JPEG: the end marker
(FFD9) after the first scan; PNG: the IEND chunk; GIF: the trailer (0x3B); BMP: the size its header gives. Bytes
after the end (padding, a camera's trailer, a motion photo's video) are allowed, as the decoders allow them. No PIL:
a few byte searches from the file's end, so that checking costs next to nothing beside reading the file. An image's
height and width (`image_size`) are read from its header, no decode, as well.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from train.data.data_settings import DataSettings
from train.dataset_path import IMAGES, SHOWN, Dialect, Entry, Survey, TableReader, number, reader_of
from train.errors import SettingsError

if TYPE_CHECKING:
    import tensorflow as tf

INT64 = (-(2**63), 2**63 - 1)  # a whole-number column beyond this range is float32
# whole-number labels from 0 are classes where there are at most this many (0 to the largest) and at most twice as
# many as the values seen: a year column (2,021 classes for 30 years) is a value to predict
MAX_INTEGER_CLASSES = 1000
JPEG_END = b"\xff\xd9"
JPEG_SCAN = 0xDA
PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and its CRC (its length, 0, before them)
GIF_END = 0x3B
PADDING = b"\x00\r\n "  # what writers leave after a GIF's trailer
# JPEG's start-of-frame markers (baseline, progressive, lossless...): C4, C8 and CC are other segments
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
TAIL = 64 << 10  # a GIF's trailer is looked for this far from the end, past padding


@dataclass
class Read:
    """What reading the source's files gave: their sha256 (the fingerprint's parts) and what was left out."""

    files: dict[str, tuple[int, str]] = field(default_factory=dict)  # relative path -> (size, sha256)
    skipped: list[str] = field(default_factory=list)  # not images, left out
    beside: list[str] = field(default_factory=list)  # files beside the class folders, left out
    broken: list[tuple[str, str]] = field(default_factory=list)  # (path, what is wrong): BAD_FILES decides
    missing: dict[str, int] = field(default_factory=dict)  # a table's numeric column -> its empty (or NaN) cells
    dialects: dict[str, str] = field(default_factory=dict)  # a CSV file -> how it was read (dataset_path.Dialect)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.files)

    @property
    def read_as(self) -> list[str]:
        """How the CSV files were read, but for how every one was before their dialects were found (comma-separated,
        quoted with ", decimal point: such a file's written copy keeps its name), for the written copy's name."""
        return sorted(set(self.dialects.values()) - {str(Dialect())})


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
    kind = IMAGES.image(data[:8])
    if kind is None:
        if reader_of(entry.path) is IMAGES:
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


# ---- tables: the rows of each split's file, read by the survey's Table reader (train.dataset_path) ----------------


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

    def example(self, row: dict) -> tf.train.Example:
        """A typed row as the record it is written as (train.data.written)."""
        import tensorflow as tf

        feature = {}
        for column in self.columns:
            value = row[column.name]
            if column.dtype == "string" and column.classes is None:
                feature[column.name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
            elif column.dtype == "float32":
                feature[column.name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
            else:
                feature[column.name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Example(features=tf.train.Features(feature=feature))


def read_table(
    survey: Survey,
    label_key: str | None,
    label_kind: str | None,
    read: Read,
    *,
    delimiter: str | None = None,
    drop: tuple[str, ...] = (),
    advance: Callable[[], None] = lambda: None,
) -> Table:
    """Every split's file read once: rows checked (`advance()` after each: a long file's progress), columns typed
    from their non-empty values, the label's kind (`label_kind` overrides the guess: class or value; `label_key`
    None: LABEL_KEY=none, no label), the columns `drop` names (DROP_COLUMNS) left out. An empty cell of a numeric
    column is missing (NaN, its column float32, counted in `read.missing`); of a text column, "". A CSV's dialect
    is found from each file, or its delimiter told (`delimiter`: CSV_DELIMITER), noted in `read.dialects`. Raises
    SettingsError."""
    reader = survey.reader
    if not isinstance(reader, TableReader):
        raise TypeError(f"{survey.root} is no table: its reader is {type(reader).__name__}")  # our fault, not data's
    rows: dict[str, list[tuple[int, dict]]] = {}
    names: list[str] = []
    for split, [(entry, _)] in sorted(survey.splits.items()):
        name = str(survey.file(entry))
        data = survey.file(entry).read_bytes()
        read.files[entry.path] = (len(data), hashlib.sha256(data).hexdigest())
        dialect = reader.dialect(name, data, delimiter)
        if dialect is not None:
            read.dialects[entry.path] = str(dialect)
        rows[split] = []
        for row in reader.rows(name, data, dialect):
            rows[split].append(row)
            advance()
        if not rows[split]:
            raise SettingsError(f"{name} has no rows")
        for _, row in rows[split]:
            names.extend(key for key in row if key not in names)
    if label_key is not None and label_key not in names:
        raise SettingsError(f"LABEL_KEY={label_key!r} is not a column of {survey.root}: use one of {', '.join(names)}")
    others = [name for name in names if name != label_key]
    for name in drop:
        if name not in others:
            why = "is the label (LABEL_KEY)" if name == label_key else f"is not a column of {survey.root}"
            raise SettingsError(f"DROP_COLUMNS={','.join(drop)!r}: {name!r} {why}: use some of {', '.join(others)}")
    names = [name for name in names if name not in drop]
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


def read_as(dialects: dict[str, str]) -> tuple[str, ...]:
    """The start's line of how each CSV file was read (`Read.dialects`), files read alike named together."""
    alike: dict[str, list[str]] = {}
    for path, dialect in dialects.items():
        alike.setdefault(dialect, []).append(path)
    return tuple(f"{', '.join(paths)} read as {dialect}." for dialect, paths in alike.items())


def check_label_values(settings: DataSettings, table: Table, label_key: str) -> None:
    """A class label with one value in every split cannot train a classifier: refused, unless LABEL_KEY=none.
    Raises SettingsError."""
    label = next((column for column in table.columns if column.name == label_key), None)
    if not settings.labeled or label is None or (label.classes is None and label.num_classes is None):
        return
    values = {row[label_key] for rows in table.rows.values() for row in rows}
    if len(values) >= 2:
        return
    [value] = values
    shown = label.classes[value] if label.classes is not None else value
    raise SettingsError(
        f"DATASET={settings.dataset!r}: the label column {label_key!r} holds one value, {shown!r}: classification "
        "needs two classes at least: add rows of another class, set LABEL_KIND=value if it is a number to predict, "
        "or LABEL_KEY=none to train without labels"
    )


def is_empty(value: object) -> bool:  # a cell as read: text (CSV) or any JSON value
    """An empty cell: nothing or only spaces (CSV), null or no such key (JSON Lines)."""
    return value is None or (isinstance(value, str) and not value.strip())


def _typed(survey: Survey, name: str, every: list, is_label: bool, label_kind: str | None) -> Column:
    values = [(split, number, row.get(name)) for split, number, row in every]
    present = [value for _, _, value in values if not is_empty(value)]
    numbers = [number(value) for value in present]
    numeric = bool(present) and all(number is not None for number in numbers)
    if is_label and len(present) < len(values):
        empty = [f"row {number} of {split}" for split, number, value in values if is_empty(value)]
        shown = ", ".join(empty[:SHOWN]) + (", ..." if len(empty) > SHOWN else "")
        rows = f"{empty[0]} is empty" if len(empty) == 1 else f"{len(empty)} rows are empty ({shown})"
        raise SettingsError(
            f"DATASET={survey.root}: column {name!r} is the label but {rows}: fill the label in, or remove the row"
        )
    # "3" is whole, "3.0" is not; a column with an empty cell is float32, to hold it as NaN
    whole = (
        numeric
        and len(present) == len(values)
        and all(isinstance(n, int) and INT64[0] <= n <= INT64[1] for n in numbers)
    )
    dtype = "int64" if whole else "float32" if numeric else "string"
    if not is_label:
        return Column(name, dtype)
    if dtype == "string":
        if label_kind == "value":
            raise SettingsError(f"LABEL_KIND=value but LABEL_KEY={name!r} holds text: use LABEL_KIND=class")
        return Column(name, "int64", classes=tuple(sorted({str(value) for value in present})))
    integers = [int(number) for number in numbers] if whole else []
    classes = max(integers, default=-1) + 1  # 0 to the largest
    guess_class = whole and min(integers) >= 0 and classes <= min(2 * len(set(integers)), MAX_INTEGER_CLASSES)
    if label_kind == "class" or (label_kind is None and guess_class):
        if not whole or min(integers) < 0:
            raise SettingsError(
                f"LABEL_KIND=class but LABEL_KEY={name!r} holds values that are not whole numbers "
                "from 0: use LABEL_KIND=value"
            )
        return Column(name, "int64", num_classes=classes)
    return Column(name, "float32")


def _value(column: Column, value: object) -> int | float | str:  # a cell as read
    if column.classes is not None:
        return column.index[str(value)]
    if column.dtype == "int64":
        return int(number(value))
    if column.dtype == "float32":
        return math.nan if is_empty(value) else float(number(value))
    return "" if value is None else str(value)


def damage(data: bytes, kind: str) -> str | None:
    """What is wrong with the image `data` of `kind` (jpeg, png, gif, bmp), in a few words; None where it is whole."""
    return {"jpeg": _jpeg, "png": _png, "gif": _gif, "bmp": _bmp}[kind](data)


def _jpeg(data: bytes) -> str | None:
    """The segments are walked to the first scan (an EXIF thumbnail before it holds an end marker of its own); the
    end marker must follow it. A scan's data cannot hold FF D9 (an FF in it is followed by 00 or a restart marker)."""
    scan = _first_scan(data)
    if scan is None:
        return "cut short: it ends before its image data"
    if data.rfind(JPEG_END, scan) < 0:
        return "cut short: no JPEG end marker (FF D9)"
    return None


def _first_scan(data: bytes) -> int | None:
    """Where the first scan's data begins, None where the file ends first."""
    position = 2  # after SOI
    while position + 4 <= len(data):
        if data[position] != 0xFF:  # not where a marker should be: looked for, as a lenient decoder does
            found = data.find(b"\xff\xda", position)
            return None if found < 0 else found + 2
        marker = data[position + 1]
        if marker == 0xFF:  # fill bytes before a marker
            position += 1
        elif marker == 0xD8 or 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            position += 2
        elif marker == 0xD9:  # the end before any scan
            return None
        else:
            end = position + 2 + int.from_bytes(data[position + 2 : position + 4], "big")
            if marker == JPEG_SCAN:
                return end if end <= len(data) else None
            position = end
    return None


def _png(data: bytes) -> str | None:
    return None if data.rfind(PNG_END) >= 8 else "cut short: no PNG IEND chunk"


def _gif(data: bytes) -> str | None:
    end = len(data)
    while end > max(6, len(data) - TAIL) and data[end - 1] in PADDING:
        end -= 1
    return None if end > 6 and data[end - 1] == GIF_END else "cut short: no GIF trailer (3B)"


def _bmp(data: bytes) -> str | None:
    """The file's size in its header (some writers leave 0 there: then the pixel array's own size), against the
    bytes there are."""
    if len(data) < 26:
        return "cut short: its header is incomplete"
    declared = int.from_bytes(data[2:6], "little")
    if declared < 26:  # not given: the pixel array of an uncompressed bitmap (BI_RGB) after its offset
        declared = _bmp_pixels_end(data)
    if declared > len(data):
        return f"cut short: {len(data):,} of its {declared:,} bytes"
    return None


def _bmp_pixels_end(data: bytes) -> int:
    offset, header = int.from_bytes(data[10:14], "little"), int.from_bytes(data[14:18], "little")
    if header < 40 or len(data) < 34:  # an OS/2 header, or too short to say: only the offset is known
        return offset
    width = abs(int.from_bytes(data[18:22], "little", signed=True))
    height = abs(int.from_bytes(data[22:26], "little", signed=True))
    bits, compression = int.from_bytes(data[28:30], "little"), int.from_bytes(data[30:34], "little")
    if compression != 0:
        return offset
    return offset + (width * bits + 31) // 32 * 4 * height


def image_size(data: bytes, kind: str) -> tuple[int, int] | None:
    """(height, width) of a JPEG, PNG, GIF or BMP from its header; None where the header does not say."""
    try:
        if kind == "png" and data[12:16] == b"IHDR":
            return int.from_bytes(data[20:24], "big"), int.from_bytes(data[16:20], "big")
        if kind == "gif":  # the logical screen, what a decoded frame fills
            return int.from_bytes(data[8:10], "little"), int.from_bytes(data[6:8], "little")
        if kind == "bmp":  # a negative height: the rows stored top-down
            height = int.from_bytes(data[22:26], "little", signed=True)
            return abs(height), int.from_bytes(data[18:22], "little", signed=True)
        if kind == "jpeg":
            return _jpeg_size(data)
    except (IndexError, ValueError):
        return None
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2  # after SOI
    while at + 9 < len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte
            at += 1
            continue
        if marker in _JPEG_FRAMES:
            return int.from_bytes(data[at + 5 : at + 7], "big"), int.from_bytes(data[at + 7 : at + 9], "big")
        if marker == 0xDA:  # start of scan before any frame: not a JPEG we can read
            return None
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return None
