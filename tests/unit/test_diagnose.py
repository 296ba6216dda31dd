"""The verdict of one analysis tick: the focus process's, or the job's over every rank."""

from __future__ import annotations

from tests.unit.hookrecords import hook_record
from tests.unit.ranks import rank_state
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.analysis.store import Store, Window
from torchwatch.model.readings import HookState, SourceStatus
from torchwatch.watch.diagnose import JobDiagnoser, why_missing
from torchwatch.watch.observe import NO_CUDA

# Rank 1 (PID 101) loads for 64 ms of an 87 ms step, rank 0 (PID 100) for 16 ms: rank 1 is the straggler.
JOB = Window(0.0, 10.0, hook=[rank_state(100, 0, 16, 4, 87), rank_state(101, 1, 64, 4, 87)])


def judge() -> JobDiagnoser:
    return JobDiagnoser(load_rules(), lambda name: "not measured")


def test_one_process_gets_its_own_analysis_and_no_job() -> None:
    lone = Window(0.0, 10.0, hook=[HookState(3.0, 100, 20, 20, 0.0, 0.0, record=hook_record(100))])
    a = judge().evaluate(lone, 100, 3.0)
    assert a.t == 3.0 and a.per_rank == {} and a.ranks == () and a.straggler is None


def test_a_job_gets_every_rank_the_straggler_and_leaves_each_ranks_analysis_as_built() -> None:
    a = judge().evaluate(JOB, 100, 3.0)
    assert set(a.per_rank) == {100, 101} and [r.pid for r in a.ranks] == [100, 101]
    assert a.straggler is not None and a.straggler.pid == 101
    assert a.verdict.summary.startswith("Rank 1 is the straggler")
    for own in a.per_rank.values():  # each rank's analysis is what its rules made: no job inside
        assert own is not a and own.per_rank == {} and own.ranks == () and own.straggler is None


def test_the_job_is_shown_for_the_focus_or_the_lowest_rank() -> None:
    assert judge().evaluate(JOB, 101, 3.0).ranks[1].pid == 101
    launcher = judge().evaluate(JOB, 99, 3.0)  # the focus is no rank (a spawn launcher)
    assert set(launcher.per_rank) == {100, 101}


def test_the_ranks_not_shown_are_evaluated_every_other_tick() -> None:
    jd = judge()
    ticks = [jd.evaluate(JOB, 100, now) for now in (3.0, 4.0, 5.0, 6.0)]
    assert [a.per_rank[100].t for a in ticks] == [3.0, 4.0, 5.0, 6.0]  # the focus, every tick
    assert [a.per_rank[101].t for a in ticks] == [3.0, 4.0, 4.0, 6.0]  # in between, its last stands


def test_a_missing_feature_is_blamed_on_its_source_then_on_the_focus() -> None:
    store = Store()
    down = {"py-spy": SourceStatus.unavailable("py-spy may not read process 1: permission denied", "sudo")}
    assert why_missing("data_wait_share", down, store, 7).startswith("py-spy unavailable: py-spy may not read")
    assert why_missing("data_wait_share", {}, store, None) == "no Python training process found in the tree yet"
    assert why_missing("no_such_feature", {}, store, 7) == "unknown feature"
    store.add([HookState(1.0, 7, 0, 0, 0.0, 0.0, record=hook_record(7, cuda_initialized=False))])
    assert why_missing("cuda_mem_peak_ratio", {}, store, 7) == NO_CUDA
    assert why_missing("cuda_mem_peak_ratio", {}, store, 8) != NO_CUDA  # another process's record
