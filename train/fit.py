"""`fit` and `evaluate`: what the CLI calls, each returning plain data.

One training path for every strategy: devices, then the strategy, then the data and the model in its
scope; an explicit loop (train.loop) of `tf.function` calls under `strategy.run` (train.step); checkpoints
that a restart resumes from at step granularity. Keras 3 `model.fit` cannot serve multi-worker strategies
(keras-team/keras#20585) and its BackupAndRestore resumes only per epoch; this loop runs on one device,
N GPUs or N workers alike. What multi-worker does differently sits behind `peers` (train.cluster.workers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from train.accumulation import refuse_custom_train_step
from train.adapt import check_recorded
from train.batches import accumulation_changed, describe_batch, smaller_micro_batch
from train.callbacks import Callbacks, build_callbacks
from train.checkpoints import RunCheckpoint, make_checkpoint, restore_newest, save_checkpoint
from train.cluster.agreement import Decision, reconcile, report
from train.cluster.workers import SingleHost, connect
from train.context import run_context
from train.custom_step import make_calls, make_evaluator, overrides_train_step, refuse_unevaluated_monitor
from train.data import (
    Data,
    Dataset,
    Remainder,
    StreamedSplit,
    batches_per_pass,
    gathers_in_step,
    input_pipelines,
    make_feed,
    open_dataset,
)
from train.data.images import DECODE_ERROR, undecodable
from train.data.opening import check_same_data, data_identity_text
from train.data.raised import preprocess_raised
from train.data.shapes import odd_shape
from train.devices.runtime import Runtime, auto_precision, choose_xla, setup_runtime
from train.errors import SettingsError, TrainingError, first_line, storage_fix
from train.exportable import check_exportable
from train.loop import Outcome, Schedule, check_finite, longest_call, run_loop, write_scalars
from train.model import (
    Built,
    averaged_weights,
    build,
    export,
    model_to_export,
    use_averaged_weights,
    weights_fingerprint,
)
from train.model_file import RESNET_EXAMPLE
from train.progress import evaluation_notice, format_metrics, reporter
from train.rundir import RUN, RunLock, StopRequest, check_same_model, read_run, write_json
from train.settings import RUN_SETTINGS, Settings, agreed_settings, changed_settings, model_fingerprint
from train.timeline import Segment, first_segment, resume, segment_at, unread_pass, with_remainder

Say = Callable[[str], None]


def _say(message: str) -> None:
    print(message, flush=True)


def steps_per_epoch(settings: Settings, data: Data, runtime: Runtime) -> int:
    """STEPS_PER_EPOCH, or one pass over the split. Raises SettingsError for a split under one global batch."""
    pipelines = input_pipelines(runtime.strategy, streamed=not data.in_memory)
    return settings.steps_per_epoch or batches_per_pass(data.train, runtime.global_batch, pipelines=pipelines)


def _workers_here(runtime: Runtime) -> int:
    """The workers TF_CONFIG places on this host (each holds its own copy of the data in memory)."""
    if runtime.cluster is None:
        return 1
    host = runtime.cluster.address.rpartition(":")[0]
    local = {host, "localhost", "127.0.0.1", socket.gethostname()} if host in ("localhost", "127.0.0.1") else {host}
    return sum(address.rpartition(":")[0] in local for address in runtime.cluster.addresses)


def agree(settings: Settings, runtime: Runtime, peers: SingleHost, dataset: Dataset) -> Decision:
    """Every worker's settings, model and facts against the chief's, and one answer for each auto."""
    spec = dataset.spec
    facts = {
        "local replicas": len(runtime.devices),
        "examples": f"{spec.train_examples} train, {spec.eval_examples} eval",
        "inputs": spec.describe_inputs(),
        "label": f"{spec.label_key} {list(spec.label_shape)} {spec.label_dtype}",
        "data": data_identity_text(dataset.identity),  # the data itself, not DATASET's text (a path differs by host)
    }
    recorded = read_run(settings.output_dir) if peers.is_chief else {}
    check_recorded(settings, recorded, dataset.adapted)  # a start whose adapt fitted other vocabularies
    this_worker = report(
        agreed_settings(settings), model_fingerprint(settings.model), facts,
        dataset.fits_in_memory(_workers_here(runtime)), auto_precision(runtime.plan)[0], recorded, dataset.adapted,
    )  # fmt: skip
    return reconcile(peers.all_gather("report", this_worker))


def _topology(runtime: Runtime) -> dict[str, Any]:
    """What a start ran on: a resume on other devices decides again what does not change the math."""
    return {"workers": runtime.workers, "replicas": runtime.replicas, "devices": list(runtime.devices)}


def _decide_xla(settings: Settings, runtime: Runtime, peers: SingleHost, built: Built, whole_call: bool, jit: str):
    """XLA on or off, decided on the chief at a run's first start and reused on resume (on the same devices; on
    others, decided again: it does not change the math), the same on every worker."""
    recorded_run = read_run(settings.output_dir) if peers.is_chief else {}
    recorded = recorded_run.get("jit_compile")
    starts = recorded_run.get("starts") or []
    moved = _moved(starts, runtime)
    if jit == "auto" and recorded is not None and not moved and not runtime.deterministic:  # DETERMINISTIC: off
        try:
            choose_xla("true" if recorded else "false", runtime, whole_call, built.convolutional, None)
            on, why = bool(recorded), "auto: as this run's first start decided"
        except SettingsError:
            on, why = False, "auto: this run's first start had it on, but it cannot be here"
    else:
        on, why = choose_xla(jit, runtime, whole_call, built.convolutional, built.layer_without_xla())
        if moved and jit == "auto":
            last = starts[-1]
            why = (f"{why}; chosen again: the last start ran {last.get('replicas')} replica(s) on "
                   f"{last.get('workers')} worker(s)")  # fmt: skip
    on = peers.share_from_chief("jit", "1" if on else "0") == "1"
    return on, why if peers.is_chief else "as the chief decided"


@dataclass
class Run:
    """Everything a training run is made of, and what it does between calls (train.loop.run_loop calls it)."""

    settings: Settings
    runtime: Runtime
    peers: SingleHost
    data: Data
    built: Built
    jit_compile: bool
    jit_why: str
    say: Say
    checkpoint: Any = None
    manager: Any = None
    restorer: Any = None
    writers: dict[str, Any] = field(default_factory=dict)
    evaluate: Any = None  # train.step.Evaluator, or the model's own test_step's (train.custom_step)
    progress: Any = None
    resumed_from: int | None = None
    profiling: bool = False
    segment: Segment | None = None  # how steps map to epochs and to the data from here on (train.timeline)
    marks: tuple[Any, ...] = ()  # the segment's rest of a streamed pass: what each input pipeline reads of it
    starts: list[dict[str, Any]] = field(default_factory=list)  # every start of the run (run.json), this one last
    context: Any = None  # train.context.Context: the run's facts, as build_model and build_callbacks got them
    callbacks: Any = None  # train.callbacks.Callbacks: the fork's callbacks, MONITOR, epochs.json
    identity: dict[str, Any] = field(default_factory=dict)  # the data's (train.data.opening): run.json's "data"
    adapted: dict[str, Any] = field(default_factory=dict)  # what MODEL's adapt fitted (train.adapt.fingerprint)

    @property
    def output_dir(self) -> Path:
        return self.settings.output_dir

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"

    # --- between calls (train.loop) ---

    def should_stop(self, step: int, saved_step: int, skipped: int) -> bool:
        if self.callbacks.stop_requested(step):  # model.stop_training: ends the run, with a checkpoint
            if saved_step != step:
                self.save(step, skipped)
            return True
        return self.peers.should_stop(step, saved_step)

    def before_call(self, step: int) -> None:
        """PROFILE_STEPS: the chief's trace starts before step START (counted from 1), into logs/."""
        profile = self.settings.profile_steps
        if profile and self.peers.is_chief and not self.profiling and profile[0] - 1 <= step < profile[1]:
            tf.profiler.experimental.start(str(self.output_dir / "logs"))
            self.profiling = True
        self.callbacks.before_call(step)

    def after_call(self, step: int, result, examples_per_sec: float | None) -> None:
        self.progress.called(step, result.metrics, examples_per_sec)
        self.callbacks.after_call(step, result.metrics)
        if self.profiling and step >= self.settings.profile_steps[1]:
            tf.profiler.experimental.stop()
            self.profiling = False
            where = self.output_dir / "logs" / "plugins" / "profile"
            text = self.settings.to_json()["PROFILE_STEPS"]
            self.say(f"PROFILE_STEPS={text}: trace written to {where} (make tensorboard, its Profile tab)")

    def check(self, result, step: int, skipped: int) -> None:
        check_finite(result, step, self.built.loss_scale, skipped, self.manager.latest_checkpoint)

    def log(self, step: int, result, examples_per_sec: float | None) -> None:
        self.progress.log(step, result.metrics, examples_per_sec)
        write_scalars(self.writers["train"], step, result.metrics, examples_per_sec=examples_per_sec or 0.0)

    def end_epoch(self, epoch: int, step: int) -> None:
        with averaged_weights(self.built), self.progress.evaluating(self.settings.eval_split, len(self.data.eval)):
            metrics = self.evaluate(self.data.eval, self.runtime.micro_global_batch)
        self.progress.evaluated(epoch, metrics)
        write_scalars(self.writers["eval"], step, metrics)
        self.callbacks.end_epoch(epoch, step, metrics)

    def save(self, step: int, skipped: int) -> None:
        save_checkpoint(self.manager, step, skipped)
        self.callbacks.saved(step)


def _start(settings: Settings, runtime: Runtime, peers: SingleHost, say: Say) -> Run:
    """Agree, load the data, build and check the model, decide XLA: everything before the run directory."""
    for note in runtime.notes:
        say(note)
    if runtime.cluster is not None:
        writes = f", chief: writes {settings.output_dir}" if peers.is_chief else ""
        say(f"Worker {peers.worker_index} of {peers.workers} ({runtime.cluster.address}{writes}): all workers joined.")
    dataset = open_dataset(settings, say)
    settings = dataset.settings  # a dataset with one split: TRAIN_SPLIT and EVAL_SPLIT slice it
    if peers.is_chief:
        check_same_data(settings, dataset.identity)  # another DATASET, or changed files: before anything is built
    decision = agree(settings, runtime, peers, dataset)
    runtime = runtime.with_precision(decision.precision)
    data = dataset.load(settings, decision.data_in_memory, _workers_here(runtime))
    for line in (*decision.notes, *data.notes):
        say(line)
    context = run_context(settings, runtime, data, steps_per_epoch(settings, data, runtime))  # a split under one
    built = build(settings, data.spec, runtime.strategy, context)  # global batch, a bad model: before writing
    if built.custom_step is not None and runtime.precision == "mixed_float16":  # MIXED_PRECISION=auto (train.model)
        say("MIXED_PRECISION=auto: float32, not mixed_float16, for a model's own train_step (its loss scale would "
            "judge each replica's gradients alone); mixed_bfloat16 needs compute capability 8.0+.")  # fmt: skip
        runtime = runtime.with_precision("float32")
        context = run_context(settings, runtime, data, steps_per_epoch(settings, data, runtime))
        built = build(settings, data.spec, runtime.strategy, context)
    refuse_unevaluated_monitor(settings.monitor, settings.model, built)
    refuse_custom_train_step(settings.model, built.network, runtime.accumulation)
    if peers.is_chief:  # the one that exports: a model it could not export is refused before the first step
        check_exportable(built, settings)
    whole_call = gathers_in_step(runtime.strategy, data.spec.records)  # the feed lets XLA compile the whole call
    jit, why = _decide_xla(settings, runtime, peers, built, whole_call, decision.jit_compile)
    if jit and decision.jit_compile == "auto" and built.custom_step is not None and not built.network.jit_compile:
        # as model.fit runs it: a step of the fork's own may hold what XLA cannot compile (a tf.print)
        jit, why = False, "auto: off, as model.fit runs this model's own train_step (its jit_compile is False)"
    run = Run(settings, runtime, peers, data, built, jit, why, say, context=context, identity=dataset.identity,
              adapted=dataset.adapted)  # fmt: skip
    run.callbacks = Callbacks(build_callbacks(settings, context), run)  # bad callbacks: before writing
    return run


def _open_run_dir(run: Run, lock: RunLock) -> None:
    """From here on the run directory is written (by the chief only): lock, settings, checkpoints, logs."""
    settings, say = run.settings, run.say
    changed: list[tuple[str, str, str]] = []
    if run.peers.is_chief:
        lock.acquire()
        changed = changed_settings(run.output_dir / RUN_SETTINGS, settings)
    run.checkpoint = make_checkpoint(run.built)
    run.manager = run.peers.checkpoint_manager(run.checkpoint, run.checkpoint_dir, settings.keep_checkpoints)
    run.restorer = RunCheckpoint(run.checkpoint, run.manager, run.built, run.runtime.strategy, run.checkpoint_dir)
    restored = run.restorer.newest(say, run.peers.restore)
    # Written once the run's checkpoints have loaded (or there are none): a start that cannot open the run rewrites
    # nothing of it (a run.json naming another model would lock the right one out).
    step = int(run.checkpoint.step.numpy()) if restored else 0
    recorded = read_run(run.output_dir) if run.peers.is_chief else {}
    _take_up_segment(run, step, recorded.get("starts") or [])
    if run.peers.is_chief:
        write_json(run.output_dir / RUN_SETTINGS, settings.to_json())
        _write_run(run, recorded)
        _say_model(run.built.serving, say, resumed=bool(restored))
    if restored:
        run.resumed_from = int(run.checkpoint.step.numpy())
        say(f"Resuming from {restored} at step {run.resumed_from}.")
        if run.peers.is_chief and changed:
            say(
                "warning: resuming with settings changed since this run directory's last start: "
                + ", ".join(f"{name} {before or '(unset)'} -> {now or '(unset)'}" for name, before, now in changed)
                + ". The steps taken stay; the rest follow the new values (a new OUTPUT_DIR starts over)."
            )
    else:
        save_checkpoint(run.manager, 0, 0)  # the initial weights: what AUTO_BATCH restarts from before step 1
    logs = run.output_dir / "logs"
    make = tf.summary.create_file_writer if run.peers.is_chief else (lambda _: tf.summary.create_noop_writer())
    run.writers = {name: make(str(logs / name)) for name in ("train", "eval")}
    if run.peers.is_chief:
        write_hparams(run, logs)
    run.evaluate = make_evaluator(run.built, run.runtime.strategy)


def _say_model(model: keras.Model, say: Say, resumed: bool) -> None:
    """The model's table at the run's first start; a resume names the model and its size in one line."""
    if resumed:
        say(f"Model {model.name}: {model.count_params():,} parameters.")
    else:
        model.summary(print_fn=lambda line, **_: say(line))


def _segment_facts(run: Run) -> tuple[int, int, int, int]:
    """(global batch, steps per epoch, batches per pass, input pipelines) of the run as it now is."""
    runtime = run.runtime
    pipelines = input_pipelines(runtime.strategy, streamed=not run.data.in_memory)
    pass_batches = batches_per_pass(run.data.train, runtime.global_batch, pipelines=pipelines)
    return runtime.global_batch, steps_per_epoch(run.settings, run.data, runtime), pass_batches, pipelines


def _marks(run: Run, segment: Segment) -> tuple[Any, ...]:
    """What each input pipeline reads of the rest of the pass `segment` begins with (train.timeline)."""
    if not segment.in_remainder(segment.first_step):
        return ()
    return tuple(run.data.train.remainder_marks(
        run.settings.seed, segment.remainder_pass, segment.read_by, segment.read_batch, segment.read_batches,
        segment.pipelines,
    ))  # fmt: skip


def _with_unread_pass(run: Run, previous: Segment, segment: Segment, step: int) -> tuple[Segment, tuple[Any, ...]]:
    """A streamed split resumed mid-pass at another worker count reads first what its old workers had not read
    of that pass, every such example once: `segment` with that rest of the pass in front, and its marks."""
    split = run.data.train
    unread = unread_pass(previous, step, segment.pipelines) if isinstance(split, StreamedSplit) else None
    if unread is None or not split.as_records:
        return segment, ()
    marks = _marks(run, with_remainder(segment, previous, unread, length=1))  # the length is what they give
    length = min(int(mark.sum()) for mark in marks) // (segment.global_batch // segment.pipelines)
    run.say(
        f"The run stopped in pass {unread[0]} after {unread[1]} of its batches on {previous.pipelines} worker(s); "
        f"on {segment.pipelines} it reads first the {sum(int(mark.sum()) for mark in marks):,} examples of that "
        f"pass not read yet ({length} steps), then the passes after it whole."
    )
    return with_remainder(segment, previous, unread, length), marks


def _moved(starts: list[dict[str, Any]], runtime: Runtime) -> bool:
    """Whether this start runs on other devices or workers than the last one recorded."""
    return bool(starts) and {key: starts[-1].get(key) for key in _topology(runtime)} != _topology(runtime)


def _take_up_segment(run: Run, step: int, starts: list[dict[str, Any]]) -> None:
    """This start's segment (train.timeline): the recorded one at `step`, re-based where the global batch or
    the steps per epoch differ; decided on the chief, the same on every worker. Said where it changes."""
    facts = _segment_facts(run)
    # None recorded: a new run, or a run.json from before starts were recorded (its steps map as they did)
    previous = segment_at(starts, step) or first_segment(*facts)
    segment, marks = resume(previous, step, *facts), ()
    if run.peers.is_chief:
        segment, marks = _with_unread_pass(run, previous, segment, step)
    text = run.peers.share_from_chief("segment", json.dumps(segment.to_json()))
    run.segment = Segment.from_json(json.loads(text))
    # the chief's, or (another worker, or a restart inside that rest of a pass) made again: the same
    run.marks = marks or (_marks(run, run.segment) if run.segment.in_remainder(step) else ())
    run.starts = [*starts, {"first_step": step, **_topology(run.runtime), "precision": run.runtime.precision,
                            "xla": run.jit_compile, "all_reduce": _all_reduce(run), "global_batch":
                            run.runtime.global_batch, "accumulation": run.runtime.accumulation,
                            "segment": run.segment.to_json()}]  # fmt: skip
    if run.peers.is_chief and _moved(starts, run.runtime):
        last = starts[-1]
        run.say(
            f"This start runs {run.runtime.replicas} replica(s) on {run.runtime.workers} worker(s), the last one "
            f"{last.get('replicas')} on {last.get('workers')}: chosen again for these devices, XLA "
            f"{'on' if run.jit_compile else 'off'} and the all-reduce {_all_reduce(run)}."
        )
    if run.peers.is_chief and previous.global_batch != run.segment.global_batch:
        _say_new_batch(run, previous, step)
    elif run.peers.is_chief and starts and starts[-1].get("accumulation", 1) != run.runtime.accumulation:
        run.say(accumulation_changed(starts[-1], run.runtime))


def _all_reduce(run: Run) -> str:
    """The all-reduce the replicas' gradients go through (XLA's own collective where XLA compiles the step)."""
    runtime = run.runtime
    if runtime.replicas == 1:
        return "none (one replica)"
    if run.jit_compile:  # under XLA on several replicas TensorFlow uses its own, whatever CROSS_DEVICE_OPS says
        return "xla collective"
    return runtime.cross_device_ops or ("collective ops" if runtime.workers > 1 else "TensorFlow's choice")


def _say_new_batch(run: Run, previous: Segment, step: int) -> None:
    segment, epochs, replicas = run.segment, run.settings.epochs, run.runtime.replicas
    owed = max(0.0, epochs - segment.epochs_done(step))
    run.say(
        f"warning: the global batch is {segment.global_batch} on this start, {previous.global_batch} before it "
        f"(BATCH_SIZE x {replicas} replica{'s' if replicas > 1 else ''}): EPOCHS={epochs} still counts passes "
        "over the data, so "
        f"the {owed:.2f} epochs still owed take {segment.total_steps(epochs) - step} steps of "
        f"{segment.global_batch} from step {step}, reading on from the same example of the pass under way. Set "
        "GLOBAL_BATCH_SIZE to keep the global batch (and every batch's examples) when the hardware changes."
    )


def _write_run(run: Run, recorded: dict[str, Any]) -> None:
    """run.json: what the first start resolved (kept from `recorded`, the file as it was), every start (this one
    last)."""
    settings = run.settings
    write_json(run.output_dir / RUN, {
        "model": settings.model, "model_sha256": model_fingerprint(settings.model),
        "jit_compile": run.jit_compile, "data_in_memory": run.data.in_memory, "precision": run.runtime.precision,
        "data": run.identity,
        "adapted": run.adapted,  # what MODEL's adapt fitted (train.adapt): a later start must fit the same
        **{key: recorded[key] for key in ("jit_compile", "data_in_memory", "precision", "adapted") if key in recorded},
        "starts": run.starts,
    })  # fmt: skip


def write_hparams(run: Run, logs: Path) -> None:
    """An HParams session at logs/, so that its train/ and eval/ scalars attach to it: the resolved settings
    and what the run resolved, for TensorBoard's HParams table (runs under one parent, side by side)."""
    from tensorboard.plugins.hparams import api as hp

    values: dict[str, Any] = run.settings.typed()  # build_model's hyperparameters (HP_*) among them
    runtime = run.runtime
    values.update(replicas=runtime.replicas, global_batch=runtime.global_batch, accumulation=runtime.accumulation,
                  precision=runtime.precision, xla=run.jit_compile, data_in_memory=run.data.in_memory)  # fmt: skip
    with tf.summary.create_file_writer(str(logs)).as_default():
        hp.hparams(values, trial_id=str(run.output_dir))


def _describe(run: Run, schedule: Schedule, start_step: int) -> str:
    runtime, data = run.runtime, run.data
    if start_step < schedule.total_steps:
        span = f"steps {start_step}-{schedule.total_steps}"
    else:
        span = (
            f"already at step {start_step} of {schedule.total_steps} (EPOCHS={run.settings.epochs} x "
            f"{schedule.steps_per_epoch}; the steps taken count, at whatever batch size): nothing to train, "
            "evaluating again"
        )
    workers = f" on {runtime.workers} workers" if runtime.workers > 1 else ""
    where = "in memory" if data.in_memory else "streamed from the TFDS files"
    if data.spec.records:
        made = "preprocessed" if data.spec.examples.preprocess else "decoded"
        where += f" as the stored records, each {made} in tf.data"
    if not gathers_in_step(runtime.strategy, data.spec.records):
        how = "fed by tf.data"
    else:
        how = "gathered inside the step" if data.in_memory else "read ahead a call at a time"
    per_epoch = f"{schedule.steps_per_epoch} step{'s' if schedule.steps_per_epoch != 1 else ''} per epoch"
    return (
        f"Training {data.name} on {runtime.replicas} replica(s){workers} ({runtime.strategy_name}: "
        f"{', '.join(runtime.devices)}{' on each worker' if workers else ''}), "
        f"{describe_batch(run.settings, runtime)}, {per_epoch}, {span}; {runtime.precision}; "
        f"data {where}, batches {how}, XLA {'on' if run.jit_compile else 'off'} ({run.jit_why})."
    )


def _train(run: Run) -> Outcome:
    """The loop, at BATCH_SIZE; on out-of-memory with AUTO_BATCH, again from the last checkpoint at half."""
    settings, say = run.settings, run.say
    run.peers.watch_stops(lambda step: save_checkpoint(run.manager, step, int(run.checkpoint.skipped_steps)))
    while True:
        runtime = run.runtime
        schedule, segment = Schedule(settings, run.segment), run.segment
        start = int(run.checkpoint.step.numpy())
        remainder = None
        if segment.in_remainder(start):  # the rest of a streamed pass first (train.timeline)
            length, done = segment.remainder_end - segment.first_step, start - segment.first_step
            remainder = Remainder(segment.remainder_pass, run.marks, length, done)
        feed = make_feed(runtime.strategy, run.data.train, runtime.global_batch, settings.seed,
                         segment.data_step(max(start, segment.remainder_end) if remainder else start),
                         longest_call(settings, schedule.steps_per_epoch), settings.device_prefetch,
                         remainder)  # fmt: skip
        say(_describe(run, schedule, start))
        calls = make_calls(run.built, runtime.strategy, feed, runtime.global_batch, run.jit_compile,
                           runtime.accumulation)  # fmt: skip
        _say_profile(run, start)
        run.progress = reporter(settings.progress, run.peers.is_chief, say, schedule.total_steps,
                                segment.epoch_of, settings.epochs, start)  # fmt: skip
        try:
            with (  # the innermost hears an error first: an odd shape, then a damaged or undecodable file
                preprocess_raised(run.data.spec, settings.model, lambda: run.manager.latest_checkpoint),
                streamed_files_intact(run),
                preprocess_shapes_hold(run),
            ):
                return run_loop(calls, schedule, start, int(run.checkpoint.skipped_steps.numpy()), run)
        except tf.errors.ResourceExhaustedError:
            _halve_batch(run)
        finally:
            run.progress.close()
            if run.profiling:
                tf.profiler.experimental.stop()
                run.profiling = False


def _say_profile(run: Run, start: int) -> None:
    """PROFILE_STEPS on resume: a range already passed is a note; one under way is traced from here."""
    profile = run.settings.profile_steps
    if not profile or not run.peers.is_chief:
        return
    text = run.settings.to_json()["PROFILE_STEPS"]
    if start >= profile[1]:
        run.say(f"PROFILE_STEPS={text}: those steps were trained before this start (at step {start}): no trace.")
    elif start >= profile[0]:
        run.say(
            f"PROFILE_STEPS={text}: resumed at step {start}, inside the range: tracing steps {start + 1}-{profile[1]}."
        )


@contextlib.contextmanager
def streamed_files_intact(run: Run) -> Iterator[None]:
    """Damage in a streamed split's files, found while reading them (training or evaluating), in one line; and an
    image that cannot be decoded, by its filename."""
    try:
        yield
    # What reading damaged TFRecords raises: lost bytes, a missing file, fewer examples than recorded.
    except (tf.errors.DataLossError, tf.errors.NotFoundError, tf.errors.FailedPreconditionError) as error:
        if run.data.in_memory:
            raise
        raise TrainingError(
            f"reading the streamed {run.data.name} failed while training ({first_line(error, 160)}): its prepared "
            f"files are damaged; the last checkpoint {run.manager.latest_checkpoint} is intact. Delete the "
            "dataset's directory, prepare it anew and run again to resume"
        ) from None
    except tf.errors.InvalidArgumentError as error:
        if not DECODE_ERROR.search(str(error.message)):
            raise
        for split in (run.data.train, run.data.eval):
            found = undecodable(split, run.data.spec)
            if found:
                raise TrainingError(
                    f"the image {found[0]} of DATASET={run.settings.dataset} cannot be decoded ({found[1]}); the last "
                    f"checkpoint {run.manager.latest_checkpoint} is intact. Remove or replace the file and train in a "
                    "new OUTPUT_DIR (the data then differs)"
                ) from None
        raise


@contextlib.contextmanager
def preprocess_shapes_hold(run: Run) -> Iterator[None]:
    """A later example whose output differs from the shape the first examples gave (train.data.shapes), in one
    line."""
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        odd = odd_shape(error)
        if odd is None:
            raise
        raise TrainingError(
            f"MODEL={run.settings.model!r}: preprocess returned {odd[0]} for an example of {run.data.name}, where the "
            f"first examples gave {odd[1]}; the last checkpoint {run.manager.latest_checkpoint} is intact. Make "
            f"preprocess return one shape for every example (resize or crop it to a constant size, as "
            f"{RESNET_EXAMPLE} does)"
        ) from None


def _halve_batch(run: Run) -> None:
    """Out of memory: AUTO_BATCH goes on from the last checkpoint at half the batch (under GLOBAL_BATCH_SIZE: the
    next smaller micro-batch, accumulating more); otherwise a clear error."""
    runtime, settings = run.runtime, run.settings
    failed, picture = runtime.per_replica_batch, memory_picture(runtime)
    own_step = bool(settings.global_batch_size) and overrides_train_step(run.built.network)  # cannot accumulate
    if settings.global_batch_size:
        smaller = None if own_step else smaller_micro_batch(runtime)
    else:
        smaller = failed // 2 or None
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
            f"the last checkpoint {run.manager.latest_checkpoint} is intact. Lower {lower}, "
            f"set MEMORY_GROWTH=true{halve}"
        ) from None
    run.runtime = runtime.with_micro_batch(smaller) if settings.global_batch_size else runtime.with_batch(smaller)
    run.restorer.newest(run.say)
    # A new global batch from the restored step on: the epochs and the data re-based to it (train.timeline); under
    # GLOBAL_BATCH_SIZE the global batch stays, and so does the segment.
    run.segment = resume(run.segment, int(run.checkpoint.step.numpy()), *_segment_facts(run))
    run.starts[-1].update(global_batch=run.runtime.global_batch, accumulation=run.runtime.accumulation,
                          segment=run.segment.to_json())  # fmt: skip
    if run.peers.is_chief:
        _write_run(run, read_run(run.output_dir))
    run.built.network.reset_metrics()
    now = run.runtime
    if settings.global_batch_size:
        went_on = (f"with micro-batches of {now.per_replica_batch} per replica, {now.accumulation} accumulated a step "
                   f"(global batch {now.global_batch} and the data order unchanged)")  # fmt: skip
    else:
        went_on = f"with BATCH_SIZE={now.per_replica_batch} (global batch {now.global_batch})"
    run.say(
        f"AUTO_BATCH: out of memory at BATCH_SIZE={failed} ({picture}); continuing from "
        f"{run.manager.latest_checkpoint} {went_on}."
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


def _summary(run: Run, outcome: Outcome, fingerprint: str) -> dict[str, Any]:
    runtime, schedule = run.runtime, Schedule(run.settings, run.segment)
    return {
        "dataset": run.data.name,
        "classes": run.data.spec.classes,
        "model": run.settings.model,
        "model_sha256": model_fingerprint(run.settings.model),
        "strategy": runtime.strategy_name,
        "workers": runtime.workers,
        "replicas": runtime.replicas,
        "per_replica_batch": runtime.per_replica_batch,
        "accumulation": runtime.accumulation,
        "global_batch": runtime.global_batch,
        "data_in_memory": run.data.in_memory,
        "jit_compile": run.jit_compile,
        "precision": runtime.precision,
        "deterministic": runtime.deterministic,
        # Under XLA on several replicas TensorFlow uses its own collective all-reduce, whatever CROSS_DEVICE_OPS says.
        "cross_device_ops": "xla collective" if run.jit_compile and runtime.replicas > 1 else runtime.cross_device_ops,
        "steps": outcome.step,
        "total_steps": schedule.total_steps,
        "steps_per_epoch": schedule.steps_per_epoch,
        "epochs_completed": run.segment.epochs_completed(outcome.step),
        "resumed_from_step": run.resumed_from,
        # every start: its first step, where it ran, and what it resolved there
        "starts": [{key: value for key, value in start.items() if key != "segment"} for start in run.starts],
        "interrupted": outcome.interrupted,
        "skipped_steps": outcome.skipped,
        "loss_scale": run.built.loss_scale,
        "examples_per_sec": outcome.examples_per_sec,
        "checkpoint": run.manager.latest_checkpoint,
        "weights_sha256": fingerprint,
        "train": None,
        "eval": None,
        "exported_model": None,
    }


def _finish(run: Run, outcome: Outcome) -> dict[str, Any]:
    """Evaluate both splits (every worker takes part), export and write the summary (the chief)."""
    for writer in run.writers.values():
        writer.flush()
    fingerprint = weights_fingerprint(run.built)
    summary = _summary(run, outcome, fingerprint) | run.callbacks.summary()
    if outcome.interrupted:
        run.say(f"Stopped {run.peers.stopped_by()} at step {outcome.step}; checkpoint saved. Run the same "
                "command again to resume.")  # fmt: skip
        if run.peers.is_chief:
            write_json(run.output_dir / "summary.json", summary)
        return summary
    run.peers.agree_on_weights(fingerprint)
    run.callbacks.use_best()  # MONITOR: the best epoch's weights are evaluated and exported
    settings, batch = run.settings, run.runtime.micro_global_batch  # evaluation fits wherever training fits
    with averaged_weights(run.built):
        with evaluation_notice(run.say, settings.train_split, len(run.data.train)):
            summary["train"] = run.evaluate(run.data.train, batch)
        with evaluation_notice(run.say, settings.eval_split, len(run.data.eval)):
            summary["eval"] = run.evaluate(run.data.eval, batch)
        if run.peers.is_chief:
            try:
                summary["exported_model"] = export(run.built, run.output_dir, model_to_export(settings, run.built))
            except (OSError, tf.errors.OpError) as error:
                raise TrainingError(
                    f"could not export the model to {run.output_dir} ({first_line(error, 160)}); checkpoint "
                    f"{run.manager.latest_checkpoint} is intact: {storage_fix(error, run.output_dir)} and run again "
                    "to export"
                ) from None
    if run.peers.is_chief:
        write_json(run.output_dir / "summary.json", summary)
    same = f" (the same on all {run.runtime.workers} workers)" if run.runtime.workers > 1 else ""
    exported = (f"; model exported to {run.output_dir / 'model.keras'} and {run.output_dir / 'saved_model'}"
                if run.peers.is_chief else "; the chief exports the model")  # fmt: skip
    run.say(f"Done: {outcome.step} steps; weights sha256 {fingerprint[:16]}{same}; eval "
            f"{format_metrics(summary['eval'])}{exported}.")  # fmt: skip
    run.peers.done()
    return summary


def fit(settings: Settings, stop: StopRequest, say: Say = _say) -> dict[str, Any]:
    """Train (or resume) to EPOCHS x steps per epoch; returns the summary also written to summary.json.

    `stop` is the SIGTERM/Ctrl-C flag (the CLI installs it before TensorFlow loads). The caller has run
    `train.rundir.preflight(settings)` (the CLI does, before TensorFlow loads); a lock taken since is found
    when the run directory is opened. Multi-worker (TF_CONFIG): every worker calls this; the chief writes the
    run directory, the others only train.
    """
    runtime = setup_runtime(settings)
    peers = connect(runtime, stop, settings.worker_start_timeout)
    lock = RunLock(settings.output_dir)
    try:
        with peers.guard("starting"):
            peers.refuse_if_busy(settings.output_dir)
            run = _start(settings, runtime, peers, say)
            _open_run_dir(run, lock)
            run.callbacks.begin(int(run.checkpoint.step.numpy()))  # on_train_begin, the recorded epochs replayed
        with peers.guard("training", run.checkpoint_dir):
            outcome = _train(run)
            if run.callbacks.stopped_early:  # model.stop_training: the run is done, not interrupted
                outcome = dataclasses.replace(outcome, interrupted=False)
            if not outcome.interrupted:
                run.callbacks.end(outcome.step)
            with streamed_files_intact(run), preprocess_shapes_hold(run):
                return _finish(run, outcome)
    finally:
        peers.close()
        lock.release()


def evaluate(settings: Settings, exported: bool = False, say: Say = _say) -> dict[str, Any]:
    """Every compiled metric on EVAL_SPLIT, of the latest checkpoint or of the exported `model.keras`.

    `settings` are the run's (the CLI reads its settings.json under the flags and environment)."""
    check_same_model(settings)
    runtime = setup_runtime(settings, local_only=True)  # on this host, even where TF_CONFIG names a cluster
    precision = read_run(settings.output_dir).get("precision")
    if settings.mixed_precision == "auto" and precision:
        runtime = runtime.with_precision(precision)
    dataset = open_dataset(settings)
    check_recorded(settings, read_run(settings.output_dir), dataset.adapted)  # the vocabularies it trained with
    in_memory = settings.data_in_memory == "true" or (settings.data_in_memory == "auto" and dataset.fits_in_memory())
    data = dataset.load(settings, in_memory)
    context = run_context(settings, runtime, data, steps_per_epoch(settings, data, runtime))  # this host's facts
    built = build(settings, data.spec, runtime.strategy, context)  # its compiled loss and metrics score either source
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
