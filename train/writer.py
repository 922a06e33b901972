"""What a run writes into OUTPUT_DIR, decided in one place: the chief writes it, every other worker nothing.

The run's role (train.cluster.role.take_role) gives the chief a `ChiefWriter` and every other worker a `Writer`,
which has the same methods and does nothing (its TensorBoard writers write nowhere). So
the engine says what is written once, and never asks which worker it is on to write it:

| file or folder                | written by           | when                                                      |
|-------------------------------|----------------------|-----------------------------------------------------------|
| `.lock`                       | `lock`               | the run directory is opened (train.resume)                |
| `settings.json`, `run.json`   | `settings`, `run`    | once the checkpoints loaded; run.json again on AUTO_BATCH |
| `logs/` (TensorBoard)         | `scalars`, `hparams` | while training (train.run_hooks.Scalars)                  |
| `epochs.json`                 | `epochs`             | every epoch's end (train.callbacks)                       |
| `summary.json`                | `summary`            | the end, or a stop                                        |

The checkpoints are not here: saving one is a collective of every worker (train.checkpoints, `peers`); nor are
`crash.log`, the chief's role's (train.cluster.role), and the export, which the chief alone runs (its role's
`chief_only`: train.resume).
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from train.errors import TrainingError, storage_fix
from train.hooks import Json, Say
from train.run_files import RUN_SETTINGS
from train.rundir import EPOCHS, RUN, RunLock, read_epochs, read_run, write_json

SummaryWriters = dict[str, tf.summary.SummaryWriter]  # "train", "eval" (train.run_hooks.Scalars writes to them)


class Writer:
    """A worker other than the chief: it trains, evaluates and says what matters to it, and writes nothing."""

    def __init__(self, output_dir: Path, say: Say) -> None:
        self.output_dir, self.say = output_dir, say

    def recorded(self) -> Json:
        """run.json as the run's starts left it ({} on other workers: the chief's decisions reach them)."""
        return {}

    def recorded_epochs(self) -> list[Json] | None:
        """epochs.json as the run's starts left it, None where there is none ([] on other workers: the chief's
        reach them). Its damage was refused before TensorFlow loaded (train.rundir.preflight)."""
        return []

    def lock(self, lock: RunLock) -> None:
        """One writer per run directory (train.rundir.RunLock)."""

    def settings(self, text: dict[str, str]) -> None:
        """settings.json: the settings this start runs with, as text (Settings.to_json)."""

    def run(self, record: Json) -> None:
        """run.json (train.resume.run_record)."""

    def epochs(self, epochs: list[Json], latest: str | None) -> None:
        """epochs.json: each epoch's logs (train.callbacks); `latest`: the checkpoint an error says is intact."""

    def summary(self, summary: Json) -> None:
        """summary.json."""

    def scalars(self) -> SummaryWriters:
        """TensorBoard's writers, train and eval, under logs/."""
        return {name: tf.summary.create_noop_writer() for name in ("train", "eval")}

    def hparams(self, values: Json) -> None:
        """logs/'s HParams session: the resolved settings and what the run resolved."""

    def note(self, message: str) -> None:
        """A message about the run directory, or one the chief says for every worker."""


class ChiefWriter(Writer):
    """The chief (or the only process): everything in OUTPUT_DIR is written here."""

    def recorded(self) -> Json:
        return read_run(self.output_dir)

    def recorded_epochs(self) -> list[Json] | None:
        return read_epochs(self.output_dir)[0]

    def lock(self, lock: RunLock) -> None:
        lock.acquire()

    def settings(self, text: dict[str, str]) -> None:
        write_json(self.output_dir / RUN_SETTINGS, text)

    def run(self, record: Json) -> None:
        write_json(self.output_dir / RUN, record)

    def epochs(self, epochs: list[Json], latest: str | None) -> None:
        try:
            write_json(self.output_dir / EPOCHS, epochs)
        except OSError as error:
            raise TrainingError(
                f"could not write {self.output_dir / EPOCHS} ({error.strerror or error}); the last checkpoint "
                f"{latest} is intact: {storage_fix(error, self.output_dir)} and run again"
            ) from None

    def summary(self, summary: Json) -> None:
        write_json(self.output_dir / "summary.json", summary)

    def scalars(self) -> SummaryWriters:
        logs = self.output_dir / "logs"
        return {name: tf.summary.create_file_writer(str(logs / name)) for name in ("train", "eval")}

    def hparams(self, values: Json) -> None:
        """An HParams session at logs/, so that its train/ and eval/ scalars attach to it, for TensorBoard's
        HParams table (runs under one parent, side by side)."""
        from tensorboard.plugins.hparams import api as hp

        with tf.summary.create_file_writer(str(self.output_dir / "logs")).as_default():
            hp.hparams(values, trial_id=str(self.output_dir))

    def note(self, message: str) -> None:
        self.say(message)
