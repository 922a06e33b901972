"""`fit` and `evaluate`: what the CLI calls, each returning plain data.

One training path for every strategy: devices, then the strategy, then the data and the model in its
scope; an explicit loop (train.loop) of `tf.function` calls under `strategy.run` (train.step); checkpoints
that a restart resumes from at step granularity. Keras 3 `model.fit` cannot serve multi-worker strategies
(keras-team/keras#20585) and its BackupAndRestore resumes only per epoch; this loop runs on one device,
N GPUs or N workers alike. What multi-worker does differently sits behind `peers` (train.cluster.workers).

`fit` is the run's story in order; each chapter is a module:

| chapter                                  | module            | gives                                   |
|------------------------------------------|-------------------|-----------------------------------------|
| agree, load the data, build, decide XLA  | train.start       | `Start`, frozen                         |
| open the run directory, restore, re-base | train.resume      | `Position` and the `RunCheckpoint`      |
| the calls and the hooks between them     | train.loop, hooks | an `Outcome`                            |
| what goes wrong, in one line             | here, at the end  | errors; AUTO_BATCH's retry              |
| evaluate, export, summarise              | train.resume      | summary.json's dict (`finish`)          |

Which worker this is, chief or not, is decided once: its `Role` (train.cluster.role) holds the peers, the writer
(train.writer: the other workers write nothing) and whatever only the chief does.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import keras
import tensorflow as tf

from train.callbacks import Callbacks
from train.checkpoints import RunCheckpoint
from train.cluster.role import Role, take_role
from train.data.feeds import adapter
from train.data.reading_errors import reading_errors
from train.data.source import Remainder
from train.devices.runtime import Runtime, setup_runtime
from train.errors import SettingsError, TrainingError, first_line
from train.exportable import averaged_weights
from train.formats import ATOL, convert
from train.hooks import Hook, Json, Say
from train.loop import Outcome, Schedule, longest_call, run_loop
from train.phased import PhaseCalls
from train.predict import open_trained
from train.progress import Lines, Quiet, reporter
from train.resume import Evaluate, Metrics, Position, finish, hparams, open_run_dir, rebase
from train.run_hooks import FiniteLoss, Profiler, Scalars, StopRequests, between_calls
from train.rundir import RunLock
from train.settings import Settings
from train.signals import StopRequest
from train.start import Start, batch_of, start_run
from train.step import describe_batch, make_calls, make_evaluator, smaller_micro_batch
from train.writer import SummaryWriters, Writer


def _say(message: str) -> None:
    print(message, flush=True)


def fit(settings: Settings, stop: StopRequest, say: Say = _say, hooks: Sequence[Hook] = ()) -> Json:
    """Train (or resume) to EPOCHS x steps per epoch; returns the summary also written to summary.json.

    `stop` is the SIGTERM/Ctrl-C flag (the CLI installs it before TensorFlow loads). The caller has run
    `train.rundir.preflight` (the CLI does, before TensorFlow loads); a lock taken since is found
    when the run directory is opened. Multi-worker (TF_CONFIG): every worker calls this; the chief writes the
    run directory, the others only train. `hooks`: the plug-ins' (train.plugins.fit_hooks), called with MODEL's
    (build_hooks) where train.run_hooks.between_calls places them; a `chief_only` one on the chief alone.
    """
    runtime = setup_runtime(settings)
    role = take_role(runtime, stop, settings.worker_start_timeout, settings.output_dir, say)
    peers, writer, lock = role.peers, role.writer, RunLock(settings.output_dir)
    plugged: list[Hook] = []  # the hooks this worker calls, beside the engine's: the plug-ins', then MODEL's
    summary = None
    try:
        with peers.guard("starting"):
            peers.refuse_if_busy(settings.output_dir)
            start, runtime = start_run(settings, runtime, role, say)
            every = [*hooks, *start.hooks]
            plugged = role.chief_only(list, every) or [hook for hook in every if not hook.chief_only]
            position, checkpoint = open_run_dir(start, runtime, lock, role, plugged)
            scalars = writer.scalars()
            writer.hparams(hparams(start, runtime))
            evaluate = make_evaluator(start.built, runtime.strategy)
            callbacks = Callbacks(
                list(start.callbacks),
                start.built.network,
                start.settings.epochs,
                start.context.steps_per_epoch,
                start.settings.monitor,
                start.settings.monitor_mode,
                role,
                checkpoint,
                say,
                settings.model,
                start.phases.plan.index_at_epoch,
            )
            callbacks.begin(checkpoint.step, position.segment)  # on_train_begin, the recorded epochs replayed
        with peers.guard("training", start.checkpoint_dir):
            outcome = _train(start, position, checkpoint, callbacks, role, scalars, evaluate, plugged)
            start.phases.rates_as_built()  # a schedule unscaled: what the export holds
            if not outcome.interrupted:  # not by a signal (model.stop_training, a pruned trial: finished)
                callbacks.end(outcome.step)
            with reading_errors(start.data, start.settings.dataset, start.settings.model, lambda: checkpoint.latest):
                added = {key: value for hook in plugged for key, value in (hook.summary() or {}).items()}  # a trial's
                summary = finish(start, position, checkpoint, callbacks, role, scalars, evaluate, outcome, added)
            if settings.export_formats and not outcome.interrupted:
                role.chief_only(_formats, start)
            return summary
    finally:  # the peers closed and the run directory freed first: a fork's hook may raise in run_end
        peers.close()
        lock.release()
        for hook in plugged:
            hook.run_end(summary)


def _formats(start: Start) -> None:
    """EXPORT_FORMATS: model.keras in each format, checked (train.formats). Raises TrainingError where that fails:
    the run is trained and exported as without it."""
    settings, listed = start.settings, ",".join(start.settings.export_formats)
    try:
        convert(start.built, start.data, settings.output_dir, settings.export_formats, None, ATOL, start.say)
    except (SettingsError, TrainingError) as error:
        raise TrainingError(
            f"the run is trained and exported, but EXPORT_FORMATS={listed} failed: {error}; once that is fixed, run "
            f"python -m train formats --output-dir {settings.output_dir} --format {listed}"
        ) from None


def _train(
    start: Start,
    position: Position,
    checkpoint: RunCheckpoint,
    callbacks: Callbacks,
    role: Role,
    scalars: SummaryWriters,
    evaluate: Evaluate,
    plugged: Sequence[Hook],
) -> Outcome:
    """The loop, at BATCH_SIZE; on out-of-memory with AUTO_BATCH, again from the last checkpoint at half.
    `plugged`: the plug-ins' and MODEL's hooks, in their place among the engine's (between_calls)."""
    settings, say, data = start.settings, start.say, start.data
    role.peers.watch_stops(lambda step: checkpoint.save(step, checkpoint.skipped))
    while True:
        runtime, segment = position.runtime, position.segment
        schedule, first = Schedule(settings, segment), checkpoint.step
        feed = _feed(start, position, schedule, first)
        say(_describe(start, runtime, schedule, first))
        batch, strategy = runtime.global_batch, runtime.strategy  # the calls, made again at each phase's start:
        make = partial(make_calls, start.built, strategy, feed, batch, start.jit_compile, runtime.accumulation)
        calls = PhaseCalls(start.phases, segment, make, batch, checkpoint.record_phase, say)
        profile = settings.profile_steps, settings.to_json()["PROFILE_STEPS"]  # as the setting was written
        profiler = role.chief_only(Profiler, *profile, start.output_dir, say, first) or Hook()
        total, epochs = schedule.total_steps, settings.epochs  # the chief's bar or lines (PROGRESS); quiet elsewhere
        progress = role.chief_only(reporter, settings.progress, True, say, total, segment.epoch_of, epochs, first)
        progress = progress or Quiet(say, total, segment.epoch_of, epochs)

        def evaluate_epoch(runtime: Runtime = runtime, progress: Lines = progress) -> Metrics:
            start.built.average_statistics()  # the replicas' mean, as the export will hold it
            with averaged_weights(start.built), progress.evaluating(settings.eval_split, len(data.eval)):
                return evaluate(data.eval, runtime.micro_global_batch)

        hooks = between_calls(
            profiler=profiler,
            callbacks=callbacks,
            stops=StopRequests(role.peers),
            plugged=plugged,
            scalars=Scalars(scalars),
            progress=progress,
            finite_loss=FiniteLoss(start.built, checkpoint),
            checkpoints=checkpoint,
        )
        try:
            with reading_errors(data, settings.dataset, settings.model, lambda: checkpoint.latest):
                return run_loop(calls, schedule, first, checkpoint.skipped, hooks, evaluate_epoch)
        except tf.errors.ResourceExhaustedError:
            halve_batch(start, position, checkpoint, role.writer)


def _feed(start: Start, position: Position, schedule: Schedule, first: int):
    """The training feed from step `first` on: the rest of a streamed pass first where the segment begins with one
    (train.timeline)."""
    settings, runtime, segment = start.settings, position.runtime, position.segment
    remainder = None
    if segment.in_remainder(first):
        length, done = segment.remainder_end - segment.first_step, first - segment.first_step
        remainder = Remainder(segment.remainder_pass, position.marks, length, done)
    return adapter(runtime.strategy, start.data.train).train_feed(
        runtime.global_batch,
        settings.seed,
        segment.data_step(max(first, segment.remainder_end) if remainder else first),
        longest_call(schedule.cadence, schedule.steps_per_epoch),
        settings.device_prefetch,
        remainder,
    )


def _describe(start: Start, runtime: Runtime, schedule: Schedule, first: int) -> str:
    data = start.data
    if first < schedule.total_steps:
        span = f"steps {first}-{schedule.total_steps}"
    else:
        span = (
            f"already at step {first} of {schedule.total_steps} (EPOCHS={start.settings.epochs} x "
            f"{schedule.steps_per_epoch}; the steps taken count, at whatever batch size): nothing to train, "
            "evaluating again"
        )
    workers = f" on {runtime.workers} workers" if runtime.workers > 1 else ""
    per_epoch = f"{schedule.steps_per_epoch} step{'s' if schedule.steps_per_epoch != 1 else ''} per epoch"
    return (
        f"Training {data.name} on {runtime.replicas} replica(s){workers} ({runtime.strategy_name}: "
        f"{', '.join(runtime.devices)}{' on each worker' if workers else ''}), "
        f"{describe_batch(batch_of(start.settings), runtime)}, {per_epoch}, {span}; {runtime.precision}; "
        f"data {data.describe()}, batches {adapter(runtime.strategy, data.train).describe()}, "
        f"XLA {'on' if start.jit_compile else 'off'} ({start.jit_why})."
    )


def evaluate(settings: Settings, exported: bool = False, say: Say = _say) -> Json:
    """Every compiled metric on EVAL_SPLIT, of the latest checkpoint or of the exported `model.keras`.

    `settings` are the run's (the CLI reads its settings.json under the flags and environment)."""
    trained = open_trained(settings, "evaluated", say, restore=not exported)  # built: its loss and metrics score
    runtime, source, predict = trained.runtime, trained.restored, None  # the checkpoint or the export alike
    if exported:
        path = settings.output_dir / "model.keras"
        if not path.is_file():
            raise SettingsError(f"OUTPUT_DIR={settings.output_dir} has no model.keras: run fit to the end first")
        try:
            with runtime.strategy.scope():
                predict = keras.saving.load_model(path)  # safe_mode stays on: no arbitrary code from the file
        except ValueError as error:
            raise SettingsError(f"{path} cannot be loaded safely: {first_line(error, 200)}") from None
        source = str(path)
    metrics = make_evaluator(trained.built, runtime.strategy, predict)(trained.data.eval, runtime.micro_global_batch)
    return {"source": source, "split": settings.eval_split, "examples": len(trained.data.eval), **metrics}


# --- What can go wrong while training or evaluating, told in one line (or, out of memory under AUTO_BATCH, mended).
# Each handler names the last checkpoint, which stays intact: the run resumes from it once the cause is fixed.


def _smaller(start: Start, runtime: Runtime) -> tuple[int | None, bool]:
    """The batch AUTO_BATCH would go on with (None: none is smaller), and whether the model's own train_step keeps
    it from accumulating micro-batches under GLOBAL_BATCH_SIZE."""
    settings = start.settings
    own_step = bool(settings.global_batch_size) and not start.built.step.accumulates  # the model's own train_step
    if settings.global_batch_size:
        return (None if own_step else smaller_micro_batch(runtime)), own_step
    return runtime.per_replica_batch // 2 or None, own_step


def halve_batch(start: Start, position: Position, checkpoint: RunCheckpoint, writer: Writer) -> None:
    """Out of memory: AUTO_BATCH goes on from the last checkpoint at half the batch (under GLOBAL_BATCH_SIZE: the
    next smaller micro-batch, accumulating more); otherwise a clear error."""
    runtime, settings = position.runtime, start.settings
    failed, picture = runtime.per_replica_batch, memory_picture(runtime)
    smaller, own_step = _smaller(start, runtime)
    if not settings.auto_batch or smaller is None:
        if own_step:
            lower = f"GLOBAL_BATCH_SIZE (e.g. {max(runtime.replicas, runtime.global_batch // 2)}; this model's own "
            lower += "train_step cannot accumulate)"
        elif settings.global_batch_size:
            lower = f"BATCH_SIZE (e.g. {max(1, failed // 2)}: a step then accumulates micro-batches of it)"
        else:
            lower = f"BATCH_SIZE (e.g. {max(1, failed // 2)})"
        halve = "" if runtime.workers > 1 else ", or AUTO_BATCH=true to find one that fits"
        raise TrainingError(
            f"out of memory at BATCH_SIZE={failed} per replica (global batch {runtime.global_batch}); {picture}; "
            f"the last checkpoint {checkpoint.latest} is intact. Lower {lower}, "
            f"set MEMORY_GROWTH=true{halve}"
        ) from None
    now = runtime.with_micro_batch(smaller) if settings.global_batch_size else runtime.with_batch(smaller)
    checkpoint.newest(start.say)
    rebase(start, position, now, checkpoint.step, writer)
    start.built.network.reset_metrics()
    if settings.global_batch_size:
        went_on = (
            f"with micro-batches of {now.per_replica_batch} per replica, {now.accumulation} accumulated a step "
            f"(global batch {now.global_batch} and the data order unchanged)"
        )
    else:
        went_on = f"with BATCH_SIZE={now.per_replica_batch} (global batch {now.global_batch})"
    start.say(
        f"AUTO_BATCH: out of memory at BATCH_SIZE={failed} ({picture}); continuing from {checkpoint.latest} {went_on}."
    )


def memory_picture(runtime: Runtime) -> str:
    """Per-GPU memory now and at peak, or a note that the devices do not report it."""
    if not runtime.plan.visible_gpus:
        return "memory: not reported on CPU"
    from train.devices.backend import TensorFlowDevices

    devices = TensorFlowDevices()
    parts = []
    for logical in range(len(runtime.plan.visible_gpus)):
        info = devices.memory_info(f"GPU:{logical}")
        parts.append(f"GPU:{logical} {info['current'] >> 20} MiB now, {info['peak'] >> 20} MiB peak")
    return "memory: " + "; ".join(parts)
