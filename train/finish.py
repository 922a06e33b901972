"""A run's end: evaluate both splits (every worker takes part), export, and the summary (written by the chief,
through train.writer). A stop by a signal writes the summary of where it stopped, and nothing else."""

from __future__ import annotations

import time
from collections.abc import Callable

from train.callbacks import Callbacks
from train.checkpoints import RunCheckpoint
from train.cluster.role import Role
from train.cluster.workers import WeightsDiffer
from train.data.source import TrainSplit
from train.errors import TrainingError
from train.exportable import averaged_weights
from train.loop import Outcome
from train.model import weights_fingerprint
from train.model_file import model_fingerprint
from train.progress import evaluation_notice, format_metrics
from train.run_state import Position, Start
from train.rundir import CRASH_LOG
from train.writer import Json, SummaryWriters, Writer

Metrics = dict[str, float | list]
Evaluate = Callable[[TrainSplit, int], Metrics]


def summary(start: Start, position: Position, checkpoint: RunCheckpoint, outcome: Outcome, fingerprint: str
            ) -> Json:  # fmt: skip
    """summary.json, but for the evaluations and the export (filled in by `finish`)."""
    runtime, segment, settings, xla = position.runtime, position.segment, start.settings, start.jit_compile
    return {
        "dataset": start.data.name,
        "classes": start.data.spec.classes,
        "model": settings.model,
        "model_sha256": model_fingerprint(settings.model),
        "strategy": runtime.strategy_name,
        "workers": runtime.workers,
        "replicas": runtime.replicas,
        "per_replica_batch": runtime.per_replica_batch,
        "accumulation": runtime.accumulation,
        "global_batch": runtime.global_batch,
        "data_in_memory": start.data.in_memory,
        "jit_compile": start.jit_compile,
        "precision": runtime.precision,
        "deterministic": runtime.deterministic,
        "sync_batch_norm": settings.sync_batch_norm,
        # Under XLA on several replicas TensorFlow uses its own collective all-reduce, whatever CROSS_DEVICE_OPS says.
        "cross_device_ops": "xla collective" if xla and runtime.replicas > 1 else runtime.cross_device_ops,
        "steps": outcome.step,
        "total_steps": segment.total_steps(settings.epochs),
        "steps_per_epoch": segment.steps_per_epoch,
        "epochs_completed": segment.epochs_completed(outcome.step),
        "resumed_from_step": position.resumed_from,
        # every start: its first step, where it ran, and what it resolved there
        "starts": [{key: value for key, value in each.items() if key != "segment"} for each in position.starts],
        **({"phases": start.phases.plan.to_json(segment)} if start.phases.plan.phased else {}),
        "interrupted": outcome.interrupted,
        "skipped_steps": outcome.skipped,
        "initialized_from": position.initialized_from,  # INIT_FROM, applied at step 0 (train.init_from)
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
    role: Role[Writer],
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
    say, peers, built = start.say, start.peers, start.built
    built.average_statistics()  # what is evaluated, exported and compared across workers: the replicas' mean
    fingerprint = weights_fingerprint(built)
    result = summary(start, position, checkpoint, outcome, fingerprint) | callbacks.summary() | (added or {})
    if outcome.interrupted:
        say(f"Stopped {peers.stopped_by()} at step {outcome.step}; checkpoint saved. Run the same "
            "command again to resume.")  # fmt: skip
        writer.summary(result)
        return result
    try:
        peers.agree_on_weights(fingerprint)
    except WeightsDiffer as error:
        raise _weights_differ(error, start, checkpoint, role) from None
    callbacks.use_best()  # MONITOR: the best epoch's weights are evaluated and exported
    settings, data = start.settings, start.data
    batch = position.runtime.micro_global_batch  # evaluation fits wherever training fits
    with averaged_weights(built):
        with evaluation_notice(say, settings.train_split, len(data.train)):
            result["train"] = evaluate(data.train, batch)
        with evaluation_notice(say, settings.eval_split, len(data.eval)):
            result["eval"] = evaluate(data.eval, batch)
        result["exported_model"] = writer.export(built, settings, checkpoint.latest)
    writer.summary(result)
    workers = position.runtime.workers
    same = f" (the same on all {workers} workers)" if workers > 1 else ""
    output_dir = start.output_dir
    exported = (f"; model exported to {output_dir / 'model.keras'} and {output_dir / 'saved_model'}"
                if result["exported_model"] else "; the chief exports the model")  # fmt: skip
    say(f"Done: {outcome.step} steps; weights sha256 {fingerprint[:16]}{same}; eval "
        f"{format_metrics(result['eval'])}{exported}.")  # fmt: skip
    peers.done()
    return result


def _weights_differ(error: WeightsDiffer, start: Start, checkpoint: RunCheckpoint, role: Role[Writer]
                    ) -> TrainingError:  # fmt: skip
    """The workers' weights differ (a bug of ours): the chief records every worker's hash in crash.log and keeps the
    last checkpoint; every worker says it in one line."""
    header = f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}: the workers ended with different weights (sha256)\n"
    log = role.crash(header + "".join(f"worker {index}: {value}\n" for index, value in enumerate(error.hashes)))
    kept = f"checkpoint {checkpoint.latest} is kept" if checkpoint.latest else "the chief keeps the last checkpoint"
    where = f"every worker's hash is in {log}" if log else f"the chief's {start.output_dir / CRASH_LOG} has every hash"
    return TrainingError(
        f"worker {start.peers.worker_index} of {start.peers.workers}: the workers ended with different weights "
        f"({error}): the replicas were not kept in sync; this is a bug; {kept}; {where}: please report it with "
        "the logs of every worker"
    )
