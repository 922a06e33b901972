"""The training library: `fit`, `evaluate` and `check`, each returning plain data.

One training path for every strategy: an explicit loop that runs up to STEPS_PER_CALL steps per
`tf.function` call under `strategy.run` (calls end early at epoch ends, LOG_EVERY and CHECKPOINT_EVERY).
Keras 3 `model.fit` cannot serve multi-worker strategies (keras-team/keras#20585) and its BackupAndRestore
resumes only per epoch; this loop checkpoints and resumes at step granularity on one device, N GPUs or
N workers alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from train.data import (
    Data,
    Feed,
    TrainSplit,
    batches_per_pass,
    eval_dataset,
    gathers_in_step,
    load_data,
    make_feed,
)
from train.errors import SettingsError, TrainingError, first_line
from train.model import build_model
from train.probe import format_probe
from train.rundir import StopRequest, checkpoints_newest_first, preflight, write_json
from train.runtime import Runtime, setup_runtime
from train.settings import Settings, changed_settings
from train.workers import (
    PEER_ERRORS,
    ClusterPreemption,
    WorkerCheckpoints,
    check_same_settings,
    check_same_weights,
    peer_error_cause,
    restore_from_chief,
    wait_for_chief,
)

EXIT_PREEMPTED = 42  # "stopped cleanly, start me again": the code TensorFlow's preemption handler uses too
END_BARRIER_SECONDS = 3600  # multi-worker: how long the others wait for the chief's final evaluation and export

Say = Callable[[str], None]


def _say(message: str) -> None:
    print(message, flush=True)


def _per_example_loss(model: keras.Model) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """The compiled loss, unreduced, so the loop can average it over the *global* batch."""
    loss = keras.losses.get(model.loss)
    if isinstance(loss, keras.losses.Loss):
        return loss.call
    return loss


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


def _build(settings: Settings, runtime: Runtime, data: Data) -> keras.Model:
    keras.utils.set_random_seed(settings.seed)
    with runtime.strategy.scope():
        model = build_model(data.input_dim, data.num_classes, settings.learning_rate)
        model.optimizer.build(model.trainable_variables)  # now, so a checkpoint restores into it
    return model


def _evaluator(model: keras.Model) -> Callable[[TrainSplit, int], dict[str, float]]:
    loss_fn = _per_example_loss(model)

    @tf.function(autograph=False)
    def batch_totals(features, labels):
        probabilities = model(features, training=False)
        correct = tf.equal(tf.argmax(probabilities, axis=-1), labels)
        return tf.reduce_sum(loss_fn(labels, probabilities)), tf.reduce_sum(tf.cast(correct, tf.float32))

    def evaluate_split(split: TrainSplit, batch: int) -> dict[str, float]:
        loss_sum = correct = 0.0
        for features, labels in eval_dataset(split, batch):
            batch_loss, batch_correct = batch_totals(features, labels)
            loss_sum += float(batch_loss)
            correct += float(batch_correct)
        return {"loss": loss_sum / len(split), "accuracy": correct / len(split)}

    return evaluate_split


def weights_fingerprint(model: keras.Model) -> str:
    """sha256 of every weight, in order: equal on every worker of a multi-worker run."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(weight.numpy().tobytes())
    return digest.hexdigest()


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


def make_checkpoint(model: keras.Model) -> tf.train.Checkpoint:
    """What a checkpoint holds: the model, its optimizer and the loop's step; fit saves it, evaluate restores it."""
    # The loop's own step count: the optimizer's `iterations` stays behind it where a mixed_float16 step
    # skips its update (gradients overflowed), and resuming must start where the run stopped, not earlier.
    step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer, step=step_counter)


def restore_newest(checkpoint: tf.train.Checkpoint, checkpoint_dir: Path, say: Say) -> str | None:
    """Restore the newest checkpoint of this run directory that loads; warn about each one that does not.

    Returns None when the directory has no checkpoint. Raises TrainingError when it has some and none
    loads: starting over would overwrite them.
    """
    candidates = checkpoints_newest_first(checkpoint_dir)
    failed = []
    for prefix in candidates:
        try:
            checkpoint.restore(str(prefix)).assert_existing_objects_matched()
        # Damage shows as IndexError, DataLossError, ValueError, ...: each means "not this one".
        except Exception as error:
            failed.append(prefix.name)
            say(f"warning: checkpoint {prefix.name} does not load ({first_line(error, 160)}).")
            continue
        if failed:
            say(f"warning: {', '.join(failed)} could not be loaded; resuming from the previous one, {prefix.name}.")
        return str(prefix)
    if failed:
        raise TrainingError(
            f"no checkpoint in {checkpoint_dir} loads ({', '.join(failed)}): they are corrupt, or from another model "
            "or dataset. They are left as they are: use another OUTPUT_DIR, or delete them to start over"
        )
    return None


def save_checkpoint(manager: tf.train.CheckpointManager, step: int) -> None:
    """Save, or end clearly: TensorFlow writes to temporary files, so the previous checkpoint stays loadable."""
    manager.checkpoint.step.assign(step)
    try:
        manager.save(checkpoint_number=step)
    except (OSError, tf.errors.OpError) as error:
        raise TrainingError(
            f"could not write checkpoint ckpt-{step} to {manager.directory} ({first_line(error, 160)}); "
            f"the previous checkpoint {manager.latest_checkpoint} is intact: free space and run again to resume"
        ) from None


def make_metrics(runtime: Runtime) -> tuple[keras.metrics.Metric, keras.metrics.Metric]:
    """Training loss and accuracy, made up front in the strategy's scope (never lazily in a tf.function)."""
    with runtime.strategy.scope():
        return keras.metrics.Mean(name="loss"), keras.metrics.SparseCategoricalAccuracy(name="accuracy")


def jit_compile_for(settings: Settings, runtime: Runtime, split: TrainSplit) -> bool:
    """JIT_COMPILE resolved: auto compiles the call with XLA where it can, one device gathering from memory.

    Measured by `python -m train bench` on CPU: about 3x on one device (README, How fast). Under
    MirroredStrategy XLA cannot compile the call (the variables live on several devices; with one replica it
    would, but stays off like the rest of that path), and a tf.data iterator cannot be compiled.
    """
    gathers = gathers_in_step(runtime.strategy, split)
    possible = gathers and runtime.strategy_name == "one_device"
    if settings.jit_compile == "true" and not possible:
        # a feed that gathers runs on CPU devices only: its replicas are the CPU_DEVICES
        why = (
            f"{runtime.replicas} replicas, CPU_DEVICES={settings.cpu_devices}"
            if gathers
            else "a tf.data pipeline feeds the step"
        )
        raise SettingsError(
            f"JIT_COMPILE=true is not allowed here ({runtime.strategy_name}, {why}): XLA compiles the training "
            "call only on one device (one_device) that gathers its batches from memory on CPU; use JIT_COMPILE=auto "
            "or false"
        )
    return possible and settings.jit_compile != "false"


def describe_feed(data: Data, feed: Feed) -> str:
    where = "in memory" if data.in_memory else "streamed from the TFDS files"
    how = "gathered inside the step" if feed.compilable else "fed by tf.data"
    return f"data {where}, batches {how}"


def make_train_steps(model: keras.Model, runtime: Runtime, train_loss, train_accuracy, feed: Feed, jit_compile: bool):
    """A tf.function that runs `steps` training steps under `strategy.run`, for any batch size, and returns
    the mean training loss since the metric's last reset (the epoch's start), over all replicas and workers.
    Read inside the call: reading the metric eagerly after it cost ~0.3 ms a call on CPU.

    `feed` says what one call takes and how each replica finds its batch in it (see train.data).
    """
    loss_fn = _per_example_loss(model)

    def replica_step(*args):
        features, labels = feed.replica_batch(*args)
        with tf.GradientTape() as tape:
            probabilities = model(features, training=True)
            per_example = loss_fn(labels, probabilities)
            # Averaged over the global batch (per-replica rows x replicas): the strategy sums gradients.
            loss = tf.nn.compute_average_loss(per_example)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            # mixed_float16: Keras wrapped the optimizer in a LossScaleOptimizer, which scales here and
            # unscales (and skips steps whose gradients overflowed) in apply_gradients; a no-op otherwise.
            scaled_loss = model.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        model.optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        train_loss.update_state(per_example)
        train_accuracy.update_state(labels, probabilities)

    # autograph=False: the loop is written as the graph op it is; converting it and the step took 0.3-0.4 s of
    # every run's first call. (Keras still converts each layer's `call`, so a model's Python branches work.)
    @tf.function(jit_compile=jit_compile, autograph=False)
    def train_steps(call_args, steps):
        def one_step(step):
            runtime.strategy.run(replica_step, args=feed.step_args(call_args, step))
            return (step + 1,)

        # a while loop, not a loop over tf.range(steps): XLA would compile once per value of `steps`
        tf.while_loop(lambda step: step < steps, one_step, (tf.constant(0),))
        return train_loss.result()

    return train_steps


def run_steps(train_steps, feed: Feed, steps: int, global_batch: int) -> float:
    """Run `steps` steps; returns the mean training loss so far (which waits for them to finish).

    The one seam where running out of device memory surfaces, for fit and check alike.
    """
    del global_batch  # what the steps are fed; the seam names it so a test can fail above a threshold
    return float(train_steps(feed.call_args(steps), tf.constant(steps, tf.int32)))


def memory_picture(runtime: Runtime) -> str:
    """Per-GPU memory now and at peak, or a note that the devices do not report it."""
    if not runtime.plan.visible_gpus:
        return "memory: not reported on CPU"
    from train.gpus import TensorFlowDevices

    devices = TensorFlowDevices()
    parts = []
    for logical in range(len(runtime.plan.visible_gpus)):
        info = devices.memory_info(f"GPU:{logical}")
        parts.append(f"GPU:{logical} {info['current'] >> 20} MiB now, {info['peak'] >> 20} MiB peak")
    return "memory: " + "; ".join(parts)


def _steps_per_epoch(settings: Settings, data: Data, runtime: Runtime) -> int:
    passes_batches = batches_per_pass(data.train, runtime.global_batch)
    return settings.steps_per_epoch or passes_batches


def fit(settings: Settings, say: Say = _say, stop: StopRequest | None = None) -> dict[str, Any]:
    """Train (or resume) to EPOCHS x steps per epoch; returns the summary also written to summary.json.

    `stop` is the SIGTERM/Ctrl-C flag; the CLI installs it before TensorFlow loads. Without one, fit
    installs its own around the training loop (multi-worker: once the cluster has formed).
    Multi-worker (TF_CONFIG): every worker calls this; the chief writes the run directory, the others only train.
    """
    preflight(settings)  # before any device work: a wrong UID, a full disk, RESUME=never on checkpoints
    runtime = setup_runtime(settings)
    for note in runtime.notes:
        say(note)
    multi = runtime.strategy_name == "multi_worker"
    if multi:
        say(
            f"Worker {runtime.worker_index} of {runtime.workers} ({runtime.cluster.address}"
            f"{', chief: writes ' + str(settings.output_dir) if runtime.is_chief else ''}): all workers joined."
        )
        try:
            check_same_settings(runtime, settings)
        except PEER_ERRORS as error:
            raise _peer_lost(runtime, error, "comparing settings", None) from None
    with contextlib.ExitStack() as stack:
        # Multi-worker: TensorFlow's C++ preemption notifier, installed when the cluster forms, has just replaced
        # the SIGTERM handler with one that only logs (training would go on until SIGKILL): ours goes back on.
        if multi and stop is None:
            stop = stack.enter_context(StopRequest())
        elif multi:
            stop.rearm()
        try:
            return _fit(settings, runtime, stop, say)
        except PEER_ERRORS as error:
            if not multi:
                raise
            raise _peer_lost(runtime, error, "training", settings.output_dir / "checkpoints") from None


def _peer_lost(runtime: Runtime, error: BaseException, doing: str, checkpoint_dir: Path | None) -> TrainingError:
    """A worker died or hangs: TensorFlow ends the others' collectives with an error; say it in one line."""
    newest = checkpoints_newest_first(checkpoint_dir) if checkpoint_dir else []
    kept = f"the newest checkpoint, {newest[0]}, is intact" if newest else "no checkpoint was written yet"
    return TrainingError(
        f"worker {runtime.worker_index} of {runtime.workers} lost contact with the other workers while {doing} "
        f"({type(error).__name__}: {peer_error_cause(error)}): a worker died, hangs or cannot be reached; {kept}. "
        "Start every worker again to resume"
    )


def _fit(settings: Settings, runtime: Runtime, stop: StopRequest | None, say: Say) -> dict[str, Any]:
    multi = runtime.strategy_name == "multi_worker"
    chief = runtime.is_chief
    data = load_data(settings)
    _steps_per_epoch(settings, data, runtime)  # a split smaller than one global batch fails here, before writing
    jit_compile = jit_compile_for(settings, runtime, data.train)  # JIT_COMPILE=true where XLA cannot: also here
    for note in data.notes:
        say(note)

    output_dir = settings.output_dir
    checkpoint_dir = output_dir / "checkpoints"

    # Everything above only read; from here on the run directory is written (by the chief only).
    changed = changed_settings(output_dir / "settings.json", settings) if chief else []
    if chief:
        output_dir.mkdir(parents=True, exist_ok=True)
        write_json(output_dir / "settings.json", settings.to_json())

    model = _build(settings, runtime, data)
    train_loss, train_accuracy = make_metrics(runtime)
    if chief:
        model.summary()
    checkpoint = make_checkpoint(model)
    step_counter = checkpoint.step
    if multi:
        manager = WorkerCheckpoints(checkpoint, checkpoint_dir, settings.keep_checkpoints, runtime)
        restored = restore_from_chief(
            runtime,
            checkpoint,
            checkpoint_dir,
            lambda: restore_newest(checkpoint, checkpoint_dir, say),
            settings.worker_start_timeout,
        )
    else:
        manager = tf.train.CheckpointManager(checkpoint, str(checkpoint_dir), max_to_keep=settings.keep_checkpoints)
        restored = restore_newest(checkpoint, checkpoint_dir, say)

    resumed_from = None
    if restored:
        resumed_from = int(step_counter.numpy())
        say(f"Resuming from {restored} at step {resumed_from}.")
        if changed:
            say(
                "warning: resuming with settings changed since this run directory's last start: "
                + ", ".join(f"{name} {before or '(unset)'} -> {now or '(unset)'}" for name, before, now in changed)
                + ". The steps taken stay; the rest follow the new values (a new OUTPUT_DIR starts over)."
            )
    else:
        save_checkpoint(manager, 0)  # the initial weights: what AUTO_BATCH restarts from before step 1

    evaluate_split = _evaluator(model)
    if chief:
        writers = {name: tf.summary.create_file_writer(str(output_dir / "logs" / name)) for name in ("train", "eval")}
    else:
        writers = {name: tf.summary.create_noop_writer() for name in ("train", "eval")}

    preemption = None
    if multi:  # on every worker, after the same training call: the handler's save, then its exit
        assert stop is not None  # fit installed it
        preemption = ClusterPreemption(
            runtime, lambda: stop.signal_name is not None, lambda s: save_checkpoint(manager, s)
        )
    with contextlib.nullcontext(stop) if stop else StopRequest() as stop:
        while True:
            steps_per_epoch = _steps_per_epoch(settings, data, runtime)
            total_steps = steps_per_epoch * settings.epochs
            start_step = int(step_counter.numpy())
            workers = f" on {runtime.workers} workers" if multi else ""
            feed = make_feed(
                runtime.strategy, data.train, runtime.global_batch, settings.seed, start_step,
                longest_call(settings, steps_per_epoch),
            )  # fmt: skip
            span = (
                f"steps {start_step}-{total_steps}"
                if start_step < total_steps
                else (
                    f"already at step {start_step} of {total_steps} (EPOCHS={settings.epochs} x {steps_per_epoch}; "
                    "the steps taken count, at whatever batch size): nothing to train, evaluating again"
                )
            )
            say(
                f"Training {data.name} on {runtime.replicas} replica(s){workers} "
                f"({runtime.strategy_name}: {', '.join(runtime.devices)}"
                f"{' on each worker' if multi else ''}), "
                f"global batch {runtime.global_batch} = {runtime.per_replica_batch} per replica x {runtime.replicas}, "
                f"{steps_per_epoch} step{'s' if steps_per_epoch != 1 else ''} per epoch, {span}; "
                f"{describe_feed(data, feed)}, XLA {'on' if jit_compile else 'off'}."
            )
            train_steps = make_train_steps(model, runtime, train_loss, train_accuracy, feed, jit_compile)
            try:
                step, examples_per_sec, interrupted = _train_loop(
                    settings, runtime, data, feed, train_steps, (train_loss, train_accuracy),
                    manager, evaluate_split, writers, stop, preemption, steps_per_epoch, total_steps, say,
                )  # fmt: skip
                break
            # What reading damaged TFRecords raises: lost bytes, a missing file, fewer examples than recorded.
            except (tf.errors.DataLossError, tf.errors.NotFoundError, tf.errors.FailedPreconditionError) as error:
                if data.in_memory:
                    raise
                raise TrainingError(
                    f"reading the streamed {data.name} failed while training ({first_line(error, 160)}): its "
                    f"prepared files are damaged; the last checkpoint {manager.latest_checkpoint} is intact. Delete "
                    "the dataset's directory, prepare it anew and run again to resume"
                ) from None
            except tf.errors.ResourceExhaustedError:
                failed = runtime.per_replica_batch
                picture = memory_picture(runtime)
                if not settings.auto_batch or failed == 1:
                    raise TrainingError(
                        f"out of memory at BATCH_SIZE={failed} per replica (global batch {runtime.global_batch}); "
                        f"{picture}; the last checkpoint {manager.latest_checkpoint} is intact. Lower BATCH_SIZE "
                        f"(e.g. {max(1, failed // 2)}), set MEMORY_GROWTH=true"
                        f"{'' if multi else ', or AUTO_BATCH=true to halve it'}"
                    ) from None
                runtime = runtime.with_batch(failed // 2)
                restore_newest(checkpoint, checkpoint_dir, say)
                train_loss.reset_state()
                train_accuracy.reset_state()
                say(
                    f"AUTO_BATCH: out of memory at BATCH_SIZE={failed} ({picture}); continuing from "
                    f"{manager.latest_checkpoint} with BATCH_SIZE={runtime.per_replica_batch} "
                    f"(global batch {runtime.global_batch})."
                )
        if preemption is not None:
            preemption.close()
    for writer in writers.values():
        writer.flush()
    fingerprint = weights_fingerprint(model)
    if multi and not interrupted:
        check_same_weights(runtime, fingerprint, END_BARRIER_SECONDS)

    summary: dict[str, Any] = {
        "dataset": data.name,
        "strategy": runtime.strategy_name,
        "workers": runtime.workers,
        "replicas": runtime.replicas,
        "per_replica_batch": runtime.per_replica_batch,
        "global_batch": runtime.global_batch,
        "data_in_memory": data.in_memory,
        "jit_compile": jit_compile,
        "precision": runtime.precision,
        "cross_device_ops": runtime.cross_device_ops,
        "steps": step,
        "total_steps": total_steps,
        "steps_per_epoch": steps_per_epoch,
        "epochs_completed": step // steps_per_epoch,
        "resumed_from_step": resumed_from,
        "interrupted": interrupted,
        "examples_per_sec": examples_per_sec,
        "checkpoint": manager.latest_checkpoint,
        "weights_sha256": fingerprint,
    }
    if interrupted:
        why = f"by {stop.signal_name}" if stop.signal_name else "because another worker was told to stop"
        say(f"Stopped {why} at step {step}; checkpoint saved. Run the same command again to resume.")
        summary.update(train=None, eval=None, exported_model=None)
    elif not chief:
        summary.update(train=None, eval=None, exported_model=None)
        wait_for_chief(runtime, END_BARRIER_SECONDS)
        say(f"Done: {step} steps; weights sha256 {fingerprint[:16]}; the chief evaluates and exports the model.")
        return summary
    else:
        summary["train"] = evaluate_split(data.train, runtime.global_batch)
        summary["eval"] = evaluate_split(data.eval, runtime.global_batch)
        try:
            summary["exported_model"] = _export(model, output_dir)
        except OSError as error:
            raise TrainingError(
                f"could not export the model to {output_dir} ({error.strerror}); "
                f"checkpoint {manager.latest_checkpoint} is intact: free space and run again to export"
            ) from None
        say(
            f"Done: {step} steps; weights sha256 {fingerprint[:16]}"
            f"{f' (the same on all {runtime.workers} workers)' if runtime.workers > 1 else ''}; "
            f"eval loss {summary['eval']['loss']:.4f}, accuracy {summary['eval']['accuracy']:.4f}; "
            f"model exported to {output_dir / 'model.keras'} and {output_dir / 'saved_model'}."
        )
    if chief:
        write_json(output_dir / "summary.json", summary)
    if multi and not interrupted:
        wait_for_chief(runtime, END_BARRIER_SECONDS)
    return summary


def longest_call(settings: Settings, steps_per_epoch: int) -> int:
    """The most steps `call_steps` ever gives: what a feed plans ahead for (not a huge STEPS_PER_CALL).

    The first call: from step 0 every boundary is a whole period away, from any later step at most that.
    """
    return call_steps(settings, 0, steps_per_epoch, total_steps=steps_per_epoch)


def call_steps(settings: Settings, step: int, steps_per_epoch: int, total_steps: int) -> int:
    """The length of the call that starts at `step`: STEPS_PER_CALL, cut at the next epoch end, checkpoint,
    log step or the end of training (so those happen between calls, on time)."""
    boundary = min(
        total_steps,
        _next_multiple(step, steps_per_epoch),
        _next_multiple(step, settings.checkpoint_every),
        _next_multiple(step, settings.log_every),
    )
    return min(settings.steps_per_call, boundary - step)


def _train_loop(
    settings, runtime, data, feed, train_steps, metrics, manager, evaluate_split, writers, stop, preemption,
    steps_per_epoch, total_steps, say,
) -> tuple[int, float | None, bool]:  # fmt: skip
    """Steps from the optimizer's step counter to `total_steps`; returns the last step, examples/s, interrupted.

    Single host: a signal ends the loop after the current call, with a save. Multi-worker (`preemption` set):
    every worker runs the same calls and saves at the same steps (saves are collectives); a signal on any
    worker makes all of them save after the same call and stop, through `preemption`.
    """
    train_loss, train_accuracy = metrics
    step = saved_step = int(manager.checkpoint.step.numpy())
    timed_steps, timed_seconds = 0, 0.0  # the first call traces the graph: left out of the throughput
    first_call = True
    while step < total_steps and (preemption is not None or not stop.signal_name):
        steps = call_steps(settings, step, steps_per_epoch, total_steps)
        started = time.perf_counter()
        loss_value = run_steps(train_steps, feed, steps, runtime.global_batch)
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
            speed = f"{examples_per_sec:,.0f} examples/s" if timed_seconds else "(first call: tracing)"
            say(
                f"step {step:>7}/{total_steps}  epoch {math.ceil(step / steps_per_epoch)}/{settings.epochs}  "
                f"loss {loss_value:.4f}  accuracy {accuracy:.4f}  {speed}"
            )
            with writers["train"].as_default(step=step):
                tf.summary.scalar("loss", loss_value)
                tf.summary.scalar("accuracy", accuracy)
                tf.summary.scalar("examples_per_sec", examples_per_sec)
        if epoch_end and runtime.is_chief:  # the other workers go on to the next call and wait for the chief there
            metrics_now = evaluate_split(data.eval, runtime.global_batch)
            epoch = step // steps_per_epoch
            say(f"epoch {epoch} eval: loss {metrics_now['loss']:.4f}  accuracy {metrics_now['accuracy']:.4f}")
            with writers["eval"].as_default(step=step):
                for name, value in metrics_now.items():
                    tf.summary.scalar(name, value)
        if epoch_end:
            train_loss.reset_state()
            train_accuracy.reset_state()
        if step % settings.checkpoint_every == 0 or epoch_end or step == total_steps:
            save_checkpoint(manager, step)
            saved_step = step
        if preemption is not None and preemption.saved_and_stopping(step, saved_step):
            throughput = round(timed_steps * runtime.global_batch / timed_seconds, 1) if timed_seconds else None
            return step, throughput, True

    if preemption is None and stop.signal_name and saved_step != step:
        save_checkpoint(manager, step)
    throughput = round(timed_steps * runtime.global_batch / timed_seconds, 1) if timed_seconds else None
    return step, throughput, preemption is None and stop.signal_name is not None


def evaluate(settings: Settings, exported: bool = False, say: Say = _say) -> dict[str, Any]:
    """Loss and accuracy on EVAL_SPLIT of the latest checkpoint, or of the exported `model.keras`."""
    runtime = setup_runtime(settings, local_only=True)  # on this host, even where TF_CONFIG names a cluster
    data = load_data(settings)
    if exported:
        path = settings.output_dir / "model.keras"
        if not path.is_file():
            raise SettingsError(f"OUTPUT_DIR={settings.output_dir} has no model.keras: run fit to the end first")
        try:
            with runtime.strategy.scope():
                model = keras.saving.load_model(path)  # safe_mode stays on: no arbitrary code from the file
        except ValueError as error:
            raise SettingsError(f"{path} cannot be loaded safely: {first_line(error, 200)}") from None
        source = str(path)
    else:
        model = _build(settings, runtime, data)
        source = restore_newest(make_checkpoint(model), settings.output_dir / "checkpoints", say)
        if not source:
            raise SettingsError(f"OUTPUT_DIR={settings.output_dir} has no checkpoint: run fit first")
    metrics = _evaluator(model)(data.eval, runtime.global_batch)
    return {"source": source, "split": settings.eval_split, "examples": len(data.eval), **metrics}


class _WithoutRetracingWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


def check(
    settings: Settings, start_batch: int = 16, max_batch: int = 4096, steps: int = 10, say: Say = _say
) -> dict[str, Any]:
    """Trial-run real training steps at a small batch, then probe upward for the largest batch that fits.

    Nothing is written to OUTPUT_DIR: the trial trains a throwaway copy of the model.
    """
    from train.gpus import TensorFlowDevices
    from train.probe import Trial, probe_batch_sizes

    runtime = setup_runtime(settings, local_only=True)  # on this host, even where TF_CONFIG names a cluster
    for note in runtime.notes:
        say(note)
    data = load_data(settings)
    for note in data.notes:
        say(note)
    jit_compile = jit_compile_for(settings, runtime, data.train)
    model = _build(settings, runtime, data)
    train_loss, train_accuracy = make_metrics(runtime)
    gpus = [f"GPU:{i}" for i in range(len(runtime.plan.visible_gpus))]
    devices = TensorFlowDevices()
    cap = min(max_batch, len(data.train) // runtime.replicas)

    def trial(per_replica_batch: int) -> Trial:
        trial_runtime = runtime.with_batch(per_replica_batch)
        global_batch = trial_runtime.global_batch
        feed = make_feed(runtime.strategy, data.train, global_batch, settings.seed, 0, steps)
        train_steps = make_train_steps(model, runtime, train_loss, train_accuracy, feed, jit_compile)  # per shape
        try:
            run_steps(train_steps, feed, steps, global_batch)  # warm-up: traces the graph for this shape
            for gpu in gpus:
                devices.reset_memory_stats(gpu)
            started = time.perf_counter()
            run_steps(train_steps, feed, steps, global_batch)  # returns once the steps have finished
            seconds = time.perf_counter() - started
        except tf.errors.ResourceExhaustedError as error:
            return Trial(per_replica_batch, global_batch, fits=False, error=str(error).splitlines()[0][:120])
        peaks = tuple(devices.memory_info(gpu)["peak"] / (1 << 20) for gpu in gpus) or None
        result = Trial(
            per_replica_batch, global_batch, True, 1000 * seconds / steps, steps * global_batch / seconds, peaks
        )
        say(f"  BATCH_SIZE={per_replica_batch:<6} fits: {result.examples_per_sec:,.0f} examples/s")
        return result

    say(
        f"Trial run: {steps} steps per batch size on {runtime.replicas} replica(s) ({runtime.strategy_name}), "
        f"from BATCH_SIZE={min(start_batch, cap)} up to {cap} per replica."
    )
    # Every trial traces the step for its own batch shape, on purpose: TensorFlow's warning about frequent
    # retracing would only alarm.
    quiet = _WithoutRetracingWarning()
    tf.get_logger().addFilter(quiet)
    try:
        probe = probe_batch_sizes(trial, start_batch, cap)
    finally:
        tf.get_logger().removeFilter(quiet)
    return {
        "resolved": runtime.describe(),
        "steps_per_trial": steps,
        "cap": cap,
        "trials": [asdict(t) for t in probe.trials],
        "largest_fit": probe.largest_fit,
        "smallest_failure": probe.smallest_failure,
        "recommended_batch_size": probe.recommended,
        "message": probe.message,
        "table": format_probe(probe),
    }
