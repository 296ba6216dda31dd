"""The focus policy: which training process is diagnosed and shown (no thread, no tree)."""

from __future__ import annotations

from torchwatch.model.observation import RankReading
from torchwatch.watch.focus import FocusPolicy


def rank(number: int, pid: int) -> RankReading:
    """One rank's reading over the window: only its number and PID matter to the focus."""
    return RankReading(number, pid, 2, 20, 100.0, 10.0, 20.0, 5.0)


JOB = (rank(0, 100), rank(1, 101), rank(2, 102))  # ordered by rank, as an analysis holds them


def test_no_training_process_no_focus() -> None:
    assert FocusPolicy().focus([], {100: 90.0}) is None


def test_the_oldest_main_first_then_the_busiest_kept_until_another_is_twice_as_busy() -> None:
    policy = FocusPolicy()
    assert policy.focus([100, 200], {}) == 100  # no CPU read yet: the oldest
    assert policy.focus([100, 200], {100: 1.0, 200: 95.0}) == 200  # a wrapper waiting on the training
    assert policy.focus([100, 200], {100: 60.0, 200: 50.0}) == 200  # not 2x busier: kept
    assert policy.focus([100, 200], {100: 105.0, 200: 50.0}) == 200  # 2x, but not 5 points more
    assert policy.focus([100, 200], {100: 106.0, 200: 50.0}) == 100
    assert policy.focus([200], {200: 1.0}) == 200  # the one kept exited


def test_the_straggler_is_the_focus_then_the_lowest_rank() -> None:
    policy = FocusPolicy()
    mains = [100, 101, 102]
    busy = {100: 10.0, 101: 10.0, 102: 99.0}
    policy.judged(JOB, straggler=101)
    assert policy.focus(mains, busy) == 101
    policy.judged(JOB, straggler=None)
    assert policy.focus(mains, busy) == 100  # the lowest rank, not the busiest
    policy.judged(JOB, straggler=101)
    assert policy.focus([100, 102], busy) == 100  # the straggler exited: the lowest rank


def test_a_chosen_rank_beats_the_straggler_and_none_gives_it_back() -> None:
    policy = FocusPolicy()
    mains = [100, 101, 102]
    policy.judged(JOB, straggler=101)
    policy.choose_rank(2)
    assert policy.chosen_rank == 2 and policy.focus(mains, {}) == 102
    policy.choose_rank(None)
    assert policy.focus(mains, {}) == 101


def test_a_chosen_rank_that_is_gone_gives_the_lowest_rank_not_the_straggler() -> None:
    policy = FocusPolicy()
    policy.judged(JOB, straggler=101)
    policy.choose_rank(2)
    assert policy.focus([100, 101], {}) == 100  # rank 2's process exited
    policy.choose_rank(7)  # a rank the last analysis does not hold
    assert policy.focus([100, 101], {}) == 100


def test_ranks_no_longer_in_the_tree_fall_back_to_the_busiest() -> None:
    policy = FocusPolicy()
    policy.judged(JOB, straggler=101)
    assert policy.focus([300, 301], {300: 1.0, 301: 50.0}) == 301
