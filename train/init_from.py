"""INIT_FROM: where a new run's weights start, and INIT_LAYERS: which of its layers load.

The source is one object, chosen once from INIT_FROM's text (`init_source`): a run directory (`RunDir`), a
`.keras` file (`KerasFile`), a `.weights.h5` file (`WeightsFile`), a KerasHub preset (`Preset`: a folder, or a
name found in kagglehub's cache, train.presets), or nothing (`NoSource`). `check` says in one line, before
TensorFlow loads, what is wrong with it; `match` (after the model is built, before OUTPUT_DIR is written) pairs
its weights with the model's; `Matched.apply` assigns them once, before the step-0 checkpoint (train.resume), so
that an AUTO_BATCH retry or a resume restores them and never applies them again.

Matching: from a `.keras` file, a run or a preset, by layer name (a nested layer by its `layer.path`, as each
variable's path has it); from a `.weights.h5` file, by Keras's own paths (class and order), as
`load_weights(skip_mismatch=True)` reads them. A layer whose shapes differ is left as built and named.

No TensorFlow at import: keras (and keras_hub, for a preset) are imported inside the functions that load.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from train.errors import SettingsError, first_line
from train.phases import in_model
from train.presets import is_preset_dir, looks_like_name, resolve_preset
from train.rundir import checkpoints_newest_first

if TYPE_CHECKING:
    import keras
    import numpy as np

Json = dict[str, object]
Say = Callable[[str], None]
V = TypeVar("V")  # a value by variable: an array read, or the model's own variable
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# where train.checkpoints' Checkpoint keeps the model's variables: the trainable ones under the optimizer's
MODEL_KEYS = ("model/", "optimizer/_trainable_variables/")
BY_NAME = "by layer name"
BY_KERAS_PATH = "by Keras's own paths (class and order), as load_weights(skip_mismatch=True) reads them"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


@dataclass
class Matched:
    """The source's values paired with the model's variables, and what run.json records of it."""

    pairs: list[tuple[keras.Variable, np.ndarray]]
    record: Json  # run.json's and summary.json's "initialized_from"
    line: str  # the start line

    def apply(self, say: Say) -> Json:
        """Assign the values (on every replica: a cross-replica assign), say the start line; the record."""
        for variable, value in self.pairs:
            variable.assign(value)
        say(self.line)
        return self.record


@dataclass
class NoSource:
    """INIT_FROM empty: the weights start as build_model made them."""

    text: str = ""

    def check(self) -> None:
        return None

    def identity(self) -> str | None:
        return None

    def match(self, network: keras.Model, layers: tuple[str, ...]) -> Matched | None:
        return None


@dataclass
class _Weights:
    """A source of weights at a path (INIT_FROM's `text`), its identity the file's sha256 unless it says otherwise,
    its layers' weights matched to `network`'s as `matching` says: by layer name (a nested layer by its path)."""

    text: str
    path: Path
    matching: str = field(default=BY_NAME, init=False)

    def identity(self) -> str:
        return _sha256(self.path)

    def said(self) -> str:
        """INIT_FROM as the start line names it: its text, and for a run which weights of it."""
        return self.text

    def source_weights(self, network: keras.Model) -> dict[str, list[tuple[str, np.ndarray]]]:
        raise NotImplementedError

    def match(self, network: keras.Model, layers: tuple[str, ...]) -> Matched:
        return _matched(self, self.source_weights(network), network, layers)


class KerasFile(_Weights):
    """A `.keras` file, loaded with safe_mode on (no code from the file)."""

    def check(self) -> None:
        _check_file(self.text, self.path)
        if not zipfile.is_zipfile(self.path):
            raise SettingsError(
                f"INIT_FROM={self.text!r} is not a .keras file (not a zip archive): give a file "
                "model.save wrote, or a .weights.h5 file"
            )

    def source_weights(self, network: keras.Model) -> dict[str, list[tuple[str, np.ndarray]]]:
        import keras

        try:
            model = keras.saving.load_model(self.path, compile=False)  # safe_mode stays on
        except Exception as error:  # a damaged archive, a lambda, an unknown class: each one line
            raise SettingsError(f"INIT_FROM={self.text!r} cannot be loaded safely: {first_line(error, 200)}") from None
        return _by_layer((in_model(model.path, each.path), each.numpy()) for each in model.weights)


class RunDir(_Weights):
    """A run directory: where its MONITOR chose a best epoch and the run exported it (summary.json's "best" and
    "exported_model"), that epoch's weights, from its model.keras (as a `.keras` file loads, its identity the
    file's sha256); else its latest checkpoint's model weights, each found by its variable's path in the
    checkpoint's object graph (no model rebuilt); its identity, the run's weights sha256 (summary.json's, where
    it was written at that checkpoint), else the checkpoint's files' sha256."""

    def summary(self) -> Json:
        try:
            summary = json.loads((self.path / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return summary if isinstance(summary, dict) else {}

    def best(self) -> KerasFile | None:
        """The exported model.keras where it holds MONITOR's best epoch (else None: the latest checkpoint)."""
        summary, exported = self.summary(), self.path / "model.keras"
        best = summary.get("best")
        if not isinstance(best, dict) or not summary.get("exported_model") or not exported.is_file():
            return None
        monitor = next((key for key in best if key not in ("epoch", "step")), "?")
        return KerasFile(
            f"{self.text}: its best epoch {best.get('epoch')} (MONITOR={monitor}), from model.keras", exported
        )

    def latest(self) -> Path:
        newest = checkpoints_newest_first(self.path / "checkpoints")
        if not newest:
            raise SettingsError(
                f"INIT_FROM={self.text!r} is a run directory without a checkpoint: run it first, or "
                "give a .keras or .weights.h5 file"
            )
        return newest[0]

    def check(self) -> None:
        if self.best() is None:
            self.latest()

    def identity(self) -> str:
        if best := self.best():
            return best.identity()
        latest, summary = self.latest(), self.summary()
        if Path(str(summary.get("checkpoint"))).name == latest.name:
            return str(summary.get("weights_sha256"))
        digest = hashlib.sha256()
        for file in sorted(latest.parent.glob(f"{latest.name}.*")):
            digest.update(_sha256(file).encode())
        return digest.hexdigest()

    def source_weights(self, network: keras.Model) -> dict[str, list[tuple[str, np.ndarray]]]:
        import tensorflow as tf
        from tensorflow.core.protobuf import trackable_object_graph_pb2

        if best := self.best():
            return best.source_weights(network)
        latest = self.latest()
        try:
            reader = tf.train.load_checkpoint(str(latest))
            graph = trackable_object_graph_pb2.TrackableObjectGraph()
            graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
            # the model's variables: its trainable ones saved under the optimizer's, the others under the model's
            variables = {
                attribute.full_name: reader.get_tensor(attribute.checkpoint_key)
                for node in graph.nodes
                for attribute in node.attributes
                if attribute.checkpoint_key.startswith(MODEL_KEYS)
            }
        except Exception as error:  # a damaged or foreign checkpoint
            raise SettingsError(f"INIT_FROM={self.text!r}: {latest} cannot be read: {first_line(error, 200)}") from None
        return _by_layer(variables.items())

    def said(self) -> str:
        best = self.best()
        return best.text if best else self.text


class Preset(_Weights):
    """A KerasHub preset folder (resolved from a name in kagglehub's cache by train.presets): its backbone."""

    def check(self) -> None:
        self.path = resolve_preset(self.text, "INIT_FROM")

    def identity(self) -> str:
        digest = hashlib.sha256()
        for file in sorted(self.path.rglob("*")):
            if file.is_file():
                digest.update(f"{file.relative_to(self.path)}\0{_sha256(file)}\0".encode())
        return digest.hexdigest()

    def source_weights(self, network: keras.Model) -> dict[str, list[tuple[str, np.ndarray]]]:
        import keras_hub  # lazily: it imports TensorFlow, and is an extra (make setup EXTRAS=dev,hub)

        try:
            backbone = keras_hub.models.Backbone.from_preset(str(self.path))
        except Exception as error:
            raise SettingsError(
                f"INIT_FROM={self.text!r}: KerasHub cannot load the preset's backbone from {self.path}: "
                f"{first_line(error, 200)}"
            ) from None
        return _by_layer((in_model(backbone.path, each.path), each.numpy()) for each in backbone.weights)


@dataclass
class WeightsFile(_Weights):
    """A `.weights.h5` file, read as Keras's load_weights reads it: each layer's entry by Keras's path."""

    matching: str = field(default=BY_KERAS_PATH, init=False)

    def check(self) -> None:
        _check_file(self.text, self.path)
        with open(self.path, "rb") as stream:
            if stream.read(len(HDF5_MAGIC)) != HDF5_MAGIC:
                raise SettingsError(
                    f"INIT_FROM={self.text!r} is not a .weights.h5 file (not HDF5): give a file "
                    "model.save_weights wrote, or a .keras file"
                )

    def source_weights(self, network: keras.Model) -> dict[str, list[tuple[str, np.ndarray]]]:
        """What load_weights(skip_mismatch=True) would give each layer of `network`, by Keras's own walk of the
        file (class and order): {layer path: [(variable name, value), ...]}, read without assigning anything."""
        import numpy as np

        layers = [layer for layer in network._flatten_layers(include_self=True) if _own(layer)]
        read: dict[str, list[tuple[str, np.ndarray]]] = {}

        def reader(layer: keras.layers.Layer) -> Callable[[Mapping[str, np.ndarray]], None]:
            def load_own_variables(store: Mapping[str, np.ndarray]) -> None:  # what Keras hands the layer: its entry
                names = [variable.path.rpartition("/")[2] for variable in _own(layer)]
                values = [np.asarray(store[key]) for key in sorted(store.keys(), key=int)]
                names += [f"#{i}" for i in range(len(names), len(values))]
                read[in_model(network.path, layer.path)] = list(zip(names, values, strict=False))

            return load_own_variables

        for layer in layers:
            layer.load_own_variables = reader(layer)  # an instance's own: Keras's walk calls it in the class's place
        try:
            network.load_weights(self.path, skip_mismatch=True)
        except Exception as error:
            raise SettingsError(f"INIT_FROM={self.text!r} cannot be read: {first_line(error, 200)}") from None
        finally:
            for layer in layers:
                del layer.load_own_variables
        return read


Source = NoSource | KerasFile | RunDir | Preset | WeightsFile


def init_source(text: str) -> Source:
    """INIT_FROM's source, chosen once from its text (not checked: `check` says what is wrong with it)."""
    path = Path(text).expanduser()
    if not text:
        return NoSource()
    if text.endswith(".weights.h5"):
        return WeightsFile(text, path)
    if text.endswith(".keras"):
        return KerasFile(text, path)
    if path.is_dir() and ((path / "checkpoints").is_dir() or (path / "model.keras").exists()):
        return RunDir(text, path)
    if is_preset_dir(path) or (not path.exists() and looks_like_name(text)):
        return Preset(text, path)
    if path.is_dir():
        raise SettingsError(
            f"INIT_FROM={text!r} is a folder, but neither a run directory (checkpoints/ or model.keras) nor a KerasHub "
            "preset (config.json and metadata.json)"
        )
    raise SettingsError(
        f"INIT_FROM={text!r} is not allowed: give a run directory, a .keras or .weights.h5 file, or a KerasHub preset "
        "(a folder, or a name in the kagglehub cache)" + ("" if path.exists() else f"; {path} does not exist")
    )


def _check_file(text: str, path: Path) -> None:
    if not path.is_file():
        where = "does not exist" if not path.exists() else "is not a file"
        raise SettingsError(f"INIT_FROM={text!r}: {path} {where} (from {Path.cwd()})")


def check_init_from(init_from: str, init_layers: tuple[str, ...], recorded: Json, trained: bool) -> None:
    """INIT_FROM before TensorFlow loads: another INIT_FROM than the run directory's is refused (it defines the
    run: run.json records it); a new run's source is checked. `recorded`: run.json; `trained`: it holds
    checkpoints. Raises SettingsError."""
    was = recorded.get("initialized_from")
    before = was.get("source", "") if isinstance(was, dict) else ""
    if trained and before != init_from:
        raise SettingsError(
            f"INIT_FROM={init_from!r}, but this run directory started from {before or 'the weights build_model made'}"
            f"{'' if before else ' (INIT_FROM empty)'}: it defines the run. Set INIT_FROM={before!r} to go on with it, "
            "or use another OUTPUT_DIR"
        )
    if not trained:
        init_source(init_from).check()
    if init_layers and not init_from:
        raise SettingsError(f"INIT_LAYERS={','.join(init_layers)!r} is set but INIT_FROM is empty: nothing loads")


def _by_layer(variables: Iterable[tuple[str, V]]) -> dict[str, list[tuple[str, V]]]:
    """{layer path: [(variable name, value), ...]} from (variable path, value) pairs (a nested layer's path in it),
    a random layer's state left out (the run's seeds own it)."""
    found: dict[str, list[tuple[str, V]]] = {}
    for path, value in variables:
        layer, _, name = path.rpartition("/")
        if "seed_generator" not in path:
            found.setdefault(layer, []).append((name, value))
    return found


def _own(layer: keras.layers.Layer) -> list[keras.Variable]:
    """A layer's own variables, in the order Keras saves them (keras.layers.Layer.load_own_variables)."""
    return [*layer._trainable_variables, *layer._non_trainable_variables]


def _aligned(
    weights: dict[str, list[tuple[str, np.ndarray]]], here: dict[str, list[keras.Variable]]
) -> dict[str, list[tuple[str, np.ndarray]]]:
    """The source's layers by this model's paths: a path as it is, or, where only that matches, without its first
    part (a checkpoint's Sequential holds `sequential/head`, whatever name this model's Sequential has)."""
    aligned = {path: values for path, values in weights.items() if path in here}
    for path, values in weights.items():
        rest = path.partition("/")[2]
        if path not in here and rest in here and rest not in aligned:
            aligned[rest] = values
    return aligned


def _matched(
    source: Source, weights: dict[str, list[tuple[str, np.ndarray]]], network: keras.Model, layers: tuple[str, ...]
) -> Matched:
    """The source's layers paired with `network`'s by path, within INIT_LAYERS; shapes that differ left out."""
    by_layer = _by_layer((in_model(network.path, each.path), each) for each in network.weights)
    here = {path: [variable for _, variable in each] for path, each in by_layer.items()}
    weights = _aligned(weights, here)
    chosen = [path for path in here if not layers or any(fnmatch.fnmatchcase(path, glob) for glob in layers)]
    if layers and not chosen:
        raise SettingsError(
            f"INIT_LAYERS={','.join(layers)!r} matches no layer of this model: its layers are {', '.join(here)}"
        )
    pairs, loaded, left_out = [], [], {}
    for path in chosen:
        theirs = dict(weights.get(path, []))
        if not theirs:
            continue
        ours = here[path]
        names = [variable.path.rpartition("/")[2] for variable in ours]
        differ = [
            name
            for name, variable in zip(names, ours, strict=True)
            if name not in theirs or tuple(theirs[name].shape) != tuple(variable.shape)
        ]
        if differ or len(theirs) != len(ours):
            name = differ[0] if differ else names[0]
            there = _shape(theirs[name].shape) if name in theirs else "none"
            left_out[path] = f"{name} {there}, here {_shape(tuple(dict(zip(names, ours, strict=True))[name].shape))}"
            continue
        pairs += [(variable, theirs[name]) for name, variable in zip(names, ours, strict=True)]
        loaded.append(path)
    if not loaded:
        raise SettingsError(
            f"INIT_FROM={source.text!r} loads nothing into this model ({source.matching}"
            f"{', INIT_LAYERS=' + ','.join(layers) if layers else ''}): its layers are "
            f"{', '.join(weights) or 'none'}; this model's are {', '.join(chosen)}"
            + (f"; shapes differ: {'; '.join(f'{k} ({v})' for k, v in left_out.items())}" if left_out else "")
        )
    record = {
        "source": source.text,
        "identity": source.identity(),
        "matching": source.matching,
        "loaded": loaded,
        "left_out": left_out,
    }
    line = f"INIT_FROM={source.said()}: {len(loaded)} layer(s) loaded, matched {source.matching}"
    if left_out:
        line += "; left out: " + ", ".join(f"{path} ({shapes})" for path, shapes in left_out.items())
    return Matched(pairs, record, line + ".")
