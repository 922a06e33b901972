"""The few places the engine reaches below Keras's public API, each for a reason a test guards.

Keras 3.15.1 (pinned in pyproject.toml). If an upgrade moves one of these, the tests named here fail:

- `model._symbolic_build`: what `model.fit` calls to create the compiled metrics and loss before the first
  step, inside the strategy's scope (metrics made lazily inside a tf.function break under tf.distribute). It
  also traces the loss on the label's spec, which is how a model whose output does not fit the labels is
  found before the run directory is written (tests/test_model_contract.py).
- `model._compile_loss`, `model._compile_metrics`: whether `compile` was given a loss or metrics to build: a
  model with its own train_step that compiled neither (the keras.io DCGAN) is not built on the data's spec
  (tests/test_custom_step.py, the DCGAN).
- `model._loss_tracker`: the `Mean` named "loss" that `model.fit` and `model.evaluate` report, so the loop's
  "loss" is theirs (tests/test_examples.py, tests/test_replicas.py).
- `optimizer._all_reduce_sum_gradients`: Keras's TensorFlow optimizer sums the replicas' gradients inside
  `apply`, after clipping them per replica and after a LossScaleOptimizer has judged "finite" on one replica's
  local gradients. The loop all-reduces first instead, so that clipping and loss scaling see the global
  gradient, and turns this second sum off (tests/test_replicas.py: 2 replicas against 1, clipping, overflow).
  Only for the engine's own step: a model's own train_step applies optimizers that keep this sum, as in Keras
  (train/step.py; tests/test_custom_step.py).
- `model._flatten_layers`: every layer, nested ones included, as Keras's own `model_supports_jit` walks them.
- `layer._non_trainable_variables`: the variables a layer made with `trainable=False`; `non_trainable_weights`
  also lists the weights of a layer frozen by `trainable = False`. The replicas' statistics are the former
  (train.replica_statistics; tests/test_statistics.py).
- `node.arguments` and a KerasTensor's `_keras_mask`: whether a functional model calls a layer with a mask
  (SYNC_BATCH_NORM's warning; tests/test_statistics.py).
- `MonitorCallback._set_monitor_op`: MONITOR's direction as Keras's mode="auto" decides it (the name "loss", or
  a compiled metric's `_direction`), asked of an EarlyStopping (tests/test_experiment.py).
- `tf.train.CheckpointManager._maybe_delete`: the checkpoints the manager deletes to keep `max_to_keep`, rebuilt
  from its state file at every start. It has no public way to keep one beyond `max_to_keep`; one taken out of
  this dict is never deleted, nor listed in that file (the run finds its checkpoints by listing the folder).
  MONITOR's best epoch is kept so, by the chief (train.cluster.role; tests/test_experiment.py, the best epoch's
  checkpoint kept across a resume at KEEP_CHECKPOINTS=1).
- `optimizer._learning_rate`, `optimizer._model_variables_moving_average`: whether the rate is a schedule (the
  `learning_rate` property gives its value, not it), and which of the optimizer's variables are its slots (zeroed
  at a phase's first step, as a new optimizer's are) rather than its step, rate or moving averages
  (train.phased; tests/test_phases.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import keras
import tensorflow as tf


def build_metrics_and_loss(model: keras.Model, features: object, labels: object) -> None:
    """Create the compiled metrics' and loss's state from one batch's spec (arrays or KerasTensors)."""
    model._symbolic_build(data_batch=(features, labels))


def compiled(model: keras.Model) -> list[str]:
    """What `compile` gave the model to build before the first step: "loss", "metrics" (a GAN that compiles
    only its own optimizers: neither)."""
    given = (("loss", model._compile_loss), ("metrics", model._compile_metrics))
    return [name for name, each in given if each is not None]


def loss_tracker(model: keras.Model) -> keras.metrics.Mean:
    return model._loss_tracker


def inner_optimizers(optimizer: keras.optimizers.Optimizer) -> Iterator[keras.optimizers.Optimizer]:
    """The optimizer and, for a LossScaleOptimizer, the one it wraps (which does the update)."""
    yield optimizer
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        yield from inner_optimizers(inner)


def gradients_come_summed(optimizer: keras.optimizers.Optimizer) -> None:
    """Make `apply` take gradients already summed over the replicas (it would sum them again)."""
    for each in inner_optimizers(optimizer):
        each._all_reduce_sum_gradients = list  # the (gradient, variable) pairs as they are


def all_layers(model: keras.Model) -> list[keras.layers.Layer]:
    return list(model._flatten_layers(include_self=False))


def made_non_trainable(layer: keras.layers.Layer) -> list[keras.Variable]:
    """The variables `layer` itself made non-trainable (not its sublayers', not those frozen by `trainable`)."""
    return list(layer._non_trainable_variables)


def called_with_mask(layer: keras.layers.Layer) -> bool:
    """Whether a functional model calls `layer` on a masked tensor, or passes it a mask."""
    for node in getattr(layer, "_inbound_nodes", ()):
        arguments = node.arguments
        if arguments.kwargs.get("mask") is not None:
            return True
        if any(getattr(tensor, "_keras_mask", None) is not None for tensor in arguments.keras_tensors):
            return True
    return False


def monitor_direction(model: keras.Model, monitor: str) -> str | None:
    """ "max" or "min": which way MONITOR improves, as Keras's callbacks decide it with mode="auto"; None where
    Keras cannot tell."""
    probe = keras.callbacks.EarlyStopping(monitor=monitor, mode="auto")
    probe.set_model(model)
    try:
        probe._set_monitor_op()
    except ValueError:
        return None
    return "max" if bool(probe.monitor_op(1.0, 0.0)) else "min"


def rotation(manager: tf.train.CheckpointManager) -> dict[str, float]:
    """The checkpoints `manager` may delete to keep `max_to_keep`, by prefix (their time saved): one deleted from
    this dict stays on disk."""
    return manager._maybe_delete


def learning_rate_schedule(
    optimizer: keras.optimizers.Optimizer,
) -> keras.optimizers.schedules.LearningRateSchedule | None:
    """The optimizer's LearningRateSchedule, None where its rate is a constant (`learning_rate` gives the value)."""
    rate = optimizer._learning_rate
    return rate if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) else None


def rate_is_callable(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether the optimizer's rate is a plain callable: neither a constant nor a LearningRateSchedule."""
    rate = optimizer._learning_rate
    return callable(rate) and not isinstance(rate, keras.optimizers.schedules.LearningRateSchedule | keras.Variable)


def slots(optimizer: keras.optimizers.Optimizer) -> list[keras.Variable]:
    """The optimizer's own state per variable (Adam's moments, SGD's momentum, summed gradients): what a new
    optimizer starts at zero. Not its step counter, its learning rate or its moving averages of the weights."""
    kept = {id(optimizer.iterations), id(optimizer._learning_rate)}
    kept.update(id(each) for each in getattr(optimizer, "_model_variables_moving_average", None) or [])
    return [each for each in optimizer.variables if id(each) not in kept]


def held_optimizers(network: keras.Model) -> dict[str, keras.optimizers.Optimizer]:
    """Every optimizer the model holds as a public attribute (or in a list or dict of them), by attribute name:
    the compiled one and those a model's own train_step applies (a GAN's)."""
    found: dict[str, keras.optimizers.Optimizer] = {}
    for name, value in vars(network).items():
        if name.startswith("_"):  # Keras's and TensorFlow's own bookkeeping (the compiled one is `optimizer`)
            continue
        values = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else [value]
        for each in values:
            if isinstance(each, keras.optimizers.Optimizer) and all(each is not o for o in found.values()):
                found[name] = each
    return found
