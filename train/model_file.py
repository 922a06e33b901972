"""MODEL's file: the functions a fork defines, loaded once a process.

    build_model(input_shape, num_classes, learning_rate) -> a compiled keras.Model      (required)
    preprocess(example, training, seed) -> (inputs, label)                              (optional)
    build_callbacks(context) -> a list of keras.callbacks.Callback                       (optional)
    build_hooks(context) -> a list of train.hooks.Hook: the fork's own between the calls  (optional)
    export_model(model) -> the keras.Model to export in the trained model's place        (optional)
    adapt(context): fits the layers preprocess uses, on the raw training data (train.data.adapt)  (optional)
    phases(context, *, ...) -> a list of train.Phase(epochs, trainable, learning_rate)    (optional)

`phases` splits the run into phases (train.phases): each `Phase(epochs, trainable, learning_rate)` lasts `epochs`
(int >= 1; the last one lasts to the run's end); `trainable` is "all" or None (every layer as build_model left it)
or globs on layer paths (a str or a list of str; a layer matched trains with its nested layers, the others are
frozen); `learning_rate` is a float > 0 (a constant rate is set to it, a schedule scaled by it / LEARNING_RATE)
or None (the optimizer's own). Its keyword-only parameters are HP_ settings, as build_model's are (a parameter
both declare is one setting). `from train import Phase` imports no TensorFlow. It and FREEZE are exclusive.

`build_model` is what train.model calls (its keyword-only parameters: hyperparameters, train.hparams, and
`context`, train.context); `preprocess` is what the data path (train.data.examples) runs per example, in
tf.data, in training, evaluation and the export; `build_callbacks` gives the callbacks the loop calls
(train.callbacks), `build_hooks` hooks of the engine's own kind (train.hooks; docs/fork.md, Hooks).
examples/mlp.py, examples/resnet.py and examples/early_stopping.py say each in full.

| concern                                     | where                                                      |
|---------------------------------------------|------------------------------------------------------------|
| where MODEL's file is                       | `is_model_path`, `model_source`                            |
| the documented model on a table             | `model_for_data` (TABLE_MODEL: examples/mlp_table.py)      |
| its syntax tree and hash (nothing imported) | `model_tree`, `model_fingerprint`                          |
| build_model's hyperparameters (the same)    | `model_hyperparameters` (train.hparams reads the tree)     |
| its functions, imported once per version    | `load_model_file`, `Experiment`, `OPTIONAL_SEAMS`          |
| whether a built model brings its own step   | `Experiment.own_train_step`, `own_test_step` (`overrides`) |

Nothing here imports TensorFlow (Keras is imported by `overrides`, called on a built model), nor train.settings:
the settings' validation reads MODEL's file through this module before TensorFlow loads.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from train import hparams
from train.errors import SettingsError, first_line

if TYPE_CHECKING:
    import keras

DEFAULT_MODEL = "examples.mlp"  # the documented model: Dense(64, relu) -> Dense(num_classes, softmax)
TABLE_MODEL = "examples.mlp_table"  # ... on a table: behind a preprocessing adapted on the train split
TABULAR_TEXT_EXAMPLE = "examples/tabular_text.py"  # a table's text column, with preprocess and adapt
RESNET_EXAMPLE = "examples/resnet.py"  # where a fork finds a preprocess to start from
PHASES_DOC = "docs/fork.md, Phases: freeze, then unfreeze"  # ... and phases


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def is_model_path(text: str) -> bool:
    """MODEL names a file when it has a / or ends in .py; otherwise it is a module name."""
    return "/" in text or text.endswith(".py")


def model_for_data(text: str, table: bool) -> str:
    """MODEL as it trains on DATASET: the documented model (DEFAULT_MODEL, as a module or its file) on a `table`
    (a CSV or JSON Lines path) is TABLE_MODEL, the same MLP behind the preprocessing a table's columns need (it
    cannot take them as they are); any other MODEL is as given."""
    if not table:
        return text
    default, given = model_source(DEFAULT_MODEL), model_source(text)
    same = default is not None and given is not None and default.resolve() == given.resolve()
    return TABLE_MODEL if same else text


def model_source(text: str) -> Path | None:
    """The file MODEL names (a path, or a module's source), None where it cannot be found. Imports nothing but a
    module's parent packages (their `__init__`), so no TensorFlow."""
    if is_model_path(text):
        path = Path(text).expanduser()
        return path if path.is_file() else None
    if not _MODULE.fullmatch(text):
        return None
    try:
        spec = importlib.util.find_spec(text)
    except (ImportError, ValueError):  # a parent package that does not exist
        return None
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def model_fingerprint(text: str) -> str:
    """sha256 of MODEL's code: its syntax tree, so comments and formatting may change but the code may not.

    Raises SettingsError for a file that is gone, cannot be read or does not parse: the file, the line, the message.
    """
    return hashlib.sha256(ast.dump(model_tree(text)).encode()).hexdigest()


def model_hyperparameters(text: str) -> dict[str, hparams.HyperParameter] | None:
    """build_model's hyperparameters by setting name (HP_WIDTH), from MODEL's syntax tree (None: the file has no
    `def build_model` to read). Raises SettingsError as `model_fingerprint` does, and for a keyword-only parameter
    that cannot be a setting."""
    return hparams.declared(model_tree(text), text)


def model_tree(text: str) -> ast.Module:
    """MODEL's syntax tree, parsed once per version of the file (validation, the fingerprint and the hyperparameters
    all read it). Raises SettingsError as `model_fingerprint` says."""
    source = model_source(text)
    if source is None:
        raise SettingsError(f"MODEL={text!r} is no longer a file (from {Path.cwd()}): put it back, or set MODEL again")
    try:
        data = source.read_bytes()
        key = (str(source.resolve()), hashlib.sha256(data).hexdigest())
        if key not in _TREES:  # bytes: Python's own rules for the encoding
            _TREES[key] = ast.parse(data, filename=key[0])
    except OSError as error:
        raise SettingsError(f"MODEL={text!r}: {source} cannot be read ({error.strerror})") from None
    except SyntaxError as error:  # IndentationError, a null byte and text that is not UTF-8 included
        where = f"{source}, line {error.lineno}" if error.lineno else str(source)
        raise SettingsError(f"MODEL={text!r} does not parse: {where}: {error.msg}") from None
    except (RecursionError, MemoryError, ValueError) as error:  # nesting too deep for the parser, and the like
        raise SettingsError(f"MODEL={text!r} does not parse: {source}: {type(error).__name__}") from None
    return _TREES[key]


_TREES: dict[tuple[str, str], ast.Module] = {}  # (resolved path, sha256 of its bytes): a changed file is parsed again


@dataclass(frozen=True)
class Experiment:
    """MODEL's file, loaded once (`load_model_file`) and passed down: the model (`build_model`), `preprocess`,
    `adapt`, the callbacks (`build_callbacks`), `export_model`, and whether the model brings its own step
    (`own_train_step`, `own_test_step`: train.model.build traces the model's own once)."""

    text: str  # MODEL as given
    build_model: Callable
    preprocess: Callable | None = None
    build_callbacks: Callable | None = None
    build_hooks: Callable | None = None  # the fork's own hooks (train.hooks), called where the engine's are
    export_model: Callable | None = None  # a GAN's: its generator (examples/gan.py)
    adapt: Callable | None = None
    phases: Callable | None = None  # phases(context, *, ...) -> a list of train.Phase (train.phases, train.phased)
    # the imported file: its globals hold the layers `preprocess` uses (train.data.adapt)
    module: ModuleType | None = None

    @staticmethod
    def own_train_step(network: keras.Model) -> bool:
        """Whether the model built from this file brings its own `train_step` (its class or a base below
        keras.Model): it is then the training step, and what holds only for the engine's own step (gradient
        micro-batches) does not apply."""
        return overrides(network, "train_step")

    @staticmethod
    def own_test_step(network: keras.Model) -> bool:
        """Whether the model built from this file brings its own `test_step`: it is then evaluation's step."""
        return overrides(network, "test_step")


# The MODEL file's optional functions: what each must be, and the example that shows it.
OPTIONAL_SEAMS = {
    "preprocess": ("preprocess(example, training, seed) -> (inputs, label)", RESNET_EXAMPLE),
    "build_callbacks": ("build_callbacks(context) -> a list of keras.callbacks.Callback", "examples/early_stopping.py"),
    "build_hooks": ("build_hooks(context) -> a list of train.hooks.Hook", "docs/fork.md, Hooks"),
    "export_model": ("export_model(model) -> the keras.Model to export", "examples/gan.py"),
    "adapt": ("adapt(context) that fits the layers preprocess uses on context.examples(n)", "examples/text.py"),
    "phases": ("phases(context, *, ...) -> a list of train.Phase", PHASES_DOC),
}


# The imported MODEL files, by (resolved path, sha256 of its bytes), or by the module's name: a file changed or
# replaced at the same path within one process (the fuzz driver's cases, a notebook) is imported again, and the
# same file is imported once, so the layers `adapt` fits stay those `preprocess` reads.
_MODULES: dict[tuple[str, str], ModuleType] = {}


def load_model_file(text: str) -> Experiment:
    """MODEL's file as an Experiment, its module imported once a process per version of the file (so the layers
    `adapt` fits are those `preprocess` reads, wherever it is loaded). Raises SettingsError."""
    try:
        module = _import(text)
    except SettingsError:
        raise
    except Exception as error:
        raise SettingsError(
            f"MODEL={text!r} could not be imported ({type(error).__name__}: {first_line(error, 200)})"
        ) from None
    build = getattr(module, "build_model", None)
    if not callable(build):
        raise SettingsError(
            f"MODEL={text!r} has no build_model: define build_model(input_shape, num_classes, learning_rate) "
            "returning a compiled keras.Model (see examples/mlp.py)"
        )
    seams = {}
    for name, (signature, example) in OPTIONAL_SEAMS.items():
        seams[name] = getattr(module, name, None)
        if seams[name] is not None and not callable(seams[name]):
            raise SettingsError(
                f"MODEL={text!r}: {name} is a {type(seams[name]).__name__}, not a function: define {signature} "
                f"(see {example})"
            )
    return Experiment(text, build, module=module, **seams)


# What MIXED_PRECISION=auto gives a model's own train_step where it would be mixed_float16 (train.start, the doctor)
OWN_STEP_PRECISION = (
    "float32, not mixed_float16, for a model's own train_step (its loss scale would judge each replica's "
    "gradients alone); mixed_bfloat16 needs compute capability 8.0+"
)


def _import(text: str) -> ModuleType:
    if not is_model_path(text):
        key = ("module", text)
        if key not in _MODULES:
            _MODULES[key] = importlib.import_module(text)
        return _MODULES[key]
    path = Path(text).expanduser().resolve()
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SettingsError(f"MODEL={text!r}: {path} cannot be read ({error.strerror})") from None
    key = (str(path), hashlib.sha256(data).hexdigest())
    if key not in _MODULES:
        if str(path.parent) not in sys.path:  # as Python runs a script: a module beside the file imports by name
            sys.path.insert(0, str(path.parent))
        name = f"train_model_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # so the classes it defines can be found again by name
        exec(compile(data, str(path), "exec"), module.__dict__)  # the bytes hashed, not a later version of them
        _MODULES[key] = module
    return _MODULES[key]


# What the engine's loop replaces: a model that overrides one of these would not run as written.
UNRUNNABLE = ("fit", "train_on_batch", "make_train_function")


def refuse_step(experiment: Experiment, network: keras.Model, mixed_precision: str, labeled: bool) -> None:
    """What neither step can run, refused as soon as build_model returns. Raises SettingsError for a model that
    overrides what the engine's loop replaces; for one with its own train_step, mixed_float16 set by hand (its loss
    scale would judge each replica's gradients alone: MIXED_PRECISION=auto passes, train.start builds it again in
    float32); for one without it, LABEL_KEY=none (the engine's step fits the output to labels)."""
    import keras

    model = experiment.text
    for name in UNRUNNABLE:
        if overrides(network, name):
            raise SettingsError(
                f"MODEL={model!r}: {type(network).__name__} overrides {name}, which the engine does not call "
                "(it runs its own loop of train_step calls on every replica): override train_step (and test_step) "
                "instead"
            )
    if not overrides(network, "train_step"):
        if not labeled:
            raise SettingsError(
                f"LABEL_KEY=none gives MODEL={model!r} its inputs alone, but the model has no train_step of its own "
                "and the engine's step fits the output to labels: override train_step(self, data) "
                "(examples/dcgan.py), or set LABEL_KEY to the label"
            )
    elif keras.mixed_precision.global_policy().name == "mixed_float16" and mixed_precision != "auto":
        raise SettingsError(
            f"MIXED_PRECISION=mixed_float16 is not allowed with MODEL={model!r}'s own train_step: its loss "
            "scale would judge each replica's gradients alone; use MIXED_PRECISION=mixed_bfloat16 (compute "
            "capability 8.0+) or off"
        )


def overrides(model: keras.Model | type, name: str) -> bool:
    """Whether `model` (a model or its class), or a base class below keras.Model, defines `name` itself."""
    import keras

    for cls in (model if isinstance(model, type) else type(model)).__mro__:
        if cls is keras.Model:
            return False
        if name in vars(cls):
            return True
    return False
