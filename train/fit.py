"""`fit` and `evaluate`: what the CLI calls, each returning plain data.

One training path for every strategy: devices, then the strategy, then the data and the model in its
scope; an explicit loop (train.loop) of `tf.function` calls under `strategy.run` (train.step); checkpoints
that a restart resumes from at step granularity. Keras 3 `model.fit` cannot serve multi-worker strategies
(keras-team/keras#20585) and its BackupAndRestore resumes only per epoch; this loop runs on one device,
N GPUs or N workers alike. What multi-worker does differently sits behind `peers` (train.cluster.workers).

`fit` is the run's story in order; each chapter is a module:

| chapter                                  | module            | gives                                   |
|------------------------------------------|-------------------|-----------------------------------------|
| agree, load the data, build, decide XLA  | train.start       | `Start` (train.run_state), frozen       |
| open the run directory, restore, re-base | train.resume      | `Position` and the `RunCheckpoint`      |
| the calls and the hooks between them     | train.loop, hooks | an `Outcome`                            |
| what goes wrong, in one line             | train.failures    | errors; AUTO_BATCH's retry              |
| evaluate, export, summarise              | train.finish      | summary.json's dict                     |

Which worker this is, chief or not, is decided once: its `Role` (train.cluster.role) holds the peers, the writer
(train.writer: the other workers write nothing) and whatever only the chief does.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import tensorflow as tf

from train.batches import describe_batch
from train.built import build
from train.callbacks import Callbacks
from train.checkpoints import RunCheckpoint, make_checkpoint
from train.cluster.role import Role, take_role
from train.custom_step import make_calls, make_evaluator
from train.data import open_dataset
from train.data.adapt import check_recorded
from train.data.feeds import adapter
from train.data.opening import check_same_data
from train.data.reading_errors import reading_errors
from train.data.source import Remainder
from train.devices.runtime import Runtime, setup_runtime
from train.errors import SettingsError, first_line
from train.failures import halve_batch
from train.finish import Evaluate, Metrics, finish
from train.hooks import Hook, Say
from train.loop import Outcome, Schedule, longest_call, run_loop
from train.model import averaged_weights, use_averaged_weights
from train.model_file import load_model_file
from train.phased import PhaseCalls
from train.progress import Lines
from train.resume import hparams, open_run_dir
from train.run_hooks import FiniteLoss, Profiler, Scalars, StopRequests, between_calls
from train.run_state import Position, Start
from train.rundir import RunLock, check_same_model, read_run, restore_newest
from train.settings import Settings
from train.signals import StopRequest
from train.start import batch_of, cadence_of, run_context, start_run, steps_per_epoch
from train.writer import Json, SummaryWriters, Writer, Writers


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
    role = take_role(runtime, stop, settings.worker_start_timeout, Writers(settings.output_dir, say))
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
            callbacks = Callbacks(list(start.callbacks), start.built.network, start.settings.epochs,
                                  start.context.steps_per_epoch, start.settings.monitor, start.settings.monitor_mode,
                                  role, checkpoint, say, settings.model, start.phases.plan.index_at_epoch)  # fmt: skip
            callbacks.begin(checkpoint.step, position.segment)  # on_train_begin, the recorded epochs replayed
        with peers.guard("training", start.checkpoint_dir):
            outcome = _train(start, position, checkpoint, callbacks, role, scalars, evaluate, plugged)
            start.phases.rates_as_built()  # a schedule unscaled: what the export holds
            if not outcome.interrupted:  # not by a signal (model.stop_training, a pruned trial: finished)
                callbacks.end(outcome.step)
            with reading_errors(start.data, start.settings.dataset, start.settings.model, lambda: checkpoint.latest):
                added = {key: value for hook in plugged for key, value in (hook.summary() or {}).items()}  # a trial's
                summary = finish(start, position, checkpoint, callbacks, role, scalars, evaluate, outcome, added)
                return summary
    finally:  # the peers closed and the run directory freed first: a fork's hook may raise in run_end
        peers.close()
        lock.release()
        for hook in plugged:
            hook.run_end(summary)


def _train(
    start: Start,
    position: Position,
    checkpoint: RunCheckpoint,
    callbacks: Callbacks,
    role: Role[Writer],
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
        schedule, first = Schedule(cadence_of(settings), segment), checkpoint.step
        feed = _feed(start, position, schedule, first)
        say(_describe(start, runtime, schedule, first))
        calls = PhaseCalls(start.phases, segment, lambda runtime=runtime, feed=feed: make_calls(
            start.built, runtime.strategy, feed, runtime.global_batch, start.jit_compile, runtime.accumulation,
        ), runtime.global_batch, checkpoint.record_phase, say)  # fmt: skip
        profiler = role.chief_only(Profiler, settings.profile_steps, settings.to_json()["PROFILE_STEPS"],
                                   start.output_dir, say, first) or Hook()  # fmt: skip
        progress = role.writer.progress(settings.progress, schedule.total_steps, segment.epoch_of, settings.epochs,
                                        first)  # fmt: skip

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
    check_same_model(settings.output_dir, settings.model)
    runtime = setup_runtime(settings, local_only=True)  # on this host, even where TF_CONFIG names a cluster
    recorded = read_run(settings.output_dir)
    precision = recorded.get("precision")
    if settings.mixed_precision == "auto" and precision:
        runtime = runtime.with_precision(precision)
    experiment = load_model_file(settings.model)  # MODEL's file, loaded once for this command and passed down
    dataset = open_dataset(settings, experiment)
    check_same_data(dataset.settings, recorded.get("data"), dataset.identity, "evaluated")  # changed files: refused
    check_recorded(settings, recorded, dataset.adapted)  # the vocabularies it trained with
    in_memory = settings.data_in_memory == "true" or (settings.data_in_memory == "auto" and dataset.fits_in_memory())
    data = dataset.load(settings, in_memory)
    context = run_context(settings, runtime, data, steps_per_epoch(settings, data, runtime))  # this host's facts
    built = build(
        settings, experiment, data.spec, runtime.strategy, context
    )  # its compiled loss and metrics score either source
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
    else:
        predict = None
        source = restore_newest(make_checkpoint(built), settings.output_dir / "checkpoints", say)
        if not source:
            raise SettingsError(f"OUTPUT_DIR={settings.output_dir} has no checkpoint: run fit first")
        use_averaged_weights(built)  # the weights fit evaluated and exported, where the optimizer averages them
    metrics = make_evaluator(built, runtime.strategy, predict)(data.eval, runtime.micro_global_batch)
    return {"source": source, "split": settings.eval_split, "examples": len(data.eval), **metrics}
