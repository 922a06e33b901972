"""build_model's hyperparameters: its keyword-only parameters with defaults, each a setting named HP_<NAME>.

    def build_model(input_shape, num_classes, learning_rate, *, width=64, dropout=0.1, context): ...

declares HP_WIDTH (an int, 64 unless set) and HP_DROPOUT (a float); `context`, declared without a default, is the
run's facts (train.context), not a hyperparameter. Each is typed by its default (int, float, bool or str) and set
like any setting (`--hp-width 128`, HP_WIDTH=128 in the environment, .env or project/defaults.env). The
keyword-only parameters of MODEL's `phases(context, *, ...)` (train.phases) are hyperparameters too: one both
functions declare is one setting, with one default; each function is given its own (`taken_by`).

The signature is read from MODEL's syntax tree, as its hash is (train.model_file.model_fingerprint): nothing is
imported, so no TensorFlow, and a bad value is refused in the first second. No TensorFlow here.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from train.errors import SettingsError

PREFIX = "HP_"
CONTEXT = "context"  # build_model's keyword-only parameter that receives the run's facts
PHASES = "phases"  # MODEL's phases(context, *, ...): its keyword-only parameters are hyperparameters too
TRUE = ("true", "1", "yes", "on")  # what a true/false setting takes, in any case: every bool setting, HP_ ones too
FALSE = ("false", "0", "no", "off")
Value = bool | int | float | str  # a hyperparameter's, typed by its default


def boolean(text: str) -> bool | None:
    """`text` as a true/false setting reads it (TRUE, FALSE: in any case), None where it is neither."""
    if text.lower() in TRUE:
        return True
    if text.lower() in FALSE:
        return False
    return None


def _whole(text: str) -> int | None:
    return int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else None


def _finite(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


# A hyperparameter's type (its default's), one row each: its name, with its article, its --help metavar, how a
# value's text reads (None: not one of it) and what to use instead ({} is the default).
_KINDS: dict[type, tuple[str, str, str, Callable[[str], Value | None], str]] = {
    bool: ("bool", "a bool", "true|false", boolean, "use true or false"),
    int: ("int", "an int", "INT", _whole, "use a whole number, like {}"),
    float: ("float", "a float", "X", _finite, "use a finite number, like {}"),
    str: ("str", "a str", "TEXT", str, ""),
}


def env_name(name: str) -> str:
    """HP_ + a parameter's name in upper case: width -> HP_WIDTH."""
    return PREFIX + name.upper()


def flag_name(env: str) -> str:
    """A setting's flag: HP_WIDTH -> --hp-width, BATCH_SIZE -> --batch-size."""
    return "--" + env.lower().replace("_", "-")


@dataclass(frozen=True)
class HyperParameter:
    """One of build_model's keyword-only parameters with a default: its name, and the default that types it."""

    name: str
    default: Value

    @property
    def env(self) -> str:
        return env_name(self.name)

    @property
    def flag(self) -> str:
        return flag_name(self.env)

    @property
    def metavar(self) -> str:
        return _KINDS[type(self.default)][2]

    @property
    def help(self) -> str:
        a_kind = _KINDS[type(self.default)][1]
        return f"build_model's {self.name}, {a_kind} (env: {self.env}; default: {text(self.default)})."

    def parse(self, value: str) -> Value:
        """The value of `HP_<NAME>=value`, of the default's type. Raises SettingsError naming the setting and type."""
        _, a_kind, _, read, allowed = _KINDS[type(self.default)]
        parsed = read(value)
        if parsed is not None:
            return parsed
        raise SettingsError(
            f"{self.env}={value!r} is not allowed: build_model's {self.name} is {a_kind} (its default is "
            f"{text(self.default)}): {allowed.format(self.default)}"
        )


def taken_by(function: Callable, values: Iterable[tuple[str, Value]]) -> dict[str, Value]:
    """The hyperparameters `function` (build_model or phases) declares, of `values` ((name, value), ...): each of
    the two takes its own (every one where its signature cannot be read, or takes **keywords)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return dict(values)
    if any(each.kind is inspect.Parameter.VAR_KEYWORD for each in parameters.values()):
        return dict(values)
    return {name: value for name, value in values if name in parameters}


def text(value: Value) -> str:
    """A hyperparameter's value as a setting writes it: true/false for a bool, else as Python prints it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _function(tree: ast.Module, name: str = "build_model") -> ast.FunctionDef | None:
    """The module's own `def <name>` (the last one, as Python would keep), or None."""
    defined = (node for node in reversed(tree.body) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))
    return next((node for node in defined if node.name == name), None)


def _constants(tree: ast.Module) -> dict[str, object]:
    """The module's top-level `NAME = literal` assignments (any literal: `declared` checks the one a default names,
    `width=WIDTH`)."""
    constants: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                constants.pop(node.targets[0].id, None)
    return constants


def declared(tree: ast.Module, model: str) -> dict[str, HyperParameter] | None:
    """build_model's hyperparameters by setting name (HP_WIDTH), or None where the file has no `def build_model`
    (it imports or assigns it: nothing to read). Raises SettingsError for a keyword-only parameter that is neither
    `context` nor a hyperparameter of a type a setting can hold."""
    function = _function(tree)
    if function is None:
        return None
    found: dict[str, HyperParameter] = {}
    for each in (function, _function(tree, PHASES)):
        if each is not None:
            _declared_by(each, tree, model, found)
    return found


def _declared_by(function: ast.FunctionDef, tree: ast.Module, model: str, found: dict[str, HyperParameter]) -> None:
    """`function`'s keyword-only parameters into `found`: build_model's, then those of `phases` (a parameter both
    declare is one setting, with one default)."""
    constants, of = _constants(tree), function.name
    mine: set[str] = set()
    for argument, default in zip(function.args.kwonlyargs, function.args.kw_defaults, strict=True):
        name = argument.arg
        if name == CONTEXT:
            continue
        if default is None:
            raise SettingsError(
                f"MODEL={model!r}: {of}'s keyword-only parameter {name} has no default: give it one (it is then "
                f"the hyperparameter {env_name(name)}), or name it {CONTEXT} to get the run's facts"
            )
        try:
            value = constants[default.id] if isinstance(default, ast.Name) else ast.literal_eval(default)
        except (KeyError, ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            value, kind = None, "an expression"
        else:
            kind = "None" if value is None else f"a {type(value).__name__}"
        if type(value) not in _KINDS:
            raise SettingsError(
                f"MODEL={model!r}: {of}'s keyword-only parameter {name}={ast.unparse(default)} is {kind}, but "
                f"a hyperparameter ({env_name(name)}) is typed by its default: make it an int, float, bool or str "
                "literal (or a module constant holding one), or move the parameter before the `*`"
            )
        parameter = HyperParameter(name, value)
        if parameter.env in found and (parameter.env in mine or found[parameter.env].name != name):
            raise SettingsError(
                f"MODEL={model!r}: {of}'s {found[parameter.env].name} and {name} are both the setting "
                f"{parameter.env}: rename one"
            )
        if parameter.env in found and found[parameter.env] != parameter:
            raise SettingsError(
                f"MODEL={model!r}: build_model and {of} both take {name}, with other defaults "
                f"({text(found[parameter.env].default)}, {text(value)}): it is one setting, {parameter.env}: give "
                "them the same default"
            )
        mine.add(parameter.env)
        found[parameter.env] = parameter


def describe(hyperparameters: Mapping[str, HyperParameter] | None) -> str:
    """What build_model declares, for a message: "HP_WIDTH (int, 64), HP_DROPOUT (float, 0.1)"."""
    if not hyperparameters:
        return "none (its keyword-only parameters with defaults, like `*, width=64`, are its hyperparameters)"
    return ", ".join(
        f"{env} ({_KINDS[type(each.default)][0]}, {text(each.default)})" for env, each in hyperparameters.items()
    )


def resolve(
    hyperparameters: Mapping[str, HyperParameter] | None,
    layers: Iterable[tuple[str, Mapping[str, str]]],
    model: str,
) -> tuple[tuple[str, Value], ...]:
    """(parameter name, value) of each hyperparameter: the first layer that sets HP_<NAME> (flags, environment,
    ...), else its default. `layers`: (where, its values) from the highest precedence down.

    Raises SettingsError for an HP_ name that build_model does not declare (naming those it does), or a value not
    of its type."""
    layers = list(layers)
    for where, layer in layers:
        for name in layer:
            if name.startswith(PREFIX) and name not in (hyperparameters or {}):
                if hyperparameters is None:
                    reason = "its file has no `def build_model` whose signature could be read"
                else:
                    reason = f"build_model declares {describe(hyperparameters)}"
                raise SettingsError(f"{name} (from {where}) is not a hyperparameter of MODEL={model!r}: {reason}")
    values = []
    for env, each in (hyperparameters or {}).items():
        given = next((layer[env] for _, layer in layers if env in layer), None)
        values.append((each.name, each.default if given is None else each.parse(given)))
    return tuple(values)
