"""The training library: `fit`, `evaluate` and `describe_devices`, each returning plain data.

One training path for every strategy: an explicit loop that runs STEPS_PER_CALL steps per
`tf.function` call under `strategy.run`. Keras 3 `model.fit` cannot serve multi-worker
strategies (keras-team/keras#20585) and its BackupAndRestore resumes only per epoch; this
loop checkpoints and resumes at step granularity on one device, N GPUs or N workers alike.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from train.data import Data, Split, batches_per_pass, eval_dataset, load_data, train_dataset
from train.model import build_model
from train.runtime import Runtime, setup_runtime
from train.settings import Settings, SettingsError, write_settings

EXIT_PREEMPTED = 42  # "stopped cleanly, start me again": the code TensorFlow's preemption handler uses too

Say = Callable[[str], None]


def _say(message: str) -> None:
    print(message, flush=True)


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss is not finite); the last good checkpoint is kept."""


class StopRequest:
    """SIGTERM (docker stop, Kubernetes, spot preemption) or Ctrl-C: finish the step, save, leave.

    The handler only sets a flag; the loop looks at it between calls. A second Ctrl-C stops at once.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal_name and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name

    def __enter__(self) -> StopRequest:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _per_example_loss(model: keras.Model) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """The compiled loss, unreduced, so the loop can average it over the *global* batch."""
    loss = keras.losses.get(model.loss)
    if isinstance(loss, keras.losses.Loss):
        return loss.call
    return loss


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


def _atomic_write_json(path: Path, payload: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(temporary, path)


def _build(settings: Settings, runtime: Runtime, data: Data) -> keras.Model:
    keras.utils.set_random_seed(settings.seed)
    with runtime.strategy.scope():
        model = build_model(data.input_dim, data.num_classes, settings.learning_rate)
        model.optimizer.build(model.trainable_variables)  # now, so a checkpoint restores into it
    return model


def _evaluator(model: keras.Model, global_batch: int) -> Callable[[Split], dict[str, float]]:
    loss_fn = _per_example_loss(model)

    @tf.function
    def batch_totals(features, labels):
        probabilities = model(features, training=False)
        correct = tf.equal(tf.argmax(probabilities, axis=-1), labels)
        return tf.reduce_sum(loss_fn(labels, probabilities)), tf.reduce_sum(tf.cast(correct, tf.float32))

    def evaluate_split(split: Split) -> dict[str, float]:
        loss_sum = correct = 0.0
        for features, labels in eval_dataset(split, global_batch):
            batch_loss, batch_correct = batch_totals(features, labels)
            loss_sum += float(batch_loss)
            correct += float(batch_correct)
        return {"loss": loss_sum / len(split), "accuracy": correct / len(split)}

    return evaluate_split


def _export(model: keras.Model, output_dir: Path) -> dict[str, str]:
    """`model.keras` for Keras and `saved_model/` for TF Serving, each replaced whole or not at all."""
    keras_path = output_dir / "model.keras"
    model.save(output_dir / "model.tmp.keras")
    os.replace(output_dir / "model.tmp.keras", keras_path)

    saved_model = output_dir / "saved_model"
    staging = output_dir / "saved_model.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    model.export(str(staging), format="tf_saved_model", verbose=False)
    shutil.rmtree(saved_model, ignore_errors=True)
    os.replace(staging, saved_model)
    return {"keras": str(keras_path), "saved_model": str(saved_model)}


def fit(settings: Settings, say: Say = _say) -> dict[str, Any]:
    """Train (or resume) to EPOCHS x steps per epoch; returns the summary also written to summary.json."""
    runtime = setup_runtime(settings)
    for note in runtime.notes:
        say(note)
    data = load_data(settings)
    passes_batches = batches_per_pass(data.train, runtime.global_batch)
    steps_per_epoch = settings.steps_per_epoch or passes_batches
    total_steps = steps_per_epoch * settings.epochs

    output_dir = settings.output_dir
    checkpoint_dir = output_dir / "checkpoints"
    existing = tf.train.latest_checkpoint(str(checkpoint_dir)) if checkpoint_dir.is_dir() else None
    if existing and settings.resume == "never":
        raise SettingsError(
            f"RESUME=never but OUTPUT_DIR={output_dir} already holds checkpoints ({Path(existing).name}): "
            "use another OUTPUT_DIR, delete that one, or RESUME=auto"
        )

    # Everything above only read; from here on the run directory is written.
    output_dir.mkdir(parents=True, exist_ok=True)
    write_settings(settings, output_dir / "settings.json")

    model = _build(settings, runtime, data)
    with runtime.strategy.scope():
        train_loss = keras.metrics.Mean(name="loss")
        train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    model.summary()
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(checkpoint, str(checkpoint_dir), max_to_keep=settings.keep_checkpoints)

    start_step = 0
    if manager.latest_checkpoint:
        try:
            checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            raise SettingsError(
                f"OUTPUT_DIR={output_dir} holds {manager.latest_checkpoint}, which does not fit this model and "
                f"dataset ({str(error).splitlines()[0][:160]}): use another OUTPUT_DIR"
            ) from None
        start_step = int(model.optimizer.iterations.numpy())
        say(f"Resuming from {manager.latest_checkpoint} at step {start_step} of {total_steps}.")

    say(
        f"Training {data.name} on {runtime.replicas} replica(s) "
        f"({runtime.strategy_name}: {', '.join(runtime.devices)}), "
        f"global batch {runtime.global_batch} = {runtime.per_replica_batch} per replica x {runtime.replicas}, "
        f"{steps_per_epoch} steps per epoch, {total_steps} steps."
    )

    loss_fn = _per_example_loss(model)

    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            probabilities = model(features, training=True)
            per_example = loss_fn(labels, probabilities)
            # Averaged over the global batch: the strategy sums gradients across replicas.
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=runtime.global_batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        train_loss.update_state(per_example)
        train_accuracy.update_state(labels, probabilities)

    @tf.function
    def train_steps(iterator, steps):
        for _ in tf.range(steps):
            runtime.strategy.run(replica_step, args=next(iterator))

    iterator = iter(train_dataset(runtime.strategy, data.train, runtime.global_batch, settings.seed, start_step))
    evaluate_split = _evaluator(model, runtime.global_batch)
    writers = {name: tf.summary.create_file_writer(str(output_dir / "logs" / name)) for name in ("train", "eval")}

    step = saved_step = start_step
    timed_steps, timed_seconds = 0, 0.0  # the first call traces the graph: left out of the throughput
    first_call = True
    with StopRequest() as stop:
        while step < total_steps and not stop.signal_name:
            boundary = min(
                total_steps,
                _next_multiple(step, steps_per_epoch),
                _next_multiple(step, settings.checkpoint_every),
                _next_multiple(step, settings.log_every),
            )
            steps = min(settings.steps_per_call, boundary - step)
            started = time.perf_counter()
            train_steps(iterator, tf.constant(steps))
            loss_value = float(train_loss.result())  # also waits for the call to finish
            elapsed = time.perf_counter() - started
            if not first_call:
                timed_steps, timed_seconds = timed_steps + steps, timed_seconds + elapsed
            first_call = False
            step += steps

            if not math.isfinite(loss_value):
                raise TrainingError(
                    f"the training loss became {loss_value} by step {step}; stopped without saving these weights "
                    f"(last good checkpoint: {manager.latest_checkpoint}). Try a lower LEARNING_RATE."
                )
            epoch_end = step % steps_per_epoch == 0
            if step % settings.log_every == 0 or epoch_end or step == total_steps:
                examples_per_sec = timed_steps * runtime.global_batch / timed_seconds if timed_seconds else 0.0
                accuracy = float(train_accuracy.result())
                say(
                    f"step {step:>7}/{total_steps}  epoch {math.ceil(step / steps_per_epoch)}/{settings.epochs}  "
                    f"loss {loss_value:.4f}  accuracy {accuracy:.4f}  {examples_per_sec:,.0f} examples/s"
                )
                with writers["train"].as_default(step=step):
                    tf.summary.scalar("loss", loss_value)
                    tf.summary.scalar("accuracy", accuracy)
                    tf.summary.scalar("examples_per_sec", examples_per_sec)
            if epoch_end:
                metrics = evaluate_split(data.eval)
                epoch = step // steps_per_epoch
                say(f"epoch {epoch} eval: loss {metrics['loss']:.4f}  accuracy {metrics['accuracy']:.4f}")
                with writers["eval"].as_default(step=step):
                    for name, value in metrics.items():
                        tf.summary.scalar(name, value)
                train_loss.reset_state()
                train_accuracy.reset_state()
            if step % settings.checkpoint_every == 0 or epoch_end or step == total_steps:
                manager.save(checkpoint_number=step)
                saved_step = step

        interrupted = stop.signal_name is not None
        if interrupted and saved_step != step:
            manager.save(checkpoint_number=step)
    for writer in writers.values():
        writer.flush()

    summary: dict[str, Any] = {
        "dataset": data.name,
        "strategy": runtime.strategy_name,
        "replicas": runtime.replicas,
        "per_replica_batch": runtime.per_replica_batch,
        "global_batch": runtime.global_batch,
        "steps": step,
        "total_steps": total_steps,
        "steps_per_epoch": steps_per_epoch,
        "epochs_completed": step // steps_per_epoch,
        "resumed_from_step": start_step or None,
        "interrupted": interrupted,
        "examples_per_sec": round(timed_steps * runtime.global_batch / timed_seconds, 1) if timed_seconds else None,
        "checkpoint": manager.latest_checkpoint,
    }
    if interrupted:
        say(f"Stopped by {stop.signal_name} at step {step}; checkpoint saved. Run the same command again to resume.")
        summary.update(train=None, eval=None, exported_model=None)
    else:
        summary["train"] = evaluate_split(data.train)
        summary["eval"] = evaluate_split(data.eval)
        summary["exported_model"] = _export(model, output_dir)
        say(
            f"Done: {step} steps; eval loss {summary['eval']['loss']:.4f}, accuracy {summary['eval']['accuracy']:.4f}; "
            f"model exported to {output_dir / 'model.keras'} and {output_dir / 'saved_model'}."
        )
    _atomic_write_json(output_dir / "summary.json", summary)
    return summary


def evaluate(settings: Settings, exported: bool = False, say: Say = _say) -> dict[str, Any]:
    """Loss and accuracy on EVAL_SPLIT of the latest checkpoint, or of the exported `model.keras`."""
    runtime = setup_runtime(settings)
    data = load_data(settings)
    if exported:
        path = settings.output_dir / "model.keras"
        if not path.is_file():
            raise SettingsError(f"OUTPUT_DIR={settings.output_dir} has no model.keras: run fit to the end first")
        with runtime.strategy.scope():
            model = keras.saving.load_model(path)  # safe_mode stays on: no arbitrary code from the file
        source = str(path)
    else:
        model = _build(settings, runtime, data)
        source = tf.train.latest_checkpoint(str(settings.output_dir / "checkpoints"))
        if not source:
            raise SettingsError(f"OUTPUT_DIR={settings.output_dir} has no checkpoint: run fit first")
        tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(source).expect_partial()
    metrics = _evaluator(model, runtime.global_batch)(data.eval)
    return {"source": source, "split": settings.eval_split, "examples": len(data.eval), **metrics}


def describe_devices(settings: Settings) -> dict[str, Any]:
    """What TensorFlow sees and what the settings resolve to, as plain data."""
    runtime = setup_runtime(settings)
    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "physical_devices": [f"{d.device_type}:{d.name}" for d in tf.config.list_physical_devices()],
        "logical_devices": [d.name for d in tf.config.list_logical_devices()],
        **runtime.describe(),
    }
