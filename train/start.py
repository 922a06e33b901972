"""A run's start, before its directory is opened: the workers agree, the data is opened and loaded, the model is
built and checked, and XLA is decided. What it decided is a `train.run_state.Start`; nothing is written yet (a
start refused here leaves OUTPUT_DIR as it was)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Protocol

from train.accumulation import refuse_custom_train_step
from train.agreement import Decision, reconcile, report
from train.batches import Batch
from train.built import build
from train.callbacks import build_callbacks, build_hooks
from train.cluster.role import Peers, Role
from train.context import Context
from train.custom_step import refuse_unevaluated_monitor
from train.data import Dataset, open_dataset
from train.data.adapt import check_recorded
from train.data.feeds import adapter
from train.data.opening import check_same_data, data_identity_text
from train.data.source import Data
from train.data.spec import features_record
from train.devices.runtime import Runtime, auto_precision, choose_xla
from train.errors import SettingsError
from train.init_from import NoSource, init_source
from train.loop import Cadence
from train.model import Built
from train.model_file import OWN_STEP_PRECISION, Experiment, load_model_file, model_fingerprint
from train.phased import Phased, make_phases
from train.run_state import Start
from train.rundir import checkpoints_newest_first
from train.settings import Settings, agreed_settings
from train.writer import Json, Writer

Say = Callable[[str], None]


class Place(Protocol):
    """Where this process stands among the workers: its role's (train.cluster.role.Role)."""

    def facts(self) -> dict[str, bool]: ...


def run_context(
    settings: Settings, runtime: Runtime, data: Data, steps_per_epoch: int, role: Place | None = None
) -> Context:
    """The facts of a run on this runtime (its topology and precision) and data (`sample` reads its train split);
    what it says of this worker, its `role`'s (None: the only process, as `evaluate` runs)."""
    return Context(
        global_batch=runtime.global_batch, replicas=runtime.replicas, workers=runtime.workers,
        steps_per_epoch=steps_per_epoch, epochs=settings.epochs, seed=settings.seed, precision=runtime.precision,
        output_dir=settings.output_dir, _sample=data.sample,
        **(role.facts() if role else {}),
    )  # fmt: skip


def batch_of(settings: Settings) -> Batch:
    """GLOBAL_BATCH_SIZE and BATCH_SIZE as train.batches takes them, with the layer each came from."""
    return Batch(settings.global_batch_size, settings.batch_size, settings.batch_from)


def cadence_of(settings: Settings) -> Cadence:
    """When the loop's calls end and it logs and saves, as train.loop takes it."""
    return Cadence(settings.steps_per_call, settings.log_every, settings.checkpoint_every, settings.profile_steps,
                   settings.epochs)  # fmt: skip


def steps_per_epoch(settings: Settings, data: Data, runtime: Runtime) -> int:
    """STEPS_PER_EPOCH, or one pass over the split. Raises SettingsError for a split under one global batch."""
    return settings.steps_per_epoch or adapter(runtime.strategy, data.train).pass_batches(runtime.global_batch)


def workers_here(runtime: Runtime) -> int:
    """The workers TF_CONFIG places on this host (each holds its own copy of the data in memory)."""
    if runtime.cluster is None:
        return 1
    host = runtime.cluster.address.rpartition(":")[0]
    local = {host, "localhost", "127.0.0.1", socket.gethostname()} if host in ("localhost", "127.0.0.1") else {host}
    return sum(address.rpartition(":")[0] in local for address in runtime.cluster.addresses)


def agree(settings: Settings, runtime: Runtime, peers: Peers, dataset: Dataset, recorded: Json, init: str = ""
          ) -> Decision:  # fmt: skip
    """Every worker's settings, model and facts against the chief's, and one answer for each auto. `recorded`:
    run.json as the chief found it ({} on other workers); `init`: INIT_FROM's identity (its sha256)."""
    spec = dataset.spec
    facts = {
        "local replicas": len(runtime.devices),
        "examples": f"{spec.train_examples} train, {spec.eval_examples} eval",
        "inputs": spec.describe_inputs(),
        "label": f"{spec.label_key} {list(spec.label_shape)} {spec.label_dtype}" if spec.labeled else "none",
        "data": data_identity_text(dataset.identity),  # the data itself, not DATASET's text (a path differs by host)
        # Every worker reads INIT_FROM itself and applies it at step 0, rather than the chief broadcasting its
        # values: the same file (its sha256, compared here) gives the same values, with no collective of the model's
        # size at start, and a worker's bad file is refused in one line as the chief's is.
        "INIT_FROM sha256": init or "(none)",
    }
    check_recorded(settings, recorded, dataset.adapted)  # a start whose adapt fitted other vocabularies
    this_worker = report(
        agreed_settings(settings), model_fingerprint(settings.model), facts,
        dataset.fits_in_memory(workers_here(runtime)), auto_precision(runtime.plan)[0], recorded, dataset.adapted,
    )  # fmt: skip
    return reconcile(peers.all_gather("report", this_worker))


def topology(runtime: Runtime) -> dict[str, object]:
    """What a start ran on: a resume on other devices decides again what does not change the math."""
    return {"workers": runtime.workers, "replicas": runtime.replicas, "devices": list(runtime.devices)}


def moved(starts: list[Json], runtime: Runtime) -> bool:
    """Whether this start runs on other devices or workers than the last one recorded."""
    return bool(starts) and {key: starts[-1].get(key) for key in topology(runtime)} != topology(runtime)


def _decide_xla(
    runtime: Runtime, role: Role[Writer], built: Built, whole_call: bool, jit: str, recorded_run: Json
) -> tuple[bool, str]:
    """XLA on or off, decided on the chief at a run's first start and reused on resume (on the same devices; on
    others, decided again: it does not change the math), the same on every worker."""
    recorded = recorded_run.get("jit_compile")
    starts = recorded_run.get("starts") or []
    if jit == "auto" and recorded is not None and not moved(starts, runtime) and not runtime.deterministic:
        try:  # (DETERMINISTIC: off)
            choose_xla("true" if recorded else "false", runtime, whole_call, built.convolutional, None)
            on, why = bool(recorded), "auto: as this run's first start decided"
        except SettingsError:
            on, why = False, "auto: this run's first start had it on, but it cannot be here"
    else:
        on, why = choose_xla(jit, runtime, whole_call, built.convolutional, built.layer_without_xla())
        if moved(starts, runtime) and jit == "auto":
            last = starts[-1]
            why = (f"{why}; chosen again: the last start ran {last.get('replicas')} replica(s) on "
                   f"{last.get('workers')} worker(s)")  # fmt: skip
    return role.decided("jit", on, why)


def _build(settings: Settings, experiment: Experiment, runtime: Runtime, data: Data, role: Role[Writer], say: Say
           ) -> tuple[Runtime, Context, Built]:  # fmt: skip
    """The context and the model; MIXED_PRECISION=auto gives a model's own train_step float32 (train.model)."""
    context = run_context(settings, runtime, data, steps_per_epoch(settings, data, runtime), role)  # a split under one
    # the global batch, a bad model: before writing
    built = build(settings, experiment, data.spec, runtime.strategy, context, say)
    if built.custom_step is not None and runtime.precision == "mixed_float16":
        say(f"MIXED_PRECISION=auto: {OWN_STEP_PRECISION}.")
        runtime = runtime.with_precision("float32")
        context = run_context(settings, runtime, data, steps_per_epoch(settings, data, runtime), role)
        built = build(settings, experiment, data.spec, runtime.strategy, context)
    return runtime, context, built


def start_run(settings: Settings, runtime: Runtime, role: Role[Writer], say: Say) -> tuple[Start, Runtime]:
    """Agree, load the data, build and check the model, decide XLA: everything before the run directory. Returns
    what the start decided and the runtime it resolved (its precision)."""
    peers, writer = role.peers, role.writer
    for note in runtime.notes:
        say(note)
    if runtime.cluster is not None:
        say(role.joined(runtime.cluster.address))
    experiment = load_model_file(settings.model)  # MODEL's file, loaded once for the run and passed down
    dataset = open_dataset(settings, experiment, say)
    settings = dataset.settings  # a dataset with one split: TRAIN_SPLIT and EVAL_SPLIT slice it
    recorded = writer.recorded()  # run.json, read once: the chief's ({} on the others, which have nothing to check)
    # another DATASET, or changed files: refused before anything is built; a run that trained no step yet takes
    # the data as it is now
    if recorded.get("data"):
        taken = check_same_data(settings, recorded.get("data"), dataset.identity, trained=_trained(settings))
        if taken:
            say(taken)
    # INIT_FROM's source, chosen once (train.init_from); a resume restores what it gave at step 0: not read again
    fresh = not _has_checkpoints(settings)
    source = init_source(settings.init_from) if fresh else NoSource()
    source.check()
    decision = agree(settings, runtime, peers, dataset, recorded, source.identity() or "")
    runtime = runtime.with_precision(decision.precision)
    data = dataset.load(settings, decision.data_in_memory, workers_here(runtime))
    for line in (*decision.notes, *data.notes):
        say(line)
    runtime, context, built = _build(settings, experiment, runtime, data, role, say)
    refuse_unevaluated_monitor(settings.monitor, settings.model, built)
    refuse_custom_train_step(settings.model, built.network, runtime.accumulation)
    writer.check_export(built, settings)  # the chief's: a model it could not export is refused before the first step
    whole_call = adapter(runtime.strategy, data.train).whole_call  # the feed lets XLA compile the whole call
    jit, why = _decide_xla(runtime, role, built, whole_call, decision.jit_compile, recorded)
    if jit and decision.jit_compile == "auto" and built.custom_step is not None and not built.network.jit_compile:
        # as model.fit runs it: a step of the fork's own may hold what XLA cannot compile (a tf.print)
        jit, why = False, "auto: off, as model.fit runs this model's own train_step (its jit_compile is False)"
    callbacks = tuple(build_callbacks(experiment, context))  # bad callbacks (and hooks, below): before writing
    phases = make_phases(settings, experiment, built, context)  # a FREEZE glob matching no layer: before writing
    check_same_phases(settings, phases, recorded)
    init = source.match(built.network, settings.init_layers)  # a bad file, nothing to load: before writing
    start = Start(settings, peers, data, built, context, callbacks, jit, why, dataset.identity, dataset.adapted,
                  recorded, say, phases, dataset.left_out, features_record(dataset.builder, settings),
                  init, tuple(build_hooks(experiment, context)))  # fmt: skip
    return start, runtime


def check_same_phases(settings: Settings, phases: Phased, recorded: Json) -> None:
    """Another plan of phases (FREEZE, UNFREEZE_*, or what MODEL's phases() returns for these HP_ settings) than
    run.json's, on a run that has started: refused, as another DATASET is. Raises SettingsError."""
    if not recorded.get("starts"):
        return
    before = recorded.get("phases")
    if (before is None and not phases.plan.phased) or phases.plan.same_as(before):
        return
    now = phases.plan.source or "one phase, every layer as built"
    raise SettingsError(
        f"the phases ({now}) are not those OUTPUT_DIR={settings.output_dir} was trained with "
        f"({_described(before)}): they define the run. Set FREEZE, UNFREEZE_AT_EPOCH, UNFREEZE_LEARNING_RATE and the "
        "HP_ settings back to the run's (its settings.json), or use another OUTPUT_DIR"
    )


def _described(recorded: object) -> str:
    if not isinstance(recorded, list):
        return "one phase, every layer as built"
    return "; ".join(
        f"from epoch {entry.get('first_epoch')}: {len(entry.get('trainable') or [])} layer(s) training, learning rate "
        f"{entry.get('learning_rate') or 'as built'}"
        for entry in recorded if isinstance(entry, dict)
    )  # fmt: skip


def _has_checkpoints(settings: Settings) -> bool:
    """Whether OUTPUT_DIR holds a checkpoint (step 0's included): this start resumes."""
    try:
        return bool(checkpoints_newest_first(settings.output_dir / "checkpoints"))
    except SettingsError:
        return True


def _trained(settings: Settings) -> bool:
    """Whether OUTPUT_DIR holds a checkpoint after step 0 (the initial weights, saved at a first start)."""
    try:
        newest = checkpoints_newest_first(settings.output_dir / "checkpoints")
    except SettingsError:  # cannot be read: as if it had trained (refused, the safe side)
        return True
    return bool(newest) and newest[0].name != "ckpt-0"
