"""A run's start, before its directory is opened: the workers agree, the data is opened and loaded, the model is
built and checked, and XLA is decided. What it decided is a `Start`, typed and frozen (where the run is from then
on is train.resume's `Position`); nothing is written yet (a start refused here leaves OUTPUT_DIR as it was)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

import keras

from train.agreement import Decision, reconcile, report
from train.batches import Batch
from train.callbacks import build_callbacks, build_hooks
from train.cluster.role import Role
from train.cluster.workers import SingleHost
from train.context import Context
from train.data import Dataset, open_dataset
from train.data.adapt import check_recorded
from train.data.feeds import adapter
from train.data.opening import check_same_data, data_identity_text, with_run_label_kind
from train.data.source import Data
from train.data.spec import features_record
from train.devices.runtime import Runtime, auto_precision, choose_xla
from train.errors import SettingsError
from train.exportable import check_exportable
from train.formats import check_convertible
from train.hooks import Hook, Json, Say
from train.init_from import Matched, NoSource, init_source
from train.model import Built, build
from train.model_file import OWN_STEP_PRECISION, Experiment, load_model_file, model_fingerprint
from train.phased import Phased, make_phases
from train.run_files import RUN_SETTINGS
from train.rundir import checkpoints_newest_first
from train.settings import Settings, agreed_settings, changed_settings
from train.step import refuse_custom_train_step, refuse_unevaluated_monitor


@dataclass(frozen=True)
class Start:
    """What the run's start decided: the settings (a one-split dataset's slices in them), the data, the built
    model, XLA, and what run.json records of them."""

    settings: Settings
    data: Data
    built: Built
    context: Context  # the run's facts, as build_model, build_callbacks and build_hooks got them
    callbacks: tuple[keras.callbacks.Callback, ...]  # MODEL's build_callbacks(context), checked
    jit_compile: bool
    jit_why: str
    identity: Json  # the data's (train.data.opening): run.json's "data"
    adapted: Json  # what MODEL's adapt fitted (train.data.adapt.fingerprint)
    recorded: Json  # run.json as this start found it (the chief's; {} on other workers)
    say: Say
    phases: Phased  # which layers train when, and at what rate (train.phased): one phase unless FREEZE or phases()
    left_out: Json = field(default_factory=dict)  # a folder's files not in the data: summary.json's "left_out"
    features: Json = field(default_factory=dict)  # what predict needs of the data (train.data.spec.features_record)
    init: Matched | None = None  # INIT_FROM's values matched to the model, applied at step 0 (train.init_from)
    hooks: tuple[Hook, ...] = ()  # MODEL's build_hooks(context), checked, each behind a ForkHook (train.callbacks)
    # (NAME, before, now) of each setting changed since the run's last start, as the chief's settings.json has them
    changed: tuple[tuple[str, str, str], ...] = ()

    @property
    def output_dir(self) -> Path:
        return self.settings.output_dir

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"


def run_context(
    settings: Settings, runtime: Runtime, data: Data, steps_per_epoch: int, role: Role | None = None
) -> Context:
    """The facts of a run on this runtime (its topology and precision) and data (`sample` reads its train split);
    what it says of this worker, its `role`'s (None: the only process, as `evaluate` runs)."""
    return Context(
        global_batch=runtime.global_batch,
        replicas=runtime.replicas,
        workers=runtime.workers,
        steps_per_epoch=steps_per_epoch,
        epochs=settings.epochs,
        seed=settings.seed,
        precision=runtime.precision,
        output_dir=settings.output_dir,
        _sample=data.sample,
        **(role.facts() if role else {}),
    )


def batch_of(settings: Settings) -> Batch:
    """GLOBAL_BATCH_SIZE and BATCH_SIZE as train.batches takes them, with the layer each came from."""
    return Batch(settings.global_batch_size, settings.batch_size, settings.batch_from)


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


def agree(
    settings: Settings, runtime: Runtime, peers: SingleHost, dataset: Dataset, recorded: Json, init: str = ""
) -> Decision:
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
        agreed_settings(settings),
        model_fingerprint(settings.model),
        facts,
        dataset.fits_in_memory(workers_here(runtime)),
        auto_precision(runtime.plan)[0],
        recorded,
        dataset.adapted,
    )
    return reconcile(peers.all_gather("report", this_worker))


def topology(runtime: Runtime) -> Json:
    """What a start ran on: a resume on other devices decides again what does not change the math."""
    return {"workers": runtime.workers, "replicas": runtime.replicas, "devices": list(runtime.devices)}


def moved(starts: list[Json], runtime: Runtime) -> bool:
    """Whether this start runs on other devices or workers than the last one recorded."""
    return bool(starts) and {key: starts[-1].get(key) for key in topology(runtime)} != topology(runtime)


def _decide_xla(
    runtime: Runtime, role: Role, built: Built, whole_call: bool, jit: str, recorded_run: Json
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
            why = (
                f"{why}; chosen again: the last start ran {last.get('replicas')} replica(s) on "
                f"{last.get('workers')} worker(s)"
            )
    on, why = role.decided("jit", on, why)
    if on and jit == "auto" and built.custom_step is not None and not built.network.jit_compile:
        # as model.fit runs it: a step of the fork's own may hold what XLA cannot compile (a tf.print)
        return False, "auto: off, as model.fit runs this model's own train_step (its jit_compile is False)"
    return on, why


def _build(
    settings: Settings, experiment: Experiment, runtime: Runtime, data: Data, role: Role, say: Say
) -> tuple[Runtime, Context, Built]:
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


def start_run(settings: Settings, runtime: Runtime, role: Role, say: Say) -> tuple[Start, Runtime]:
    """Agree, load the data, build and check the model, decide XLA: everything before the run directory. Returns
    what the start decided and the runtime it resolved (its precision)."""
    for note in runtime.notes:
        say(note)
    if runtime.cluster is not None:
        say(role.joined(runtime.cluster.address))
    experiment = load_model_file(settings.model)  # MODEL's file, loaded once for the run and passed down
    recorded = role.writer.recorded()  # run.json, read once: the chief's ({} on others: nothing to check)
    dataset = open_dataset(with_run_label_kind(settings, recorded), experiment, say)
    settings = dataset.settings  # a dataset with one split: TRAIN_SPLIT and EVAL_SPLIT slice it
    newest = _checkpoints(settings.output_dir)
    # another DATASET, or changed files: refused before anything is built; a run that trained no step yet (none
    # after step 0's initial weights) takes the data as it is now
    if recorded.get("data"):
        trained = newest is None or any(path.name != "ckpt-0" for path in newest[:1])
        taken = check_same_data(settings, recorded.get("data"), dataset.identity, trained=trained)
        if taken:
            say(taken)
    # INIT_FROM's source, chosen once (train.init_from); a resume restores what it gave at step 0: not read again
    source = init_source(settings.init_from) if newest == [] else NoSource()
    source.check()
    decision = agree(settings, runtime, role.peers, dataset, recorded, source.identity() or "")
    runtime = runtime.with_precision(decision.precision)
    data = dataset.load(settings, decision.data_in_memory, workers_here(runtime))
    for line in (*decision.notes, *data.notes):
        say(line)
    runtime, context, built = _build(settings, experiment, runtime, data, role, say)
    refuse_unevaluated_monitor(settings.monitor, settings.model, built)
    refuse_custom_train_step(settings.model, built.network, runtime.accumulation)
    role.chief_only(check_exportable, built, settings.dataset)  # the chief exports: a model it could not is refused now
    role.chief_only(check_convertible, built, settings.export_formats)  # and converts, with EXPORT_FORMATS
    whole_call = adapter(runtime.strategy, data.train).whole_call  # the feed lets XLA compile the whole call
    jit, why = _decide_xla(runtime, role, built, whole_call, decision.jit_compile, recorded)
    callbacks = tuple(build_callbacks(experiment, context))  # bad callbacks (and hooks, below): before writing
    phases = make_phases(settings, experiment, built, context)  # a FREEZE glob matching no layer: before writing
    check_same_phases(settings, phases, recorded)
    init = source.match(built.network, settings.init_layers)  # a bad file, nothing to load: before writing
    start = Start(
        settings,
        data,
        built,
        context,
        callbacks,
        jit,
        why,
        dataset.identity,
        dataset.adapted,
        recorded,
        say,
        phases,
        dataset.left_out,
        features_record(dataset.builder, settings),
        init,
        tuple(build_hooks(experiment, context)),
        tuple(role.chief_only(changed_settings, settings.output_dir / RUN_SETTINGS, settings) or []),
    )
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
        for entry in recorded
        if isinstance(entry, dict)
    )


def _checkpoints(output_dir: Path) -> list[Path] | None:
    """OUTPUT_DIR's checkpoints, newest first (step 0's, the initial weights saved at a first start, included); None
    where they cannot be read: as if the run had trained (refused, the safe side)."""
    try:
        return checkpoints_newest_first(output_dir / "checkpoints")
    except SettingsError:
        return None
