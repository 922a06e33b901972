"""The run directory opened: its checkpoints restored (a resume) or the initial weights saved (a first start),
this start's place taken up in the run's timeline, and what the chief records of it (through train.writer).

From here on OUTPUT_DIR is written. A resume on other hardware re-bases the epochs and the data (train.timeline);
so does AUTO_BATCH's retry at a smaller batch (`rebase`).
"""

from __future__ import annotations

import json

import keras
import numpy as np

from train.batches import accumulation_changed
from train.checkpoints import RunCheckpoint, make_checkpoint
from train.cluster.role import Role
from train.data.feeds import adapter
from train.data.source import StreamedSplit
from train.devices.runtime import Runtime
from train.errors import SettingsError, TrainingError
from train.hooks import Hook, RunInfo
from train.keras_seams import monitor_direction
from train.model_file import model_fingerprint
from train.run_state import Position, Start
from train.rundir import RunLock
from train.start import moved, topology
from train.timeline import Segment, first_segment, resume, segment_at, unread_pass, with_remainder
from train.writer import Json, Writer


def open_run_dir(
    start: Start, runtime: Runtime, lock: RunLock, role: Role[Writer], hooks: list[Hook]
) -> tuple[Position, RunCheckpoint]:
    """From here on the run directory is written (by the chief only): lock, settings, checkpoints, logs. `hooks`
    (the plug-ins' and MODEL's: train.hooks) hear of the run once the checkpoints have loaded, and what their
    `run_begin` returns goes into run.json."""
    settings, say, writer = start.settings, start.say, role.writer
    writer.lock(lock)
    changed = writer.changed_settings(settings)
    made = make_checkpoint(start.built, start.phases.plan.phased)
    manager = role.checkpoint_manager(made, start.checkpoint_dir, settings.keep_checkpoints)
    checkpoint = RunCheckpoint(made, manager, start.built, runtime.strategy, start.checkpoint_dir)
    try:
        restored = checkpoint.newest(say, role.peers.restore)
    except TrainingError:  # none loads: where settings changed, they are the likelier cause, and a bad input
        if not changed:
            raise
        raise SettingsError(
            f"no checkpoint in {start.checkpoint_dir} loads: settings changed since the run's last start may build "
            "another model than the run's ("
            + ", ".join(f"{name} {before or '(unset)'} -> {now or '(unset)'}" for name, before, now in changed)
            + "), or the checkpoints are corrupt. Set the settings back to the run's (its settings.json), or use "
            "another OUTPUT_DIR; the checkpoints are left as they are"
        ) from None
    # Written once the run's checkpoints have loaded (or there are none): a start that cannot open the run rewrites
    # nothing of it (a run.json naming another model would lock the right one out).
    step = checkpoint.step if restored else 0
    position = _take_up_segment(start, runtime, step, list(start.recorded.get("starts") or []), role)
    # INIT_FROM, once: at a first start, before the step-0 checkpoint; a resume restores it (train.init_from)
    position.initialized_from = start.recorded.get("initialized_from") if restored else _initialize(start)
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
    writer.settings(settings)
    writer.run(run_record(start, position))
    _say_model(start.built.serving, writer, resumed=bool(restored))
    if restored:
        position.resumed_from = checkpoint.step
        say(f"Resuming from {restored} at step {position.resumed_from}.")
        if changed:
            writer.note(
                "warning: resuming with settings changed since this run directory's last start: "
                + ", ".join(f"{name} {before or '(unset)'} -> {now or '(unset)'}" for name, before, now in changed)
                + ". The steps taken stay; the rest follow the new values (a new OUTPUT_DIR starts over)."
            )
    else:
        checkpoint.save(0, 0)  # the initial weights: what AUTO_BATCH restarts from before step 1
    return position, checkpoint


def _initialize(start: Start) -> Json | None:
    """INIT_FROM's values assigned (cross-replica: every replica's copy) at a run's first start; its record."""
    return start.init.apply(start.say) if start.init is not None else None


def hparams(start: Start, runtime: Runtime) -> Json:
    """The resolved settings and what the run resolved, for TensorBoard's HParams table (train.writer)."""
    values: Json = start.settings.typed()  # build_model's hyperparameters (HP_*) among them
    values.update(replicas=runtime.replicas, global_batch=runtime.global_batch, accumulation=runtime.accumulation,
                  precision=runtime.precision, xla=start.jit_compile, data_in_memory=start.data.in_memory)  # fmt: skip
    return values


def _say_model(model: keras.Model, writer: Writer, resumed: bool) -> None:
    """The model's table at the run's first start; a resume names the model and its size in one line."""
    if resumed:
        writer.note(f"Model {model.name}: {model.count_params():,} parameters.")
    else:
        model.summary(print_fn=lambda line, **_: writer.note(line))


def run_record(start: Start, position: Position) -> Json:
    """run.json: what the first start resolved (kept from the file as this start found it), every start (this
    one last), what this start's hooks added; the rest of the file as found (an earlier start's hooks' entries, like
    TRACKING=mlflow's run, kept by a start without them)."""
    settings, recorded = start.settings, start.recorded
    return recorded | {
        "model": settings.model, "model_sha256": model_fingerprint(settings.model),
        "jit_compile": start.jit_compile, "data_in_memory": start.data.in_memory,
        "precision": position.runtime.precision, "data": start.identity, "sync_batch_norm": settings.sync_batch_norm,
        "features": start.features,  # what predict on files needs of the data: it opens no source
        "adapted": start.adapted,  # what MODEL's adapt fitted (train.data.adapt): a later start must fit the same
        **({"phases": start.phases.plan.to_json(position.segment)} if start.phases.plan.phased else {}),
        "initialized_from": position.initialized_from,  # INIT_FROM, applied at step 0 (train.init_from)
        **position.from_hooks,  # what this start's hooks' run_begin added (TRACKING=mlflow's mlflow_run_id)
        **{key: recorded[key] for key in ("jit_compile", "data_in_memory", "precision", "adapted") if key in recorded},
        "starts": position.starts,
    }  # fmt: skip


def segment_facts(start: Start, runtime: Runtime) -> tuple[int, int, int, int]:
    """(global batch, steps per epoch, batches per pass, input pipelines) of the run on `runtime`."""
    feeding = adapter(runtime.strategy, start.data.train)
    pass_batches = feeding.pass_batches(runtime.global_batch)
    return runtime.global_batch, start.settings.steps_per_epoch or pass_batches, pass_batches, feeding.pipelines


def _marks(start: Start, segment: Segment) -> tuple[np.ndarray, ...]:
    """What each input pipeline reads of the rest of the pass `segment` begins with (train.timeline)."""
    if not segment.in_remainder(segment.first_step):
        return ()
    return tuple(start.data.train.remainder_marks(
        start.settings.seed, segment.remainder_pass, segment.read_by, segment.read_batch, segment.read_batches,
        segment.pipelines,
    ))  # fmt: skip


def _with_unread_pass(start: Start, previous: Segment, segment: Segment, step: int
                      ) -> tuple[Segment, tuple[np.ndarray, ...]]:  # fmt: skip
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


def _take_up_segment(start: Start, runtime: Runtime, step: int, starts: list[Json], role: Role[Writer]) -> Position:
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
    this = {"first_step": step, **topology(runtime), "precision": runtime.precision, "xla": start.jit_compile,
            "all_reduce": all_reduce(runtime, start.jit_compile), "global_batch": runtime.global_batch,
            "accumulation": runtime.accumulation, "segment": segment.to_json()}  # fmt: skip
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
    position.starts[-1].update(global_batch=runtime.global_batch, accumulation=runtime.accumulation,
                               segment=position.segment.to_json())  # fmt: skip
    writer.run(run_record(start, position))
