"""`tune`'s search space: `--space NAME=SPEC`, parsed and checked before any trial, or MODEL's `search_space(trial)`.

    --space LEARNING_RATE=1e-4..1e-2:log --space BATCH_SIZE=32|64 --space HP_WIDTH=int:16..128

NAME is a setting of the table (train.settings.table) or one of build_model's HP_ names; SPEC is one of
`low..high` (a float), `low..high:log`, `int:low..high` or `a|b|c` (a choice). Each bound and each choice is parsed
by NAME's own parser, so `LEARNING_RATE=0..1` is refused as LEARNING_RATE=0 would be. Nothing here imports
TensorFlow or optuna: a `Dimension` is handed the trial it suggests on.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from train import hparams
from train.errors import SettingsError
from train.model_file import model_tree

if TYPE_CHECKING:  # optuna is the tune extra's
    import optuna

FORMS = "low..high, low..high:log, int:low..high or a|b|c"
NOT_SEARCHED = ("OUTPUT_DIR", "STUDY_DIR")  # each trial has its own run directory, in the study's
SEARCH_SPACE = "search_space"  # MODEL's search_space(trial) -> {NAME: value}
Check = Callable[[str, str], object]  # (NAME, text) -> the value NAME's parser makes, or SettingsError
Parsers = Mapping[str, Check]  # each setting's parser by name: train.settings' FIELDS
Choice = int | float | str
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_RANGE = re.compile(rf"(?P<int>int:)?(?P<low>{_NUMBER})\.\.(?P<high>{_NUMBER})(?P<log>:log)?")


@dataclass(frozen=True)
class Dimension:
    """One searched setting: a float range (on a log scale or not), an int range, or a choice."""

    name: str
    kind: str  # "float", "int" or "choice"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[Choice, ...] = ()

    def suggest(self, trial: optuna.Trial) -> Choice:
        """This dimension's value for an optuna trial (its `suggest_*`)."""
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log)
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_categorical(self.name, list(self.choices))


def name_checker(
    parsers: Parsers, hyperparameters: Mapping[str, hparams.HyperParameter] | None, model: str
) -> Callable[[str], Check]:
    """For a NAME, the parser of its value: a setting's (`parsers`), or a hyperparameter's of MODEL. Raises
    SettingsError for a NAME that is neither, or one that is not searched (OUTPUT_DIR, STUDY_DIR)."""
    declared = dict(hyperparameters or {})

    def check(name: str) -> Check:
        if name in NOT_SEARCHED:
            raise SettingsError(f"{name} cannot be searched: each trial has its own run directory in STUDY_DIR")
        if name in parsers:
            return parsers[name]
        if name in declared:
            return lambda _name, text: declared[name].parse(text)
        hps = ", ".join(declared) or f"none (MODEL={model!r} declares no HP_ setting)"
        raise SettingsError(
            f"{name} is not a setting or a hyperparameter of MODEL={model!r}: use a setting such as LEARNING_RATE or "
            f"BATCH_SIZE (python -m train tune --help lists them), or one of build_model's HP_ names: {hps}"
        )

    return check


def parse_space(texts: list[str], checker: Callable[[str], Check]) -> tuple[Dimension, ...]:
    """Every `--space NAME=SPEC`, in order. Raises SettingsError naming the first bad one."""
    dimensions: list[Dimension] = []
    for text in texts:
        dimension = parse_dimension(text, checker)
        if any(each.name == dimension.name for each in dimensions):
            raise SettingsError(f"--space {text}: {dimension.name} is searched twice; give each NAME once")
        dimensions.append(dimension)
    return tuple(dimensions)


def parse_dimension(text: str, checker: Callable[[str], Check]) -> Dimension:
    """One `NAME=SPEC`. Raises SettingsError: one line naming --space, the text and the forms allowed."""
    name, equals, spec = text.partition("=")
    name, spec = name.strip(), spec.strip()
    if not equals or not name or not spec:
        raise SettingsError(f"--space {text!r} is not NAME=SPEC: use NAME={FORMS}, like LEARNING_RATE=1e-4..1e-2:log")
    check = _checked(text, checker, name)
    found = _RANGE.fullmatch(spec)
    if found:
        return _range(text, name, found, check)
    if "|" in spec:
        choices = tuple(each.strip() for each in spec.split("|"))
        if not all(choices) or len(set(choices)) != len(choices):
            raise SettingsError(f"--space {text!r}: a choice needs distinct, non-empty values, like {name}=a|b|c")
        for each in choices:
            _value(text, check, name, each)
        return Dimension(name, "choice", choices=tuple(_typed(each) for each in choices))
    raise SettingsError(f"--space {text!r}: {spec!r} is not a SPEC: use {FORMS}, like {name}=1e-4..1e-2:log")


def _checked(text: str, checker: Callable[[str], Check], name: str) -> Check:
    try:
        return checker(name)
    except SettingsError as error:
        raise SettingsError(f"--space {text!r}: {error}") from None


def _range(text: str, name: str, found: re.Match, check: Check) -> Dimension:
    integer, log = bool(found["int"]), bool(found["log"])
    if integer and not all(re.fullmatch(r"[-+]?\d+", found[each]) for each in ("low", "high")):
        raise SettingsError(f"--space {text!r}: int:low..high takes whole numbers, like {name}=int:16..128")
    low, high = (int(found[e]) if integer else float(found[e]) for e in ("low", "high"))
    if not low < high:
        raise SettingsError(f"--space {text!r}: low must be below high, like {name}=0.0001..0.01")
    if log and low <= 0:
        raise SettingsError(f"--space {text!r}: a :log range needs low above 0, like {name}=1e-4..1e-2:log")
    for each in (found["low"], found["high"]):
        _value(text, check, name, each)
    return Dimension(name, "int" if integer else "float", low=low, high=high, log=log)


def _value(text: str, check: Check, name: str, value: str) -> object:
    try:
        return check(name, value)
    except SettingsError as error:
        raise SettingsError(f"--space {text!r}: {error}") from None


def _typed(text: str) -> Choice:
    """A choice as optuna keeps it: a whole number, a number, or the text."""
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    if re.fullmatch(_NUMBER, text):
        return float(text)
    return text


def has_search_space(model: str) -> bool:
    """Whether MODEL's file defines `search_space(trial)` at its top level: read from its syntax tree, so nothing is
    imported (the tune imports the file, and whatever it imports, only to call it)."""
    tree: ast.Module = model_tree(model)
    return any(isinstance(node, ast.FunctionDef) and node.name == SEARCH_SPACE for node in tree.body)


def checked_values(values: object, checker: Callable[[str], Check], model: str) -> dict[str, str]:
    """What MODEL's search_space(trial) returned, as settings' text, each value parsed by its NAME's parser.
    Raises SettingsError."""
    if not isinstance(values, dict) or not values:
        example = "{'LEARNING_RATE': trial.suggest_float('LEARNING_RATE', 1e-4, 1e-2, log=True)}"
        raise SettingsError(f"MODEL={model!r}: search_space(trial) must return a dict of settings, like {example}")
    texts = {}
    for name, value in values.items():
        text = hparams.text(value) if isinstance(value, bool | int | float | str) else repr(value)
        try:
            checker(str(name))(str(name), text)
        except SettingsError as error:
            raise SettingsError(f"MODEL={model!r}: search_space(trial) returned {name}={text!r}: {error}") from None
        texts[str(name)] = text
    return texts
