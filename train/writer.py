"""What a run writes into OUTPUT_DIR, decided in one place: the chief writes it, every other worker nothing.

`writer_for(peers, ...)` gives the chief a `ChiefWriter` and every other worker a `Writer`, which has the same
methods and does nothing (its TensorBoard writers write nowhere). So the engine says what is written once, and
never asks which worker it is on to write it:

| file or folder                | written by           | when                                                      |
|-------------------------------|----------------------|-----------------------------------------------------------|
| `.lock`                       | `lock`               | the run directory is opened (train.resume)                |
| `settings.json`, `run.json`   | `settings`, `run`    | once the checkpoints loaded; run.json again on AUTO_BATCH |
| `logs/` (TensorBoard)         | `scalars`, `hparams` | while training (train.hooks.Scalars)                      |
| `epochs.json`                 | `epochs`             | every epoch's end (train.callbacks)                       |
| `model.keras`, `saved_model/` | `export`             | the end (train.finish)                                    |
| `summary.json`                | `summary`            | the end, or a stop                                        |
| `crash.log`                   | `crash`              | the end, where the workers' weights differ (a bug)        |

The checkpoints are not here: saving one is a collective of every worker (train.checkpoints, `peers`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensorflow as tf

from train.cluster.workers import SingleHost
from train.errors import TrainingError, first_line, storage_fix
from train.model import Built, export, model_to_export
from train.rundir import CRASH_LOG, EPOCHS, RUN, RunLock, read_run, write_json
from train.settings import RUN_SETTINGS, Settings, changed_settings

Say = Callable[[str], None]
SummaryWriters = dict[str, Any]  # "train", "eval": tf.summary writers (train.hooks.Scalars writes to them)


class Writer:
    """A worker other than the chief: it trains, evaluates and says what matters to it, and writes nothing."""

    chief = False

    def __init__(self, output_dir: Path, say: Say) -> None:
        self.output_dir, self.say = output_dir, say

    def recorded(self) -> dict[str, Any]:
        """run.json as the run's starts left it ({} on other workers: the chief's decisions reach them)."""
        return {}

    def lock(self, lock: RunLock) -> None:
        """One writer per run directory (train.rundir.RunLock)."""

    def changed_settings(self, settings: Settings) -> list[tuple[str, str, str]]:
        """The settings changed since the run's last start, as settings.json has them."""
        return []

    def settings(self, settings: Settings) -> None:
        """settings.json: the settings this start runs with."""

    def run(self, record: dict[str, Any]) -> None:
        """run.json (train.resume.run_record)."""

    def epochs(self, epochs: list[dict[str, Any]], latest: str | None) -> None:
        """epochs.json: each epoch's logs (train.callbacks); `latest`: the checkpoint an error says is intact."""

    def summary(self, summary: dict[str, Any]) -> None:
        """summary.json."""

    def export(self, built: Built, settings: Settings, latest: str | None) -> str | None:
        """model.keras and saved_model/; where they are (None: not written here)."""
        return None

    def scalars(self) -> SummaryWriters:
        """TensorBoard's writers, train and eval, under logs/."""
        return {name: tf.summary.create_noop_writer() for name in ("train", "eval")}

    def hparams(self, values: dict[str, Any]) -> None:
        """logs/'s HParams session: the resolved settings and what the run resolved."""

    def note(self, message: str) -> None:
        """A message about the run directory, or one the chief says for every worker."""

    def crash(self, text: str) -> Path | None:
        """`text` appended to crash.log, what a bug left to report; where it is (None: not written here)."""
        return None


class ChiefWriter(Writer):
    """The chief (or the only process): everything in OUTPUT_DIR is written here."""

    chief = True

    def recorded(self) -> dict[str, Any]:
        return read_run(self.output_dir)

    def lock(self, lock: RunLock) -> None:
        lock.acquire()

    def changed_settings(self, settings: Settings) -> list[tuple[str, str, str]]:
        return changed_settings(self.output_dir / RUN_SETTINGS, settings)

    def settings(self, settings: Settings) -> None:
        write_json(self.output_dir / RUN_SETTINGS, settings.to_json())

    def run(self, record: dict[str, Any]) -> None:
        write_json(self.output_dir / RUN, record)

    def epochs(self, epochs: list[dict[str, Any]], latest: str | None) -> None:
        try:
            write_json(self.output_dir / EPOCHS, epochs)
        except OSError as error:
            raise TrainingError(
                f"could not write {self.output_dir / EPOCHS} ({error.strerror or error}); the last checkpoint "
                f"{latest} is intact: {storage_fix(error, self.output_dir)} and run again"
            ) from None

    def summary(self, summary: dict[str, Any]) -> None:
        write_json(self.output_dir / "summary.json", summary)

    def export(self, built: Built, settings: Settings, latest: str | None) -> str | None:
        try:
            return export(built, self.output_dir, model_to_export(settings, built))
        except (OSError, tf.errors.OpError) as error:
            raise TrainingError(
                f"could not export the model to {self.output_dir} ({first_line(error, 160)}); checkpoint "
                f"{latest} is intact: {storage_fix(error, self.output_dir)} and run again to export"
            ) from None

    def crash(self, text: str) -> Path | None:
        path = self.output_dir / CRASH_LOG
        try:
            with open(path, "a", encoding="utf-8") as stream:
                stream.write(text)
        except OSError as error:
            self.say(f"warning: could not write {path} ({error.strerror or error}): {text.strip()}")
            return None
        return path

    def scalars(self) -> SummaryWriters:
        logs = self.output_dir / "logs"
        return {name: tf.summary.create_file_writer(str(logs / name)) for name in ("train", "eval")}

    def hparams(self, values: dict[str, Any]) -> None:
        """An HParams session at logs/, so that its train/ and eval/ scalars attach to it, for TensorBoard's
        HParams table (runs under one parent, side by side)."""
        from tensorboard.plugins.hparams import api as hp

        with tf.summary.create_file_writer(str(self.output_dir / "logs")).as_default():
            hp.hparams(values, trial_id=str(self.output_dir))

    def note(self, message: str) -> None:
        self.say(message)


def writer_for(peers: SingleHost, output_dir: Path, say: Say) -> Writer:
    """The chief's `ChiefWriter` (or a single host's), or another worker's silent `Writer`: the one place that asks
    which worker this is to decide what it writes."""
    return ChiefWriter(output_dir, say) if peers.is_chief else Writer(output_dir, say)
