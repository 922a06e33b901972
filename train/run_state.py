"""The run's state, typed: what its start decided (`Start`, frozen) and where it is (`Position`, mutable).

`Start` is made once, before the run directory is opened (train.start.start_run). `Position` is made when it
is opened (train.resume.open_run_dir) and changes in two places only: AUTO_BATCH's retry at a smaller batch
(train.failures.halve_batch, through train.resume.rebase) re-bases it, and nothing else writes to it.
What happens between training calls is not here: it is the hooks' (train.hooks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import keras
import numpy as np

from train.cluster.workers import SingleHost
from train.context import Context
from train.data.source import Data
from train.devices.runtime import Runtime
from train.hooks import Hook, Json, Say
from train.init_from import Matched
from train.model import Built
from train.phased import Phased
from train.settings import Settings
from train.timeline import Segment


@dataclass(frozen=True)
class Start:
    """What the run's start decided: the settings (a one-split dataset's slices in them), the data, the built
    model, XLA, and what run.json records of them."""

    settings: Settings
    peers: SingleHost
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

    @property
    def output_dir(self) -> Path:
        return self.settings.output_dir

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"


@dataclass
class Position:
    """Where the run is: the devices and batch it trains at now, how its steps map to epochs and to the data
    (train.timeline), and every start of it."""

    runtime: Runtime  # AUTO_BATCH halves its batch
    segment: Segment  # how steps map to epochs and to the data from here on
    marks: tuple[np.ndarray, ...] = ()  # the segment's rest of a streamed pass: what each input pipeline reads of it
    starts: list[Json] = field(default_factory=list)  # every start of the run (run.json), this one last
    resumed_from: int | None = None  # the step this start restored, None for a run's first
    initialized_from: Json | None = None  # INIT_FROM's record (train.init_from): run.json's and summary.json's
    from_hooks: Json = field(default_factory=dict)  # what the hooks' run_begin added to run.json (train.hooks)
