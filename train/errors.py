"""The two kinds of failure a user sees as one line, and their exit codes. No TensorFlow here."""


class SettingsError(ValueError):
    """A bad input: the message names the setting, the value and what is allowed. Exit code 2."""

    exit_code = 2


class TrainingError(RuntimeError):
    """Training cannot go on (out of memory, a non-finite loss, a full disk); checkpoints are intact. Exit code 1."""

    exit_code = 1


def first_line(error: BaseException) -> str:
    """The first line of an exception's message: TensorFlow's run to dozens of lines."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
