"""The run's facts, handed to the MODEL file: `build_model(..., *, context)` and `build_callbacks(context)`.

    context.global_batch, .replicas, .workers        the topology the run trains on
    context.steps_per_epoch, .epochs, .total_steps   what a schedule needs (total_steps = steps_per_epoch x epochs)
    context.seed, .precision                         SEED, and the Keras dtype policy ("float32", "mixed_bfloat16")
    context.is_chief, .output_dir                    where a callback may write files (only the chief should)
    context.sample(n)                                n training inputs, batched, as the model gets them
    context.sample(n, labels=True)                   ... as (inputs, labels) batches: a label's statistics

`sample(n)` (train.data.source.Data.sample) is what `Normalization.adapt` (and the like) needs: the first n
examples of TRAIN_SPLIT in the order TFDS lists them, after `preprocess(training=False)` where the MODEL file has
one (else the feature as stored, an image scaled to [0, 1]), inputs only; with `labels=True`, their labels beside
them (what a regression head's target is normalised with: examples/mlp_table.py). It depends on nothing but the
split, so it is the same on every worker and every start, and a layer adapted on it comes out the same everywhere.
A layer that `preprocess` uses is adapted earlier, in the MODEL file's `adapt(context)`, on the raw stored examples
(train.data.adapt).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf


@dataclass(frozen=True)
class Context:
    """The run's facts (see the module's docstring). Frozen: a model file reads them, it cannot change them."""

    global_batch: int
    replicas: int
    workers: int
    steps_per_epoch: int
    epochs: int
    seed: int
    precision: str
    is_chief: bool = True
    output_dir: Path | None = None
    _sample: Callable[[int, bool], tf.data.Dataset] | None = field(default=None, repr=False, compare=False)

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def sample(self, n: int, labels: bool = False) -> tf.data.Dataset:
        """The first `n` training inputs (all of them where the split holds fewer), batched, as the model gets them;
        `labels`: (inputs, labels) batches. Raises ValueError for an `n` under 1."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"context.sample(n) takes a whole number of examples, 1 or more, not {n!r}")
        if self._sample is None:
            raise ValueError("context.sample is not available here: this context has no training split")
        return self._sample(n, labels)
