"""What a checkpoint holds, and saving and restoring it: the model, its optimizer (loss scale and moving
averages included), every random layer's state, and the loop's own step and skip counts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

from train.errors import TrainingError, first_line, storage_fix
from train.hooks import Hook, Say
from train.model import Built, spread_seeds
from train.rundir import restore_newest


def make_checkpoint(built: Built, phased: bool = False) -> tf.train.Checkpoint:
    """fit saves it, evaluate restores it.

    `phased`: the run has phases (train.phases), and the checkpoint records the one its weights are in. Only then:
    a checkpoint of a run without phases keeps the structure it always had, and `evaluate` and `predict`, which
    make it without, restore either (`assert_existing_objects_matched` asks only for what they hold).

    The loop's own step count: the optimizer's `iterations` stays behind it where a mixed_float16 step skips
    its update (gradients overflowed), and resuming must start where the run stopped, not earlier. The random
    layers' states (`SeedGenerator`s: Dropout, augmentation) are not Keras variables a Checkpoint of the
    model finds, so they are listed here: without them a resumed run would draw other random numbers.
    """
    phase = {"phase": tf.Variable(0, dtype=tf.int64, trainable=False, name="phase")} if phased else {}
    return tf.train.Checkpoint(
        model=built.network,
        optimizer=built.optimizer,
        seeds=list(built.seeds),
        step=tf.Variable(0, dtype=tf.int64, trainable=False, name="step"),
        skipped_steps=tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps"),
        **phase,
    )


class RunCheckpoint(Hook):
    """The run's checkpoint and its manager (`peers.checkpoint_manager`'s), under `directory`. Every restore gives
    each replica its random stream again (spread_seeds), wherever it happens: the run's start, AUTO_BATCH's
    retry, the callbacks' replay. The loop's innermost hook (train.run_hooks): the step saved at every
    CHECKPOINT_EVERY step, epoch end and the end (a collective across workers)."""

    def __init__(
        self,
        checkpoint: tf.train.Checkpoint,
        manager: tf.train.CheckpointManager,
        built: Built,
        strategy: tf.distribute.Strategy,
        directory: Path,
    ) -> None:
        self.checkpoint, self.manager, self.built, self.strategy = checkpoint, manager, built, strategy
        self.directory = directory

    @property
    def latest(self) -> str | None:
        """The last checkpoint saved: what an error says is intact."""
        return self.manager.latest_checkpoint

    @property
    def step(self) -> int:
        return int(self.checkpoint.step.numpy())

    @property
    def skipped(self) -> int:
        return int(self.checkpoint.skipped_steps.numpy())

    @property
    def phase(self) -> int:
        """The phase its weights are in (train.phases; 0 for a run without phases)."""
        recorded = getattr(self.checkpoint, "phase", None)
        return int(recorded.numpy()) if recorded is not None else 0

    def record_phase(self, index: int) -> None:
        """The phase the weights are in from here on, saved with them (a run without phases records none)."""
        recorded = getattr(self.checkpoint, "phase", None)
        if recorded is not None:
            recorded.assign(index)

    def restore(self, prefix: Path) -> None:
        """That checkpoint, or what its restore raises."""
        self.checkpoint.restore(str(prefix)).assert_existing_objects_matched()
        spread_seeds(self.built, self.strategy)

    def newest(self, say: Say, restore: Callable[..., str | None] = restore_newest) -> str | None:
        """The newest that loads (`restore_newest`, or the cluster's `peers.restore`), or None where none is."""
        found = restore(self.checkpoint, self.directory, say)
        if found:
            spread_seeds(self.built, self.strategy)
        return found

    def save(self, step: int, skipped: int) -> None:
        """The replicas' statistics averaged (train.replica_statistics), then saved: what a restore gives each."""
        self.built.average_statistics()
        save_checkpoint(self.manager, step, skipped)


def save_checkpoint(manager: tf.train.CheckpointManager, step: int, skipped: int) -> None:
    """Save, or end clearly: TensorFlow writes to temporary files, so the previous checkpoint stays loadable."""
    manager.checkpoint.step.assign(step)
    manager.checkpoint.skipped_steps.assign(skipped)
    try:
        manager.save(checkpoint_number=step)
    except (OSError, tf.errors.OpError) as error:
        raise TrainingError(
            f"could not write checkpoint ckpt-{step} to {manager.directory} ({first_line(error, 160)}); "
            f"the previous checkpoint {manager.latest_checkpoint} is intact: {storage_fix(error, manager.directory)} "
            "and run again to resume"
        ) from None
