"""DATASET's kind, decided once before TensorFlow loads (`source`, which load_settings calls to make
Settings.source): a TFDS name (TFDS), or a path (`is_path`) and what it holds, from `stat` alone (`survey`): its
reader, the layout (classes, splits), every file's size and mtime. Nothing else tells DATASET's kind from its text:
the rest of the engine reads Settings.source.

The readers: one object per kind of data (a folder of images, a CSV file, a JSON Lines file, a prepared TFDS
folder, a TFDS name). A path's are registered once in READERS, by kind and by the file suffixes each claims; a TFDS
name's is TFDS (`TfdsName`: no file here, TFDS's builder reads it). The writing of the records
(train.data.written, by the reader's class), the reading of the files (train.data.local) and predict's INPUT
(train.predict) all ask READERS; none tests a kind's name. Adding a kind (Parquet) is one subclass of
`TableReader` and one entry in READERS.

Below the settings (which make the source) and the data (train.data.local reads the files the survey lists;
train.data.written writes them once), which both ask it; it imports neither. A bare name that names a folder here
too is TFDS's where TFDS has a builder of that name (train.datasets.registered).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import itertools
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from train.datasets import registered
from train.errors import SettingsError

SHOWN = 3  # files named in a refusal
SPLIT_NAME = re.compile(r"[A-Za-z0-9_]+")  # what TFDS takes as a split's name
DEFAULT_DATA_DIR = "~/tensorflow_datasets"  # TFDS's own, where TFDS_DATA_DIR is unset or empty


Row = dict[str, object]  # a table's row: column -> its value as written (CSV: text; JSON: any JSON value)
MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)


class ImageFolder:
    """Image files in class folders (<class>/<file>, or <split>/<class>/<file>); as predict's INPUT, image files.

    Every reader answers `kind`, run.json's "data" kind (images, table or tfds: runs and tests read it, never
    renamed), and `suffixes`, the file names it claims (lower case; () for a folder's kind). How its data is written
    as records is train.data.written's, by its class: images, a TableReader's rows, or a PreparedFolder read in
    place."""

    kind = "images"
    suffixes = (".jpg", ".jpeg", ".jpe", ".png", ".gif", ".bmp")  # a file named so must be one (else refused)

    def image(self, head: bytes) -> str | None:
        """jpeg, png, gif or bmp, told from a file's first bytes; None for anything else."""
        return next((kind for magic, kind in MAGIC if head.startswith(magic)), None)


DELIMITERS = {"comma": ",", "semicolon": ";", "tab": "\t", "pipe": "|"}  # CSV_DELIMITER's words: no shell quoting
WORDS = {char: word for word, char in DELIMITERS.items()}
SNIFFED = 8 << 10  # a CSV's first bytes, where csv.Sniffer finds its delimiter and quote: its regular expressions
# take a time that grows with the square of the text (64 KiB of "x 'y,1" lines: 38 s; 8 KiB: 1 s)
SAMPLE = 64 << 10  # a CSV's first bytes, where its decimal is found
DECIMAL_COMMA = re.compile(r"\s*[+-]?\d*,\d+(?:[eE][+-]?\d+)?\s*")  # 3,14 -0,5 ,5 1,5e3


@dataclass(frozen=True)
class Dialect:
    """How a CSV file is written: its delimiter, quote character and decimal mark ("," where 3,14 is a number)."""

    delimiter: str = ","
    quote: str = '"'
    decimal: str = "."

    def __str__(self) -> str:
        decimal = "comma" if self.decimal == "," else "point"
        return f"{WORDS[self.delimiter]}-separated, quoted with {self.quote}, decimal {decimal}"


class TableReader(ABC):
    """A file of rows (one a split in a folder, <split><suffix>): a reader of tables answers `rows`, and `dialect`
    where its files may be written in more than one way (a CSV's)."""

    kind = "table"
    suffixes: tuple[str, ...] = ()

    def dialect(self, name: str, data: bytes, delimiter: str | None = None) -> Dialect | None:
        """How the file is written, found from its first rows (`delimiter`: CSV_DELIMITER's word, told); None for
        a kind written one way."""
        return None

    @abstractmethod
    def rows(self, name: str, data: bytes, dialect: Dialect | None = None) -> Iterator[tuple[int, Row]]:
        """A file's rows, each with its line number, read as `dialect` says (None: as found). Raises SettingsError
        naming `name` and the line."""


class Csv(TableReader):
    """A header row, then one value per column: every value text, a decimal comma's number written with a point."""

    suffixes = (".csv", ".tsv")

    def dialect(self, name: str, data: bytes, delimiter: str | None = None) -> Dialect:
        """csv.Sniffer's delimiter (of DELIMITERS; comma where it cannot tell), or the one told, and quote (" or ')
        on the header and first rows (SNIFFED), the quote kept where cells there open with it and each closes with
        it (an apostrophe, '90s, is none). The decimal is a comma where the first rows (SAMPLE) have numbers with a
        decimal comma and none with a point; never in a comma file (its cell cannot hold a comma unquoted)."""
        head = _first_lines(data, SNIFFED)
        chars = DELIMITERS[delimiter] if delimiter else "".join(DELIMITERS.values())
        try:
            sniffed = csv.Sniffer().sniff(head, delimiters=chars)
            found = Dialect(sniffed.delimiter, sniffed.quotechar)
        except csv.Error:  # one column, or no delimiter alike in every row: the first (comma, or the one told)
            found = Dialect(chars[0])
        opened = [cell for line in head.splitlines() for cell in line.split(found.delimiter) if cell[:1] == found.quote]
        if not opened or not all(len(cell) > 1 and cell.endswith(found.quote) for cell in opened):  # '90s, it's
            found = Dialect(found.delimiter)
        if found.delimiter == ",":
            return found
        try:
            sample = _first_lines(data, SAMPLE)
            rows = csv.reader(io.StringIO(sample, newline=""), delimiter=found.delimiter, quotechar=found.quote)
            cells = [cell for row in itertools.islice(rows, 1, None) for cell in row]
        except csv.Error:  # a NUL byte, ...: the reading names it
            return found
        commas = any(DECIMAL_COMMA.fullmatch(cell) for cell in cells)
        points = any("." in cell and number(cell) is not None for cell in cells)
        return Dialect(found.delimiter, found.quote, "," if commas and not points else ".")

    def rows(self, name: str, data: bytes, dialect: Dialect | None = None) -> Iterator[tuple[int, Row]]:
        dialect = dialect or self.dialect(name, data)
        text = io.StringIO(decoded(name, data), newline="")
        reader = csv.reader(text, delimiter=dialect.delimiter, quotechar=dialect.quote)
        try:
            header = next(reader, None)
            if not header or not all(column.strip() for column in header) or number(header[0]) is not None:
                raise SettingsError(
                    f"{name} has no header row: its first line must name the columns, like age,fare,label"
                )
            held = [char for char in DELIMITERS.values() if char != dialect.delimiter and char in header[0]]
            if len(header) == 1 and held:  # the whole header read as one name
                char = max(held, key=header[0].count)
                raise SettingsError(
                    f"{name}'s header is one column {header[0]!r} that holds {char!r}: set CSV_DELIMITER={WORDS[char]}"
                )
            twice = sorted({column for column in header if header.count(column) > 1})
            if twice:  # a dict of the row would keep one of them
                raise SettingsError(
                    f"{name}'s header names the column {twice[0]!r} {header.count(twice[0])} times: "
                    "give each column its own name"
                )
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    raise SettingsError(
                        f"{name} line {reader.line_num} has {len(row)} values, the header "
                        f"{len(header)} columns ({','.join(header)}): every row needs one value "
                        "per column"
                    )
                if dialect.decimal == ",":
                    row = [cell.replace(",", ".") if DECIMAL_COMMA.fullmatch(cell) else cell for cell in row]
                yield reader.line_num, dict(zip(header, row, strict=True))
        except csv.Error as error:  # a NUL byte, a cell over csv's field size limit, ...
            raise SettingsError(f"{name} line {reader.line_num} is not CSV ({error})") from None


class JsonLines(TableReader):
    """One JSON object a line: its values any JSON value."""

    suffixes = (".jsonl",)

    def rows(self, name: str, data: bytes, dialect: Dialect | None = None) -> Iterator[tuple[int, Row]]:
        for line_number, line in enumerate(decoded(name, data).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                raise SettingsError(
                    f"{name} line {line_number} is not JSON ({error.msg}): one JSON object per line"
                ) from None
            if not isinstance(row, dict):
                raise SettingsError(
                    f"{name} line {line_number} is a JSON {type(row).__name__}, not an object: one object a line"
                )
            yield line_number, row


class PreparedFolder:
    """A folder TFDS prepared (its dataset_info.json beside the record files): read in place, never written."""

    kind = "tfds"
    suffixes = ()
    marker = "dataset_info.json"


class TfdsName:
    """A TFDS name (TFDS's own, the template's, the fork's `project.datasets`): no file here; TFDS's builder reads
    it, prepared once in TFDS_DATA_DIR (train.data.opening), its records read where TFDS keeps them."""

    kind = "tfds"


Reader = ImageFolder | TableReader | PreparedFolder  # a path's kind of data (READERS)
IMAGES, PREPARED, TFDS = ImageFolder(), PreparedFolder(), TfdsName()
READERS: tuple[Reader, ...] = (IMAGES, PREPARED, Csv(), JsonLines())  # the one registration of a path's kinds
TABLES: dict[str, TableReader] = {suffix: r for r in READERS if isinstance(r, TableReader) for suffix in r.suffixes}
TABLE_SUFFIXES = tuple(TABLES)
WRITTEN = frozenset(reader.kind for reader in READERS if reader is not PREPARED)  # kinds written into TFDS_DATA_DIR


def reader_of(path: str | Path) -> Reader | None:
    """The reader that claims a file by its suffix, None for a suffix no reader claims."""
    suffix = Path(path).suffix.lower()
    return next((reader for reader in READERS if suffix in reader.suffixes), None)


def _first_lines(data: bytes, size: int) -> str:
    """A file's first `size` bytes as text, cut after its last whole line there (all of them where none ends)."""
    text = data[:size].decode("utf-8-sig", errors="ignore")  # a bad byte is the reading's to name
    return text[: text.rfind("\n") + 1] or text


def decoded(name: str, data: bytes) -> str:
    """A table file's bytes as text: UTF-8, a byte-order mark dropped (a spreadsheet's export). Raises
    SettingsError naming `name` and the line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise SettingsError(f"{name} is not UTF-8 text (line {line}): save it as UTF-8") from None


def number(text: object) -> int | float | None:
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


def data_dir(tfds_data_dir: str | Path | None) -> Path:
    """TFDS_DATA_DIR (its setting's value; else the environment's), or TFDS's own default: where TFDS prepares a
    name, and a path is written. Never an empty value's working directory."""
    return Path(tfds_data_dir or os.environ.get("TFDS_DATA_DIR") or DEFAULT_DATA_DIR).expanduser()


def is_path(text: str) -> bool:
    """DATASET names a path: it starts with /, ./, ../ or ~, ends in a table's suffix (.csv, .tsv, .jsonl), or a
    file or folder of that name exists here, and, for a bare name (no /), TFDS has no builder of that name (`./name`
    is always the path)."""
    if text.startswith(("/", "./", "../", "~")) or text.lower().endswith(TABLE_SUFFIXES):
        return True
    if not Path(text).exists():
        return False
    return "/" in text or not is_tfds_name(text)


@functools.cache  # a bare name's answer, asked once a process
def is_tfds_name(name: str) -> bool:
    """Whether TFDS has a builder of this name (`name:1.2.3` too): its own, the template's, the fork's
    (`project.datasets`). Imports TFDS (not TensorFlow), asked only where a file or folder of that name is here."""
    return name.split(":")[0] in registered().list_builders(with_community_datasets=False)


@dataclass(frozen=True)
class Entry:
    """One file of the source: its path relative to the root, size and mtime (what `stat` says)."""

    path: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Survey:
    """What a path holds, from `stat` alone.

    reader: the reader of what it holds (READERS). splits: split name -> the entries of that split (images:
    (entry, class name); a table: its one file). classes: the sorted class folders (images)."""

    root: Path
    reader: Reader
    splits: dict[str, list[tuple[Entry, str | None]]]
    classes: tuple[str, ...] = ()
    entries: tuple[Entry, ...] = field(default=(), repr=False)  # every file under the root (the stat listing)

    @property
    def kind(self) -> str:
        """run.json's "data" kind: images, table or tfds."""
        return self.reader.kind

    def file(self, entry: Entry) -> Path:
        return self.root if self.root.is_file() else self.root / entry.path

    @cached_property
    def listing(self) -> str:
        """sha256 of every file's relative path, size and mtime: what decides whether to read the files again."""
        text = "".join(f"{entry.path}\0{entry.size}\0{entry.mtime_ns}\n" for entry in self.entries)
        return hashlib.sha256(text.encode()).hexdigest()


def _entries(root: Path) -> tuple[list[Entry], list[str]]:
    """Every file under `root` (a file: itself), sorted by relative path, the engine's own caches left out; and the
    empty folders."""
    if root.is_file():
        stat = root.stat()
        return [Entry(root.name, stat.st_size, stat.st_mtime_ns)], []
    found, empty = [], []
    for directory, folders, files in os.walk(root):
        folders[:] = [name for name in folders if name != "train-arrays-cache"]  # the engine's own cache
        relative = Path(directory).relative_to(root).as_posix()
        prefix = "" if relative == "." else relative + "/"
        if not folders and not files and prefix:
            empty.append(relative)
        for name in files:
            stat = os.stat(os.path.join(directory, name))
            found.append(Entry(prefix + name, stat.st_size, stat.st_mtime_ns))
    return sorted(found, key=lambda entry: entry.path), sorted(empty)


TFDS_NAME = re.compile(r"[a-z][a-z0-9_]*(/[A-Za-z0-9_.\-]+)?(:[0-9]+\.[0-9]+\.[0-9]+)?")  # name/config:1.2.3
Source = Survey | TfdsName  # DATASET's kind: a path's survey, or TFDS for a TFDS name


def source(name: str, text: str) -> Source:
    """DATASET's kind, decided once (load_settings makes Settings.source with it): a path's survey (`stat` alone,
    before TensorFlow loads), else TFDS for a TFDS name: `name`, `name/config`, `name:1.2.3`. Raises SettingsError."""
    if is_path(text):
        return survey(text)
    if not TFDS_NAME.fullmatch(text):
        raise SettingsError(
            f"{name}={text!r} is not allowed: use a TFDS dataset name, optionally with config and version, "
            "like mnist, or name/config:1.0.0, or a path (./photos, /data/table.csv)"
        )
    return TFDS


def survey(text: str) -> Survey:
    """The layout of the path DATASET names, told from its folders and file names. Raises SettingsError."""
    root = Path(text).expanduser()
    if not root.exists():
        raise SettingsError(
            f"DATASET={text!r} does not exist: name a folder of images, a CSV or JSON Lines file, "
            "a folder of <split>.csv or <split>.jsonl, or a prepared TFDS folder"
        )
    try:
        entries, empty = _entries(root)
    except OSError as error:
        raise SettingsError(f"DATASET={text!r} cannot be read ({error.strerror}: {error.filename})") from None
    if root.is_file():
        table = TABLES.get(root.suffix.lower())
        if table is None:
            raise SettingsError(
                f"DATASET={text!r} is a file that is neither .csv, .tsv nor .jsonl: name a CSV or JSON "
                "Lines file, or a folder of images"
            )
        return Survey(root, table, {"train": [(entries[0], None)]}, entries=tuple(entries))
    if (root / PREPARED.marker).is_file():
        return Survey(root, PREPARED, {}, entries=tuple(entries))
    if not entries:
        raise SettingsError(f"DATASET={text!r} is an empty folder: put images in class folders, or CSV files in it")
    top = [entry for entry in entries if "/" not in entry.path]
    tables = [entry for entry in top if Path(entry.path).suffix.lower() in TABLE_SUFFIXES]
    if tables:
        others = [entry.path for entry in entries if entry not in tables and not Path(entry.path).name.startswith(".")]
        if others:
            raise SettingsError(
                f"DATASET={text!r} mixes tables ({tables[0].path}) with other files ({others[0]}): "
                "keep only <split>.csv or <split>.jsonl files in it"
            )
        kinds = {TABLES[Path(entry.path).suffix.lower()] for entry in tables}  # .csv and .tsv: one kind, CSV
        if len(kinds) > 1:
            raise SettingsError(f"DATASET={text!r} mixes .csv and .jsonl files: keep one kind")
        wrong = [entry.path for entry in tables if not SPLIT_NAME.fullmatch(Path(entry.path).stem)]
        if wrong:
            raise SettingsError(
                f"DATASET={text!r}: {wrong[0]} does not name a split: use <split>.csv or "
                "<split>.jsonl, the split in letters, digits and _ (train.csv, test.csv)"
            )
        table = kinds.pop()
        return Survey(root, table, {Path(e.path).stem: [(e, None)] for e in tables}, entries=tuple(entries))
    return _image_layout(text, root, entries, empty)


def _image_layout(text: str, root: Path, entries: list[Entry], empty: list[str]) -> Survey:
    """<class>/<file> (one split, train) or <split>/<class>/<file>: told from the root's subfolders."""
    below: dict[str, list[Entry]] = {}
    for entry in entries:
        if "/" in entry.path:
            below.setdefault(entry.path.split("/")[0], []).append(entry)
    if not below:
        raise SettingsError(
            f"DATASET={text!r} holds no folders: put the images in one folder per class, like "
            f"{text}/cat/1.jpg (images without labels, for LABEL_KEY=none: in one folder, like "
            f"{text}/images/1.jpg)"
        )
    # a subfolder with files of its own holds images: a class; one with only folders holds classes: a split
    as_splits = all(all(entry.path.count("/") >= 2 for entry in files) for files in below.values())
    splits: dict[str, list[tuple[Entry, str | None]]] = {}
    class_sets: dict[str, set[str]] = {}
    for top_name, files in sorted(below.items()):
        split, depth = (top_name, 1) if as_splits else ("train", 0)
        for entry in files:
            name = entry.path.split("/")[depth]
            splits.setdefault(split, []).append((entry, name))
            class_sets.setdefault(split, set()).add(name)
    for relative in empty:
        if relative.count("/") == (1 if as_splits else 0):
            raise SettingsError(
                f"DATASET={text!r}: the class folder {relative} is empty: put its images in it or remove it"
            )
    classes = sorted(set().union(*class_sets.values()))
    for split, names in class_sets.items():
        if names != set(classes):
            missing = sorted(set(classes) - names)
            raise SettingsError(
                f"DATASET={text!r}: the splits' class folders differ: {split} has no "
                f"{', '.join(missing[:SHOWN])}; every split needs the same class folders"
            )
    for split in splits:
        if not SPLIT_NAME.fullmatch(split):
            raise SettingsError(
                f"DATASET={text!r}: the split folder {split!r} is not a split name: use letters, "
                "digits and _ (train, test, validation)"
            )
    return Survey(root, IMAGES, splits, tuple(classes), tuple(entries))
