"""How a start at another global batch maps the run's steps to epochs and to the data (train.timeline): the
epochs still owed are trained, no epoch ends twice, and the pass under way goes on from the same example.
Plain arithmetic: no TensorFlow."""

from __future__ import annotations

from train.timeline import Segment, first_segment, resume, segment_at

SPLIT = 16_384  # the default dataset's train split


def epoch_ends(segment: Segment, start: int, total: int) -> list[int]:
    return [step for step in range(start + 1, total + 1) if (step - segment.origin_step) % segment.steps_per_epoch == 0]


def total_steps(segment: Segment, epochs: int) -> int:
    return segment.origin_step + segment.steps_per_epoch * (epochs - segment.origin_epoch)


def test_the_same_global_batch_keeps_the_segment_as_it_was():
    first = first_segment(256, 64, 64)
    assert resume(first, 100, 256, 64, 64) is first
    assert first.data_step(100) == 100 and first.epochs_done(100) == 100 / 64


def test_one_to_two_devices_mid_epoch_trains_the_epochs_owed_and_evaluates_none_twice():
    """The fault probe's case: 3 epochs at 128 a step (384 steps), stopped at step 200, resumed at 256 a step."""
    before = first_segment(128, SPLIT // 128, SPLIT // 128)
    after = resume(before, 200, 256, SPLIT // 256, SPLIT // 256)
    assert before.epochs_done(200) == 1.5625
    assert after.epochs_done(200) == 1.5625  # the epoch under way keeps its fraction
    total = total_steps(after, 3)
    assert total == 292  # 1.4375 epochs of 64 steps after step 200, never "already at step 200 of 192"
    assert epoch_ends(after, 200, total) == [228, 292]  # epochs 2 and 3 end once each; epoch 1 ended at 128
    examples = 200 * 128 + (total - 200) * 256
    assert examples == 3 * SPLIT  # EPOCHS x the split, in all
    # The data: pass 1, 72 batches of 128 in (9,216 examples), goes on at batch 36 of 256 of that pass.
    assert after.data_step(200) == SPLIT // 256 + 36


def test_two_devices_to_one_mid_epoch_trains_three_passes_not_more():
    """The fault probe's other case: 3 epochs at 256 (192 steps), stopped at step 100, resumed at 128."""
    before = first_segment(256, SPLIT // 256, SPLIT // 256)
    after = resume(before, 100, 128, SPLIT // 128, SPLIT // 128)
    total = total_steps(after, 3)
    assert 100 * 256 + (total - 100) * 128 == 3 * SPLIT  # not 3.625 passes
    assert epoch_ends(after, 100, total) == [156, 284]  # epoch 1 ended at step 64, before the stop: not again
    assert after.data_step(100) == SPLIT // 128 + 72  # pass 1 at example 9,216: batch 72 of 128


def test_a_start_exactly_at_an_epoch_end_counts_that_epoch_as_done():
    before = first_segment(128, 128, 128)
    after = resume(before, 256, 256, 64, 64)
    assert (after.origin_step, after.origin_epoch) == (256, 2)
    assert total_steps(after, 3) == 320 and epoch_ends(after, 256, 320) == [320]
    assert after.data_step(256) == 2 * 64  # pass 2 from its start


def test_a_restore_goes_back_to_the_segment_that_held_its_step():
    first = first_segment(128, 128, 128)
    second = resume(first, 200, 256, 64, 64)
    starts = [{"first_step": 0, "segment": first.to_json()}, {"first_step": 200, "segment": second.to_json()}]
    assert segment_at(starts, 250) == second
    assert segment_at(starts, 150) == first  # an older checkpoint than the last start's
    assert segment_at([{"first_step": 0}], 10) is None  # a start recorded before segments were: none
    assert segment_at([{"segment": {"first_step": "x"}}], 10) is None  # damaged: skipped, not a traceback
