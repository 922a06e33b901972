"""The prepared datasets in TFDS_DATA_DIR, and the runs that use them: `python -m train data list|prune`.

Every change to a folder or table writes another full copy (train.data.written names a copy by its data), and the
old ones stay until removed. `prepared` finds each copy (`<name>[/<config>]/<version>/dataset_info.json`), its
source, size and date; `runs_using` reads the run.json of every run directory under a root, which records the
data it trained on (train.data.opening's identity). `prune` removes the copies written from a path that no run
under the root records, under TFDS_DATA_DIR's lock. Datasets TFDS prepared from a name are listed, never removed:
making one again may need a download. TFDS_DATA_DIR is the caller's (train.settings.layers.data_dir). No TensorFlow
here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import train.data.written as written
from train import dataset_path
from train.data.written import Identity
from train.errors import TrainingError
from train.run_files import RUN_SETTINGS

RUN = "run.json"  # in a run directory: what it trained on ("data")
TRASH = ".train-removed"  # in TFDS_DATA_DIR: the copies `prune` took out of use, until they are removed whole
Json = dict[str, object]  # a JSON document's object: run.json, a source's record, `data list --json`'s entries


@dataclass
class Prepared:
    """One prepared dataset: its folder's place under TFDS_DATA_DIR (`name[/config]/version`), where it came from,
    its size and date, and the run directories whose run.json records it."""

    key: str
    directory: Path
    source: str
    written: bool  # from a path DATASET (train.data.written): `prune` may remove it
    size: int
    date: float
    runs: list[Path] = field(default_factory=list)

    def to_json(self) -> Json:
        return {
            "name": self.key,
            "directory": str(self.directory),
            "source": self.source,
            "written": self.written,
            "bytes": self.size,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.date)),
            "runs": [str(run) for run in self.runs],
        }


def prepared(root: Path) -> list[Prepared]:
    """Every dataset prepared in `root` (TFDS_DATA_DIR), by name; none where it does not exist."""
    sources = _index_sources(root)
    found = []
    for info in sorted(_dataset_infos(root)):
        directory = info.parent
        key = directory.relative_to(root).as_posix()
        recorded = _read_json(directory / written.SOURCE)
        is_written = recorded is not None
        if is_written:
            identity = recorded.get("identity") or {}
            where = recorded.get("source") or sources.get(directory.parent.name) or "a path (not recorded)"
            source = f"{where} ({identity.get('kind', '?')}, {identity.get('files', '?')} files)"
        else:
            source = "TFDS name " + key.rsplit("/", 1)[0] + ":" + key.rsplit("/", 1)[1]
        size = sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())
        found.append(Prepared(key, directory, source, is_written, size, info.stat().st_mtime))
    return found


def _dataset_infos(root: Path) -> list[Path]:
    """dataset_info.json two or three levels down (name/version, name/config/version); not in the engine's own
    folders (.train-*), TFDS's downloads, or a preparation under way (incomplete.*)."""
    found = []
    if not root.is_dir():
        return found
    for directory, folders, files in os.walk(root):
        depth = len(Path(directory).relative_to(root).parts)
        folders[:] = [name for name in folders if not name.startswith((".", "incomplete.")) and name != "downloads"]
        if "dataset_info.json" in files and depth in (2, 3):
            found.append(Path(directory) / "dataset_info.json")
            folders.clear()
        if depth >= 3:
            folders.clear()
    return found


def _index_sources(root: Path) -> dict[str, str]:
    """A written dataset's name -> the path it was written from, as TFDS_DATA_DIR's index recorded it."""
    sources = {}
    for index in sorted((root / written.INDEX).glob("*.json")) if (root / written.INDEX).is_dir() else []:
        record = _read_json(index) or {}
        if record.get("name") and record.get("source"):
            sources[record["name"]] = record["source"]
    return sources


def _read_json(path: Path) -> Json | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def run_directories(runs: Path) -> list[Path]:
    """Every run directory under `runs` (it, or a folder below it, holding run.json and settings.json: not a copy of
    run.json alone, as MLflow keeps among a tracked run's artifacts); not looked into further."""
    found = []
    for directory, folders, files in os.walk(runs):
        if RUN in files and RUN_SETTINGS in files:
            found.append(Path(directory))
            folders.clear()  # checkpoints, logs, the export: no run inside a run
    return sorted(found)


def runs_using(runs: Path, warn: Callable[[str], None]) -> dict[str, list[Path]]:
    """The prepared dataset (its key, as `prepared` names it) that each run under `runs` records, and the runs."""
    using: dict[str, list[Path]] = {}
    for run in run_directories(runs):
        data = (_read_json(run / RUN) or {}).get("data")
        if not isinstance(data, dict):
            warn(f"{run / RUN} cannot be read or records no data: the datasets it may use are not known")
            continue
        key = _key(data)
        if key:
            using.setdefault(key, []).append(run)
    return using


def _key(identity: Identity) -> str | None:
    """Where the data a run recorded is under TFDS_DATA_DIR: a written copy's `name/1.0.0`, a TFDS name's
    `name[/config]/version`; None for a prepared folder read in place (it is not in TFDS_DATA_DIR)."""
    if identity.get("kind") in dataset_path.WRITTEN and identity.get("name"):
        return f"{identity['name']}/{written.VERSION}"
    if identity.get("written"):  # a tfds.ImageFolder's folder, written once as a folder path is
        return f"{identity['written']}/{written.VERSION}"
    if identity.get("kind") == "tfds" and identity.get("name") and identity.get("version"):
        config = f"/{identity['config']}" if identity.get("config") else ""
        return f"{identity['name']}{config}/{identity['version']}"
    return None


def listed(root: Path, runs: Path, warn: Callable[[str], None]) -> list[Prepared]:
    """`prepared(root)`, each with the runs under `runs` that record it."""
    using = runs_using(runs, warn)
    found = prepared(root)
    for each in found:
        each.runs = using.get(each.key, [])
    return found


def prune(root: Path, runs: Path, warn: Callable[[str], None], dry_run: bool = False) -> list[Prepared]:
    """Remove every copy written from a path that no run under `runs` records (under TFDS_DATA_DIR's lock, with
    the index's records of it); returns what was (or, `dry_run`, would be) removed. Raises TrainingError where a
    copy, out of use already, cannot be removed whole (`_empty`)."""
    if not root.is_dir():
        return []
    with written.locked(root, "the pruning"):
        unused = [each for each in listed(root, runs, warn) if each.written and not each.runs]
        if dry_run:
            return unused
        trash, names = root / TRASH, set()
        try:
            for each in unused:  # out of TFDS's sight in one rename: never half a copy in TFDS_DATA_DIR
                trash.mkdir(exist_ok=True)
                os.rename(each.directory, trash / f"{each.directory.parent.name}-{time.time_ns()}")
                names.add(each.directory.parent.name)
                if not any(each.directory.parent.iterdir()):  # name/1.0.0 was its only version
                    each.directory.parent.rmdir()
        except OSError as error:
            raise TrainingError(
                f"TFDS_DATA_DIR's copy {each.directory} cannot be removed ({error.strerror}): fix "
                "that and run `data prune` again"
            ) from None
        finally:  # the index forgets what was taken out, whatever stopped the rest
            for index in (root / written.INDEX).glob("*.json") if (root / written.INDEX).is_dir() else []:
                if (_read_json(index) or {}).get("name") in names:
                    index.unlink()
        _empty(trash)
    return unused


def _empty(trash: Path) -> None:
    """The copies taken out of use (this prune's, and what an earlier one could not remove), removed: as much as can
    be. Raises TrainingError naming the first file that could not be."""
    failed: list[tuple[str, BaseException]] = []

    def note(function: object, path: str, error: BaseException | tuple) -> None:  # onexc's, or onerror's exc_info
        failed.append((path, error if isinstance(error, BaseException) else error[1]))

    if trash.is_dir():
        shutil.rmtree(trash, **({"onexc": note} if sys.version_info >= (3, 12) else {"onerror": note}))
    if failed:
        path, error = failed[0]
        why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise TrainingError(
            f"the copies no run uses are out of use, but {path} could not be removed ({why}): fix that and run "
            f"`data prune` again to free {trash}"
        )


def human(size: int) -> str:
    """A size in KB, MB or GB (powers of 1000, as `du --si` and file managers say them)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size / 1e3:,.1f} KB"


def format_list(root: Path, runs: Path, found: list[Prepared]) -> str:
    """One line per prepared dataset: its name, size, date, source and the runs under `runs` that use it."""
    total = sum(each.size for each in found)
    lines = [f"TFDS_DATA_DIR={root}: {len(found)} prepared dataset(s), {human(total)}; runs under {runs}"]
    for each in found:
        date = time.strftime("%Y-%m-%d %H:%M", time.localtime(each.date))
        used = ", ".join(str(run) for run in each.runs) if each.runs else "no run"
        lines.append(f"  {each.key}  {human(each.size)}  {date}  from {each.source}; used by {used}")
    return "\n".join(lines)


def format_pruned(root: Path, runs: Path, removed: list[Prepared], dry_run: bool) -> str:
    """What prune removed (or would) and the space it freed."""
    verb = "Would remove" if dry_run else "Removed"
    lines = [f"  {verb} {each.key} ({human(each.size)}, from {each.source})" for each in removed]
    freed = human(sum(each.size for each in removed))
    if not removed:
        return (
            f"TFDS_DATA_DIR={root}: every copy written from a folder or table is used by a run under {runs}: "
            "nothing freed"
        )
    head = (
        f"TFDS_DATA_DIR={root}: {len(removed)} copy(ies) that no run under {runs} uses; "
        f"{'would free' if dry_run else 'freed'} {freed}"
    )
    return "\n".join([head, *lines])
