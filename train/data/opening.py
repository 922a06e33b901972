"""DATASET opened: a TFDS name (registered builders, the fork's `project.datasets`, prepared once) or a path
(written once, train.data.written), with the data's identity that run.json records and a restart must match.

Which of the two DATASET is was decided once, before TensorFlow loads: the settings' `source` (a path's survey, or
TFDS; train.dataset_path.source). Either way what `inspect` then reads is a TFDS builder, so everything after
(slices, in memory or streamed, workers, preprocess, resume) is the same.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import tensorflow as tf

import train.data.written as written
from train.data.data_settings import DataSettings
from train.data.examples import Example, Inputs
from train.data.written import Identity, LeftOut
from train.dataset_path import SHOWN, Survey, TableReader, data_dir, survey
from train.datasets import registered
from train.errors import SettingsError, first_line
from train.model_file import TABLE_MODEL, TABULAR_TEXT_EXAMPLE

if TYPE_CHECKING:
    import tensorflow_datasets as tfds

Json = dict[str, object]  # run.json's, read back
ONE_SPLIT = ("train[:90%]", "train[90%:]")  # TRAIN_SPLIT and EVAL_SPLIT of a dataset with one split, train


@dataclass(frozen=True)
class Opened:
    """DATASET's builder, the data's identity (run.json's "data"), the settings with a one-split dataset's slices,
    and what to say about it."""

    builder: tfds.core.DatasetBuilder
    identity: Identity
    settings: DataSettings
    notes: tuple[str, ...] = ()
    left_out: LeftOut = field(default_factory=dict)  # a folder's files not in the data (written.Written)

    def columns(self, settings: DataSettings) -> Callable | None:
        """A table's (CSV, JSON Lines) `preprocess` where MODEL has none and FEATURE_KEY is unset: every column but
        the label, as a dict by name. None for other data. Raises SettingsError for a text column."""
        if self.identity.get("kind") != TableReader.kind or settings.feature_key:  # any table reader's rows
            return None
        import tensorflow_datasets as tfds

        label_key = (settings.label_key or "label") if settings.labeled else None
        features = self.builder.info.features
        names = sorted(name for name in features if name != label_key)  # not the files' order: it varies
        text = [repr(name) for name in sorted(names) if isinstance(features[name], tfds.features.Text)]
        if text:
            which = f"the column {text[0]} holds" if len(text) == 1 else f"the columns {', '.join(text)} hold"
            raise SettingsError(
                f"DATASET={settings.dataset!r}: {which} text, which MODEL={settings.model!r} cannot take as it is "
                f"(it has no preprocess): define preprocess in your MODEL file to make numbers of it (see "
                f"{TABULAR_TEXT_EXAMPLE}), train the default model of a table (MODEL unset, or {TABLE_MODEL}), or "
                "drop the column"
            )

        def columns(
            example: Example, training: bool, seed: tf.Tensor
        ) -> Inputs | tuple[Inputs, tf.Tensor]:  # the engine's own preprocess: the columns as stored
            inputs = {name: example[name] for name in names}
            return (inputs, example[label_key]) if label_key else inputs  # LABEL_KEY=none: the inputs alone

        return columns


def open_source(settings: DataSettings, say: Callable[[str], None]) -> Opened:
    """DATASET's builder, prepared or written once. Raises SettingsError."""
    import tensorflow_datasets as tfds

    notes: tuple[str, ...] = ()
    left_out: LeftOut = {}
    path = settings.source if isinstance(settings.source, Survey) else None
    named = open_builder(settings.dataset, settings.tfds_data_dir) if path is None else None
    if named is None or named.info.file_format is None:  # a path, or a tfds.ImageFolder: its folder written once
        folder = settings if named is None else settings.replace(dataset=image_folder_root(named, settings.dataset))
        source = written.prepare_path(folder, path or survey(folder.dataset), say)  # the ImageFolder's: surveyed now
        builder = tfds.builder_from_directory(str(source.directory))
        identity, notes, left_out = source.identity, source.notes, source.left_out
        if named is not None:  # the builder's name, and the written copy's fingerprint: its folder changed is refused
            identity = {**identity, "kind": "tfds", "name": named.name, "written": identity["name"]}
    else:
        builder = named
        prepare(builder, settings.dataset)
        if not builder.info.splits:  # prepared by another process sharing TFDS_DATA_DIR while this one waited
            builder = open_builder(settings.dataset, settings.tfds_data_dir)
        identity = tfds_identity(builder)
    settings, split_note = one_split(settings, builder)
    return Opened(builder, identity, settings, (*notes, *split_note), left_out)


def image_folder_root(builder: tfds.core.DatasetBuilder, dataset: str) -> str:
    """The folder a tfds.ImageFolder (a fork's subclass, say) reads its images from: TFDS keeps its root_dir as the
    builder's data_dir (ImageFolder.__init__ sets `_data_dir = root_dir`; TFDS 4.9). Another builder that TFDS reads
    without prepared files (a TranslateFolder, say) is refused. Raises SettingsError."""
    import tensorflow_datasets as tfds

    if not isinstance(builder, tfds.ImageFolder):
        raise SettingsError(
            f"DATASET={dataset!r} is a {type(builder).__name__}, which TFDS reads without prepared files: "
            "only a tfds.ImageFolder's folder is written for training; prepare it as TFDS files, or name its "
            "folder, DATASET=<folder>"
        )
    return str(builder.data_dir)


def tfds_identity(builder: tfds.core.DatasetBuilder) -> Identity:
    """A TFDS name's identity: name, config, version and each split's prepared shard lengths."""
    config = getattr(builder, "builder_config", None)
    shards = {name: [int(n) for n in split.shard_lengths] for name, split in builder.info.splits.items()}
    return {
        "kind": "tfds",
        "name": builder.name,
        "config": config.name if config else None,
        "version": str(builder.version),
        "shard_lengths": shards,
    }


def data_identity_text(identity: Identity) -> str:
    """What workers compare: a path's fingerprint, or a TFDS dataset's name, config, version and shard lengths."""
    if "fingerprint" in identity:
        return f"{identity['kind']} sha256 {identity['fingerprint'][:16]}, {identity['files']} files"
    return json.dumps({key: identity[key] for key in sorted(identity) if key != "kind"}, separators=(",", ":"))


def one_split(settings: DataSettings, builder: tfds.core.DatasetBuilder) -> tuple[DataSettings, tuple[str, ...]]:
    """A dataset with one split, train, and TRAIN_SPLIT/EVAL_SPLIT at their defaults: 90% to train on, 10% to
    evaluate on."""
    if list(builder.info.splits.keys()) != ["train"] or (settings.train_split, settings.eval_split) != (
        "train",
        "test",
    ):
        return settings, ()
    note = (
        f"DATASET={settings.dataset} has one split, train: training on {ONE_SPLIT[0]}, evaluating on "
        f"{ONE_SPLIT[1]} (TRAIN_SPLIT and EVAL_SPLIT choose others)"
    )
    return settings.replace(train_split=ONE_SPLIT[0], eval_split=ONE_SPLIT[1]), (note,)


def with_run_label_kind(settings: DataSettings, recorded: Json) -> DataSettings:
    """`settings` reading a table's label as the run's run.json ("features": class names, or none for a value)
    records it, so that a later start reads the kind it trained with whatever the guess says now (LABEL_KIND, where
    set, decides). `recorded`: run.json ({} for a new run)."""
    features = recorded.get("features")
    if not isinstance(features, dict) or "classes" not in features:
        return settings
    return settings.replace(run_label_kind="value" if features["classes"] is None else "class")


def check_same_data(
    settings: DataSettings, recorded: Identity | None, identity: Identity, doing: str = "trained", trained: bool = True
) -> str | None:
    """A run directory trained on other data (another DATASET, or its files changed) is refused in one line: nothing
    is `doing` (trained, evaluated, predicted) on it. `recorded`: run.json's "data" (None for a new run). A fit of a
    run that trained no step yet (`trained` False: stopped by a file that did not decode, say) takes the data as it
    is now: what to say about that, else None. Raises SettingsError."""
    if not recorded or recorded == identity:
        return None
    where = f"OUTPUT_DIR={settings.output_dir}"
    if not trained and doing == "trained":
        return (
            f"DATASET={settings.dataset!r} is not the data {where} was first started on, but no step was trained "
            "on that: this run trains on the data as it is now"
        )
    if _source(recorded) is not None and _source(recorded) == _source(identity):  # the same folder or file, changed
        changes = _changes(settings.tfds_data_dir, recorded, identity)
        raise SettingsError(
            f"DATASET={settings.dataset!r} has changed since {where} was trained on it: {changes}; nothing was {doing} "
            f"on the changed data: {'train in a new OUTPUT_DIR' if doing == 'trained' else 'train a new run on it'}, "
            "or put the files back"
        )
    keys = ("name", "config", "version", "shard_lengths", "files")
    differs = [
        f"{key} {_short(recorded.get(key))} now {_short(identity.get(key))}"
        for key in keys
        if recorded.get(key) != identity.get(key)
    ]
    what = "; ".join(differs[:2]) or "its fingerprint differs"
    if differs and differs[0].startswith("shard_lengths"):
        what += ": it was prepared anew"
    raise SettingsError(
        f"DATASET={settings.dataset!r} is not the data {where} was trained on ({what}): use another OUTPUT_DIR for it, "
        "or set DATASET back"
    )


def _source(identity: Identity) -> tuple[str, str] | None:
    """Where written data came from, whatever its files hold now: a path's kind and stem (its name is stem_hash), a
    tfds.ImageFolder's name; None for a prepared TFDS dataset (another version or preparation is other data)."""
    if identity.get("kind") != "tfds":
        return identity.get("kind", ""), identity.get("name", "").rsplit("_", 1)[0]
    return ("tfds", identity.get("name", "")) if "fingerprint" in identity else None


def _short(value: object) -> str:
    """A value of the identity as a refusal shows it: shard lengths as each split's files and examples."""
    if isinstance(value, dict):
        shown = (f"{split}: {len(lengths)} files, {sum(lengths)} examples" for split, lengths in value.items())
        return "{" + ", ".join(shown) + "}"
    return repr(value)


def _changes(tfds_data_dir: Path | None, recorded: Identity, identity: Identity) -> str:
    """How many files were added, removed or modified, and the first few, from both datasets' source.json."""
    root = data_dir(tfds_data_dir)
    fallback = f"its fingerprint differs ({recorded.get('files')} files then, {identity.get('files')} now)"
    if identity.get("kind") == "tfds folder":  # read in place: no list of its files was kept
        return fallback
    try:  # a tfds.ImageFolder's copy is named by "written"; a path's by "name"
        before, now = (_listed(root / each.get("written", each["name"])) for each in (recorded, identity))
    except (OSError, ValueError, KeyError, TypeError):
        return fallback
    changes = [f"added {p}" for p in sorted(set(now) - set(before))]
    changes += [f"removed {p}" for p in sorted(set(before) - set(now))]
    changes += [f"modified {p}" for p in sorted(set(now) & set(before)) if now[p] != before[p]]
    if not changes:  # the files are the same: a setting that defines the copy made it another dataset
        settings = "LABEL_KEY, LABEL_KIND, CSV_DELIMITER or DROP_COLUMNS"
        return f"it was written anew as {identity.get('name')} ({settings} changed)"
    shown = ", ".join(changes[:SHOWN]) + (", ..." if len(changes) > SHOWN else "")
    return f"{len(changes)} file(s) changed ({shown})"


def _listed(folder: Path) -> dict[str, tuple[int, str]]:
    """A written dataset's source files, each with its (size, sha256), from its source.json."""
    listed = json.loads((folder / written.VERSION / written.SOURCE).read_text(encoding="utf-8"))["files"]
    return {path: tuple(value) for path, value in listed.items()}


def open_builder(dataset: str, tfds_data_dir: Path | None) -> tfds.core.DatasetBuilder:
    """The TFDS builder of DATASET: the template's own datasets and the fork's (`project.datasets`) registered."""
    tfds = registered()
    tfds.display_progress_bar(sys.stderr.isatty())  # a log that is not a terminal gets no bars' escape codes ("[A")
    # Never TFDS's reading of an empty TFDS_DATA_DIR (the working directory): TFDS's default (dataset_path.data_dir)
    try:
        return tfds.builder(dataset, data_dir=str(data_dir(tfds_data_dir)))
    except tfds.core.registered.DatasetNotFoundError:
        name = dataset.split("/")[0].split(":")[0]
        close = difflib.get_close_matches(name, tfds.list_builders(), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "see tfds.list_builders() for the known names"
        raise SettingsError(f"DATASET={dataset!r} is not a TFDS dataset: {hint}") from None
    except Exception as error:  # unknown config or version: TFDS raises several types
        raise SettingsError(f"DATASET={dataset!r} cannot be opened: {first_line(error)}") from None


def _directories(root: Path, depth: int) -> set[Path]:
    """Folders at most `depth` levels below `root` (root included, if it exists)."""
    found = set()
    for directory, subdirectories, _ in os.walk(root):
        found.add(Path(directory))
        if len(Path(directory).relative_to(root).parts) >= depth:
            subdirectories.clear()  # the downloads' extracted archives can be large trees: not walked
    return found


CONNECT_SECONDS = 3.0  # how long the reachability check waits for a download host (TFDS's retries take minutes)


def _hosts(urls: object) -> set[tuple[str, int]]:
    """(host, port) of every URL in what a builder hands TFDS's download manager (a URL, a Resource, or a tree)."""
    import urllib.parse
    import urllib.request

    found: set[tuple[str, int]] = set()
    if isinstance(urls, dict):
        urls = list(urls.values())
    if isinstance(urls, list | tuple):
        for url in urls:
            found |= _hosts(url)
        return found
    url = urllib.parse.urlparse(str(getattr(urls, "url", urls)))
    if url.scheme not in ("http", "https") or not url.hostname:
        return found
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(url.hostname):  # the connection that matters is the proxy's
        url = urllib.parse.urlparse(proxy if "://" in proxy else f"http://{proxy}")
    found.add((url.hostname or "", url.port or (443 if url.scheme == "https" else 80)))
    return found


@contextlib.contextmanager
def _downloads_checked_first() -> Iterator[None]:
    """While TFDS prepares: before its download manager starts (and retries for minutes, printing urllib3
    warnings), a plain connect to every host it is about to download from, failing in seconds."""
    import socket

    import tensorflow_datasets as tfds

    manager = tfds.download.DownloadManager
    originals = {name: getattr(manager, name) for name in ("download", "download_and_extract")}

    def checked(original: Callable[..., object]) -> Callable[..., object]:  # TFDS's download methods
        def method(self: tfds.download.DownloadManager, url_or_urls: object, *args: object, **kwargs: object) -> object:
            for host, port in sorted(_hosts(url_or_urls)):
                try:
                    socket.create_connection((host, port), timeout=CONNECT_SECONDS).close()
                except OSError as error:
                    reason = error.strerror or type(error).__name__
                    raise ConnectionError(f"the download host {host}:{port} cannot be reached ({reason})") from None
            return original(self, url_or_urls, *args, **kwargs)

        return method

    for name, original in originals.items():
        setattr(manager, name, checked(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(manager, name, original)


def prepare(builder: tfds.core.DatasetBuilder, dataset: str) -> None:
    """Make sure the data is on disk: generated locally, or downloaded once if it must be.

    Under TFDS_DATA_DIR's lock (written.locked), where a killed preparation's `incomplete.*` folders are removed
    first. A failed preparation leaves no dataset behind: TFDS prepares into a temporary directory and keeps what
    it downloaded (a retry goes on from there), and the empty folders it made for it are removed here.
    """
    if tf.io.gfile.exists(builder.data_dir):  # prepared: what download_and_prepare would only say, too
        return
    root = Path(str(builder.data_dir_root))  # str: TFDS's own path type, which may name a bucket
    if "://" in str(builder.data_dir_root):
        return _prepare(builder, dataset, root)
    with written.locked(root, f"DATASET={dataset!r} (made here, offline or downloaded)"):
        if tf.io.gfile.exists(builder.data_dir):  # another process prepared it while this one waited
            return
        written.remove_incomplete(root / Path(str(builder.data_dir)).relative_to(root).parts[0])
        _prepare(builder, dataset, root)


def _prepare(builder: tfds.core.DatasetBuilder, dataset: str, root: Path) -> None:
    # The dataset's own folder and the downloads, where TFDS makes folders (dataset/version/.tmp,
    # downloads/dataset/file.tmp.ID) before it knows that the download fails.
    roots = (root / Path(str(builder.data_dir)).relative_to(root).parts[0], root / "downloads")

    def folders() -> set[Path]:
        return _directories(roots[0], depth=4) | _directories(roots[1], depth=2)

    before = folders()
    try:
        with _downloads_checked_first():
            builder.download_and_prepare()
    except Exception as error:
        made = folders() - before
        for directory in sorted(made, key=lambda path: len(path.parts), reverse=True):  # the deepest first
            with contextlib.suppress(OSError):  # not empty: a file in it is kept
                directory.rmdir()
        raise SettingsError(
            f"DATASET={dataset!r} is not prepared in {root} and could not be made "
            f"({type(error).__name__}: {first_line(error, 200)}): on a machine with network run "
            f"scripts/prepare-dataset.sh {dataset} DIR, then set TFDS_DATA_DIR=DIR"
        ) from None
