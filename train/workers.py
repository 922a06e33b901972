"""What multi-worker training needs beyond one host: checkpoints every worker writes, the chief's
word on what to restore, settings every worker must share, and preemption that stops all of them.

Under MultiWorkerMirroredStrategy a checkpoint save is a collective: every worker must call it at
the same step. TensorFlow's documented pattern is followed: the chief saves into the run
directory, every other worker into a temporary directory deleted right after; all restore from
the chief's (so OUTPUT_DIR must be storage every worker sees). The workers talk through the
key-value store of TensorFlow's coordination service, which the strategy already runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import tensorflow as tf
from tensorflow.python.eager import context  # the coordination service's key-value store (no public API)
from tensorflow.python.util import deprecation

from train.errors import FUNCTION_NODE, SettingsError, TrainingError, first_line
from train.runtime import Runtime
from train.settings import Settings

# Settings that must be equal on every worker: they fix the data order, the step plan and where the
# collectives (training calls, checkpoint saves) fall. The others (paths, GPUS, ...) may differ per host.
SHARED_SETTINGS = (
    "DATASET", "TRAIN_SPLIT", "BATCH_SIZE", "EPOCHS", "STEPS_PER_EPOCH", "STEPS_PER_CALL", "LEARNING_RATE",
    "SEED", "CHECKPOINT_EVERY", "LOG_EVERY", "STRATEGY",
)  # fmt: skip
_KEY = "tf_train_template/"
# Lost peers surface as these: a closed connection (Unavailable), the coordination service's verdict
# after missed heartbeats (Unavailable, Aborted, Internal), a cancelled collective (Cancelled).
PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.DeadlineExceededError,
    tf.errors.InternalError,
)


_NOISE = (
    "Graph execution error", "Detected at node", "Additional GRPC", ":UNKNOWN", "[[", "The error could be",
    "The tasks have crashed", "Check the task logs", "This is usually caused",
)  # fmt: skip


def peer_error_cause(error: BaseException) -> str:
    """The informative part of TensorFlow's many-line message about a lost peer, on one line."""
    kept = []
    for line in str(error).splitlines():
        line = FUNCTION_NODE.sub("", line).strip()
        line = line.replace("Collective ops is aborted by: ", "")
        line = re.sub(r"\s*\[type\.googleapis\.com/[^\]]*\]", "", line)
        if line and not line.startswith(_NOISE) and not line.startswith('File "') and "most recent call" not in line:
            kept.append(line)
        if len(kept) == 2:
            break
    return " ".join(kept)[:240] or type(error).__name__


def _quiet_watcher_threads() -> None:
    """The handler's watcher threads die with a traceback when a peer is lost; the main thread says it in one line."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread else ""
        if isinstance(args.exc_value, tf.errors.OpError) and name.startswith(
            ("PeerTerminationWatcher", "WorkerTerminationSignalWatcher")
        ):
            return
        previous(args)

    threading.excepthook = hook


def share_from_chief(runtime: Runtime, name: str, value: str | None, timeout_s: float) -> str:
    """The chief publishes `value` under `name`; every worker returns the chief's value."""
    key = _KEY + name
    if runtime.is_chief:
        assert value is not None
        context.context().set_config_key_value(key, value)
        return value
    return context.context().get_config_key_value(key, timeout_in_ms=int(timeout_s * 1000))


def _verdicts(runtime: Runtime, name: str, problem: str, timeout_s: float, error: type[Exception]) -> None:
    """Each worker reports `problem` ("" if none); a worker raises its own, and the chief raises the first
    other worker's too, so the chief's log says what went wrong rather than that a worker went away."""
    context.context().set_config_key_value(f"{_KEY}{name}/{runtime.worker_index}", problem or "ok")
    if problem:
        raise error(problem)
    if runtime.is_chief:
        for index in range(1, runtime.workers):
            answer = context.context().get_config_key_value(
                f"{_KEY}{name}/{index}", timeout_in_ms=int(timeout_s * 1000)
            )
            if answer != "ok":
                raise error(answer)


def check_same_settings(runtime: Runtime, settings: Settings) -> None:
    """Every worker must train with the chief's data and step plan. A difference is a SettingsError naming it,
    on that worker and on the chief (the others would otherwise just see the chief stop)."""
    timeout_s = settings.worker_start_timeout
    mine = {name: settings.to_json()[name] for name in SHARED_SETTINGS}
    mine["local replicas"] = str(len(runtime.devices))
    chiefs = json.loads(share_from_chief(runtime, "settings", json.dumps(mine), timeout_s))
    differ = [
        f"{name}={mine[name]!r} on worker {runtime.worker_index} but {chiefs[name]!r} on the chief"  # said on both
        for name in mine
        if mine[name] != chiefs[name]
    ]
    problem = (
        f"worker {runtime.worker_index} does not match the chief: {'; '.join(differ)}. Give every worker the same "
        "settings (and as many GPUs)"
        if differ
        else ""
    )
    _verdicts(runtime, "settings_verdict", problem, timeout_s, SettingsError)


class WorkerCheckpoints:
    """Saves on every worker at once: the chief's go to `directory`, the others' to a deleted temporary directory.

    Quacks like the tf.train.CheckpointManager the single-host path uses (save, directory, latest_checkpoint).
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, directory: Path, keep: int, runtime: Runtime) -> None:
        self.checkpoint = checkpoint
        self.is_chief = runtime.is_chief
        self.worker_index = runtime.worker_index
        self._chief_manager = tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=keep)
        self.directory = str(directory)

    @property
    def latest_checkpoint(self) -> str | None:
        return self._chief_manager.latest_checkpoint if self.is_chief else None

    def save(self, checkpoint_number: int) -> str:
        if self.is_chief:
            return self._chief_manager.save(checkpoint_number=checkpoint_number)
        scratch = tempfile.mkdtemp(prefix=f"tf-train-worker{self.worker_index}-")
        try:
            tf.train.CheckpointManager(self.checkpoint, scratch, max_to_keep=1).save(
                checkpoint_number=checkpoint_number
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return ""


def restore_from_chief(
    runtime: Runtime,
    checkpoint: tf.train.Checkpoint,
    checkpoint_dir: Path,
    chief_choice: Callable[[], str | None],
    timeout_s: float,
) -> str | None:
    """The chief picks the checkpoint (`chief_choice` restores it there); every other worker restores the same one,
    by name, from its own OUTPUT_DIR: the same shared storage, mounted anywhere. None: the run starts fresh."""
    chosen = chief_choice() if runtime.is_chief else None
    name = share_from_chief(runtime, "restore", Path(chosen).name if chosen else "", timeout_s)
    if not name:
        return None
    prefix, problem = str(checkpoint_dir / name), ""
    if not runtime.is_chief:
        try:
            checkpoint.restore(prefix).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            problem = (
                f"worker {runtime.worker_index} cannot read the chief's checkpoint {name} as {prefix} "
                f"({first_line(error, 160)}): OUTPUT_DIR must be the same shared storage (NFS, a mounted bucket, "
                "...) on every worker"
            )
    _verdicts(runtime, "restore_verdict", problem, timeout_s, TrainingError)
    return chosen if runtime.is_chief else prefix


class Preempted(Exception):
    """Raised by the preemption handler's exit function once every worker has saved."""


@contextlib.contextmanager
def _off_gcp_probe() -> Iterator[None]:
    """The handler asks the GCE metadata server whether it runs on GCP (5 s off GCP, and on GCE CPU VMs it then
    does nothing at all). SIGTERM is what this template handles everywhere, so the probe is sent to a closed local
    port, only while the handler is made: other libraries (GCS credentials) still see the real GCE_METADATA_IP."""
    previous = os.environ.get("GCE_METADATA_IP")
    os.environ["GCE_METADATA_IP"] = "127.0.0.1:1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("GCE_METADATA_IP", None)
        else:
            os.environ["GCE_METADATA_IP"] = previous


class ClusterPreemption:
    """SIGTERM (or Ctrl-C) on any worker: every worker saves at the same step and stops.

    Built on tf.distribute.experimental.PreemptionCheckpointHandler: it watches `stopped` (the template's
    own signal flag) once a second, agrees on a call after which all workers save, and then calls the
    save and exit functions given here. Its call counter starts at 0 in every process (it gets an empty
    checkpoint of its own), so it never lags; the step is the optimizer's.
    """

    def __init__(self, runtime: Runtime, stopped: Callable[[], bool], save: Callable[[int], None]) -> None:
        self._step = self._saved_step = -1

        def save_once() -> None:  # unless the loop has just saved this very step
            if self._step != self._saved_step:
                save(self._step)

        def leave() -> None:
            raise Preempted

        config = tf.distribute.experimental.TerminationConfig(
            termination_watcher_fn=stopped, exit_fn=leave, save_fn=save_once
        )
        nowhere = os.path.join(tempfile.gettempdir(), f"tf-train-preemption-{os.getpid()}-never-written")
        counter_only = tf.train.CheckpointManager(tf.train.Checkpoint(), nowhere, max_to_keep=1)
        _quiet_watcher_threads()
        with _off_gcp_probe():
            self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
                runtime.strategy.cluster_resolver, counter_only, termination_config=config
            )

    def saved_and_stopping(self, step: int, saved_step: int) -> bool:
        """Call after every training call, on every worker. True: all workers have just saved `step`; stop now."""
        self._step, self._saved_step = step, saved_step
        try:
            with deprecation.silence():  # its save reads its own deprecated total_run_calls
                self._handler.save_checkpoint_if_preempted()
        except Preempted:
            return True
        return False

    def close(self) -> None:
        """Stop the handler's watcher threads while every peer is still there to answer."""
        with contextlib.suppress(Exception):
            self._handler.__del__()


def check_same_weights(runtime: Runtime, fingerprint: str, timeout_s: float) -> None:
    """Every worker publishes a hash of its weights; the chief checks they are all its own (they must be)."""
    context.context().set_config_key_value(f"{_KEY}weights/{runtime.worker_index}", fingerprint)
    if not runtime.is_chief:
        return
    others = {
        index: context.context().get_config_key_value(f"{_KEY}weights/{index}", timeout_in_ms=int(timeout_s * 1000))
        for index in range(1, runtime.workers)
    }
    differ = [f"worker {index}: {value[:12]}" for index, value in others.items() if value != fingerprint]
    if differ:
        raise TrainingError(
            f"the workers ended with different weights (chief: {fingerprint[:12]}; {', '.join(differ)}): "
            "the replicas were not kept in sync; this is a bug, please report it with the logs of every worker"
        )


def wait_for_chief(runtime: Runtime, timeout_s: float) -> None:
    """The end of the run: the others wait until the chief has evaluated and exported, so no worker leaves early."""
    context.context().wait_at_barrier(_KEY + "end", int(timeout_s * 1000))
