"""The failures a user sees as one line, and every exit code of `python -m train`. No TensorFlow here."""

import errno
import os
import re

EXIT_OK = 0
EXIT_FAILED = 1  # TrainingError: a step could not be done (training cannot go on, or an artifact did not match)
EXIT_BAD_INPUT = 2  # SettingsError: fix the named setting; nothing was written
EXIT_PREEMPTED = 42  # stopped by SIGTERM/Ctrl-C (after a checkpoint, or the data being written dropped): start me again
EXIT_BUSY = 75  # BusyError: another live process holds what this one needs; try again later (sysexits' TEMPFAIL)


class SettingsError(ValueError):
    """A bad input: the message names the setting, the value and what is allowed. Exit code 2."""

    exit_code = EXIT_BAD_INPUT


class TrainingError(RuntimeError):
    """A step could not be done: training cannot go on (out of memory, a non-finite loss, a full disk; checkpoints
    are intact), or an artifact did not match what it was made from (train.formats: nothing of it kept). Exit 1."""

    exit_code = EXIT_FAILED


class Stopped(RuntimeError):
    """SIGTERM or Ctrl-C heard before training began (while DATASET was being written): nothing was written, and the
    same command starts again. Exit code 42."""

    exit_code = EXIT_PREEMPTED


class BusyError(RuntimeError):
    """Busy: another live process holds what this one needs, the run directory (its lock) or the study's storage
    (a sqlite file locked past STUDY_WAIT): nothing was written. Exit code 75."""

    exit_code = EXIT_BUSY


# TensorFlow wraps what went wrong: a status line "INVALID_ARGUMENT: ..." (after "(0) " when several ops
# failed) amid "Graph execution error:", the Python stack of the op and a "{{function_node ...}}" prefix.
_STATUS = re.compile(r"^(\(\d+\) )?[A-Z][A-Z_]{4,}:\s*")
FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}\s*")
_NOISE = (  # TensorFlow's wrapping, then Keras's of a call's
    "Graph execution error",
    "Detected at node",
    'File "',
    "[[",
    "root error",
    "successful operations",
    "Cf. ",
    "Exception encountered when calling",
    "Arguments received by",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Keras's bold in a terminal's escape codes


def first_line(error: BaseException, limit: int | None = None) -> str:
    """The one line of an exception's message that says what went wrong; TensorFlow's run to dozens of lines.

    Its status line where it has one (without the code), else the first line that is not TensorFlow's wrapping,
    with the lines that go on its sentence (Keras wraps a paragraph at 72 columns); longer than `limit`
    characters, cut after the last whole sentence that fits ("...": more followed). Never inside a sentence: one
    longer than `limit` is kept whole.
    """
    lines = [FUNCTION_NODE.sub("", _ANSI.sub("", line)).strip() for line in str(error).splitlines()]
    status = [line for line in lines if _STATUS.match(line)]
    if status:
        line = _STATUS.sub("", status[0])
    else:
        useful = [index for index, line in enumerate(lines) if line and not line.startswith(_NOISE)]
        filled = [index for index, line in enumerate(lines) if line]
        line = _sentence_from(lines, (useful or filled)[0]) if filled else type(error).__name__
    return line if limit is None else clip(line, limit)


_SENTENCE_END = re.compile(r"[.!?;](?=\s|$)")


def _sentence_from(lines: list[str], start: int) -> str:
    """The line at `start`, joined with the lines after it up to the end of its sentence or its paragraph."""
    joined = lines[start]
    for line in lines[start + 1 :]:
        if not line or _SENTENCE_END.search(joined) or line.startswith(_NOISE):
            break
        joined += " " + line
    return joined


def clip(text: str, limit: int) -> str:
    """`text` cut after the last whole sentence (or clause ended by ";") that fits in `limit` characters, and
    "..." said; kept whole where even its first sentence is longer."""
    if len(text) <= limit:
        return text
    ends = [match.end() for match in _SENTENCE_END.finditer(text) if match.end() <= limit - 4]
    if not ends:
        return text
    return text[: ends[-1]] + " ..."


def storage_fix(error: BaseException, where: os.PathLike[str] | str) -> str:
    """What to do about a write that failed, from its cause (an OSError's errno, or TensorFlow's status text)."""
    code, text = getattr(error, "errno", None), str(error)
    if code in (errno.EACCES, errno.EPERM) or "Permission denied" in text or "Operation not permitted" in text:
        return f"fix the owner or permissions of {where} (UID {os.getuid()} writes there)"
    if code == errno.EROFS or "Read-only file system" in text:
        return f"make {where} writable (it is on a read-only filesystem), or use another OUTPUT_DIR"
    if code in (errno.ENOSPC, errno.EDQUOT) or "No space left" in text or "quota exceeded" in text.lower():
        return "free space"
    return "fix what it names"
