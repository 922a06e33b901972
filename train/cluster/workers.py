"""The one seam for what multi-worker training does differently: `SingleHost` and `Workers` answer the
same calls, and the training loop calls them without asking which it has.

Under MultiWorkerMirroredStrategy a checkpoint save is a collective: every worker must call it at
the same step. TensorFlow's documented pattern is followed: the chief saves into the run
directory, every other worker into a temporary directory deleted right after; all restore from
the chief's (so OUTPUT_DIR must be storage every worker sees). The workers talk through the
key-value store of TensorFlow's coordination service, which the strategy already runs: to agree on
settings and `auto`s (train.agreement), on what to restore, and on the weights at the end.
A stop (SIGTERM, Ctrl-C) on any worker makes every worker save after the same call and stop.
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

from train.devices.runtime import Runtime
from train.errors import FUNCTION_NODE, BusyError, TrainingError, clip, first_line
from train.hooks import Say
from train.keras_seams import rotation
from train.rundir import busy, checkpoints_newest_first, holder, restore_newest
from train.signals import StopRequest

END_BARRIER_SECONDS = 3600  # how long the others wait for the chief's export at the end
Report = dict[str, object]  # what one worker tells the others (json-serialisable)

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
    "Graph execution error",
    "Detected at node",
    "Additional GRPC",
    ":UNKNOWN",
    "[[",
    "The error could be",
    "The tasks have crashed",
    "Check the task logs",
    "This is usually caused",
)


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
    return clip(" ".join(kept), 240) or type(error).__name__


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


class WorkerCheckpoints:
    """The run's checkpoints, saved on every worker at once: the chief's go to `directory`, the others' to a deleted
    temporary directory. Quacks like a tf.train.CheckpointManager (save, directory, latest_checkpoint).

    The chief's rotation keeps KEEP_CHECKPOINTS, with one exception: MONITOR's best epoch, kept out of it (through
    train.keras_seams) whatever KEEP_CHECKPOINTS says; every other worker takes the chief's word for what it holds.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, directory: Path, keep: int, peers: SingleHost) -> None:
        self.checkpoint, self.directory = checkpoint, str(directory)
        self.worker_index, self.is_chief = peers.worker_index, peers.is_chief
        self.rotating = tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=keep)  # the chief's

    @property
    def latest_checkpoint(self) -> str | None:
        return self.rotating.latest_checkpoint if self.is_chief else None

    def save(self, checkpoint_number: int) -> str:
        if self.is_chief:
            return self.rotating.save(checkpoint_number=checkpoint_number)
        scratch = tempfile.mkdtemp(prefix=f"tf-train-worker{self.worker_index}-")
        try:
            tf.train.CheckpointManager(self.checkpoint, scratch, max_to_keep=1).save(
                checkpoint_number=checkpoint_number
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return ""

    def holds(self, step: int) -> bool:
        """Whether the chief's checkpoints hold ckpt-<step> (every other worker takes the chief's word for it)."""
        return not self.is_chief or (Path(self.directory) / f"ckpt-{step}.index").exists()

    def _named(self, step: int) -> list[str]:
        """The prefixes of ckpt-<step> in the chief's rotation ([] elsewhere)."""
        if not self.is_chief:
            return []
        return [prefix for prefix in rotation(self.rotating) if Path(prefix).name == f"ckpt-{step}"]

    def keep_out_of_rotation(self, step: int) -> None:
        """Keep ckpt-<step> whatever KEEP_CHECKPOINTS says (the best epoch's): the chief's rotation."""
        for prefix in self._named(step):
            del rotation(self.rotating)[prefix]

    def drop_kept(self, step: int) -> None:
        """Delete ckpt-<step> where the chief kept it out of the rotation (a best epoch no longer the best); where
        it is in the rotation again, it is left to it."""
        if not self.is_chief or self._named(step):
            return
        directory = Path(self.directory)
        for path in (directory / f"ckpt-{step}.index", *directory.glob(f"ckpt-{step}.data-*")):
            path.unlink(missing_ok=True)


class WeightsDiffer(Exception):
    """The workers ended with different weights (a bug of ours): every worker's hash, the chief's first."""

    def __init__(self, hashes: list[str]) -> None:
        super().__init__(", ".join(f"worker {index}: {value[:12]}" for index, value in enumerate(hashes)))
        self.hashes = hashes


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


class SingleHost:
    """One process, the cluster of one: every call is what `Workers` does, for a single worker."""

    is_chief = True
    worker_index = 0
    workers = 1

    def __init__(self, runtime: Runtime, stop: StopRequest) -> None:
        self.runtime, self.stop = runtime, stop

    def all_gather(self, name: str, own: Report) -> list[Report]:
        """Every worker's `own` value, the chief's first."""
        return [own]

    def share_from_chief(self, name: str, value: str) -> str:
        return value

    def refuse_if_busy(self, output_dir: Path) -> None:
        """Another live process trains in OUTPUT_DIR: BusyError (exit 75). One host: preflight said it already."""

    def restore(self, checkpoint: tf.train.Checkpoint, directory: Path, say: Say) -> str | None:
        return restore_newest(checkpoint, directory, say)

    def watch_stops(self, save: Callable[[int], None]) -> None:
        self._save = save

    def should_stop(self, step: int, saved_step: int) -> bool:
        """Between calls: a stop was asked for. Then the current step is saved (if it is not already)."""
        if self.stop.signal_name is None:
            return False
        if saved_step != step:
            self._save(step)
        return True

    def stopped_by(self) -> str:
        return f"by {self.stop.signal_name}"

    def agree_on_weights(self, fingerprint: str) -> None:
        """At the end: every worker holds the same weights. Raises WeightsDiffer (a bug) on every worker if not."""

    def done(self) -> None:
        """The very end: no worker leaves while another still needs it."""

    def close(self) -> None:
        pass

    @contextlib.contextmanager
    def guard(self, doing: str, checkpoint_dir: Path | None = None) -> Iterator[None]:
        """Where a lost worker would surface: here nothing is lost."""
        yield


class Workers(SingleHost):
    """MultiWorkerMirroredStrategy: the same calls, through the coordination service and collectives."""

    def __init__(self, runtime: Runtime, stop: StopRequest, timeout_s: float) -> None:
        super().__init__(runtime, stop)
        self.timeout_ms = int(timeout_s * 1000)
        self.worker_index, self.workers = runtime.worker_index, runtime.workers
        self.is_chief = self.worker_index == 0  # TensorFlow's chief: the first of TF_CONFIG's addresses
        self._preemption: ClusterPreemption | None = None
        # TensorFlow's C++ preemption notifier, installed when the cluster formed, has replaced the SIGTERM
        # handler with one that only logs (training would go on until SIGKILL): the template's goes back on.
        stop.rearm()

    def _get(self, key: str) -> str:
        return context.context().get_config_key_value(_KEY + key, timeout_in_ms=self.timeout_ms)

    def _set(self, key: str, value: str) -> None:
        context.context().set_config_key_value(_KEY + key, value)

    def all_gather(self, name: str, own: Report) -> list[Report]:
        self._set(f"{name}/{self.worker_index}", json.dumps(own))
        return [own if i == self.worker_index else json.loads(self._get(f"{name}/{i}")) for i in range(self.workers)]

    def share_from_chief(self, name: str, value: str) -> str:
        if self.is_chief:
            self._set(name, value)
            return value
        return self._get(name)

    def _verdicts(self, name: str, problem: str, error: type[Exception]) -> None:
        """Each worker reports `problem` ("" if none); a worker raises its own, and the chief raises the first
        other worker's too, so the chief's log says what went wrong rather than that a worker went away."""
        self._set(f"{name}/{self.worker_index}", problem or "ok")
        if problem:
            raise error(problem)
        if self.is_chief:
            for index in range(1, self.workers):
                answer = self._get(f"{name}/{index}")
                if answer != "ok":
                    raise error(answer)

    def refuse_if_busy(self, output_dir: Path) -> None:
        """The chief looks at OUTPUT_DIR's lock and says what it found to every worker: all exit 75 alike."""
        found = (str(busy(output_dir)) if holder(output_dir) else "free") if self.is_chief else ""
        if (said := self.share_from_chief("busy", found)) != "free":
            raise BusyError(said)

    def restore(self, checkpoint: tf.train.Checkpoint, directory: Path, say: Say) -> str | None:
        """The chief picks the checkpoint; every other worker restores the same one, by name, from its own
        OUTPUT_DIR: the same shared storage, mounted anywhere. None: the run starts fresh."""
        chosen = restore_newest(checkpoint, directory, say) if self.is_chief else None
        name = self.share_from_chief("restore", Path(chosen).name if chosen else "")
        if not name:
            return None
        prefix, problem = str(directory / name), ""
        if not self.is_chief:
            try:
                checkpoint.restore(prefix).assert_existing_objects_matched()
            except (AssertionError, ValueError, tf.errors.OpError) as error:
                problem = (
                    f"worker {self.worker_index} cannot read the chief's checkpoint {name} as {prefix} "
                    f"({first_line(error, 160)}): OUTPUT_DIR must be the same shared storage (NFS, a mounted "
                    "bucket, ...) on every worker"
                )
        self._verdicts("restore_verdict", problem, TrainingError)
        return chosen if self.is_chief else prefix

    def watch_stops(self, save: Callable[[int], None]) -> None:
        """On every worker, after the same training call: the handler's save, then its exit."""
        self._preemption = ClusterPreemption(self.runtime, lambda: self.stop.signal_name is not None, save)

    def should_stop(self, step: int, saved_step: int) -> bool:
        return self._preemption.saved_and_stopping(step, saved_step)

    def stopped_by(self) -> str:
        return f"by {self.stop.signal_name}" if self.stop.signal_name else "because another worker was told to stop"

    def agree_on_weights(self, fingerprint: str) -> None:
        """Every worker publishes a hash of its weights and reads every other's: where they differ, every worker
        raises WeightsDiffer before any other collective, so that each says so (rather than that a peer went
        away) and the chief records every hash."""
        hashes = [str(each["sha256"]) for each in self.all_gather("weights", {"sha256": fingerprint})]
        if len(set(hashes)) > 1:
            raise WeightsDiffer(hashes)

    def done(self) -> None:
        context.context().wait_at_barrier(_KEY + "end", END_BARRIER_SECONDS * 1000)

    def close(self) -> None:
        if self._preemption is not None:
            self._preemption.close()

    @contextlib.contextmanager
    def guard(self, doing: str, checkpoint_dir: Path | None = None) -> Iterator[None]:
        """A worker died or hangs: TensorFlow ends the others' collectives with an error; say it in one line."""
        try:
            yield
        except PEER_ERRORS as error:
            newest = checkpoints_newest_first(checkpoint_dir) if checkpoint_dir else []
            kept = f"the newest checkpoint, {newest[0]}, is intact" if newest else "no checkpoint was written yet"
            raise TrainingError(
                f"worker {self.worker_index} of {self.workers} lost contact with the other workers while {doing} "
                f"({type(error).__name__}: {peer_error_cause(error)}): a worker died, hangs or cannot be reached; "
                f"{kept}. Start every worker again to resume"
            ) from None


def connect(runtime: Runtime, stop: StopRequest, timeout_s: float) -> SingleHost:
    """The seam for this run: `Workers` under MultiWorkerMirroredStrategy, else `SingleHost`."""
    if runtime.strategy_name == "multi_worker":
        return Workers(runtime, stop, timeout_s)
    return SingleHost(runtime, stop)
