"""The two kinds of failure a user sees as one line, and their exit codes. No TensorFlow here."""

import re


class SettingsError(ValueError):
    """A bad input: the message names the setting, the value and what is allowed. Exit code 2."""

    exit_code = 2


class TrainingError(RuntimeError):
    """Training cannot go on (out of memory, a non-finite loss, a full disk); checkpoints are intact. Exit code 1."""

    exit_code = 1


# TensorFlow wraps what went wrong: a status line "INVALID_ARGUMENT: ..." (after "(0) " when several ops
# failed) amid "Graph execution error:", the Python stack of the op and a "{{function_node ...}}" prefix.
_STATUS = re.compile(r"^(\(\d+\) )?[A-Z][A-Z_]{4,}:\s*")
FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}\s*")
_NOISE = ("Graph execution error", "Detected at node", 'File "', "[[", "root error", "successful operations", "Cf. ")


def first_line(error: BaseException, limit: int | None = None) -> str:
    """The one line of an exception's message that says what went wrong; TensorFlow's run to dozens of lines.

    Its status line where it has one (without the code), else the first line that is not TensorFlow's wrapping;
    longer than `limit` characters, cut at a space and ended with "...".
    """
    lines = [FUNCTION_NODE.sub("", line).strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line]
    status = [line for line in lines if _STATUS.match(line)]
    if status:
        line = _STATUS.sub("", status[0])
    else:
        useful = [line for line in lines if not line.startswith(_NOISE)]
        line = (useful or lines or [type(error).__name__])[0]
    if limit is None or len(line) <= limit:
        return line
    cut = line[: max(0, limit - 3)]
    space = cut.rfind(" ")
    if space >= 0 and space > len(cut) - 20:  # at a word ending near the limit; a long path or URL is cut inside
        cut = cut[:space]
    return cut + "..."
