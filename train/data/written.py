"""A path DATASET written once as a TFDS dataset into TFDS_DATA_DIR, then opened as any TFDS dataset is.

The files are read once (train.data.local): each image's bytes go into its record as they are (no decode, no
re-encode), and their sha256 make the fingerprint. Records are plain serialized tf.train.Examples in TFRecord
files, as TFDS writes them, beside TFDS's own dataset_info.json and features.json, so `builder_from_directory`
reads them. The writing goes to a temporary folder renamed into place (`<name>/1.0.0`, the name derived from the
fingerprint, LABEL_KEY, LABEL_KIND, DROP_COLUMNS and how a CSV was read), under a lock for the processes sharing
TFDS_DATA_DIR; a later start whose files have the same sizes and mtimes reuses it from an index, reading nothing.

Each image's structure is checked as it is read (local.damage): broken files are named and refused, or left out
(BAD_FILES), before anything trains. A folder whose images all share one size (local.image_size, from the headers)
is written with that fixed shape, as Keras's image_dataset_from_directory gives images of one size. A
SIGTERM or Ctrl-C that fit hears stops the writing at once, wherever it is (train.signals.dropping: a table's passes
over its rows never wait for a check), and the temporary folder is removed: nothing half-written, and the next
start writes again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

import train.data.local as local
from train import dataset_path
from train.data.data_settings import DataSettings
from train.errors import SettingsError
from train.progress import Counter
from train.signals import dropping, stop_heard, stopped

if TYPE_CHECKING:
    import tensorflow_datasets as tfds

VERSION = "1.0.0"
SHARD_BYTES = 64 << 20  # a TFRecord file's bytes, about: several files let workers stream disjoint shares
ORDER_SEED = 20_240_601  # the examples' written order: the same on every machine for the same files
LOCK = ".train-local.lock"  # in TFDS_DATA_DIR: one writer at a time
WRITING = ".train-writing-"  # in TFDS_DATA_DIR: a folder being written (a leftover, once the lock is free)
INDEX = ".train-sources"  # in TFDS_DATA_DIR: path + stat listing -> dataset written from them
SOURCE = "source.json"  # in the written dataset: its fingerprint and files, for a refusal to name what changed
# a reader's records written into the temporary folder: (features, each split's (shard lengths, bytes), supervised)
Made = tuple["tfds.features.FeaturesDict", dict[str, tuple[list[int], int]], tuple[str, str] | None]
Records = Callable[[Path, "local.Read"], Made]
NAMED = 10  # broken files named in a refusal, and left out files in summary.json's "left_out"
LOCK_POLL_SECONDS = 0.2  # how often a process waiting for the lock looks whether it was told to stop


class Identity(TypedDict, total=False):
    """The data's identity, run.json's "data": a path's (kind images, table or tfds folder; its written copy's name,
    the files' fingerprint and count) or a TFDS name's (kind tfds; name, config, version, each split's shard
    lengths; a tfds.ImageFolder's also "written", its copy's name, with the fingerprint). What workers compare and a
    restart must match (train.data.opening)."""

    kind: str
    name: str
    fingerprint: str
    files: int
    written: str
    config: str | None
    version: str
    shard_lengths: dict[str, list[int]]


class LeftOut(TypedDict, total=False):
    """summary.json's "left_out": how many files of the source are not in the data, and the first NAMED (empty:
    none, a TFDS name's)."""

    count: int
    files: list[str]


@dataclass(frozen=True)
class Written:
    """A path DATASET ready to open: where the TFDS dataset is, and the data's identity for run.json."""

    directory: Path
    identity: Identity
    notes: tuple[str, ...] = ()
    skipped: list[str] = field(default_factory=list)  # files left out, not images
    broken: list[tuple[str, str]] = field(default_factory=list)  # (path, what is wrong): left out, BAD_FILES=skip
    missing: dict[str, int] = field(default_factory=dict)  # a table's numeric column -> its empty cells
    dialects: dict[str, str] = field(default_factory=dict)  # a CSV file -> how it was read

    @property
    def left_out(self) -> LeftOut:
        """summary.json's "left_out": how many files of the source are not in the data (broken ones first, then
        those that are not images), and the first NAMED."""
        files = [path for path, _ in self.broken] + self.skipped
        return {"count": len(files), "files": files[:NAMED]}


@contextlib.contextmanager
def locked(root: Path, what: str) -> Iterator[None]:
    """The lock of TFDS_DATA_DIR (made if missing): one process writes at a time; leftovers of a killed write are
    removed once it is held. Raises SettingsError where the folder cannot be written."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        handle = (root / LOCK).open("a")
    except OSError as error:
        raise SettingsError(
            f"TFDS_DATA_DIR={root} cannot be written ({error.strerror}), and {what} must be written there once: "
            "make that folder writable, or set TFDS_DATA_DIR to a writable one"
        ) from None
    with handle:
        while True:  # not a blocking flock: a process waiting for another's writing still hears fit's SIGTERM
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                _stop_if_heard(f"while waiting for another process to write {what}")
                time.sleep(LOCK_POLL_SECONDS)
        try:
            for leftover in root.glob(f"{WRITING}*"):
                shutil.rmtree(leftover, ignore_errors=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _stop_if_heard(doing: str) -> None:
    """Raises Stopped where fit has heard SIGTERM or Ctrl-C."""
    heard = stop_heard()
    if heard:
        raise stopped(heard, doing)


def remove_incomplete(dataset_folder: Path) -> list[str]:
    """TFDS's `incomplete.*` folders a killed preparation left in a dataset's folder (call under `locked`)."""
    removed = []
    if dataset_folder.is_dir():
        for leftover in [*dataset_folder.glob("incomplete.*"), *dataset_folder.glob("*/incomplete.*")]:
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
                removed.append(str(leftover))
    return removed


def _index_path(root: Path, survey: dataset_path.Survey, *key: str | None) -> Path:
    text = json.dumps([str(survey.root.resolve()), *key])  # LABEL_KEY, LABEL_KIND, CSV_DELIMITER, DROP_COLUMNS
    return root / INDEX / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"


def _reused(root: Path, index: Path, survey: dataset_path.Survey) -> Written | None:
    """The dataset written from the same files (same paths, sizes, mtimes), if it is still there."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        recorded = json.loads(index.read_text(encoding="utf-8"))
        directory = root / recorded["name"] / VERSION
        if recorded["listing"] == survey.listing and (directory / "dataset_info.json").is_file():
            broken = [(path, why) for path, why in recorded.get("broken", [])]
            skipped = recorded["skipped"]
            missing, dialects = recorded.get("missing", {}), recorded.get("dialects", {})
            notes = (*_left_out(skipped, broken), *_missing(missing), *local.read_as(dialects))
            return Written(directory, recorded["identity"], notes, skipped, broken, missing, dialects)
    return None


def _name(survey: dataset_path.Survey, fingerprint: str, *key: str | None) -> str:
    stem = re.sub(r"[^a-z0-9]+", "_", survey.root.resolve().stem.lower()).strip("_") or "data"
    if not stem[0].isalpha():
        stem = "d_" + stem
    digest = hashlib.sha256(json.dumps([fingerprint, *key]).encode()).hexdigest()[:12]  # LABEL_KEY, LABEL_KIND, ...
    return f"{stem[:40]}_{digest}"


def prepare_path(settings: DataSettings, survey: dataset_path.Survey, say: Callable[[str], None]) -> Written:
    """The TFDS dataset of the path DATASET names, from its `survey` (Settings.source), as its reader's class says
    (train.dataset_path's READERS): a prepared folder read in place; images and tables written once into
    TFDS_DATA_DIR, reused while their files keep their sizes and mtimes. Raises SettingsError."""
    if isinstance(survey.reader, dataset_path.PreparedFolder):
        return _prepared_folder(settings, survey)
    if isinstance(survey.reader, dataset_path.TableReader):
        return _written(settings, survey, lambda temp, read: _write_table(settings, survey, temp, read, say))
    _check_classes(settings, survey)
    return _written(settings, survey, lambda temp, read: _write_images(settings, survey, temp, read, say))


def _written(settings: DataSettings, survey: dataset_path.Survey, records: Records) -> Written:
    """Reused where the index names a dataset written from the same files, else written now, under the lock."""
    label_key = settings.label_key or "label"
    root = dataset_path.data_dir(settings.tfds_data_dir)
    # CSV_DELIMITER and DROP_COLUMNS unset: the index's name it had before they were settings
    told = (settings.csv_delimiter,) if settings.csv_delimiter else ()
    index = _index_path(root, survey, label_key, settings.label_kind, *told, *sorted(settings.drop_columns))
    reused = _reused(root, index, survey)
    if reused is not None:
        _check_broken(settings, reused.broken)  # written with BAD_FILES=skip, started now with refuse
        return reused
    with locked(root, f"DATASET={settings.dataset!r}"):
        reused = _reused(root, index, survey)  # another process wrote it while this one waited
        if reused is not None:
            _check_broken(settings, reused.broken)
            return reused
        temporary = root / f"{WRITING}{os.getpid()}"
        try:
            written = _write(settings, survey, temporary, root, label_key, records)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
        record = {
            "name": written.directory.parent.name,
            "listing": survey.listing,
            "identity": written.identity,
            "skipped": written.skipped,
            "broken": written.broken,
            "missing": written.missing,
            "dialects": written.dialects,
            "source": str(survey.root.resolve()),
        }
        _write_index(index, record)
        return written


def _check_classes(settings: DataSettings, survey: dataset_path.Survey) -> None:
    """A folder of images with one class folder cannot train a classifier (it would learn the one answer, with loss
    0): refused before anything is written, unless LABEL_KEY=none (the images without labels). Raises
    SettingsError."""
    if len(survey.classes) >= 2 or not settings.labeled:
        return
    raise SettingsError(
        f"DATASET={settings.dataset!r} holds one class folder, {survey.classes[0]}: classification needs two "
        "classes at least: add a folder of another class's images beside it, or set LABEL_KEY=none to train on the "
        "images without labels"
    )


def _check_broken(settings: DataSettings, broken: list[tuple[str, str]]) -> None:
    """Broken image files (cut short, or named as images but not ones) with BAD_FILES=refuse: every one counted, the
    first NAMED named. Raises SettingsError."""
    if not broken or settings.bad_files == "skip":
        return
    named = "; ".join(f"{path} ({why})" for path, why in broken[:NAMED])
    more = f"; and {len(broken) - NAMED} more" if len(broken) > NAMED else ""
    raise SettingsError(
        f"DATASET={settings.dataset!r}: {len(broken)} broken image file(s): {named}{more}. Nothing was trained: "
        "replace or remove them, or set BAD_FILES=skip to leave them out"
    )


def _prepared_folder(settings: DataSettings, survey: dataset_path.Survey) -> Written:
    """A prepared TFDS folder, read in place: its identity covers dataset_info.json and the prepared files (hashed
    once for the same sizes and mtimes, then kept in TFDS_DATA_DIR's index where it is writable)."""
    index = _index_path(dataset_path.data_dir(settings.tfds_data_dir), survey, "", None)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        recorded = json.loads(index.read_text(encoding="utf-8"))
        if recorded["listing"] == survey.listing:
            return Written(survey.root, recorded["identity"])
    read = local.Read()
    try:
        name = json.loads((survey.root / "dataset_info.json").read_text(encoding="utf-8")).get("name", "")
        for entry in survey.entries:
            if entry.path == "dataset_info.json" or entry.path.startswith(f"{name}-"):  # TFDS's own file names
                data = survey.file(entry).read_bytes()
                read.files[entry.path] = (len(data), hashlib.sha256(data).hexdigest())
    except (OSError, ValueError) as error:
        raise SettingsError(
            f"DATASET={settings.dataset!r}: its dataset_info.json or prepared files cannot be read ({error})"
        ) from None
    identity = {"kind": "tfds folder", "fingerprint": read.fingerprint, "files": len(read.files), "name": name}
    with contextlib.suppress(OSError):  # a read-only TFDS_DATA_DIR: hashed again next time
        _write_index(index, {"listing": survey.listing, "identity": identity})
    return Written(survey.root, identity)


def _write_index(index: Path, record: dict[str, Any]) -> None:
    """Whole or not at all: a concurrent reader never sees half a record."""
    index.parent.mkdir(parents=True, exist_ok=True)
    temporary = index.with_name(f"{index.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(record), encoding="utf-8")
    os.replace(temporary, index)


def _write(
    settings: DataSettings, survey: dataset_path.Survey, temporary: Path, root: Path, label_key: str, records: Records
) -> Written:
    """Read every file once and write the records to `temporary`; then rename into `root/<name>/1.0.0`."""
    temporary.mkdir(parents=True)
    read = local.Read()
    with dropping(f"while DATASET was being written into {root}"):
        features, splits, supervised = records(temporary, read)
    fingerprint = read.fingerprint
    name = _name(survey, fingerprint, label_key, settings.label_kind, *read.read_as, *sorted(settings.drop_columns))
    identity = {"kind": survey.kind, "fingerprint": fingerprint, "files": len(read.files), "name": name}
    final = root / name / VERSION
    if not (final / "dataset_info.json").is_file():  # else: the same data, written before from another path
        _finish(temporary, name, features, splits, supervised)
        source = {"identity": identity, "files": read.files, "source": str(survey.root.resolve())}
        (temporary / SOURCE).write_text(json.dumps(source), encoding="utf-8")
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(final, ignore_errors=True)  # a folder without dataset_info.json: not a dataset
        os.rename(temporary, final)
    skipped = read.beside + sorted(read.skipped)  # beside the class folders, or in them but not an image
    broken = sorted(read.broken)
    notes = (*_left_out(skipped, broken), *_missing(read.missing), *local.read_as(read.dialects))
    return Written(final, identity, notes, skipped, broken, read.missing, read.dialects)


def _left_out(skipped: list[str], broken: list[tuple[str, str]]) -> tuple[str, ...]:
    """What the start says of the files left out: broken ones (BAD_FILES=skip), and those that are not images."""
    notes = []
    if broken:
        named = "; ".join(f"{path} ({why})" for path, why in broken[: dataset_path.SHOWN])
        notes.append(
            f"{len(broken)} broken image file(s) left out (BAD_FILES=skip): {named}"
            + ("; ..." if len(broken) > dataset_path.SHOWN else "")
        )
    if skipped:
        notes.append(
            f"{len(skipped)} file(s) left out, not a JPEG, PNG, GIF or BMP: {', '.join(skipped[: dataset_path.SHOWN])}"
        )
    return tuple(notes)


def _missing(missing: dict[str, int]) -> tuple[str, ...]:
    """The start line of a table with empty numeric cells: each column's count."""
    if not missing:
        return ()
    counts = ", ".join(f"{name} {count:,}" for name, count in missing.items())
    return (f"Empty numeric cells, stored as missing (NaN): {counts}.",)


def _order(count: int) -> np.ndarray:
    """The written order of a split's examples (sorted by path first): shuffled so that slices mix the classes."""
    return np.random.default_rng(ORDER_SEED).permutation(count)


def _write_records(
    temporary: Path, split: str, items: list, total_bytes: int, make: Callable[..., bytes | None], progress: Counter
) -> tuple[list[int], int]:
    """`make(item)` (a serialized example, or None to leave the item out) of each item, in order, into the split's
    TFRecord files of about SHARD_BYTES each, `progress` advanced by each; returns (examples per file, bytes
    written)."""
    import tensorflow as tf

    shards = max(1, min(len(items), math.ceil(total_bytes / SHARD_BYTES)))
    lengths, written = [0] * shards, 0
    for shard in range(shards):
        path = temporary / f"{split}.part-{shard:05d}-of-{shards:05d}"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for item in items[shard * len(items) // shards : (shard + 1) * len(items) // shards]:
                record = make(item)
                progress.advance()
                if record is not None:
                    writer.write(record)
                    lengths[shard] += 1
                    written += len(record)
    return lengths, written


def _write_images(
    settings: DataSettings, survey: dataset_path.Survey, temporary: Path, read: local.Read, say: Callable[[str], None]
) -> Made:
    import tensorflow as tf
    import tensorflow_datasets as tfds

    index = {name: number for number, name in enumerate(survey.classes)}
    read.beside.extend(entry.path for entry in survey.entries if "/" not in entry.path)  # not in a class folder
    splits, counts, sizes = {}, {}, set()
    progress = Counter(f"Writing {survey.root}", sum(map(len, survey.splits.values())), say)

    def make(item: tuple[dataset_path.Entry, str]) -> bytes | None:
        entry, label = item
        image = local.read_image(survey, entry, read)
        if image is None or (read.broken and settings.bad_files == "refuse"):  # refused once read: not written
            return None
        counts[label] = counts.get(label, 0) + 1
        sizes.add(local.image_size(*image))
        feature = {
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image[0]])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[index[label]])),
            "filename": tf.train.Feature(bytes_list=tf.train.BytesList(value=[entry.path.encode()])),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    finished = False
    try:
        for split, entries in survey.splits.items():
            ordered = [entries[i] for i in _order(len(entries))]
            size = sum(entry.size for entry, _ in entries)
            splits[split] = _write_records(temporary, split, ordered, size, make, progress)
        finished = not read.broken or settings.bad_files == "skip"  # else refused just below: no line of success
    finally:
        progress.close()
    if finished:  # else refused or stopped: what it says is the line
        images = sum(counts.values())  # every image read, once none is refused
        left = f", {progress.done - images:,} file(s) left out" if progress.done > images else ""
        seconds = time.monotonic() - progress.start
        say(f"Writing {survey.root}: {images:,} images in {seconds:.1f} s ({progress.rate()}){left}")
    _check_broken(settings, sorted(read.broken))  # every file read: every broken one counted
    for split, (lengths, _) in splits.items():
        if not sum(lengths):
            raise SettingsError(f"DATASET={survey.root}: the split {split} holds no JPEG, PNG, GIF or BMP images")
    empty = [name for name in survey.classes if not counts.get(name)]
    if empty:
        raise SettingsError(
            f"DATASET={survey.root}: the class folder {empty[0]} holds no JPEG, PNG, GIF or BMP "
            "image: put its images in it or remove it"
        )
    features = tfds.features.FeaturesDict(
        {
            "image": tfds.features.Image(shape=(*_one(sizes), 3)),
            "label": tfds.features.ClassLabel(names=list(survey.classes)),
            "filename": tfds.features.Text(),
        }
    )
    return features, splits, ("image", "label")


def _one(sizes: set) -> tuple[int | None, int | None]:
    """The images' (height, width) where all share one (a model takes them as they are), else (None, None)."""
    return next(iter(sizes)) if len(sizes) == 1 and None not in sizes else (None, None)


def _write_table(
    settings: DataSettings, survey: dataset_path.Survey, temporary: Path, read: local.Read, say: Callable[[str], None]
) -> Made:
    """The rows read and typed (local.read_table), then written as tf.train.Examples: each pass with its progress."""
    import tensorflow_datasets as tfds

    label_key = settings.label_key or "label"
    labeled = label_key if settings.labeled else None
    # a run's own kind (its run.json's) where LABEL_KIND is unset; the copy's name keeps the setting's (`_name`)
    kind = settings.label_kind or settings.run_label_kind
    with contextlib.closing(Counter(f"Reading {survey.root}", None, say, unit="rows")) as reading:
        told = {"delimiter": settings.csv_delimiter, "drop": settings.drop_columns, "advance": reading.advance}
        table = local.read_table(survey, labeled, kind, read, **told)
    local.check_label_values(settings, table, label_key)
    splits = {}
    with contextlib.closing(Counter(f"Writing {survey.root}", reading.done, say, unit="rows")) as progress:
        for split, rows in table.rows.items():
            ordered = [rows[i] for i in _order(len(rows))]
            size = sum(entry.size for entry, _ in survey.splits[split])
            splits[split] = _write_records(
                temporary, split, ordered, size, lambda row: table.example(row).SerializeToString(), progress
            )
    seconds = time.monotonic() - reading.start
    say(f"Writing {survey.root}: {reading.done:,} rows in {seconds:.1f} s ({reading.done / seconds:,.0f} rows/s)")
    features = {}
    for column in table.columns:
        if column.classes is not None:
            features[column.name] = tfds.features.ClassLabel(names=list(column.classes))
        elif column.num_classes is not None:
            features[column.name] = tfds.features.ClassLabel(num_classes=column.num_classes)
        elif column.dtype == "string":
            features[column.name] = tfds.features.Text()
        else:
            features[column.name] = tfds.features.Scalar(dtype=np.dtype(column.dtype))
    return tfds.features.FeaturesDict(features), splits, None


def _finish(
    temporary: Path,
    name: str,
    features: tfds.features.FeaturesDict,
    splits: dict[str, tuple[list[int], int]],
    supervised: tuple[str, str] | None,
) -> None:
    """The shard files renamed as TFDS names them, and dataset_info.json and features.json beside them."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core import dataset_info, naming
    from tensorflow_datasets.core import splits as splits_lib

    infos = []
    for split, (lengths, num_bytes) in splits.items():
        for index in range(len(lengths)):
            part = temporary / f"{split}.part-{index:05d}-of-{len(lengths):05d}"
            part.rename(temporary / f"{name}-{split}.tfrecord-{index:05d}-of-{len(lengths):05d}")
        template = naming.ShardedFileTemplate(
            data_dir=temporary, dataset_name=name, split=split, filetype_suffix="tfrecord"
        )
        infos.append(
            splits_lib.SplitInfo(name=split, shard_lengths=lengths, num_bytes=num_bytes, filename_template=template)
        )
    identity = dataset_info.DatasetIdentity(
        name=name, version=tfds.core.Version(VERSION), data_dir=str(temporary), module_name=""
    )
    info = dataset_info.DatasetInfo(builder=identity, features=features, supervised_keys=supervised)
    info.set_file_format(tfds.core.FileFormat.TFRECORD)
    info.set_splits(splits_lib.SplitDict(infos))
    info.write_to_directory(temporary)
