"""Where a run is, across starts on other hardware: its steps, its epochs and its place in the data.

A run's step counts calls of the optimizer; what `EPOCHS` counts is passes over the data, and what the data
order follows is the place in the plan of batches (train.data.feeds). While the global batch stays, the three
move together: step s is epoch s // steps_per_epoch and batch s of the plan. A start at another global batch
(another BATCH_SIZE or replica count without GLOBAL_BATCH_SIZE, or AUTO_BATCH halving it) re-bases them:

- epochs: the fraction of the epoch under way is kept, and the epochs left are counted in the new steps, so
  EPOCHS x the split is what the run trains in all, and no epoch ends (or is evaluated) twice;
- the data: the pass under way goes on from the same example in the pass's order, in batches of the new size.

A `Segment` is that mapping for a stretch of steps at one global batch; `run.json` records one per start
(train.resume), and the next start takes up the one that holds its checkpoint's step.

A streamed split resumed mid-pass at another worker count (its order is each worker's: train.data.feeds)
first reads the rest of that pass, every example its old workers had not read, once (`with_remainder`).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, replace

Json = dict[str, object]  # run.json's, read back: each value checked where it is read


@dataclass(frozen=True)
class Segment:
    """Steps from `first_step` on at `global_batch` examples a step.

    Epoch e (counted from 0) ends at step `origin_step + (e - origin_epoch + 1) x steps_per_epoch`; the data
    plan is read at batch `step + data_shift` (of `pass_batches` batches a pass)."""

    first_step: int
    global_batch: int
    steps_per_epoch: int
    pass_batches: int
    origin_step: int = 0
    origin_epoch: int = 0
    data_shift: int = 0
    pipelines: int = 1  # input pipelines of a streamed split: the workers
    # The rest of a streamed pass, read from `first_step` to `remainder_end`: pass `remainder_pass` as
    # `read_by` pipelines of `read_batch` examples had read `read_batches` batches of it (-1: none).
    remainder_pass: int = -1
    remainder_end: int = 0
    read_by: int = 0
    read_batch: int = 0
    read_batches: int = 0

    def in_remainder(self, step: int) -> bool:
        return self.remainder_pass >= 0 and step < self.remainder_end

    # The run's one epoch arithmetic: every count of epochs from steps is one of these.

    def epochs_done(self, step: int) -> float:
        """Epochs trained by `step`, a fraction where one is under way."""
        return self.origin_epoch + (step - self.origin_step) / self.steps_per_epoch

    def epochs_completed(self, step: int) -> int:
        """Whole epochs trained by `step`."""
        return self.origin_epoch + (step - self.origin_step) // self.steps_per_epoch

    def epoch_of(self, step: int) -> int:
        """The epoch (from 1) that step `step` belongs to: the last one that ended there, at an epoch's end."""
        return self.origin_epoch - (-(step - self.origin_step) // self.steps_per_epoch)

    def ends_epoch(self, step: int) -> bool:
        return (step - self.origin_step) % self.steps_per_epoch == 0

    def epoch_start(self, epochs: int) -> int:
        """The step at which the epoch after `epochs` whole ones begins."""
        return self.origin_step + (epochs - self.origin_epoch) * self.steps_per_epoch

    def total_steps(self, epochs: int) -> int:
        """The step at which EPOCHS=`epochs` are trained."""
        return self.epoch_start(epochs)

    def data_step(self, step: int) -> int:
        return step + self.data_shift

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Json) -> Segment:
        fields = cls.__dataclass_fields__
        return cls(**{name: int(data[name]) for name in fields if name in data or fields[name].default is MISSING})


def first_segment(global_batch: int, steps_per_epoch: int, pass_batches: int, pipelines: int = 1) -> Segment:
    return Segment(0, global_batch, steps_per_epoch, pass_batches, pipelines=pipelines)


def resume(
    previous: Segment, step: int, global_batch: int, steps_per_epoch: int, pass_batches: int, pipelines: int = 1
) -> Segment:
    """The segment a start at `step` goes on with: `previous` itself where nothing that maps steps changed, else
    re-based (see the module's docstring)."""
    same = (previous.global_batch, previous.steps_per_epoch, previous.pass_batches, previous.pipelines)
    if same == (global_batch, steps_per_epoch, pass_batches, pipelines):
        return previous
    done = previous.epochs_done(step)
    epoch = int(done + 1e-9)  # an epoch that ended exactly at `step` counts as done
    into_epoch = round((done - epoch) * steps_per_epoch)
    # The data: the same pass, at the same example of its order (rounded to the new batch).
    pass_number, batch = divmod(previous.data_step(step), previous.pass_batches)
    examples_into_pass = batch * previous.global_batch
    data_step = pass_number * pass_batches + min(pass_batches, round(examples_into_pass / global_batch))
    return Segment(
        step, global_batch, steps_per_epoch, pass_batches, step - into_epoch, epoch, data_step - step, pipelines
    )


def unread_pass(previous: Segment, step: int, pipelines: int) -> tuple[int, int] | None:
    """(pass, batches of it read) where a start at `step` on `pipelines` streamed input pipelines must first read
    the rest of a pass its old ones had begun; None where the pass is whole or nothing changed. (Within the rest
    of a pass read that way, another change is not followed exactly: the remainder of a remainder.)"""
    if pipelines == previous.pipelines or previous.in_remainder(step):
        return None
    pass_number, read = divmod(previous.data_step(step), previous.pass_batches)
    return (pass_number, read) if read else None


def with_remainder(segment: Segment, previous: Segment, unread: tuple[int, int], length: int) -> Segment:
    """`segment` (a start's, at its first step) reading first `length` batches of the rest of pass `unread[0]`,
    then the passes after it whole. One pass an epoch (the default STEPS_PER_EPOCH): that epoch ends with it."""
    pass_number, read = unread
    end = segment.first_step + length
    origin_step, origin_epoch = segment.origin_step, segment.origin_epoch
    if segment.steps_per_epoch == segment.pass_batches and previous.steps_per_epoch == previous.pass_batches:
        origin_step = end - segment.steps_per_epoch  # the epoch under way ends where its pass does
    return replace(
        segment,
        origin_step=origin_step,
        origin_epoch=origin_epoch,
        data_shift=(pass_number + 1) * segment.pass_batches - end,
        remainder_pass=pass_number,
        remainder_end=end,
        read_by=previous.pipelines,
        read_batch=previous.global_batch // previous.pipelines,
        read_batches=read,
    )


def segment_at(starts: list[Json], step: int) -> Segment | None:
    """The segment of the latest start recorded in run.json that began at or before `step` (a restore may go
    back before the last start, to an older checkpoint)."""
    for start in reversed(starts):
        try:
            segment = Segment.from_json(start["segment"])
        except (KeyError, TypeError, ValueError):  # not recorded (or damaged): the start before it, if any
            continue
        if segment.first_step <= step:
            return segment
    return None
