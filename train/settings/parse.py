"""How a setting's text becomes its value: one parser per kind, each `parser(NAME, text) -> value`.

A parser raises SettingsError with one line that names the setting, the value and what is allowed, whatever layer
the text came from (a flag, the environment, `.env`). Each carries `metavar`, the form --help shows (N, PATH, ...).
Nothing here imports TensorFlow: DATASET's kind is train.dataset_path.source's (load_settings), MODEL's file
train.model_file's.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path

from train import hparams
from train.errors import SettingsError
from train.model_file import DEFAULT_MODEL, is_model_path, model_fingerprint, model_source

Parser = Callable[[str, str], object]  # a setting's value: int, float, bool, str, Path, tuple or None


def positive_int(name: str, text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text) or int(text) == 0:
        raise SettingsError(f"{name}={text!r} is not allowed: use a whole number of 1 or more")
    return int(text)


def non_negative_int(name: str, text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise SettingsError(f"{name}={text!r} is not allowed: use a whole number of 0 or more")
    return int(text)


def positive_float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise SettingsError(f"{name}={text!r} is not allowed: use a number greater than 0, e.g. 0.001")
    return value


def globs(name: str, text: str) -> tuple[str, ...]:
    """Comma-separated globs (fnmatch's *, ?, [...]) on layer paths, like backbone_*,stem; empty: none given."""
    if text.strip() == "":
        return ()
    items = tuple(item.strip() for item in text.split(","))
    if not all(items):
        raise SettingsError(
            f"{name}={text!r} is not allowed: use comma-separated globs on layer paths, like backbone_*"
        )
    return items


def names(name: str, text: str) -> tuple[str, ...]:
    """Comma-separated column names, like id,notes; empty: none given."""
    items = tuple(item.strip() for item in text.split(",")) if text.strip() else ()
    if not all(items):
        raise SettingsError(f"{name}={text!r} is not allowed: use comma-separated column names, like id,notes")
    return items


def true_or_false(name: str, text: str) -> bool:
    """The words of train.hparams.boolean (true/1/yes/on, false/0/no/off), as every bool setting takes them."""
    value = hparams.boolean(text)
    if value is None:
        raise SettingsError(f"{name}={text!r} is not allowed: use true or false")
    return value


def choice(allowed: tuple[str, ...]) -> Callable[[str, str], str]:
    """A parser taking one of `allowed`, as written."""

    def parse(name: str, text: str) -> str:
        if text not in allowed:
            raise SettingsError(f"{name}={text!r} is not allowed: use one of {', '.join(allowed)}")
        return text

    parse.metavar = "|".join(allowed)  # type: ignore[attr-defined]
    return parse


FORMATS = ("onnx", "litert")  # what train.formats converts model.keras to


def formats(name: str, text: str) -> tuple[str, ...]:
    """A comma list of FORMATS, each once, in order; empty: none."""
    names = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    unknown = [each for each in names if each not in FORMATS]
    if unknown:
        raise SettingsError(
            f"{name}={text!r} is not allowed: {unknown[0]!r} is not a format; use a comma list of "
            f"{', '.join(FORMATS)}, like onnx,litert"
        )
    return names


TRACKERS = ("none", "mlflow")


def tracking(name: str, text: str) -> str:
    """TRACKING: none, or mlflow where the track extra is installed (found, not imported: mlflow loads in seconds,
    inside train.plugins.tracking, on the chief of a run that tracks)."""
    chosen = choice(TRACKERS)(name, text)
    if chosen == "mlflow" and importlib.util.find_spec("mlflow") is None:
        raise SettingsError(
            f"{name}=mlflow needs mlflow, which is not installed: make setup EXTRAS=dev,track (the track extra), or "
            f"use {name}=none"
        )
    return chosen


def gpus(name: str, text: str) -> str | tuple[int, ...]:
    """`all`, `none`, or distinct GPU indices like `0,1`."""
    if text in ("all", "none"):
        return text
    allowed = "use all, none, or distinct GPU indices without spaces, like 0 or 0,1"
    if not re.fullmatch(r"[0-9]+(,[0-9]+)*", text):
        raise SettingsError(f"{name}={text!r} is not allowed: {allowed}")
    indices = tuple(int(part) for part in text.split(","))
    if len(set(indices)) != len(indices):
        raise SettingsError(f"{name}={text!r} names a GPU twice: {allowed}")
    return indices


def required_text(name: str, text: str) -> str:
    if text.strip() != text or text == "":
        raise SettingsError(f"{name}={text!r} is not allowed: use a non-empty value without surrounding spaces")
    return text


def dataset(name: str, text: str) -> str:
    """DATASET as text: its kind (a TFDS name, or a path and what it holds) is decided once by load_settings
    (train.dataset_path.source, Settings.source), not here."""
    return text


def model(name: str, text: str) -> str:
    text = required_text(name, text)
    if model_source(text) is not None:
        model_fingerprint(text)  # a file that cannot be read or does not parse: one line now, not a traceback later
        return text
    if is_model_path(text):
        raise SettingsError(
            f"{name}={text!r} is not a file (from {Path.cwd()}): give a .py file that defines build_model, "
            f"or a module name like {DEFAULT_MODEL}"
        )
    raise SettingsError(
        f"{name}={text!r} is not an importable module: give a module name like {DEFAULT_MODEL} or project.model, "
        "or a .py file path (with a / or ending in .py)"
    )


def path(name: str, text: str) -> Path:
    return Path(required_text(name, text)).expanduser()


def profile_steps(name: str, text: str) -> tuple[int, int] | None:
    """`start-end`, global steps counted from 1, both ends inclusive (100-110); empty: no profiling."""
    if text == "":
        return None
    allowed = "use START-END, two step numbers from 1 with START <= END, like 100-110"
    match = re.fullmatch(r"([0-9]+)-([0-9]+)", text)
    if not match:
        raise SettingsError(f"{name}={text!r} is not allowed: {allowed}")
    start, end = int(match.group(1)), int(match.group(2))
    if start < 1 or end < start:
        raise SettingsError(f"{name}={text!r} is not allowed: {allowed}")
    return start, end


_METAVARS = {  # the form of each parser's value, for --help (Field.metavar); TEXT where none is given
    "N": (positive_int, non_negative_int),
    "X": (positive_float,),
    "PATH": (path,),
    "GLOB,...": (globs,),
    "NAME,...": (names,),
    "true|false": (true_or_false,),
    "all|none|0,1": (gpus,),
    "NAME|PATH": (dataset,),
    "FILE|MODULE": (model,),
    "START-END": (profile_steps,),
    "|".join(TRACKERS): (tracking,),
    "onnx,litert": (formats,),
}
for _metavar, _parsers in _METAVARS.items():
    for _parse in _parsers:
        _parse.metavar = _metavar  # type: ignore[attr-defined]


def optional(parser: Parser, empty: str | None = None, metavar: str | None = None) -> Parser:
    """`parser`, but an empty text is `empty` (None: unset; LABEL_KIND's: guessed from the label column, by
    train.data.local), as GPU_MEMORY_LIMIT_MB= or FEATURE_KEY= leave the setting unset."""

    def parse(name: str, text: str) -> object:
        return empty if text == "" else parser(name, text)

    parse.metavar = metavar or getattr(parser, "metavar", "TEXT")  # type: ignore[attr-defined]
    return parse
