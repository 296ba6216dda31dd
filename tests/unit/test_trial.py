"""Live trials: the contract (settings, request, state, statistics) and the hook's Trials run
in this process on real torch settings and a real DataLoader, without a signal."""

from __future__ import annotations

import gc
import json
import math
import random
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from torchwatch import wire
from torchwatch.analysis.rules_engine import parse_rule
from torchwatch.faces import compare as compare_mod
from torchwatch.faces.trial import outcome_lines, report_lines, state_lines
from torchwatch.hook.trial import Trials
from torchwatch.model.errors import UsageError
from torchwatch.model.trials import Outcome, Plan, verdict
from torchwatch.watch.trials import plan_trial
from torchwatch.wire import HookRecord, Instance, WireError


# -- the contract -------------------------------------------------------------------------------
def test_assignments_parse_to_a_setting_and_value_or_say_what_is_expected() -> None:
    s, v, text = wire.parse_assignment("threads=2")
    assert (s.name, v, text) == ("threads", 2, "2")
    s, v, text = wire.parse_assignment("torch.backends.cudnn.benchmark=on")
    assert (s.name, v, text) == ("cudnn_benchmark", True, "true")
    assert wire.parse_assignment("gc_threshold=5000,20")[1] == (5000, 20)
    for bad, words in [
        ("threads", "SETTING=VALUE"),
        ("threads=0", "from 1"),
        ("threads=two", "whole number"),
        ("warp_speed=9", "unknown setting"),
        ("pin_memory=maybe", "true or false"),
        ("matmul_precision=low", "highest, high or medium"),
        ("gc_threshold=1,2,3,4", "1 to 3"),
    ]:
        with pytest.raises(ValueError, match=words):
            wire.parse_assignment(bad)


@pytest.mark.parametrize(
    ("text", "kw", "why", "setting", "words"),
    [
        ("threads", {}, "syntax", "threads", "is not SETTING=VALUE"),
        ("warp=2", {}, "syntax", "warp", "unknown setting 'warp'"),
        ("threads=two", {}, "syntax", "threads", "whole number"),
        ("interop_threads=2", {}, "refused", "interop_threads", "not tried live: torch sets the inter-op pool"),
        ("allow_tf32=1", {}, "numerics", "tf32", "only tried with --allow-numerics"),
        ("num_threads=3", {"usable_cpus": 2.0}, "cpus", "threads", "threads=3 is beyond the 2"),
        ("num_workers=9", {"usable_cpus": 2.0}, "cpus", "num_workers", r"beyond the 8 \(4 per CPU\)"),
    ],
)
def test_one_check_of_a_trial_s_setting_says_why_it_is_not_tried(
    text: str, kw: dict[str, Any], why: str, setting: str, words: str
) -> None:
    with pytest.raises(wire.NotTried, match=words) as caught:
        wire.check_trial(text, **kw)
    assert (caught.value.why, caught.value.setting) == (why, setting) and "\n" not in str(caught.value)


def test_one_check_of_a_trial_s_setting_returns_the_setting_its_value_and_its_text() -> None:
    a = wire.check_trial("intra_op_threads=2", usable_cpus=2.0)
    assert (a.setting.name, a.value, a.text) == ("threads", 2, "2")
    a = wire.check_trial("tf32=on", allow_numerics=True)
    assert (a.setting.name, a.value, a.text) == ("tf32", True, "true")
    assert wire.check_trial("threads=64").value == 64  # usable CPUs unknown: no bound


def test_a_setting_is_parsed_once_by_torchwatch_and_once_by_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchwatch.watch.trials import check_assignment

    calls: list[str] = []
    parse = wire.Setting.parse

    def counted(self: wire.Setting, text: str) -> Any:
        calls.append(text)
        return parse(self, text)

    monkeypatch.setattr(wire.Setting, "parse", counted)
    checked = check_assignment("threads=2", max_s=60.0)
    plan = plan_trial([_CpusReader(1, 2.0)], checked)  # type: ignore[list-item]
    assert plan.request.value == "2" and calls == ["2"]  # torchwatch's side: the command's check, once
    calls.clear()
    trials = _Host().trials()
    try:
        req = wire.decode_request(json.loads(json.dumps(plan.request.to_json())))
        assert isinstance(req, wire.TrialRequest)
        trials.on_request(req, time.monotonic(), 0)
        assert trials.state is not None and trials.state.setting == "threads" and calls == ["2"]  # the hook's
    finally:
        trials.close()


def test_blocks_alternate_on_off_off_on() -> None:
    assert [wire.is_on(i) for i in range(8)] == [True, False, False, True, True, False, False, True]


def _block(on: bool, mean: float, steps: int = 10) -> wire.TrialBlock:
    return wire.TrialBlock(on, 0, steps, 2, mean, mean)


def test_the_estimate_is_the_pairs_mean_ratio_with_student_t() -> None:
    blocks = [_block(True, 1.0), _block(False, 2.0), _block(False, 2.2), _block(True, 1.0)]
    est = wire.estimate(blocks)
    assert est is not None and est.pairs == 2
    logs = [math.log(2.0), math.log(2.2)]
    mean = sum(logs) / 2
    half = 12.706 * abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2)
    assert est.speedup == pytest.approx(math.exp(mean))
    assert est.lo == pytest.approx(math.exp(mean - half)) and est.hi == pytest.approx(math.exp(mean + half))
    # incomplete or unmeasured pairs give nothing
    assert wire.estimate(blocks[:1]) is None
    assert wire.estimate([_block(True, 1.0), _block(False, 0.0, steps=0)]) is None


def test_one_polluted_pair_does_not_decide_once_five_pairs_are_in() -> None:
    rng = random.Random(3)
    logs = [math.log(1.5) + rng.gauss(0, 0.01) for _ in range(9)] + [math.log(0.4)]  # a neighbour's burst
    center, half = wire.trimmed_interval(logs, wire.TRIM)
    assert math.exp(center) == pytest.approx(1.5, rel=0.02) and half < 0.05
    plain_center, plain_half = wire.trimmed_interval(logs, 0.0)
    assert plain_half > 5 * half and math.exp(plain_center) < 1.35


def test_requests_and_states_are_bounded_and_round_trip() -> None:
    req = wire.TrialRequest(7, "threads", "2", block_steps=12, warmup=2, start_step=40)
    assert wire.TrialRequest.decode(json.loads(json.dumps(req.to_json()))) == req
    assert req.to_json()["kind"] == wire.TRIAL_KIND and wire.decode_request(req.to_json()) == req
    assert wire.decode_request(None) is None and wire.decode_request([1]) is None
    assert wire.decode_request({"steps": 3}) == wire.BurstRequest(steps=3)
    assert wire.decode_request({"kind": "other", "steps": 99}) == wire.BurstRequest(steps=20)  # clamped
    assert wire.decode_request(wire.TrialStop(7).to_json()) == wire.TrialStop(7)
    assert wire.decode_request({"kind": "trial-stop", "id": True}) == wire.TrialStop(0)  # ends no trial
    bad = wire.decode_request({**req.to_json(), "warmup": 12, "setting": "x" * 99})
    assert isinstance(bad, wire.BadTrial) and bad.id == 7 and "warmup" in bad.why and len(bad.setting) <= 40
    assert wire.decode_request({"kind": "trial", "id": -1}) == wire.BadTrial(
        1, "", "", "bad request: request.json.block_steps: missing"
    )
    for field, value in [("block_steps", 1), ("warmup", 12), ("max_s", 1e9), ("id", 0), ("target", 0.9)]:
        with pytest.raises(WireError, match=field):
            wire.TrialRequest.decode({**req.to_json(), field: value})
    state = wire.TrialState(7, "threads", "2", "done", old="8", blocks=(_block(True, 1.0), _block(False, 2.0)),
                          estimate=wire.estimate([_block(True, 1.0), _block(False, 2.0)]), restored=True,
                          now_value="8", started=1.0, ended=2.0)  # fmt: skip
    rec = HookRecord(Instance(10, 1, 1), "3.11", "2.13", 0.0, 12, True, trial=state)
    back = HookRecord.decode(json.loads(json.dumps(rec.to_json())))
    assert back.trial == state
    with pytest.raises(WireError, match=r"trial\.state"):
        HookRecord.decode({**rec.to_json(), "trial": {**state.to_json(), "state": "exploded"}})
    with pytest.raises(WireError, match="blocks"):
        HookRecord.decode({**rec.to_json(), "trial": {**state.to_json(), "blocks": [state.blocks[0].to_json()] * 65}})


def test_verdicts_say_faster_slower_no_difference_or_undecided() -> None:
    def st(*means: float) -> wire.TrialState:
        blocks = tuple(_block(wire.is_on(i), m) for i, m in enumerate(means))
        return wire.TrialState(1, "threads", "2", "done", blocks=blocks, estimate=wire.estimate(blocks))

    assert verdict(st(1.0, 1.5, 1.52, 1.0, 1.0, 1.49))["result"] == "faster"
    assert verdict(st(1.5, 1.0, 1.0, 1.52, 1.49, 1.0))["result"] == "slower"
    nodiff = verdict(st(1.0, 1.001, 1.0, 0.999, 1.0, 1.002))
    assert nodiff["result"] == "no difference" and "within ±" in nodiff["text"]
    assert verdict(st(1.0, 2.0, 1.0, 0.7, 1.0, 1.4))["result"] == "undecided"
    refused = wire.TrialState(1, "interop_threads", "2", "refused", reason="set once per process")
    assert verdict(refused)["result"] == "refused"
    assert state_lines(refused) == ["interop_threads=2: refused: set once per process"]


# -- the hook's Trials, in this process -----------------------------------------------------------
class _Host:
    """What the hook gives Trials: publish counter, a timer that never fires, loaders."""

    def __init__(self) -> None:
        self.published = 0
        self.loaders: dict[int, Any] = {}
        self.busy: str | None = None
        self.typical: float | None = 0.01

    def trials(self) -> Trials:
        return Trials(
            torch,
            self._changed,
            lambda: True,
            lambda key: self.loaders.get(key),
            lambda: next(iter(self.loaders), None),
            lambda: self.busy,
            lambda: self.typical,
        )

    def _changed(self) -> None:
        self.published += 1


def _req(setting: str, value: str, **kw: Any) -> wire.TrialRequest | wire.BadTrial:
    """A trial's request as the hook decodes it from ``request.json``."""
    base = {"id": 5, "setting": setting, "value": value, "block_steps": 4, "warmup": 1, "max_s": 60.0,
            "target": 0.05, "min_pairs": 2, "max_blocks": 8, "keep": False, "allow_numerics": False}  # fmt: skip
    req = wire.decode_request({"kind": "trial", **base, **kw})
    assert isinstance(req, (wire.TrialRequest, wire.BadTrial))
    return req


def _drive(trials: Trials, step_s: dict[bool, float], steps: int = 200) -> list[int]:
    """Step boundaries with a step time that depends on the thread count now set."""
    seen = []
    t = 100.0
    for n in range(steps):
        if not trials.active:
            break
        threads = torch.get_num_threads()
        seen.append(threads)
        t += step_s[threads == 1]
        trials.on_step(t, step_s[threads == 1], n + 1)
    return seen


def test_a_threads_trial_alternates_at_step_boundaries_and_puts_the_value_back() -> None:
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    host = _Host()
    trials = host.trials()
    trials.on_request(_req("threads", str(target)), time.monotonic(), 0)
    assert trials.active and trials.state is not None and trials.state.old == str(before)
    seen = _drive(trials, {True: 0.01, False: 0.02} if target == 1 else {False: 0.01, True: 0.02})
    st = trials.state
    assert st is not None and st.state == "done" and st.restored is True and st.now_value == str(before)
    assert torch.get_num_threads() == before
    # the first boundary opens block 1 (on), then on/off/off/on in whole blocks of 4 steps
    assert set(seen[1:5]) == {target} and set(seen[5:9]) == {before} and set(seen[9:13]) == {before}
    assert [b.on for b in st.blocks][:4] == [True, False, False, True]
    assert all(b.steps == 3 and b.dropped == 1 for b in st.blocks)
    # the trial's value is given the faster step either way (half the other's): a speed-up of 2
    assert st.estimate is not None and st.estimate.speedup == pytest.approx(2.0, rel=1e-6)


def test_keep_keeps_only_a_value_that_was_faster() -> None:
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    try:
        for faster, kept in ((True, True), (False, False)):
            torch.set_num_threads(before)
            trials = _Host().trials()
            trials.on_request(_req("threads", str(target), keep=True, id=9), time.monotonic(), 0)
            fast, slow = 0.01, 0.02
            on_s, off_s = (fast, slow) if faster else (slow, fast)
            _drive(trials, {target == 1: on_s, target != 1: off_s})
            st = trials.state
            assert st is not None and st.kept is kept
            assert torch.get_num_threads() == (target if kept else before)
            assert ("not kept" in st.reason) is (not kept)
    finally:
        torch.set_num_threads(before)


def test_a_stop_request_or_the_exit_puts_the_value_back_at_once() -> None:
    before = gc.get_threshold()
    trials = _Host().trials()
    trials.on_request(_req("gc_threshold", "12345"), time.monotonic(), 0)
    trials.on_step(1.0, 0.01, 1)  # block 1 opens: the threshold is the trial's
    assert gc.get_threshold()[0] == 12345
    trials.on_request(wire.TrialStop(4), time.monotonic(), 1)  # another trial's id: ignored
    assert trials.active
    trials.on_request(wire.TrialStop(5), time.monotonic(), 1)
    assert not trials.active and gc.get_threshold() == before
    st = trials.state
    assert st is not None and st.state == "stopped" and st.restored is True
    trials.on_request(_req("gc_threshold", "12345", id=6), time.monotonic(), 0)
    trials.on_step(1.0, 0.01, 1)
    trials.close()
    assert gc.get_threshold() == before and trials.state is not None and trials.state.state == "stopped"


def test_a_second_trial_request_is_refused_apart_and_the_running_trial_still_puts_its_value_back() -> None:
    """A request of another id while a trial runs (a second torchwatch) is answered in
    ``trial_refused``; the running trial keeps its state, and its setting is put back at the end.
    Before, the refusal replaced the running trial's state: it was no longer active, and its
    ``gc_threshold`` stayed the trial's after the training's exit."""
    before = gc.get_threshold()
    host = _Host()
    trials = host.trials()
    trials.on_request(_req("gc_threshold", "12345"), time.monotonic(), 0)
    trials.on_step(1.0, 0.01, 1)
    assert gc.get_threshold()[0] == 12345
    trials.on_request(_req("threads", "1", id=77), time.monotonic(), 1)
    assert trials.active and trials.state is not None and trials.state.id == 5
    refused = trials.refused
    assert refused is not None and (refused.id, refused.state) == (77, "refused")
    assert refused.reason == "trial 5 (gc_threshold) is running"
    rec = wire.HookRecord(wire.Instance(10, 1, 2), "3.12", "2.13", 1.0, 12, True, trial=trials.state)
    back = wire.HookRecord.decode(json.loads(json.dumps({**rec.to_json(), "trial_refused": refused.to_json()})))
    assert back.trial_refused == refused and back.trial is not None and back.trial.id == 5
    trials.close()
    assert gc.get_threshold() == before
    assert trials.state is not None and trials.state.state == "stopped" and trials.state.restored is True


def test_the_timer_ends_a_trial_that_sees_no_step() -> None:
    before = gc.get_threshold()
    trials = _Host().trials()
    trials.on_request(_req("gc_threshold", "777", max_s=5.0), time.monotonic() - 10, 0)
    trials.on_step(1.0, 0.01, 1)
    trials.on_interrupt(time.monotonic())
    assert not trials.active and gc.get_threshold() == before
    assert trials.state is not None and "5 s" in trials.state.reason


@pytest.mark.parametrize(
    ("req", "why"),
    [
        (_req("interop_threads", "2"), "once per process"),
        (_req("persistent_workers", "1"), "persistent"),
        (_req("tf32", "1"), "allow-numerics"),
        (_req("threads", str(torch.get_num_threads())), "already"),
        (_req("num_workers", "2"), "no DataLoader"),
        (_req("threads", "2", block_steps=4, warmup=4), "bad request"),
    ],
)
def test_what_cannot_be_applied_or_undone_is_refused_before_anything_changes(
    req: wire.TrialRequest | wire.BadTrial, why: str
) -> None:
    before = (torch.get_num_threads(), gc.get_threshold())
    trials = _Host().trials()
    trials.on_request(req, time.monotonic(), 0)
    st = trials.state
    assert st is not None and st.state == "refused" and why in st.reason
    assert (torch.get_num_threads(), gc.get_threshold()) == before and not trials.active


def test_a_trial_is_refused_while_a_burst_runs_and_gc_freeze_respects_the_training_s_own_freeze() -> None:
    host = _Host()
    host.busy = "a profiler burst is running"
    trials = host.trials()
    trials.on_request(_req("gc_threshold", "999"), time.monotonic(), 0)
    assert trials.state is not None and "burst" in trials.state.reason
    gc.freeze()
    try:
        trials = _Host().trials()
        trials.on_request(_req("gc_freeze", "1"), time.monotonic(), 0)
        assert trials.state is not None and trials.state.state == "refused" and "thaw" in trials.state.reason
    finally:
        gc.unfreeze()


class _Squares(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i * i])


class _Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return iter(range(8))

    def __len__(self) -> int:
        return 8


def test_a_dataloader_trial_makes_its_iterators_and_leaves_the_loader_as_it_was() -> None:
    host = _Host()
    loader = DataLoader(_Squares(), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(1))
    reference = DataLoader(_Squares(), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(1))
    host.loaders[id(loader)] = loader
    trials = host.trials()
    trials.on_request(_req("num_workers", "2", min_pairs=2, max_blocks=4), time.monotonic(), 0)
    assert trials.active
    kinds, step, t = [], 0, 0.0
    for _epoch in range(6):
        it = trials.make_iterator(loader, type(loader)._get_iterator) if trials.wants(loader) else iter(loader)
        kinds.append(type(it).__name__)
        got = [b.tolist() for b in it]
        assert got == [b.tolist() for b in reference]  # the same samples in the same order
        assert (loader.num_workers, loader.prefetch_factor) == (0, None)  # the user's loader untouched
        for _ in range(4):
            step += 1
            t += 0.01
            trials.on_step(t, 0.01, step)
    assert kinds[:4] == ["_MultiProcessingDataLoaderIter", "_SingleProcessDataLoaderIter",
                         "_SingleProcessDataLoaderIter", "_MultiProcessingDataLoaderIter"]  # fmt: skip
    st = trials.state
    assert st is not None and st.state == "done" and st.mode == wire.ITERATOR and len(st.blocks) == 4
    assert st.restored is True and st.now_value == "0"


def test_dataloader_trials_refuse_what_would_change_the_samples_or_not_take_effect() -> None:
    for loader, req, why in [
        (DataLoader(_Stream(), batch_size=2), _req("num_workers", "2"), "IterableDataset"),
        (DataLoader(_Squares(), batch_size=2, num_workers=1, persistent_workers=True), _req("num_workers", "2"),
         "persistent"),
        (DataLoader(_Squares(), batch_size=2), _req("prefetch_factor", "4"), "needs DataLoader workers"),
        (DataLoader(_Squares(), batch_size=2), _req("pin_memory", "1"), "accelerator"),
        (DataLoader(_Squares(), batch_size=2), _req("num_workers", "2", max_s=5.0), "epochs do not fit"),
    ]:  # fmt: skip
        host = _Host()
        host.loaders[id(loader)] = loader
        if "fit" in why:
            host.typical = 1.0
        trials = host.trials()
        trials.on_request(req, time.monotonic(), 0)
        st = trials.state
        assert st is not None and st.state == "refused" and why in st.reason, (why, st)


# -- torchwatch's side --------------------------------------------------------------------------
class _Reader:
    def __init__(self, pid: int, durations: list[float], steps: int) -> None:
        self.pid = pid
        self._snap = type("S", (), {"steps": steps, "entries": [(0.0, d, 0.0) for d in durations]})()
        self._record: Any = None

    def counters(self) -> Any:
        return self._snap

    def record(self) -> Any:
        return self._record


class _CpusReader(_Reader):
    def __init__(self, pid: int, cpus: float) -> None:
        super().__init__(pid, [0.05] * 20, 100)
        self._record = SimpleNamespace(usable_cpus=cpus)


def test_the_plan_sizes_blocks_to_two_seconds_and_aligns_ranks_on_one_start_step() -> None:
    one = plan_trial([_Reader(1, [0.05] * 20, 100)], "threads=2", rng=random.Random(1))  # type: ignore[list-item]
    assert one.request.block_steps == 40 and one.request.warmup == 5 and one.request.start_step is None
    two = plan_trial([_Reader(1, [0.5] * 20, 100), _Reader(2, [0.5] * 20, 103)], "threads=2")  # type: ignore[list-item]
    assert two.request.block_steps == 5 and two.request.warmup == 1 and two.request.start_step == 106
    # fast steps: the start is a second ahead of the furthest rank (the request's travel), not 3 steps
    fast = plan_trial([_Reader(1, [0.028] * 20, 100), _Reader(2, [0.028] * 20, 103)], "threads=2")  # type: ignore[list-item]
    assert fast.request.start_step == 103 + 36
    with pytest.raises(UsageError, match="precision"):
        plan_trial([_Reader(1, [0.05], 1)], "tf32=1")  # type: ignore[list-item]
    with pytest.raises(UsageError, match="not tried live"):
        plan_trial([_Reader(1, [0.05], 1)], "interop_threads=2")  # type: ignore[list-item]
    assert plan_trial([_Reader(1, [0.05], 1)], "tf32=1", allow_numerics=True).request.allow_numerics  # type: ignore[list-item]


def test_results_reach_the_text_the_report_and_compare() -> None:
    blocks = tuple(_block(wire.is_on(i), m) for i, m in enumerate((1.0, 1.6, 1.62, 1.0, 1.0, 1.59)))
    st = wire.TrialState(3, "threads", "2", "done", old="8", reason="decided", blocks=blocks,
                       estimate=wire.estimate(blocks), restored=True, now_value="8")  # fmt: skip
    out = Outcome(Plan(wire.TrialRequest(3, "threads", "2"), 0.01), states={11: st}, ranks={11: 0})
    lines = outcome_lines(out)
    assert lines[0].startswith("trial on PID 11 (rank 0): threads=2: 1.6") and "faster" in lines[0]
    assert any("put back: threads is 8 again" in ln for ln in lines)
    assert json.loads(json.dumps(out.to_json()))["verdict"]["result"] == "faster"
    saved = [wire.TrialState.decode(json.loads(json.dumps({**st.to_json(), "verdict": verdict(st)})), "trials[0]")]
    assert "faster" in report_lines(saved)[0]
    c = compare_mod.Comparison(("a", "b"), (1.0, 1.6), 1.6, (10.0, 6.2), (("cpu-bound", 0.9, ""),) * 2, (), (), (),
                               trials=((), tuple(report_lines(saved))))  # fmt: skip
    assert "live trials in B:" in compare_mod.render_text(c) and "Live trials in B" in compare_mod.render_markdown(c)


def test_rules_may_name_a_live_fix_only_for_a_setting_a_trial_changes() -> None:
    head = (
        'id = "x"\nlabel = "cpu-bound"\nseverity = "warning"\nsummary = "s"\nwhen = "usable_cpus > 0"\nsource = "t"\n'
    )
    rule = parse_rule(head + '[[fixes]]\ntitle = "t"\ndetail = "d"\ntrial = "threads={suggested_threads:.0f}"\n', "r")
    assert rule.fixes[0].trial == "threads={suggested_threads:.0f}"
    for bad in ('"warp=9"', '"threads"', '"interop_threads=2"', "3"):
        with pytest.raises(Exception, match="trial"):
            parse_rule(head + f'[[fixes]]\ntitle = "t"\ndetail = "d"\ntrial = {bad}\n', "r")


def test_an_extreme_interval_stays_publishable() -> None:
    # two pairs on a busy machine: one 100x, one 0.01x: Student's t with 1 df gives an end of ~10**7
    blocks = [_block(True, 0.01), _block(False, 1.0), _block(False, 0.01), _block(True, 1.0)]
    est = wire.estimate(blocks)
    assert est is not None and est.hi == wire.RATIO_LIMIT and est.lo == 1 / wire.RATIO_LIMIT
    state = wire.TrialState(1, "threads", "2", "running", blocks=tuple(blocks), estimate=est)
    rec = HookRecord(Instance(10, 1, 1), "3.11", "2.13", 0.0, 12, True, trial=state)
    assert HookRecord.decode(json.loads(json.dumps(rec.to_json()))).trial == state
    assert verdict(state)["result"] == "undecided"


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["warp=2"], 2, "unknown setting 'warp'"),
        (["threads"], 2, "is not SETTING=VALUE"),
        (["interop_threads=2"], 2, "not tried live"),
        (["tf32=1"], 2, "--allow-numerics"),
        (["threads=2", "--max-s", "1"], 2, "--max-s must be 5 to 600"),
        (["threads=2", "--steps", "1"], 2, "--steps must be 2 to 1000"),
    ],
)
def test_the_command_says_what_is_wrong_in_one_line_before_reading_the_process(
    args: list[str], code: int, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchwatch.cli import main

    assert main(["trial", "999999", *args]) == code  # checked before the (absent) process is looked at
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err


def test_a_process_without_a_hook_is_one_line_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    from torchwatch.cli import main

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        assert main(["trial", str(proc.pid), "threads=2"]) == 1
    finally:
        proc.kill()
        proc.wait()
    err = capsys.readouterr().err.strip()
    assert "no trial: no hook in PID" in err and "torchwatch run" in err and "\n" not in err
    assert main(["trial", "999999", "threads=2"]) == 1
    assert "no process with PID 999999" in capsys.readouterr().err


# -- bounds from the usable CPUs (issue 49: threads=4096 was accepted on 2 CPUs) ----------------
def test_threads_and_workers_are_bounded_by_the_usable_cpus_on_both_sides() -> None:
    threads, workers = wire.find_setting("threads"), wire.find_setting("num_workers")
    assert threads is not None and workers is not None
    assert wire.cpu_bound(threads, 2.0) == 2 and wire.cpu_bound(threads, 1.5) == 2
    assert wire.cpu_bound(workers, 2.0) == 8 and wire.cpu_bound(threads, None) is None
    assert wire.check_cpu_bound(threads, 2, 2.0) is None and wire.check_cpu_bound(workers, 8, 2.0) is None
    why = wire.check_cpu_bound(threads, 4096, 2.0)
    assert why is not None and "threads=4096" in why and "2 usable CPUs" in why and "\n" not in why
    assert "4 per CPU" in (wire.check_cpu_bound(workers, 256, 2.0) or "")
    # torchwatch refuses before sending (the fewest CPUs of the ranks) ...
    with pytest.raises(UsageError, match="threads=3 is beyond the 2"):
        plan_trial([_CpusReader(1, 4.0), _CpusReader(2, 2.0)], "threads=3")  # type: ignore[list-item]
    with pytest.raises(UsageError, match="num_workers=256"):
        plan_trial([_CpusReader(1, 2.0)], "num_workers=256")  # type: ignore[list-item]
    assert plan_trial([_CpusReader(1, 2.0)], "threads=2").request.value == "2"  # type: ignore[list-item]
    # ... and the hook refuses what reaches it anyway, before changing anything
    before = torch.get_num_threads()
    host = _Host()
    trials = Trials(torch, host._changed, lambda: True, lambda key: None, lambda: None, lambda: None,
                    lambda: 0.01, lambda: 2.0)  # fmt: skip
    trials.on_request(_req("threads", "4096"), time.monotonic(), 0)
    st = trials.state
    assert st is not None and st.state == "refused" and "beyond the 2" in st.reason
    assert torch.get_num_threads() == before and not trials.active
