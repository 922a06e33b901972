"""The run directory opened and the run ended: its checkpoints restored (a resume) or the initial weights saved (a
first start), this start's place taken up in the run's timeline (`Position`), and at the end both splits evaluated
(every worker takes part), the export and the summary; what the chief records of it, through train.writer.

From here on OUTPUT_DIR is written. A resume on other hardware re-bases the epochs and the data (train.timeline);
so does AUTO_BATCH's retry at a smaller batch (`rebase`). A stop by a signal writes the summary of where it
stopped, and nothing else.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import keras
import numpy as np
import tensorflow as tf

from train.callbacks import Callbacks
from train.checkpoints import RunCheckpoint, make_checkpoint
from train.cluster.role import Role
from train.cluster.workers import WeightsDiffer, WorkerCheckpoints
from train.data.feeds import adapter
from train.data.source import StreamedSplit, TrainSplit
from train.devices.runtime import Runtime
from train.errors import SettingsError, TrainingError, first_line, storage_fix
from train.exportable import averaged_weights, export, model_to_export
from train.hooks import Hook, Json, RunInfo
from train.keras_seams import monitor_direction
from train.loop import Outcome
from train.model import weights_fingerprint
from train.model_file import model_fingerprint
from train.progress import evaluation_notice, format_metrics
from train.rundir import CRASH_LOG, RunLock
from train.start import Start, moved, topology
from train.step import accumulation_changed
from train.timeline import Segment, first_segment, resume, segment_at, unread_pass, with_remainder
from train.writer import SummaryWriters, Writer

Metrics = dict[str, float | list]
Evaluate = Callable[[TrainSplit, int], Metrics]


@dataclass
class Position:
    """Where the run is: the devices and batch it trains at now, how its steps map to epochs and to the data
    (train.timeline), and every start of it. Made when the run directory is opened (`open_run_dir`); it changes in
    one place only: AUTO_BATCH's retry at a smaller batch re-bases it (`rebase`)."""

    runtime: Runtime  # AUTO_BATCH halves its batch
    segment: Segment  # how steps map to epochs and to the data from here on
    marks: tuple[np.ndarray, ...] = ()  # the segment's rest of a streamed pass: what each input pipeline reads of it
    starts: list[Json] = field(default_factory=list)  # every start of the run (run.json), this one last
    resumed_from: int | None = None  # the step this start restored, None for a run's first
    initialized_from: Json | None = None  # INIT_FROM's record (train.init_from): run.json's and summary.json's
    from_hooks: Json = field(default_factory=dict)  # what the hooks' run_begin added to run.json (train.hooks)


def open_run_dir(
    start: Start, runtime: Runtime, lock: RunLock, role: Role, hooks: list[Hook]
) -> tuple[Position, RunCheckpoint]:
    """From here on the run directory is written (by the chief only): lock, settings, checkpoints, logs. `hooks`
    (the plug-ins' and MODEL's: train.hooks) hear of the run once the checkpoints have loaded, and what their
    `run_begin` returns goes into run.json."""
    settings, say, writer = start.settings, start.say, role.writer
    writer.lock(lock)
    changed = ", ".join(f"{name} {before or '(unset)'} -> {now or '(unset)'}" for name, before, now in start.changed)
    made = make_checkpoint(start.built, start.phases.plan.phased)
    manager = WorkerCheckpoints(made, start.checkpoint_dir, settings.keep_checkpoints, role.peers)
    checkpoint = RunCheckpoint(made, manager, start.built, runtime.strategy, start.checkpoint_dir)
    try:
        restored = checkpoint.newest(say, role.peers.restore)
    except TrainingError:  # none loads: where settings changed, they are the likelier cause, and a bad input
        if not changed:
            raise
        raise SettingsError(
            f"no checkpoint in {start.checkpoint_dir} loads: settings changed since the run's last start may build "
            f"another model than the run's ({changed}), or the checkpoints are corrupt. Set the settings back to the "
            "run's (its settings.json), or use another OUTPUT_DIR; the checkpoints are left as they are"
        ) from None
    # Written once the run's checkpoints have loaded (or there are none): a start that cannot open the run rewrites
    # nothing of it (a run.json naming another model would lock the right one out).
    step = checkpoint.step if restored else 0
    position = _take_up_segment(start, runtime, step, list(start.recorded.get("starts") or []), role)
    # INIT_FROM, once: at a first start, before the step-0 checkpoint (every replica's copy); a resume restores it
    if restored:
        position.initialized_from = start.recorded.get("initialized_from")
    elif start.init is not None:
        position.initialized_from = start.init.apply(say)
    run = RunInfo(
        start.output_dir,
        settings.to_json(),
        hparams(start, runtime),
        start.identity,
        start.recorded,
        step,
        bool(restored),
        lambda metric: monitor_direction(start.built.network, metric),
        say,
    )
    position.from_hooks = {key: value for hook in hooks for key, value in (hook.run_begin(run) or {}).items()}
    writer.settings(settings.to_json())
    writer.run(run_record(start, position))
    _say_model(start.built.serving, writer, resumed=bool(restored))
    if restored:
        position.resumed_from = checkpoint.step
        say(f"Resuming from {restored} at step {position.resumed_from}.")
        if changed:
            writer.note(
                f"warning: resuming with settings changed since this run directory's last start: {changed}. The "
                "steps taken stay; the rest follow the new values (a new OUTPUT_DIR starts over)."
            )
    else:
        checkpoint.save(0, 0)  # the initial weights: what AUTO_BATCH restarts from before step 1
    return position, checkpoint


def hparams(start: Start, runtime: Runtime) -> Json:
    """The resolved settings and what the run resolved, for TensorBoard's HParams table (train.writer)."""
    values: Json = start.settings.typed()  # build_model's hyperparameters (HP_*) among them
    values.update(
        replicas=runtime.replicas,
        global_batch=runtime.global_batch,
        accumulation=runtime.accumulation,
        precision=runtime.precision,
        xla=start.jit_compile,
        data_in_memory=start.data.in_memory,
    )
    return values


def _say_model(model: keras.Model, writer: Writer, resumed: bool) -> None:
    """The model's table at the run's first start; a resume names the model and its size in one line."""
    if resumed:
        writer.note(f"Model {model.name}: {model.count_params():,} parameters.")
    else:
        model.summary(print_fn=lambda line, **_: writer.note(line))


def facts(start: Start, position: Position) -> Json:
    """What run.json and summary.json both say of the run: its model, XLA, the data's place, the precision, the
    phases (a run of several) and INIT_FROM, applied at step 0 (train.init_from)."""
    settings, phases = start.settings, start.phases.plan
    return {
        "model": settings.to_json()["MODEL"],  # a path absolute
        "model_sha256": model_fingerprint(settings.model),
        "jit_compile": start.jit_compile,
        "data_in_memory": start.data.in_memory,
        "precision": position.runtime.precision,
        "sync_batch_norm": settings.sync_batch_norm,
        **({"phases": phases.to_json(position.segment)} if phases.phased else {}),
        "initialized_from": position.initialized_from,
    }


def run_record(start: Start, position: Position) -> Json:
    """run.json: what the first start resolved (kept from the file as this start found it), every start (this
    one last), what this start's hooks added; the rest of the file as found (an earlier start's hooks' entries, like
    TRACKING=mlflow's run, kept by a start without them)."""
    recorded = start.recorded
    return recorded | {
        **facts(start, position),
        "data": start.identity,
        "features": start.features,  # what predict on files needs of the data: it opens no source
        "adapted": start.adapted,  # what MODEL's adapt fitted (train.data.adapt): a later start must fit the same
        **position.from_hooks,  # what this start's hooks' run_begin added (TRACKING=mlflow's mlflow_run_id)
        **{key: recorded[key] for key in ("jit_compile", "data_in_memory", "precision", "adapted") if key in recorded},
        "starts": position.starts,
    }


def segment_facts(start: Start, runtime: Runtime) -> tuple[int, int, int, int]:
    """(global batch, steps per epoch, batches per pass, input pipelines) of the run on `runtime`."""
    feeding = adapter(runtime.strategy, start.data.train)
    pass_batches = feeding.pass_batches(runtime.global_batch)
    return runtime.global_batch, start.settings.steps_per_epoch or pass_batches, pass_batches, feeding.pipelines


def _marks(start: Start, segment: Segment) -> tuple[np.ndarray, ...]:
    """What each input pipeline reads of the rest of the pass `segment` begins with (train.timeline)."""
    if not segment.in_remainder(segment.first_step):
        return ()
    return tuple(
        start.data.train.remainder_marks(
            start.settings.seed,
            segment.remainder_pass,
            segment.read_by,
            segment.read_batch,
            segment.read_batches,
            segment.pipelines,
        )
    )


def _with_unread_pass(
    start: Start, previous: Segment, segment: Segment, step: int
) -> tuple[Segment, tuple[np.ndarray, ...]]:
    """A streamed split resumed mid-pass at another worker count reads first what its old workers had not read
    of that pass, every such example once: `segment` with that rest of the pass in front, and its marks."""
    split = start.data.train
    unread = unread_pass(previous, step, segment.pipelines) if isinstance(split, StreamedSplit) else None
    if unread is None or not split.tfrecord:
        return segment, ()
    marks = _marks(start, with_remainder(segment, previous, unread, length=1))  # the length is what they give
    length = min(int(mark.sum()) for mark in marks) // (segment.global_batch // segment.pipelines)
    start.say(
        f"The run stopped in pass {unread[0]} after {unread[1]} of its batches on {previous.pipelines} worker(s); "
        f"on {segment.pipelines} it reads first the {sum(int(mark.sum()) for mark in marks):,} examples of that "
        f"pass not read yet ({length} steps), then the passes after it whole."
    )
    return with_remainder(segment, previous, unread, length), marks


def _take_up_segment(start: Start, runtime: Runtime, step: int, starts: list[Json], role: Role) -> Position:
    """This start's segment (train.timeline): the recorded one at `step`, re-based where the global batch or
    the steps per epoch differ; decided on the chief, the same on every worker. Said where it changes."""
    facts = segment_facts(start, runtime)
    # None recorded: a new run, or a run.json from before starts were recorded (its steps map as they did)
    previous = segment_at(starts, step) or first_segment(*facts)
    segment, marks = resume(previous, step, *facts), ()
    chosen = role.chief_only(_with_unread_pass, start, previous, segment, step)
    if chosen is not None:
        segment, marks = chosen
    text = role.peers.share_from_chief("segment", json.dumps(segment.to_json()))
    segment = Segment.from_json(json.loads(text))
    # the chief's, or (another worker, or a restart inside that rest of a pass) made again: the same
    marks = marks or (_marks(start, segment) if segment.in_remainder(step) else ())
    this = {
        "first_step": step,
        **topology(runtime),
        "precision": runtime.precision,
        "xla": start.jit_compile,
        "all_reduce": all_reduce(runtime, start.jit_compile),
        "global_batch": runtime.global_batch,
        "accumulation": runtime.accumulation,
        "segment": segment.to_json(),
    }
    position = Position(runtime, segment, marks, [*starts, this])
    if moved(starts, runtime):
        last = starts[-1]
        role.writer.note(
            f"This start runs {runtime.replicas} replica(s) on {runtime.workers} worker(s), the last one "
            f"{last.get('replicas')} on {last.get('workers')}: chosen again for these devices, XLA "
            f"{'on' if start.jit_compile else 'off'} and the all-reduce {all_reduce(runtime, start.jit_compile)}."
        )
    if previous.global_batch != segment.global_batch:
        role.writer.note(_new_batch(start, position, previous, step))
    elif starts and starts[-1].get("accumulation", 1) != runtime.accumulation:
        role.writer.note(accumulation_changed(starts[-1], runtime))
    return position


def all_reduce(runtime: Runtime, jit_compile: bool) -> str:
    """The all-reduce the replicas' gradients go through (XLA's own collective where XLA compiles the step)."""
    if runtime.replicas == 1:
        return "none (one replica)"
    if jit_compile:  # under XLA on several replicas TensorFlow uses its own, whatever CROSS_DEVICE_OPS says
        return "xla collective"
    return runtime.cross_device_ops or ("collective ops" if runtime.workers > 1 else "TensorFlow's choice")


def _new_batch(start: Start, position: Position, previous: Segment, step: int) -> str:
    segment, epochs, replicas = position.segment, start.settings.epochs, position.runtime.replicas
    owed = max(0.0, epochs - segment.epochs_done(step))
    return (
        f"warning: the global batch is {segment.global_batch} on this start, {previous.global_batch} before it "
        f"(BATCH_SIZE x {replicas} replica{'s' if replicas > 1 else ''}): EPOCHS={epochs} still counts passes "
        "over the data, so "
        f"the {owed:.2f} epochs still owed take {segment.total_steps(epochs) - step} steps of "
        f"{segment.global_batch} from step {step}, reading on from the same example of the pass under way. Set "
        "GLOBAL_BATCH_SIZE to keep the global batch (and every batch's examples) when the hardware changes."
    )


def rebase(start: Start, position: Position, runtime: Runtime, step: int, writer: Writer) -> None:
    """AUTO_BATCH goes on from `step` on `runtime` (a new global batch, or more micro-batches under
    GLOBAL_BATCH_SIZE): the epochs and the data re-based to it (train.timeline; under GLOBAL_BATCH_SIZE the global
    batch stays, and so does the segment), and run.json's last start updated."""
    position.runtime = runtime
    position.segment = resume(position.segment, step, *segment_facts(start, runtime))
    position.starts[-1].update(
        global_batch=runtime.global_batch, accumulation=runtime.accumulation, segment=position.segment.to_json()
    )
    writer.run(run_record(start, position))


def summary(start: Start, position: Position, checkpoint: RunCheckpoint, outcome: Outcome, fingerprint: str) -> Json:
    """summary.json, but for the evaluations and the export (filled in by `finish`)."""
    runtime, segment, settings, xla = position.runtime, position.segment, start.settings, start.jit_compile
    return {
        "dataset": start.data.name,
        "classes": start.data.spec.classes,
        **facts(start, position),
        "strategy": runtime.strategy_name,
        "workers": runtime.workers,
        "replicas": runtime.replicas,
        "per_replica_batch": runtime.per_replica_batch,
        "accumulation": runtime.accumulation,
        "global_batch": runtime.global_batch,
        "deterministic": runtime.deterministic,
        # Under XLA on several replicas TensorFlow uses its own collective all-reduce, whatever CROSS_DEVICE_OPS says.
        "cross_device_ops": "xla collective" if xla and runtime.replicas > 1 else runtime.cross_device_ops,
        "steps": outcome.step,
        "total_steps": segment.total_steps(settings.epochs),
        "steps_per_epoch": segment.steps_per_epoch,
        "epochs_completed": segment.epochs_completed(outcome.step),
        "resumed_from_step": position.resumed_from,
        # every start: its first step, where it ran, and what it resolved there
        "starts": [{key: value for key, value in each.items() if key != "segment"} for each in position.starts],
        "interrupted": outcome.interrupted,
        "skipped_steps": outcome.skipped,
        "left_out": {"count": 0, "files": []} | start.left_out,  # a folder's files not in the data
        "loss_scale": start.built.loss_scale,
        "examples_per_sec": outcome.examples_per_sec,
        "checkpoint": checkpoint.latest,
        "weights_sha256": fingerprint,
        "train": None,
        "eval": None,
        "exported_model": None,
    }


def finish(
    start: Start,
    position: Position,
    checkpoint: RunCheckpoint,
    callbacks: Callbacks,
    role: Role,
    scalars: SummaryWriters,
    evaluate: Evaluate,
    outcome: Outcome,
    added: Json | None = None,
) -> Json:
    """Evaluate both splits (every worker takes part), export and write the summary (the chief), with what the
    callbacks add to it and `added` (what the plug-ins' and MODEL's hooks' `summary()` return: a tune's trial's
    "trial" and "pruned")."""
    writer = role.writer
    for each in scalars.values():
        each.flush()
    say, peers, built = start.say, role.peers, start.built
    built.average_statistics()  # what is evaluated, exported and compared across workers: the replicas' mean
    fingerprint = weights_fingerprint(built)
    result = summary(start, position, checkpoint, outcome, fingerprint) | callbacks.summary() | (added or {})
    if outcome.interrupted:
        say(
            f"Stopped {peers.stopped_by()} at step {outcome.step}; checkpoint saved. Run the same "
            "command again to resume."
        )
        writer.summary(result)
        return result
    try:
        peers.agree_on_weights(fingerprint)
    except WeightsDiffer as error:
        raise _weights_differ(error, start, checkpoint, role) from None
    callbacks.best.use()  # MONITOR: the best epoch's weights are evaluated and exported
    settings, data = start.settings, start.data
    batch = position.runtime.micro_global_batch  # evaluation fits wherever training fits
    with averaged_weights(built):
        with evaluation_notice(say, settings.train_split, len(data.train)):
            result["train"] = evaluate(data.train, batch)
        with evaluation_notice(say, settings.eval_split, len(data.eval)):
            result["eval"] = evaluate(data.eval, batch)
        result["exported_model"] = role.chief_only(_export, start, checkpoint.latest)
    writer.summary(result)
    workers = position.runtime.workers
    same = f" (the same on all {workers} workers)" if workers > 1 else ""
    output_dir = start.output_dir
    exported = (
        f"; model exported to {output_dir / 'model.keras'} and {output_dir / 'saved_model'}"
        if result["exported_model"]
        else "; the chief exports the model"
    )
    say(
        f"Done: {outcome.step} steps; weights sha256 {fingerprint[:16]}{same}; eval "
        f"{format_metrics(result['eval'])}{exported}."
    )
    peers.done()
    return result


def _export(start: Start, latest: str | None) -> dict[str, str]:
    """model.keras and saved_model/ (train.model.export; the chief's alone); where they are. Raises TrainingError
    where they cannot be written: `latest`, the last checkpoint, is intact."""
    output_dir = start.output_dir
    try:
        return export(start.built, output_dir, model_to_export(start.built))
    except (OSError, tf.errors.OpError) as error:
        raise TrainingError(
            f"could not export the model to {output_dir} ({first_line(error, 160)}); checkpoint "
            f"{latest} is intact: {storage_fix(error, output_dir)} and run again to export"
        ) from None


def _weights_differ(error: WeightsDiffer, start: Start, checkpoint: RunCheckpoint, role: Role) -> TrainingError:
    """The workers' weights differ (a bug of ours): the chief records every worker's hash in crash.log and keeps the
    last checkpoint; every worker says it in one line."""
    header = f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}: the workers ended with different weights (sha256)\n"
    log = role.crash(header + "".join(f"worker {index}: {value}\n" for index, value in enumerate(error.hashes)))
    kept = f"checkpoint {checkpoint.latest} is kept" if checkpoint.latest else "the chief keeps the last checkpoint"
    where = f"every worker's hash is in {log}" if log else f"the chief's {start.output_dir / CRASH_LOG} has every hash"
    return TrainingError(
        f"worker {role.peers.worker_index} of {role.peers.workers}: the workers ended with different weights "
        f"({error}): the replicas were not kept in sync; this is a bug; {kept}; {where}: please report it with "
        "the logs of every worker"
    )
