"""The fuzz table (tests/test_fuzz.py): what each case's commands must end in, the exit code and the error line.

A case is `target:kind` (a run directory's file or folder, OUTPUT_DIR itself "./", a leftover of a killed save, or
the MODEL file, damaged in one way); `expected` gives {command: (exit code, a regular expression the last line of
stderr must match)}, exit 0 for a command left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

# What each case's commands must end in: {command: (exit code, what the error line says)}, the line a regular
# expression searched with {run} (the case's run directory) and {dir} (its folder) filled in. A command left out
# exits 0. BEFORE_TENSORFLOW: refusals that come before TensorFlow loads (the fuzz driver counts its loads).
FILE_LINES = {
    "a-folder": r"{run}/{target} is a folder, where a run keeps a file: move it away",
    "dangling-symlink": r"{run}/{target} is a symlink to {run}/(checkpoints/)?nowhere/\S+, which does not exist",
}
RECORD_LINES = {  # the records a command reads: damaged or unreadable, each is refused by name
    "truncated": r"{run}/{target} is damaged \(not JSON", "garbage": r"{run}/{target} is damaged \(not JSON",
    "wrong-json": r"{run}/{target} is damaged \(", "unreadable": r"{run}/{target} cannot be read \(Permission denied",
}  # fmt: skip
UNWRITABLE = r"{run}/{target} is not writable by UID \d+, owned by UID"
FOLDER_LINES = {
    "a-file": r"{run}/{target} is a file, where a run keeps a folder: move it away",
    "unwritable": UNWRITABLE, "unreadable": UNWRITABLE, "another-user": UNWRITABLE,
    "dangling-symlink": r"{run}/{target} is a symlink to {run}/\S*nowhere, which does not exist",
}  # fmt: skip
NO_CHECKPOINT = (2, r"OUTPUT_DIR={run} has no checkpoint: run fit first")
NOT_WRITABLE = (2, r"OUTPUT_DIR={run} is not writable by UID \d+ \(Permission denied at {run}\)")
RUN_FOLDER = {  # OUTPUT_DIR itself
    "deleted": {"evaluate": NO_CHECKPOINT},
    "a-file": {"evaluate": (2, r"OUTPUT_DIR={run} is a file, not a run directory"),
               "fit": (2, r"OUTPUT_DIR={run} cannot be created: {run} is a file")},
    "unwritable": {"fit": NOT_WRITABLE}, "another-user": {"fit": NOT_WRITABLE},
    "unreadable": {"evaluate": (2, r"{run}/checkpoints cannot be read by UID \d+ \(Permission denied\)"),
                   "fit": NOT_WRITABLE},
    "dangling-symlink": {"evaluate": NO_CHECKPOINT,
                         "fit": (2, r"OUTPUT_DIR={run} is a symlink to {dir}/nowhere, which does not exist")},
}  # fmt: skip
ON_IMPORT = r"MODEL='model.py' could not be imported \({error}: {message}\)"
NO_BUILD_MODEL = r"MODEL='model.py' has no build_model: define build_model\(input_shape, num_classes, learning_rate\)"
NOT_A_FILE = r"MODEL='model.py' is not a file \(from {dir}\): give a .py file that defines build_model"
MODEL_LINES = {  # what every command of a new run with this MODEL says; None: it trains
    "missing-import": ON_IMPORT.format(error="ModuleNotFoundError", message="No module named 'not_a_module_anywhere'"),
    "wrong-signature": r"build_model\(\(32,\), 10, 0\.001\) raised TypeError: build_model\(\) takes 1 positional",
    "more-classes": r"its output \(None, (\d+)\) scores \1 classes, but each label of synthetic_clusters/1\.0\.0",
    "one-output": r"its output \(None, 1\) scores 1 class, but each label of synthetic_clusters/1\.0\.0",
    "extra-axis": r"its output \(None, 10, 1\) does not fit the labels of synthetic_clusters/1\.0\.0",
    "integer-output": r"its output is int32, through which no gradient flows",
    "raises": r"build_model\(\(32,\), 10, 0\.001\) raised {error}: '?no GPU budget today",
    "returns-none": r"build_model returned NoneType, not a keras\.Model",
    "not-compiled": r"build_model returned a model that is not compiled: call model\.compile",
    "not-a-function": NO_BUILD_MODEL,
    "raises-on-import": ON_IMPORT.format(error="RuntimeError", message="no licence server"),
    "tuple-hyperparameter": r"build_model's keyword-only parameter sizes=\(8, 8\) is a tuple, but a hyperparameter",
    "positional-context": r"build_model's context is not keyword-only: declare it after a `\*`",
    "empty": NO_BUILD_MODEL,
    "a-folder": NOT_A_FILE,
    "unreadable": r"MODEL='model.py': model.py cannot be read \(Permission denied\)",
    "dangling-symlink": NOT_A_FILE,
}
CALLBACK_LINES = {  # a new run's evaluate has no checkpoint; fit builds the model, then the callbacks
    "callbacks-raise": r"MODEL='model.py': build_callbacks\(context\) raised {error}: '?no GPU budget today",
    "callbacks-not-a-list": r"MODEL='model.py': build_callbacks returned int: return a list of keras\.callbacks",
}
# (and every refusal of a damaged run directory but "has no checkpoint")
BEFORE_TENSORFLOW = {"model:cut", "model:garbage-bytes", "model:tuple-hyperparameter", "model:a-folder",
                     "model:unreadable", "model:dangling-symlink"}  # fmt: skip


def model_expected(kind: str, model: Path, template: str) -> dict[str, tuple[int, str]]:
    """A damaged MODEL's outcome. `cut` and `garbage-bytes` are drawn: what was drawn says whether it parses."""
    if kind in CALLBACK_LINES:
        return {"evaluate": (2, r"OUTPUT_DIR={dir}/new-run has no checkpoint"), "fit": (2, CALLBACK_LINES[kind])}
    if kind in ("cut", "garbage-bytes"):
        try:
            ast.parse(model.read_bytes())
        except (SyntaxError, ValueError):
            line = (2, r"MODEL='model.py' does not parse: model.py(, line \d+)?: ")
            return {"evaluate": line, "fit": line, "devices": line}
        if model.read_text().strip() == template.strip():  # cut only the last newline: the template model
            return {}
        return {"evaluate": (2, "MODEL='model.py'"), "fit": (2, "MODEL='model.py'")}
    line = (2, MODEL_LINES[kind])
    before = f"model:{kind}" in BEFORE_TENSORFLOW
    return {"evaluate": line, "fit": line, **({"devices": line} if before else {})}


def expected(name: str, model: Path, template: str) -> dict[str, tuple[int, str]]:
    """What `name`'s commands end in (exit 0 where a command is left out); `model`: the case's MODEL file, `template`:
    the good model's text it was damaged from."""
    target, kind = name.rsplit(":", 1)
    if target == "model":
        return model_expected(kind, model, template)
    if target == "leftover":
        return {}
    if target == "./":
        return RUN_FOLDER[kind]
    if target.endswith("/"):
        found = {"fit": (2, FOLDER_LINES[kind])} if kind in FOLDER_LINES else {}
        if target == "checkpoints/":
            if kind in ("deleted", "a-file", "dangling-symlink"):
                found["evaluate"] = NO_CHECKPOINT
            elif kind == "unreadable":
                found["evaluate"] = (2, r"{run}/checkpoints cannot be read by UID \d+ \(Permission denied")
        return found
    found = {"fit": (2, FILE_LINES[kind])} if kind in FILE_LINES else {}
    if target in ("run.json", "epochs.json") and kind in RECORD_LINES:
        found["fit"] = (2, RECORD_LINES[kind])
    if target == "run.json" and (kind in RECORD_LINES or kind == "a-folder"):
        found["evaluate"] = (2, RECORD_LINES.get(kind, r"{run}/{target} cannot be read \(Is a directory"))
    if target == ".lock" and kind in ("unwritable", "unreadable", "another-user"):
        found["fit"] = (2, r"OUTPUT_DIR={run} cannot be locked: {run}/\.lock cannot be opened for writing by UID")
    if target.startswith("checkpoints/ckpt-") and kind == "unreadable":
        found["fit"] = (2, r"{run}/{target} is not readable by UID \d+, owned by UID")
    return found
