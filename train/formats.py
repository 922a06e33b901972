"""`python -m train formats`: the run's `model.keras` as ONNX and LiteRT, each run in its own runtime and compared
with the Keras model before it is kept; `--quantize int8` adds the smaller model and its cost in accuracy.

    python -m train formats --output-dir runs/default --format onnx,litert
    python -m train formats --output-dir runs/default --format litert --quantize int8

RUN/formats/ holds `model.onnx`, `model.tflite` (and `model.int8.onnx`, `model.int8.tflite`) and `formats.json`:
each artifact's file, size, inputs and outputs, the class names and the parity figures. Each artifact takes what
`model.keras` takes (what `preprocess` returns, under the same input names) and returns its numeric outputs, named
as train.outputs names them without `classes` (formats.json lists the class names in order): `saved_model/`
stays the way to serve raw inputs. The folder is staged as `formats.tmp/` and replaced whole, as `saved_model/`.

Parity is checked, never assumed: up to PARITY_EXAMPLES inputs (the eval split's, after `preprocess`; seeded
random ones for what MODEL's `export_model` returns) at batch 1 and at the largest batch, against `model.keras`
(in float32: ONNX needs a float32 policy, so a mixed-precision model is rebuilt in float32 and its gap to the
mixed one reported beside). Over `atol` nothing of that format is kept (TrainingError, exit 1). What a format
cannot carry (a string input, a lookup inside the model, a model with nothing to quantize) is one line, exit 2,
with nothing written (SettingsError).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from train.errors import SettingsError, TrainingError, first_line
from train.hooks import Json, Say
from train.outputs import OUTPUTS, SCORES, class_names, label_kind, name_outputs
from train.rundir import write_json

if TYPE_CHECKING:
    import keras

    from train.data.source import Data
    from train.data.spec import DatasetSpec
    from train.model import Built

Arrays = dict[str, np.ndarray]  # a batch of inputs or outputs, by name
Runner = Callable[[Arrays], Arrays]

FORMATS = {"onnx": "model.onnx", "litert": "model.tflite"}  # each format's file in RUN/formats/ (parse.FORMATS)
QUANTIZED = {"onnx": "model.int8.onnx", "litert": "model.int8.tflite"}
MODULES = ("tf2onnx", "onnx", "onnxruntime", "ai_edge_litert")  # the formats extra
FOLDER, STAGING, RECORD = "formats", "formats.tmp", "formats.json"
PARITY_EXAMPLES = 256
ACCURACY_EXAMPLES = 2048  # the eval split's first examples, scored by the float and the int8 artifact
ATOL = 1e-4
_ONNX_TYPES = {"float": "float32", "double": "float64"}  # onnxruntime's tensor(T): T, named as NumPy names it
# How an int8 model's accuracy is told from its float one's, by the label's kind (train.outputs): the measure's
# name, the output it reads, and the measure on (outputs, labels).
MEASURES = {
    "class": ("accuracy", SCORES, lambda scores, labels: np.mean(np.argmax(scores, axis=-1) == labels.reshape(-1))),
    "multi_hot": ("binary_accuracy", SCORES, lambda scores, labels: np.mean((scores > 0.5) == (labels > 0.5))),
    "value": ("mae", OUTPUTS, lambda values, labels: np.mean(np.abs(values.reshape(labels.shape) - labels))),
}
STRINGS_FIX = "keep text and lookups in preprocess (outside the model), as examples/text.py does"
# Layers of Keras that hold a lookup table or take strings: neither converter takes their ops.
LOOKUPS = ("TextVectorization", "StringLookup", "IntegerLookup", "Hashing", "HashedCrossing")


def check_can_convert(output_dir: Path | None) -> None:
    """What `formats` (and fit's EXPORT_FORMATS: no `output_dir`) needs before TensorFlow loads: the formats extra,
    and model.keras. Raises SettingsError."""
    if missing := [name for name in MODULES if importlib.util.find_spec(name) is None]:
        raise SettingsError(
            f"converting to ONNX and LiteRT needs {', '.join(missing)} (the formats extra): make setup "
            "EXTRAS=dev,formats"
        )
    if output_dir is not None and not (output_dir / "model.keras").is_file():
        raise SettingsError(f"OUTPUT_DIR={output_dir} has no model.keras to convert: run fit to its end first")


@dataclass(frozen=True)
class Inputs:
    """What every artifact and the Keras model are run on: arrays by input name, the labels (None: random inputs,
    or LABEL_KEY=none), and where they came from, in words."""

    arrays: Arrays
    count: int  # examples in each array
    labels: np.ndarray | None
    origin: str

    def first(self, count: int) -> Arrays:
        return {name: array[:count] for name, array in self.arrays.items()}


def convert(
    built: Built, data: Data, output_dir: Path, names: tuple[str, ...], quantize: str | None, atol: float, say: Say
) -> Json:
    """Convert OUTPUT_DIR/model.keras to each format in `names` (`built`: the run's model, built, for its outputs'
    names and its eval split's inputs), check each against it, write RUN/formats/; formats.json's content."""
    wrapper, inputs, reference, record = _opened(built, data, output_dir, names, quantize, atol, say)
    staging, failed, artifacts = output_dir / STAGING, [], {}
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        for name in names:
            path = staging / FORMATS[name]
            _write(name, wrapper, path, built.experiment.text)
            entry = _check(name, path, inputs, reference, built.experiment.text)
            if (gap := entry["parity"]["max_abs_difference"]) > atol:
                failed.append(f"{name}'s {entry['parity']['output']!r} differs from model.keras by {gap:.2e}")
                path.unlink()
                continue
            artifacts[name] = entry
            if quantize:
                artifacts[f"{name}.{quantize}"] = _quantized(
                    name, wrapper, path, inputs, built.spec, built.experiment.text
                )
        for entry in artifacts.values():
            say(_line(entry, inputs.origin, atol))
        if artifacts:  # else formats/ stays as it was
            write_json(staging / RECORD, record | {"artifacts": artifacts})
            shutil.rmtree(output_dir / FOLDER, ignore_errors=True)
            os.replace(staging, output_dir / FOLDER)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if failed:
        raise TrainingError(
            f"{', '.join(failed)}: over the tolerance {atol:g} against model.keras, so nothing of it is kept; the "
            "converter or its runtime changed the model's outputs (raise --atol only if that gap is acceptable)"
        )
    return record | {"artifacts": artifacts}


def _opened(
    built: Built, data: Data, output_dir: Path, names: tuple[str, ...], quantize: str | None, atol: float, say: Say
) -> tuple[keras.Model, Inputs, Arrays, Json]:
    """model.keras loaded, checked, made float32 and named (`_named`), the inputs to check it on, its outputs on
    the first PARITY_EXAMPLES of them (the reference), and the record's head: where the inputs came from, the class
    names, and a mixed-precision model's gap to its float32 rebuild."""
    import keras

    from train.exportable import model_to_export

    check_convertible(built, names, quantize)
    own = model_to_export(built)
    model, mixed = _float32(keras.saving.load_model(output_dir / "model.keras"))  # safe_mode on, as evaluate
    _constants(model)
    wrapper = _named(model, own or built.network, built.spec)
    inputs = _inputs(model, data, built.spec.labeled, random=own is not None)
    reference, gap = _run_keras(wrapper, inputs.first(PARITY_EXAMPLES)), None
    if mixed:
        gap = _gap(
            _run_keras(_named(mixed, own or built.network, built.spec), inputs.first(PARITY_EXAMPLES)), reference
        )
        say(
            f"model.keras computes in mixed precision: converted in float32, whose outputs differ from it by up to "
            f"{gap['max_abs_difference']:.1e} ({gap['output']})"
        )
    return (
        wrapper,
        inputs,
        reference,
        {
            "model": "model.keras",
            "inputs_from": inputs.origin,
            "classes": list(class_names(built.spec)) if label_kind(built.spec) in ("class", "multi_hot") else [],
            "atol": atol,
            "mixed_precision_gap": gap,
        },
    )


def _float32(loaded: keras.Model) -> tuple[keras.Model, keras.Model | None]:
    """`loaded` in float32: itself, or a rebuild of it in float32 with its weights (then the mixed one beside)."""
    import keras

    if loaded.dtype_policy.name == "float32":  # the global policy the model was built under: every layer's
        return loaded, None
    text = re.sub(r'"mixed_(float16|bfloat16)"', '"float32"', json.dumps(keras.saving.serialize_keras_object(loaded)))
    rebuilt = keras.saving.deserialize_keras_object(json.loads(text))
    rebuilt.set_weights(loaded.get_weights())
    return rebuilt, loaded


def _named(model: keras.Model, network: keras.Model, spec: DatasetSpec) -> keras.Model:
    """`model` taking one dict by input name (the names the artifacts take) and returning its numeric outputs,
    named as train.outputs names them."""
    import keras

    structure = _input_structure(model)
    flat = keras.tree.flatten(structure)
    inputs = {each.name: keras.Input(batch_shape=each.shape, dtype=each.dtype, name=each.name) for each in flat}
    output = model(keras.tree.pack_sequence_as(structure, [inputs[each.name] for each in flat]), training=False)
    wrapper = keras.Model(inputs, name_outputs(network, spec, with_classes=False)(output), name=model.name)
    wrapper({name: np.zeros((1, *each.shape[1:]), each.dtype) for name, each in inputs.items()})  # export needs it
    return wrapper


def _input_structure(model: keras.Model) -> keras.KerasTensor | list[keras.KerasTensor] | dict[str, keras.KerasTensor]:
    """The model's Inputs as it takes them (one, a list or a dict); a Sequential loaded from model.keras, built
    but never called, has no `input`: its one Input."""
    import keras

    return model.inputs[0] if isinstance(model, keras.Sequential) else model.input


def _constants(model: keras.Model) -> None:
    """Each layer's state held as a tensor outside its variables (Normalization's mean and variance, set after
    `adapt`) made a NumPy array, which a traced function holds as a constant: tf2onnx would take such a captured
    tensor for one more input of the ONNX graph."""
    import tensorflow as tf

    from train.keras_seams import all_layers

    for layer in all_layers(model):
        for key, value in list(vars(layer).items()):
            if isinstance(value, tf.Tensor):  # an EagerTensor; a variable is not a tf.Tensor
                setattr(layer, key, value.numpy())


def check_convertible(built: Built, names: tuple[str, ...], quantize: str | None = None) -> None:
    """What the formats cannot carry, said before anything is written (by fit, before the first step): a string
    input, a lookup inside the model, nothing to quantize. Raises SettingsError."""
    from train.exportable import model_to_export
    from train.keras_seams import all_layers

    model, text, listed = model_to_export(built) or built.serving, built.experiment.text, " and ".join(names)
    for each in model.inputs if names else ():
        if each.dtype == "string":
            raise SettingsError(f"MODEL={text!r}: {listed} cannot take the string input {each.name!r}: {STRINGS_FIX}")
    for layer in all_layers(model) if names else ():
        if type(layer).__name__ in LOOKUPS:
            raise SettingsError(
                f"MODEL={text!r}: {listed} cannot carry the layer {layer.name!r} ({type(layer).__name__}), a lookup "
                f"inside the model: {STRINGS_FIX}"
            )
    if quantize and not any(len(weight.shape) >= 2 for weight in model.weights):
        raise SettingsError(
            f"MODEL={text!r}: --quantize {quantize} has nothing to quantize (no layer with a weight matrix: Dense, "
            "convolution, embedding); convert without --quantize"
        )


def _inputs(model: keras.Model, data: Data, labeled: bool, random: bool) -> Inputs:
    """The eval split's first examples as `model.keras` takes them, with their labels; or seeded random inputs of
    the model's input spec (`random`: what `export_model` returned takes something else, like a GAN's noise)."""
    import keras
    import tensorflow as tf

    from train.data.feeds import eval_dataset

    specs = keras.tree.flatten(_input_structure(model))  # in the order of the eval split's features, flattened
    if random or not len(data.eval):
        generator = np.random.default_rng(0)
        arrays = {e.name: generator.standard_normal((PARITY_EXAMPLES, *e.shape[1:])).astype(e.dtype) for e in specs}
        return Inputs(
            arrays, PARITY_EXAMPLES, None, f"{PARITY_EXAMPLES} seeded random inputs of the model's input spec"
        )
    batch = min(len(data.eval), ACCURACY_EXAMPLES)
    one_batch = eval_dataset(tf.distribute.OneDeviceStrategy("/cpu:0"), data.eval, batch)[0]  # in order
    features, labels = next(iter(one_batch))
    arrays = {  # each cast to its Input's dtype, as Keras casts what a functional model is given
        each.name: np.asarray(tensor).astype(each.dtype)
        for each, tensor in zip(specs, tf.nest.flatten(features), strict=True)
    }
    return Inputs(arrays, batch, np.asarray(labels) if labeled else None, "the eval split, after preprocess")


def _run_keras(model: keras.Model, arrays: Arrays) -> Arrays:
    return {name: np.asarray(value) for name, value in model(arrays, training=False).items()}


def _gap(outputs: Arrays, reference: Arrays) -> dict[str, float | str]:
    """The largest absolute difference between two runs' outputs, and the output where it is."""
    gaps = {name: float(np.max(np.abs(outputs[name].astype(np.float64) - value))) for name, value in reference.items()}
    worst = max(gaps, key=gaps.get)
    return {"max_abs_difference": gaps[worst], "output": worst}


def _runner(name: str, path: Path) -> tuple[Runner, Json]:
    """The artifact at `path` in its own runtime (onnxruntime, or the LiteRT interpreter's signature runner), and
    its inputs and outputs as it declares them."""
    if name == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        found = {"inputs": session.get_inputs(), "outputs": session.get_outputs()}
        declared = {key: [_tensor(each.name, each.shape, each.type[7:-1]) for each in found[key]] for key in found}
        names = [each["name"] for each in declared["outputs"]]
        return (lambda arrays: dict(zip(names, session.run(names, arrays), strict=True))), declared
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner()
    found = {"inputs": runner.get_input_details(), "outputs": runner.get_output_details()}
    declared = {
        key: [
            _tensor(each, value["shape_signature"], np.dtype(value["dtype"]).name) for each, value in found[key].items()
        ]
        for key in found
    }
    return (lambda arrays: runner(**arrays)), declared


def _tensor(name: str, shape: list, dtype: str) -> Json:
    """An artifact's input or output as formats.json records it: its name, shape (None: any size) and dtype."""
    return {
        "name": name,
        "shape": [int(dim) if isinstance(dim, int | np.integer) and dim >= 0 else None for dim in shape],
        "dtype": _ONNX_TYPES.get(dtype, dtype),
    }


def _write(name: str, wrapper: keras.Model, path: Path, text: str, quantized: Path | None = None) -> None:
    """`wrapper` to `path` in format `name` (and its int8 model to `quantized`). Raises SettingsError for what
    the converter cannot take."""
    import tensorflow as tf

    with _refusing(f"{name} cannot carry this model", text):
        if quantized is None:
            wrapper.export(str(path), format="onnx" if name == "onnx" else "litert", verbose=False)
        elif name == "onnx":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8)
        else:
            # dynamic-range quantization: int8 weights, float activations
            wrapper.export(str(quantized), format="litert", verbose=False, optimizations=[tf.lite.Optimize.DEFAULT])


@contextlib.contextmanager
def _refusing(what: str, text: str) -> Iterator[None]:
    """A converter or a runtime at work: its Python warnings held back (tf2onnx's, the quantizer's advice), and
    what it raises made one line, `what` the model cannot (SettingsError): each raises its own kind."""
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(action="ignore"):
            yield
    except Exception as error:  # ValueError, RuntimeError, the converter's ConverterError, onnxruntime's own
        raise SettingsError(
            f"MODEL={text!r}: {what} ({type(error).__name__}: {first_line(error, 200)}); nothing was written"
        ) from None
    finally:
        logging.disable(logging.NOTSET)


def _check(name: str, path: Path, inputs: Inputs, reference: Arrays, text: str) -> Json:
    """Run the artifact at batch 1 and at the largest batch on the parity inputs; its record for formats.json."""
    count = min(inputs.count, PARITY_EXAMPLES)
    with _refusing(f"{name} cannot run this model in its runtime", text):  # an op it lacks (LiteRT's Flex ops)
        run, declared = _runner(name, path)
        whole = run(inputs.first(count))
        ones = [run({key: array[i : i + 1] for key, array in inputs.first(count).items()}) for i in range(count)]
    singles = {key: np.concatenate([each[key] for each in ones]) for key in whole}
    gap = max((_gap(whole, reference), _gap(singles, reference)), key=lambda each: each["max_abs_difference"])
    return {
        "format": name,
        "file": path.name,
        "bytes": path.stat().st_size,
        **declared,
        "parity": {"examples": count, "batch_sizes": [1, count], **gap},
    }


def _quantized(name: str, wrapper: keras.Model, path: Path, inputs: Inputs, spec: DatasetSpec, text: str) -> Json:
    """The int8 model of format `name` beside its float one at `path`; its record: both sizes and the accuracy of
    both side by side (MEASURES), or without labels the int8 model's largest difference to the float one."""
    quantized = path.with_name(QUANTIZED[name])
    _write(name, wrapper, path, text, quantized=quantized)
    with _refusing(f"{name}'s int8 model cannot run", text):
        (small, declared), (large, _) = _runner(name, quantized), _runner(name, path)
        outputs = {"float": _outputs(large, inputs), "int8": _outputs(small, inputs)}
    measure, key, score = MEASURES.get(label_kind(spec), (None, None, None))
    if inputs.labels is None or key not in outputs["float"]:  # no labels: the int8 outputs against the float ones
        gap = _gap(outputs["int8"], outputs["float"])["max_abs_difference"]
        measure, scores = "max_abs_difference", {"float": 0.0, "int8": gap}
    else:
        scores = {each: float(score(found[key], inputs.labels)) for each, found in outputs.items()}
    return {
        "format": name,
        "quantized": "int8",
        "file": quantized.name,
        "bytes": quantized.stat().st_size,
        "float_bytes": path.stat().st_size,
        **declared,
        "accuracy": {"measure": measure, "examples": inputs.count, **scores},
    }


def _outputs(run: Runner, inputs: Inputs) -> Arrays:
    """Every input run at the largest batch, the outputs concatenated."""
    parts = [
        run({key: array[start : start + PARITY_EXAMPLES] for key, array in inputs.arrays.items()})
        for start in range(0, inputs.count, PARITY_EXAMPLES)
    ]
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


def _line(entry: Json, origin: str, atol: float) -> str:
    """The printed line of one artifact."""
    if "quantized" in entry:
        accuracy = entry["accuracy"]
        return (
            f"{entry['format']} int8: {FOLDER}/{entry['file']} {entry['bytes']:,} bytes (float "
            f"{entry['float_bytes']:,}); {accuracy['measure']} {accuracy['float']:.4g} float, {accuracy['int8']:.4g} "
            f"int8 on {accuracy['examples']} examples"
        )
    parity = entry["parity"]
    return (
        f"{entry['format']}: {FOLDER}/{entry['file']} {entry['bytes']:,} bytes; largest difference to model.keras "
        f"{parity['max_abs_difference']:.1e} ({parity['output']}) at batch 1 and {parity['examples']} on "
        f"{origin} (atol {atol:g})"
    )
