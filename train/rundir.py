"""The run directory: proven writable before any device work, and the checkpoints found in it.

No TensorFlow here: a wrong UID on a mounted volume or a full disk is caught in the first second.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import re
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from train.errors import BusyError, SettingsError, TrainingError, first_line
from train.model_file import model_fingerprint
from train.run_files import RUN_SETTINGS

if TYPE_CHECKING:
    import tensorflow as tf

PROBE_BYTES = 1 << 20  # a write of this size must succeed: a nearly full disk fails here, not at step 10,000
MIN_FREE_BYTES = 64 << 20  # room for a few checkpoints of a small model, the export and the logs


def write_json(path: Path, payload: object) -> None:
    """JSON for scripts and later runs. A regular file is replaced whole or not at all (through a temporary
    file beside it, where a symlink points); a pipe or /dev/stdout is written to as it is. Raises OSError."""
    text = json.dumps(payload, indent=2) + "\n"
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        target.write_text(text)
        return
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def check_output_dir(path: Path) -> None:
    """Write and remove a probe file where the run will write. Raises SettingsError naming path and UID."""
    existing = path
    while not existing.exists():
        if existing.is_symlink():  # mkdir would fail on it with "File exists"
            where = f"OUTPUT_DIR={path}" + ("" if existing == path else f": {existing}")
            raise SettingsError(
                f"{where} is a symlink to {os.readlink(existing)}, which does not exist: create that folder, remove "
                "the link, or use another OUTPUT_DIR"
            )
        existing = existing.parent
    if not existing.is_dir():
        raise SettingsError(f"OUTPUT_DIR={path} cannot be created: {existing} is a file")
    probe = existing / f".write-probe-{os.getpid()}"
    created = False
    try:
        with open(probe, "wb") as stream:
            created = True
            stream.write(b"\0" * PROBE_BYTES)
            stream.flush()
            os.fsync(stream.fileno())
        stats = os.statvfs(existing)
        free = stats.f_bavail * stats.f_frsize
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise SettingsError(f"OUTPUT_DIR={path} is on a full filesystem: free space at {existing}") from None
        if error.errno == errno.EDQUOT:
            raise SettingsError(f"OUTPUT_DIR={path} is over its disk quota: free space at {existing}") from None
        if error.errno in (errno.EACCES, errno.EPERM):
            fix = "fix the owner or permissions (docker: build the image with this UID), or use another OUTPUT_DIR"
        else:  # a read-only or special filesystem (/proc): no owner to fix
            fix = "use another OUTPUT_DIR"
        raise SettingsError(
            f"OUTPUT_DIR={path} is not writable by UID {os.getuid()} ({error.strerror} at {existing}): {fix}"
        ) from None
    finally:
        if created:
            probe.unlink(missing_ok=True)
    if free < MIN_FREE_BYTES:
        raise SettingsError(
            f"OUTPUT_DIR={path} has {free >> 20} MiB free at {existing}; "
            f"a run needs at least {MIN_FREE_BYTES >> 20} MiB"
        )


LOCK = ".lock"  # in OUTPUT_DIR: held (flock) by the process that trains there; it says who that is
RUN = "run.json"  # in OUTPUT_DIR: what the run's first start resolved (model hash, XLA, data in memory, precision)
EPOCHS = "epochs.json"  # in OUTPUT_DIR: each epoch's logs, as the callbacks got them (train.callbacks replays them)
CRASH_LOG = "crash.log"  # in OUTPUT_DIR: what a bug left (a traceback; the workers' hashes where they differed)


class RunLock:
    """One writer per run directory: an exclusive flock on OUTPUT_DIR/.lock, held until the process ends.

    The kernel drops the lock when its holder dies (SIGKILL, a lost pod's process), so a stale lock never
    blocks; the file only says who holds it. Local filesystems honour it across processes; NFSv4 too (a dead
    node's lock lasts until its lease ends, ~90 s); FUSE mounts such as gcsfuse lock per host only.
    """

    def __init__(self, output_dir: Path) -> None:
        self.output_dir, self.path = output_dir, output_dir / LOCK
        self._stream: TextIO | None = None

    def acquire(self) -> None:
        """Take the lock, creating OUTPUT_DIR if needed, or raise BusyError naming the holder (writes nothing).
        Raises SettingsError naming the file and its owner where this UID cannot open it."""
        try:
            self.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise SettingsError(f"OUTPUT_DIR={self.output_dir} cannot be created ({error.strerror})") from None
        try:
            stream = open(self.path, "a+")  # noqa: SIM115 (held open for the process's life: the lock is its descriptor)
        except OSError as error:
            raise lock_error(self.path, error) from None
        try:
            fcntl.flock(stream, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            stream.close()
            if error.errno in (errno.EAGAIN, errno.EACCES):
                raise busy(self.output_dir) from None
            raise SettingsError(f"OUTPUT_DIR={self.output_dir} cannot be locked ({error.strerror})") from None
        stream.seek(0)
        stream.truncate()
        stream.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}) + "\n")
        stream.flush()
        self._stream = stream

    def release(self) -> None:
        if self._stream is not None:
            self._stream.close()  # closing the descriptor releases the lock
            self._stream = None


def owner(path: Path) -> str:
    """Who owns a file: "UID 1000 (alice)", or "" where it cannot be known."""
    try:
        uid = path.lstat().st_uid
        return f"UID {uid} ({pwd.getpwuid(uid).pw_name})"
    except OSError:
        return ""
    except KeyError:  # a UID this machine has no name for (a volume from another host or container)
        return f"UID {uid}"


def owned_by(path: Path) -> str:
    """The phrase ", owned by UID 1000 (alice)" for a message; "" where the owner cannot be known."""
    return f", owned by {who}" if (who := owner(path)) else ""


def lock_error(path: Path, error: OSError) -> SettingsError:
    """The lock file cannot be opened for writing: typically a run directory of another user."""
    return SettingsError(
        f"OUTPUT_DIR={path.parent} cannot be locked: {path} cannot be opened for writing by UID {os.getuid()} "
        f"({error.strerror}{owned_by(path)}): use another OUTPUT_DIR, or fix its owner or permissions"
    )


def holder(output_dir: Path) -> str | None:
    """Who holds OUTPUT_DIR's lock right now ("pid 123 on host h"), or None if nobody does. Takes nothing."""
    path = output_dir / LOCK
    try:
        stream = open(path)  # noqa: SIM115
    except OSError:
        return None
    with stream:
        try:
            fcntl.flock(stream, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            try:
                info = json.loads(stream.read() or "{}")
                return f"pid {info['pid']} on host {info['host']}"
            except (ValueError, KeyError, TypeError):
                return "another process"
        fcntl.flock(stream, fcntl.LOCK_UN)
    return None


def busy(output_dir: Path) -> BusyError:
    who = holder(output_dir) or "another process"
    return BusyError(
        f"OUTPUT_DIR={output_dir} is in use: {who} trains in it. Nothing was written; run again once it has "
        "ended (a restart policy may retry), or use another OUTPUT_DIR"
    )


# What run.json may hold, and the form of each value (a key may be missing: older runs recorded fewer).
RUN_VALUES = {
    "model": lambda value: isinstance(value, str),
    "model_sha256": lambda value: isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None,
    "jit_compile": lambda value: isinstance(value, bool),
    "data_in_memory": lambda value: isinstance(value, bool),
    "data": lambda value: isinstance(value, dict),  # the data's identity (train.data.opening)
    "features": lambda value: isinstance(value, dict),  # what predict needs of the data (train.data.spec)
    "precision": lambda value: value in ("float32", "mixed_float16", "mixed_bfloat16"),
    # issue 45's: INIT_FROM's record (None: the weights build_model made), and the phases (None: one, as built)
    "initialized_from": lambda value: (
        value is None or (isinstance(value, dict) and isinstance(value.get("source"), str))
    ),
    "phases": lambda value: value is None or (isinstance(value, list) and all(isinstance(e, dict) for e in value)),
    "mlflow_run_id": lambda value: value is None or (isinstance(value, str) and value != ""),  # train.plugins.tracking
    "starts": lambda value: (
        isinstance(value, list)
        and all(isinstance(start, dict) and isinstance(start.get("segment", {}), dict) for start in value)
    ),
}


def read_run(output_dir: Path) -> dict[str, object]:
    """What the run's first start resolved (empty for a new run). Raises SettingsError for a run.json that cannot
    be read or is damaged: it says which model the checkpoints are of, so it is never guessed or rewritten."""
    path = output_dir / RUN
    if output_dir.exists() and not output_dir.is_dir():
        raise SettingsError(f"OUTPUT_DIR={output_dir} is a file, not a run directory")
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except OSError as error:
        problem = f"cannot be read ({error.strerror}{owned_by(path)})"
    except ValueError as error:  # not JSON, or not UTF-8
        problem = f"is damaged (not JSON: {first_line(error, 80)})"
    else:
        if not isinstance(recorded, dict):
            problem = f"is damaged (a JSON {type(recorded).__name__}, not an object)"
        elif wrong := [key for key, fits in RUN_VALUES.items() if key in recorded and not fits(recorded[key])]:
            problem = f"is damaged ({wrong[0]}: {recorded[wrong[0]]!r})"
        else:
            return recorded
    if checkpoints_newest_first(output_dir / "checkpoints"):
        fix = "it records which MODEL this run's checkpoints are of: put back a good copy, or delete it to have the "
        fix += "next start record MODEL anew (checkpoints of another model then do not load, and nothing is rewritten)"
    else:
        fix = "no checkpoint depends on it: delete it and run again"
    raise SettingsError(f"{path} {problem}; {fix}")


def read_epochs(output_dir: Path) -> tuple[list[dict[str, object]] | None, str | None]:
    """epochs.json: [{"epoch": 1, "step": S, "logs": {name: value}}, ...] (None where there is no file), and what
    is wrong with it ("is damaged (...)", "cannot be read (...)"), None where nothing is. Raises nothing."""
    path = output_dir / EPOCHS
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, None
    except OSError as error:
        return None, f"cannot be read ({error.strerror}{owned_by(path)})"
    except ValueError as error:
        return None, f"is damaged (not JSON: {first_line(error, 80)})"
    if not isinstance(recorded, list):
        return None, f"is damaged (a JSON {type(recorded).__name__}, not a list)"
    for index, entry in enumerate(recorded):
        fits = isinstance(entry, dict) and isinstance(entry.get("logs"), dict)
        fits = fits and all(type(entry.get(key)) is int and entry[key] > 0 for key in ("epoch", "step"))
        if not fits:
            return None, f"is damaged (entry {index}: {str(entry)[:80]})"
    return recorded, None


def check_same_model(output_dir: Path, model: str) -> None:
    """A run directory (OUTPUT_DIR) holding checkpoints of another model than MODEL is refused in one line (they
    would not load), as is one whose run.json is damaged."""
    recorded = read_run(output_dir).get("model_sha256")
    if not recorded or not checkpoints_newest_first(output_dir / "checkpoints"):
        return
    now = model_fingerprint(model)
    if now != recorded:
        raise SettingsError(
            f"MODEL={model!r} is not the model OUTPUT_DIR={output_dir} was trained with: its code "
            f"differs (sha256 {now[:12]}, the run's {recorded[:12]}), so the run's checkpoints would not load into "
            "it. Use another OUTPUT_DIR for this model, or put the run's model back"
        )


def check_same_sync_batch_norm(output_dir: Path, sync_batch_norm: bool) -> None:
    """SYNC_BATCH_NORM defines what every step of the run computed: a run directory trained with the other value is
    refused in one line (run.json records it)."""
    recorded = read_run(output_dir).get("sync_batch_norm")
    if recorded is None or recorded == sync_batch_norm:
        return
    was, now = str(recorded).lower(), str(sync_batch_norm).lower()
    raise SettingsError(
        f"SYNC_BATCH_NORM={now}, but OUTPUT_DIR={output_dir} was trained with SYNC_BATCH_NORM={was}: it "
        f"defines the run. Set SYNC_BATCH_NORM={was} to go on with it, or use another OUTPUT_DIR"
    )


# What a run keeps in OUTPUT_DIR, in the order checked: True for a folder it writes into, False for a file it
# replaces whole.
_FOLDERS = ("saved_model", "checkpoints", "formats", "logs", "logs/train", "logs/eval")
_ENTRIES = (RUN_SETTINGS, RUN, EPOCHS, "summary.json", LOCK, "model.keras", "saved_model", "checkpoints", "formats")
RUN_ENTRIES = {name: name in _FOLDERS for name in (*_ENTRIES, "checkpoints/checkpoint", *_FOLDERS[3:])}


def check_run_files(output_dir: Path) -> None:
    """Each of the run's files and folders is what the run will write there, and this UID may write it (and read
    the checkpoints). Raises SettingsError naming the first that is not: before TensorFlow loads, not after."""
    checkpoint = re.compile(r"ckpt-\d+\.(index|data-\d+-of-\d+)")
    for name, folder in RUN_ENTRIES.items():
        _check_entry(output_dir / name, folder)
    for name in _listing(output_dir / "checkpoints"):
        if checkpoint.fullmatch(name):  # restored, or replaced by the next save of its number
            _check_entry(output_dir / "checkpoints" / name, folder=False, read=True)
    lock = output_dir / LOCK
    if lock.is_file():
        try:
            os.close(os.open(lock, os.O_WRONLY | os.O_APPEND))  # what RunLock.acquire opens it for; writes nothing
        except OSError as error:
            raise lock_error(lock, error) from None


def _check_entry(entry: Path, folder: bool, read: bool = False) -> None:
    try:
        if entry.is_symlink() and not entry.exists():
            raise SettingsError(
                f"{entry} is a symlink to {os.readlink(entry)}, which does not exist: remove the link, or restore what "
                "it pointed to"
            )
        if not entry.exists():
            return
        if entry.is_dir() != folder:
            found, kept = ("a folder", "a file") if entry.is_dir() else ("a file", "a folder")
            raise SettingsError(
                f"{entry} is {found}, where a run keeps {kept}: move it away, or use another OUTPUT_DIR"
            )
        access, what = (os.W_OK | os.X_OK, "writable") if folder else (os.R_OK, "readable")
        if (folder or read) and not os.access(entry, access):
            raise SettingsError(
                f"{entry} is not {what} by UID {os.getuid()}{owned_by(entry)}: fix its owner or permissions, or use "
                "another OUTPUT_DIR"
            )
    except OSError as error:  # in a folder this UID cannot search
        raise SettingsError(
            f"{entry} cannot be looked at by UID {os.getuid()} ({error.strerror}): fix the owner or permissions of "
            f"{entry.parent}, or use another OUTPUT_DIR"
        ) from None


def _listing(folder: Path) -> list[str]:
    """The names in a folder; none where there is no folder. Raises SettingsError where it cannot be read: it would
    look empty, and a run would start over on top of the checkpoints in it."""
    try:
        return os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as error:
        raise SettingsError(
            f"{folder} cannot be read by UID {os.getuid()} ({error.strerror}{owned_by(folder)}): fix its owner or "
            "permissions, or use another OUTPUT_DIR"
        ) from None


def leftovers(output_dir: Path) -> list[Path]:
    """What a save or an export killed midway leaves: TensorFlow's `ckpt-N_temp/` folder, the data of a
    checkpoint whose index was never written, the export's staging copies, write_json's temporary files; and
    a `checkpoint` state file that is not text (TensorFlow ignores one it cannot parse, but fails on one it cannot
    decode; the checkpoints are found by listing the folder, and the next save writes the file anew)."""
    checkpoints = output_dir / "checkpoints"
    try:
        found = [path for path in checkpoints.glob("ckpt-*_temp") if re.fullmatch(r"ckpt-\d+_temp", path.name)]
        found += [
            path
            for path in checkpoints.glob("ckpt-*.data-*")
            if not (checkpoints / f"{path.name.partition('.data-')[0]}.index").exists()
        ]
        staged = ("model.tmp.keras", "saved_model.tmp", "formats.tmp")  # train.exportable's, train.formats'
        found += [output_dir / name for name in staged if (output_dir / name).exists()]
        found += [path for path in output_dir.glob(".*.tmp") if re.fullmatch(r"\..+\.\d+\.tmp", path.name)]
        found += [checkpoints / "checkpoint"] if _not_text(checkpoints / "checkpoint") else []
    except OSError:  # a folder this UID cannot read: check_run_files says so
        return []
    return sorted(found)


def _not_text(path: Path) -> bool:
    """A regular file whose bytes are not UTF-8 (not one that cannot be read: TensorFlow ignores that)."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        path.read_bytes().decode("utf-8")
    except OSError:
        return False
    except UnicodeDecodeError:
        return True
    return False


def remove_leftovers(output_dir: Path) -> list[str]:
    """Remove `leftovers` under the run's lock (so no live save loses its files); their names, relative to
    OUTPUT_DIR. Removes nothing while another process holds the lock, or where it cannot be taken."""
    found = leftovers(output_dir) if output_dir.is_dir() else []
    if not found:
        return []
    try:
        stream = open(output_dir / LOCK, "a+")  # noqa: SIM115
    except OSError:
        return []  # check_run_files says why
    with stream:
        try:
            fcntl.flock(stream, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return []  # in use: preflight says so
        removed = []
        for path in leftovers(output_dir):  # again, now that nobody else can be writing
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            except OSError:
                continue
            removed.append(str(path.relative_to(output_dir)))
    return removed


def preflight(
    output_dir: Path,
    model: str,
    sync_batch_norm: bool,
    resume: str,
    multi_worker: bool,
    chief: bool,
    warn: Callable[[str], None] = lambda message: None,
) -> None:
    """Everything about the run directory (OUTPUT_DIR) that can be known before TensorFlow loads, for MODEL,
    SYNC_BATCH_NORM and RESUME; `multi_worker`: one of a cluster's workers, `chief`: its chief. Raises SettingsError
    or BusyError; `warn` hears what is repaired (a killed save's leftovers). A damaged settings.json is said by
    train.settings.check_run_settings."""
    if not multi_worker or chief:
        removed = remove_leftovers(output_dir)  # first, so that the free space counted next is the true one
        if removed:
            warn(f"removed what a killed save or export left (or damaged) in {output_dir}: {', '.join(removed)}")
    check_output_dir(output_dir)
    check_run_files(output_dir)
    check_same_model(output_dir, model)  # reads run.json: a damaged one is refused
    check_same_sync_batch_norm(output_dir, sync_batch_norm)
    # Across workers the chief says it once they have joined (train.cluster.workers), so that every worker ends
    # with the same exit code: a worker that stopped here would leave the others waiting for it.
    if not multi_worker and holder(output_dir) is not None:
        raise busy(output_dir)
    existing = checkpoints_newest_first(output_dir / "checkpoints")
    if existing and resume == "never":
        raise SettingsError(
            f"RESUME=never but OUTPUT_DIR={output_dir} already holds checkpoints ({existing[0].name}): "
            "use another OUTPUT_DIR, delete that one, or RESUME=auto"
        )
    _, problem = read_epochs(output_dir)
    if problem:  # the callbacks and MONITOR's best epoch resume from it: never guessed
        raise SettingsError(
            f"{output_dir / EPOCHS} {problem}; it records each epoch's metrics, which the callbacks and MONITOR's best "
            "epoch resume from: put back a good copy, or delete it to have them start afresh from the next epoch"
        )


def checkpoints_newest_first(checkpoint_dir: Path) -> list[Path]:
    """Every checkpoint in this directory (prefixes like .../ckpt-120), newest first.

    Found by listing the directory, not by trusting the `checkpoint` state file: that file can name
    paths outside the run directory, and can be behind the files after a kill. Raises SettingsError for a
    directory that cannot be read.
    """
    numbered = []
    for name in _listing(checkpoint_dir):
        match = re.fullmatch(r"ckpt-(\d+)\.index", name)
        if match:
            numbered.append((int(match.group(1)), checkpoint_dir / f"ckpt-{match.group(1)}"))
    return [prefix for _, prefix in sorted(numbered, reverse=True)]


def restore_newest(checkpoint: tf.train.Checkpoint, checkpoint_dir: Path, say: Callable[[str], None]) -> str | None:
    """Restore the newest checkpoint of this run directory that loads; warn about each one that does not.

    Returns None when the directory has no checkpoint. Raises TrainingError when it has some and none
    loads: starting over would overwrite them.
    """
    candidates = checkpoints_newest_first(checkpoint_dir)
    failed = []
    for prefix in candidates:
        try:
            checkpoint.restore(str(prefix)).assert_existing_objects_matched()
        # Damage shows as IndexError, DataLossError, ValueError, ...: each means "not this one".
        except Exception as error:
            failed.append(prefix.name)
            say(f"warning: checkpoint {prefix.name} does not load ({first_line(error, 160)}).")
            continue
        if failed:
            say(f"warning: {', '.join(failed)} could not be loaded; resuming from the previous one, {prefix.name}.")
        return str(prefix)
    if failed:
        raise TrainingError(
            f"no checkpoint in {checkpoint_dir} loads ({', '.join(failed)}): they are corrupt, or from another model "
            "or dataset. They are left as they are: use another OUTPUT_DIR, or delete them to start over"
        )
    return None
