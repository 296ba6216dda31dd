"""torchwatch.hook.summary: step-time breakdown of a torch.profiler trace.

Synthetic traces use round microsecond times so that every expected number is exact; the real trace in
tests/fixtures/traces/cpu_dataloader.json.gz comes from make_cpu_trace.py (torch profiler, CPU only).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchwatch.hook.summary import CATEGORIES, IDLE_PARTS, KERNEL_WAIT_US, PHASES, load_trace, summarize_trace

FUZZ = settings(max_examples=300, deadline=None, database=None, derandomize=True)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "cpu_dataloader.json.gz"

HOST = (100, 100)  # (pid, tid) of the training loop's thread
AUTOGRAD = (100, 200)  # an autograd device thread
GPU = (0, 7)  # device 0, stream 7


def ev(cat: str, name: str, ts: float, dur: float, where: tuple[int, int] = HOST, **args: Any) -> dict[str, Any]:
    """One complete event, as kineto writes it (times in µs)."""
    e: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": where[0], "tid": where[1], "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def step(n: int, ts: float, dur: float) -> dict[str, Any]:
    return ev("user_annotation", f"ProfilerStep#{n}", ts, dur)


def op(name: str, ts: float, dur: float, where: tuple[int, int] = HOST) -> dict[str, Any]:
    return ev("cpu_op", name, ts, dur, where)


def kernel(name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return ev("kernel", name, ts, dur, GPU, **args)


def trace(*events: dict[str, Any]) -> dict[str, Any]:
    meta = {"ph": "M", "name": "process_name", "pid": HOST[0], "tid": 0, "ts": 0, "args": {"name": "python"}}
    return {"schemaVersion": 1, "traceEvents": [meta, *events]}


def _assert_sums(s: dict[str, Any]) -> None:
    assert set(s["breakdown_share"]) == set(CATEGORIES)
    assert set(s["phases_share"]) == set(PHASES)
    assert math.isclose(sum(s["breakdown_share"].values()), 1.0, abs_tol=1e-6)
    assert math.isclose(sum(s["phases_share"].values()), 1.0, abs_tol=1e-6)
    assert math.isclose(sum(s["breakdown_ms"].values()), s["step_time_ms"], abs_tol=1e-6)
    if s["gpu_idle_split_share"] is not None:  # the idle split's parts add up to the GPU idle time
        assert set(s["gpu_idle_split_share"]) == set(IDLE_PARTS)
        assert math.isclose(sum(s["gpu_idle_split_share"].values()), s["gpu_idle_share"], abs_tol=1e-6)
        assert math.isclose(sum(s["gpu_idle_split_ms"].values()), s["gpu_idle_ms"], abs_tol=1e-6)
        assert all(v >= 0 for v in s["gpu_idle_split_ms"].values())


# --- breakdown -------------------------------------------------------------------------------------------


def test_kernel_takes_priority_over_runtime_and_cpu_op_and_device_time_is_clipped_to_the_step() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 1000),
            op("aten::mm", 100, 400),  # [100, 500)
            ev("cuda_runtime", "cudaLaunchKernel", 200, 100),  # [200, 300)
            kernel("gemm", 250, 200),  # [250, 450): covers runtime and op
            kernel("gemm", 980, 120),  # [980, 1100): only 20 µs inside the step
        )
    )
    assert s["steps"] == 1
    assert s["step_time_ms"] == 1.0
    assert s["breakdown_ms"] == {
        "kernel": 0.22,  # 200 + 20 µs
        "memcpy": 0.0,
        "memset": 0.0,
        "communication": 0.0,
        "runtime": 0.05,  # [200, 250): the kernel owns [250, 300)
        "dataloader": 0.0,
        "cpu_exec": 0.15,  # [100, 200) + [450, 500)
        "other": 0.58,
    }
    assert s["breakdown_share"]["kernel"] == 0.22
    assert s["breakdown_share"]["other"] == 0.58
    assert s["gpu_idle_ms"] == 0.78
    assert s["gpu_idle_share"] == 0.78
    _assert_sums(s)


def test_memcpy_and_memset_rank_below_kernel_and_above_runtime() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 1000),
            ev("cuda_runtime", "cudaMemcpyAsync", 0, 600),
            ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 100, 300, GPU),  # [100, 400)
            ev("gpu_memset", "Memset (Device)", 300, 200, GPU),  # [300, 500)
            kernel("k", 350, 100),  # [350, 450)
        )
    )
    b = s["breakdown_ms"]
    assert (b["kernel"], b["memcpy"], b["memset"], b["runtime"], b["other"]) == (0.1, 0.25, 0.05, 0.2, 0.4)
    assert s["gpu_idle_ms"] == 0.6  # device busy [100, 500)
    _assert_sums(s)


def test_nccl_kernels_and_collective_ops_are_communication() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 1000),
            kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 100, 200),
            kernel("sm90_xmma_gemm", 250, 100),  # overlaps the NCCL kernel on another stream: kernel wins
            op("c10d::allreduce_", 500, 50),
            ev("user_annotation", "nccl:all_reduce", 600, 50),
            op("record_param_comms", 700, 50),  # no rule names it: plain CPU exec
        )
    )
    b = s["breakdown_ms"]
    assert b["kernel"] == 0.1
    assert b["communication"] == 0.25  # [100, 250) + the c10d op + the nccl: annotation
    assert b["cpu_exec"] == 0.05
    assert s["gpu_idle_ms"] == 0.75  # the NCCL kernel keeps the device busy too
    assert s["top_kernels"][0]["name"].startswith("ncclDevKernel")
    _assert_sums(s)


def test_dataloader_annotation_owns_the_ops_inside_it() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 1000),
            ev("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 10, 400),
            op("aten::stack", 100, 100),  # inside the DataLoader span
            op("aten::linear", 500, 200),
            ev("user_annotation", "Optimizer.step#SGD.step", 800, 100),
            op("aten::add_", 820, 30),
        )
    )
    b = s["breakdown_ms"]
    assert b["dataloader"] == 0.4
    assert b["cpu_exec"] == 0.23  # linear + add_; the optimizer annotation itself is not CPU exec
    assert b["other"] == 0.37
    assert s["phases_share"]["data"] == 0.4
    _assert_sums(s)


def test_categories_are_case_insensitive_and_unknown_ones_are_skipped() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 100),
            ev("Kernel", "k", 0, 10, GPU),  # older traces capitalise
            ev("Runtime", "cudaLaunchKernel", 20, 10),
            ev("Operator", "aten::mm", 40, 10),
            ev("python_function", "train.py(12): step", 0, 100),
            ev("gpu_user_annotation", "forward", 0, 100, GPU),
            ev("ac2g", "ac2g", 0, 100),
            ev("made_up", "x", 0, 100),
        )
    )
    b = s["breakdown_ms"]
    assert (b["kernel"], b["runtime"], b["cpu_exec"], b["other"]) == (0.01, 0.01, 0.01, 0.07)
    assert s["events"] == 8


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    ("kernel", "k", GPU),
                    ("kernel", "ncclKernel", GPU),
                    ("gpu_memcpy", "Memcpy", GPU),
                    ("gpu_memset", "Memset", GPU),
                    ("cuda_runtime", "cudaLaunchKernel", HOST),
                    ("cuda_runtime", "cudaStreamSynchronize", HOST),
                    ("cpu_op", "aten::mm", HOST),
                    ("cpu_op", "autograd::engine::evaluate_function: MmBackward0", AUTOGRAD),
                    ("cpu_op", "aten::item", HOST),
                    ("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", HOST),
                    ("user_annotation", "Optimizer.step#Adam.step", HOST),
                    ("user_annotation", "my_region", HOST),
                ]
            ),
            st.integers(-50, 1100),
            st.integers(0, 400),
        ),
        max_size=40,
    ),
    st.lists(st.integers(1, 400), min_size=1, max_size=4),
)
def test_categories_and_phases_add_up_to_the_step(
    spec: list[tuple[tuple[str, str, tuple[int, int]], int, int]], step_durs: list[int]
) -> None:
    events = []
    t = 0
    for i, d in enumerate(step_durs):
        events.append(step(i + 1, t, d))
        t += d + 7  # a small gap between steps, as real traces have
    events += [ev(cat, name, ts, dur, where) for (cat, name, where), ts, dur in spec]
    s = summarize_trace(trace(*events))
    assert s["steps"] == len(step_durs)
    assert s["step_times_ms"] == [d / 1000 for d in step_durs]
    assert math.isclose(s["step_time_ms"], sum(step_durs) / len(step_durs) / 1000, abs_tol=5e-5 + 1e-12)
    _assert_sums(s)
    assert all(v >= 0 for v in s["breakdown_ms"].values())
    json.dumps(s, allow_nan=False)


def test_rounded_shares_still_add_up_to_one() -> None:
    s = summarize_trace(trace(step(1, 0, 3), op("a", 0, 1), ev("cuda_runtime", "r", 1, 1), kernel("k", 2, 1)))
    shares = s["breakdown_share"]
    assert sorted([shares["kernel"], shares["runtime"], shares["cpu_exec"]]) == [0.3333, 0.3333, 0.3334]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert sum(s["breakdown_ms"].values()) == pytest.approx(s["step_time_ms"], abs=1e-9)


# --- device -------------------------------------------------------------------------------------------------


def test_gpu_idle_is_step_time_no_device_activity_covers() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 1000),
            step(2, 1000, 1000),
            kernel("a", 100, 300),  # step 1: [100, 400)
            kernel("b", 300, 300),  # overlaps a on another stream: union [100, 600)
            ev("gpu_memcpy", "Memcpy DtoH", 1500, 100, GPU),  # step 2: 100 µs
        )
    )
    # idle: step 1 1000 - 500 = 500, step 2 1000 - 100 = 900 -> mean 700 µs
    assert s["gpu_idle_ms"] == 0.7
    assert s["gpu_idle_share"] == 0.7
    assert s["kernels_per_step"] == 1.0
    assert s["top_kernels"] == [{"name": "a", "total_ms": 0.3, "calls": 1}, {"name": "b", "total_ms": 0.3, "calls": 1}]


def test_cpu_only_trace_has_no_gpu_numbers() -> None:
    s = summarize_trace(trace(step(1, 0, 100), op("aten::mm", 10, 50)))
    assert s["gpu_idle_ms"] is None
    assert s["gpu_idle_share"] is None
    assert s["top_kernels"] == []
    assert s["kernels_per_step"] == 0.0
    assert s["short_kernel_share"] is None
    assert s["breakdown_share"]["kernel"] == 0.0


def test_kernel_counts_follow_the_launch_and_short_kernels_are_counted() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 100),
            step(2, 200, 100),
            ev("cuda_runtime", "cudaLaunchKernel", 10, 5, correlation=1),
            kernel("late", 150, 40, correlation=1),  # runs between the steps, launched in step 1: counted
            ev("cuda_runtime", "cudaLaunchKernel", 20, 5, correlation=2),
            kernel("tiny", 30, 4, correlation=2),
            kernel("tiny", 230, 9.5),  # no correlation: counted by its own start (step 2)
            kernel("stray", 500, 10),  # after every step, no launch: not counted
        )
    )
    assert s["kernels_per_step"] == 1.5
    assert s["short_kernel_share"] == round(2 / 3, 4)
    assert [k["name"] for k in s["top_kernels"]] == ["late", "tiny"]
    assert s["top_kernels"][1] == {"name": "tiny", "total_ms": 0.0135, "calls": 2}


def launched(name: str, launch_ts: float, ts: float, dur: float, corr: int) -> list[dict[str, Any]]:
    """A cudaLaunchKernel on the loop's thread and the kernel it launched (same correlation id)."""
    return [
        ev("cuda_runtime", "cudaLaunchKernel", launch_ts, 4, correlation=corr),
        kernel(name, ts, dur, correlation=corr),
    ]


def test_gpu_idle_splits_into_host_wait_kernel_wait_and_other_as_hta_does() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 1000),
            *launched("a", 10, 100, 200, 1),  # [100, 300): launched before anything ran: [0, 100) host wait
            *launched("b", 150, 305, 95, 2),  # queued during a, 5 µs gap: kernel wait
            *launched("c", 420, 450, 100, 3),  # launched at 420, after b ended (400): [400, 450) host wait
            *launched("d", 500, 600, 200, 4),  # queued during c, 50 µs gap: too long for launch overhead: other
            kernel("e", 850, 50),  # no launch in the trace: [800, 850) other; [900, 1000) other (nothing next)
        )
    )
    assert s["gpu_idle_ms"] == 0.355  # device busy [100, 300) [305, 400) [450, 550) [600, 800) [850, 900)
    # host [0, 100) + [400, 450); kernel [300, 305); other [550, 600) + [800, 850) + [900, 1000)
    assert s["gpu_idle_split_ms"] == {"host_wait": 0.15, "kernel_wait": 0.005, "other": 0.2}
    assert s["gpu_idle_split_share"] == {"host_wait": 0.15, "kernel_wait": 0.005, "other": 0.2}
    _assert_sums(s)


def test_a_launch_exactly_at_the_gap_start_is_not_host_wait() -> None:
    # HTA: host wait when the runtime call began *after* the previous kernel ended
    s = summarize_trace(trace(step(1, 0, 100), *launched("a", 0, 10, 20, 1), *launched("b", 30, 33, 20, 2)))
    assert s["gpu_idle_split_ms"]["kernel_wait"] == 0.003  # [30, 33): launched at 30 = a's end
    assert s["gpu_idle_split_ms"]["host_wait"] == 0.01  # [0, 10) before a


def test_kernel_wait_threshold() -> None:
    gap = KERNEL_WAIT_US
    just_under = summarize_trace(
        trace(step(1, 0, 200), *launched("a", 0, 10, 20, 1), *launched("b", 5, 30 + gap - 1, 10, 2))
    )
    at = summarize_trace(trace(step(1, 0, 200), *launched("a", 0, 10, 20, 1), *launched("b", 5, 30 + gap, 10, 2)))
    assert just_under["gpu_idle_split_ms"]["kernel_wait"] == round((gap - 1) / 1000, 4)
    assert at["gpu_idle_split_ms"]["kernel_wait"] == 0.0
    assert at["gpu_idle_split_ms"]["other"] > 0


def test_overlapping_streams_leave_no_gap_and_memcpy_counts_as_device_work() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 500),
            *launched("a", 0, 10, 100, 1),  # [10, 110)
            ev("kernel", "b", 50, 100, (0, 8), correlation=2),  # another stream: [50, 150), no gap
            ev("cuda_runtime", "cudaMemcpyAsync", 300, 10, correlation=3),
            ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 320, 30, GPU, correlation=3),  # launched late
        )
    )
    # idle [0, 10) host, [150, 320) host (copy launched at 300 > 150), [350, 500) other
    assert s["gpu_idle_split_ms"] == {"host_wait": 0.18, "kernel_wait": 0.0, "other": 0.15}
    _assert_sums(s)


def test_kernel_share_per_step() -> None:
    s = summarize_trace(
        trace(step(1, 0, 1000), step(2, 1000, 500), kernel("a", 0, 250), kernel("b", 1000, 500)),
    )
    assert s["kernel_share_per_step"] == [0.25, 1.0]


def test_pageable_host_to_device_copies_are_counted_per_step_with_their_bytes() -> None:
    pageable = "Memcpy HtoD (Pageable -> Device)"
    s = summarize_trace(
        trace(
            step(1, 0, 1000),
            step(2, 1000, 1000),
            ev("cuda_runtime", "cudaMemcpyAsync", 10, 300, correlation=1),
            ev("gpu_memcpy", pageable, 100, 200, GPU, correlation=1, bytes=3_000_000),
            ev("gpu_memcpy", pageable, 1100, 100, GPU, bytes=1_000_000),  # no launch: counted by its start
            ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 1300, 100, GPU, bytes=5_000_000),  # pinned: not
            ev("gpu_memcpy", pageable, 1500, 10, GPU, bytes="odd"),  # a copy without a readable size: 0 bytes
        )
    )
    assert s["pageable_h2d"] == {"copies_per_step": 1.5, "ms_per_step": 0.155, "bytes_per_step": 2_000_000.0}


def test_cpu_only_trace_has_no_idle_split_nor_copies() -> None:
    s = summarize_trace(trace(step(1, 0, 100), op("aten::mm", 10, 50)))
    assert (s["gpu_idle_split_ms"], s["gpu_idle_split_share"], s["kernel_share_per_step"], s["pageable_h2d"]) == (
        None,
        None,
        None,
        None,
    )


@FUZZ
@given(
    st.lists(
        st.tuples(st.integers(-20, 1100), st.integers(0, 300), st.integers(1, 300), st.booleans()),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.integers(1, 400), min_size=1, max_size=3),
)
def test_idle_split_adds_up_to_gpu_idle(kernels: list[tuple[int, int, int, bool]], step_durs: list[int]) -> None:
    events: list[dict[str, Any]] = []
    t = 0
    for i, d in enumerate(step_durs):
        events.append(step(i + 1, t, d))
        t += d + 3
    for corr, (launch, delay, dur, on_other_stream) in enumerate(kernels, start=1):
        events.append(ev("cuda_runtime", "cudaLaunchKernel", launch, 4, correlation=corr))
        events.append(ev("kernel", "k", launch + delay, dur, (0, 8) if on_other_stream else GPU, correlation=corr))
    s = summarize_trace(trace(*events))
    assert s["gpu_idle_split_share"] is not None
    _assert_sums(s)
    assert all(0.0 <= v <= 1.0 for v in s["kernel_share_per_step"])


# --- phases -------------------------------------------------------------------------------------------------


def test_phases_use_priority_and_the_step_thread() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 1000),
            ev("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 200),
            op("aten::stack", 50, 100),  # data, not forward
            op("aten::linear", 200, 200),  # forward [200, 400)
            op("autograd::engine::evaluate_function: AddmmBackward0", 450, 150, AUTOGRAD),  # backward
            op("aten::mm", 460, 100, AUTOGRAD),  # inside backward, on the autograd thread: backward
            op("aten::mm", 620, 30, AUTOGRAD),  # another thread, not backward: not forward either -> other
            ev("user_annotation", "Optimizer.zero_grad#SGD.zero_grad", 650, 50),
            ev("user_annotation", "Optimizer.step#SGD.step", 800, 100),
            op("aten::add_", 810, 50),  # optimizer, not forward
        )
    )
    assert s["phases_share"] == {"data": 0.2, "forward": 0.2, "backward": 0.15, "optimizer": 0.15, "other": 0.3}


def test_cpu_backward_on_the_loop_thread_is_backward() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 100),
            op("aten::linear", 0, 40),
            op("autograd::engine::evaluate_function: AddmmBackward0", 50, 30),
            op("AddmmBackward0", 52, 20),
        )
    )
    assert s["phases_share"]["forward"] == 0.4
    assert s["phases_share"]["backward"] == 0.3
    assert s["phases_share"]["other"] == 0.3


# --- CPU ops ------------------------------------------------------------------------------------------------


def test_self_time_subtracts_direct_children_only() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 1000),
            op("parent", 0, 100),
            op("first", 0, 20),  # same start as the parent: (ts, -dur) order makes it a child
            op("second", 40, 50),
            op("grandchild", 50, 10),
            op("other_thread", 10, 80, AUTOGRAD),  # another thread: never anyone's child
            op("outside", 2000, 500),  # starts after the step: not counted
        )
    )
    by_name = {o["name"]: (o["self_ms"], o["calls"]) for o in s["top_cpu_ops"]}
    assert by_name == {
        "parent": (0.03, 1),  # 100 - 20 - 50
        "first": (0.02, 1),
        "second": (0.04, 1),  # 50 - 10
        "grandchild": (0.01, 1),
        "other_thread": (0.08, 1),
    }
    assert [o["name"] for o in s["top_cpu_ops"]] == ["other_thread", "second", "parent", "first", "grandchild"]
    assert s["cpu_ops_per_step"] == 5.0


def test_self_time_sums_calls_clips_overhangs_and_top_limits() -> None:
    events = (
        step(1, 0, 1000),
        op("aten::add", 0, 10),
        op("aten::add", 20, 10),
        op("bad", 100, 10),
        op("overhang", 105, 50),  # starts inside "bad", ends after it: only 5 µs are taken from "bad"
    )
    assert summarize_trace(trace(*events), top=3)["top_cpu_ops"] == [
        {"name": "overhang", "self_ms": 0.05, "calls": 1},
        {"name": "aten::add", "self_ms": 0.02, "calls": 2},
        {"name": "bad", "self_ms": 0.005, "calls": 1},
    ]
    assert [o["name"] for o in summarize_trace(trace(*events), top=1)["top_cpu_ops"]] == ["overhang"]
    assert summarize_trace(trace(step(1, 0, 10), op("a", 0, 5)), top=0)["top_cpu_ops"] == []
    assert summarize_trace(trace(step(1, 0, 10), op("a", 0, 5)), top=-3)["top_cpu_ops"] == []


# --- sync ---------------------------------------------------------------------------------------------------


def test_sync_points_are_counted_once_per_nesting() -> None:
    s = summarize_trace(
        trace(
            step(1, 0, 1000),
            step(2, 1000, 1000),
            op("aten::item", 100, 50),  # one sync point, 50 µs
            op("aten::_local_scalar_dense", 105, 40),
            ev("cuda_runtime", "cudaMemcpyAsync", 110, 5),
            ev("cuda_runtime", "cudaStreamSynchronize", 116, 20),
            ev("cuda_runtime", "cudaDeviceSynchronize", 300, 30),  # 30 µs
            ev("cuda_runtime", "cudaMemcpyAsync", 400, 10),  # async: no sync
            ev("cuda_runtime", "cudaMemcpy", 1200, 40),  # step 2, 40 µs
            ev("cuda_runtime", "cudaEventSynchronize", 1300, 20),  # 20 µs
            ev("cuda_runtime", "cudaStreamSynchronize", 2500, 20),  # after the last step: not counted
        )
    )
    assert s["sync"] == {"calls_per_step": 2.0, "ms_per_step": 0.07}  # 4 calls, 140 µs over 2 steps


def test_no_sync_points() -> None:
    s = summarize_trace(trace(step(1, 0, 100), op("aten::mm", 0, 10)))
    assert s["sync"] == {"calls_per_step": 0.0, "ms_per_step": 0.0}


# --- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"traceEvents": []}, "empty trace"),
        (trace(), "empty trace"),  # metadata only
        (trace(op("aten::mm", 0, 10)), "empty trace"),  # no ProfilerStep# span
        (trace(step(1, 0, 0), op("aten::mm", 0, 10)), "empty trace"),  # zero-length step
        (trace(ev("gpu_user_annotation", "ProfilerStep#1", 0, 10)), "empty trace"),
        ([], "not a Chrome trace"),
        ([step(1, 0, 10)], "not a Chrome trace"),
        ({}, "not a Chrome trace"),
        ({"traceEvents": {"a": 1}}, "not a Chrome trace"),
        (None, "not a Chrome trace"),
        ("trace.json", "not a Chrome trace"),
    ],
)
def test_bad_traces_raise_value_error(data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        summarize_trace(data)


def test_malformed_events_are_skipped() -> None:
    good = summarize_trace(trace(step(1, 0, 100), op("aten::mm", 0, 10)))
    odd: list[Any] = [
        "not an event",
        None,
        [1, 2],
        {"ph": "X"},
        {"ph": "X", "cat": "cpu_op", "name": "no_times"},
        {"ph": "X", "cat": "cpu_op", "name": "no_dur", "ts": 5},
        {"ph": "X", "cat": "cpu_op", "name": "str_ts", "ts": "5", "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "bool_ts", "ts": True, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "nan", "ts": float("nan"), "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "inf", "ts": 5, "dur": float("inf")},
        {"ph": "X", "cat": "cpu_op", "name": "huge", "ts": 10**400, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "negative", "ts": 5, "dur": -5},
        {"ph": "X", "cat": "cpu_op", "name": "zero", "ts": 5, "dur": 0},
        {"ph": "X", "cat": "cpu_op", "name": "tiny", "ts": 5, "dur": 1e-9},
        {"ph": "X", "cat": ["cpu_op"], "name": "list_cat", "ts": 5, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": 42, "ts": 5, "dur": 5, "pid": [1], "tid": {"a": 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": 0, "args": "x"},
        {"ph": "B", "cat": "cpu_op", "name": "begin", "ts": 5},
    ]
    s = summarize_trace(trace(step(1, 0, 100), op("aten::mm", 0, 10), *odd))
    assert s["breakdown_ms"] == good["breakdown_ms"]
    assert s["phases_share"] == good["phases_share"]
    assert s["gpu_idle_ms"] is None  # the zero-length kernel does not count as a device event
    # only the nameless op with odd pid/tid is kept (as ""), on its own thread
    assert [o["name"] for o in s["top_cpu_ops"]] == ["aten::mm", ""]


_LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
_JSON = st.recursive(
    _LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_CATS = (
    *("kernel", "Kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation"),
    *("python_function", "ac2g", "Trace", "gpu_user_annotation", "fwdbwd"),
)
_NAMES = (
    *("ProfilerStep#1", "ProfilerStep#", "enumerate(DataLoader)#x.__next__", "Optimizer.step#SGD.step"),
    *("autograd::engine::evaluate_function: X", "aten::item", "cudaStreamSynchronize", "ncclKernel", "c10d::x"),
)
_FIELDS = {
    "ph": st.sampled_from(["X", "B", "E", "i", "M", "s", "f"]) | _JSON,
    "cat": st.sampled_from(_CATS) | _JSON,
    "name": st.sampled_from(_NAMES) | _JSON,
    "ts": st.integers(-100, 10_000) | st.floats() | _JSON,
    "dur": st.integers(-10, 1_000) | st.floats() | _JSON,
    "pid": st.integers(0, 2) | _JSON,
    "tid": st.integers(0, 2) | _JSON,
    "args": st.fixed_dictionaries({}, optional={"correlation": st.integers(0, 3) | _JSON}) | _JSON,
}
_EVENT = st.fixed_dictionaries({}, optional=_FIELDS) | _JSON
_TRACE = st.fixed_dictionaries({"traceEvents": st.lists(_EVENT, max_size=25)}, optional={"x": _JSON}) | _JSON


@FUZZ
@given(_TRACE, st.integers(-2, 12))
def test_fuzz_only_value_error(data: Any, top: int) -> None:
    try:
        s = summarize_trace(data, top=top)
    except ValueError as e:
        assert str(e).startswith(("not a Chrome trace: ", "empty trace: "))
        return
    json.dumps(s, allow_nan=False)
    _assert_sums(s)
    assert len(s["top_cpu_ops"]) <= max(0, top)


# --- loading ------------------------------------------------------------------------------------------------


def test_load_trace_reads_plain_and_gzipped_json(tmp_path: Path) -> None:
    t = trace(step(1, 0, 100))
    plain = tmp_path / "t.json"
    plain.write_text(json.dumps(t))
    zipped = tmp_path / "t.pt.trace.json.gz"
    zipped.write_bytes(gzip.compress(json.dumps(t).encode()))
    misnamed = tmp_path / "gzipped_but_named.json"  # the content decides, not the name
    misnamed.write_bytes(gzip.compress(json.dumps(t).encode()))
    assert load_trace(plain) == t
    assert load_trace(str(zipped)) == t
    assert load_trace(misnamed) == t


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b"\xff\xfe\x00garbage",
        b"[]",
        b'{"traceEvents": 3}',
        b"\x1f\x8b\x08\x00broken gzip",
        gzip.compress(b"[1, 2", mtime=0),
        b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_load_trace_rejects_bad_content(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"^not a Chrome trace: "):
        load_trace(path)


def test_load_trace_lets_os_errors_through(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "missing.json")
    with pytest.raises(IsADirectoryError):
        load_trace(tmp_path)


# --- a real trace -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    return summarize_trace(load_trace(FIXTURE))


def test_real_cpu_trace_steps_and_shares(real: dict[str, Any]) -> None:
    assert FIXTURE.stat().st_size < 300_000
    assert real["steps"] == 3
    assert len(real["step_times_ms"]) == 3
    # equal up to the 4-decimal rounding of each number (±0.5e-4 for the mean, ±0.5e-4 for step_time_ms)
    assert real["step_time_ms"] == pytest.approx(sum(real["step_times_ms"]) / 3, abs=1e-4 + 1e-12)
    assert real["events"] > 100
    _assert_sums(real)
    assert real["breakdown_share"]["dataloader"] > 0
    assert real["breakdown_share"]["cpu_exec"] > 0
    assert real["breakdown_share"]["kernel"] == 0.0


def test_real_cpu_trace_phases_and_ops(real: dict[str, Any]) -> None:
    phases = real["phases_share"]
    assert phases["data"] > 0
    assert phases["forward"] > 0
    assert phases["backward"] > 0
    assert phases["optimizer"] > 0
    assert real["top_cpu_ops"]
    assert all(o["self_ms"] >= 0 and o["calls"] >= 1 for o in real["top_cpu_ops"])
    assert real["cpu_ops_per_step"] > 10
    assert real["gpu_idle_ms"] is None
    assert real["top_kernels"] == []
    assert real["sync"]["calls_per_step"] == 1.0  # loss.item() once per step
    json.dumps(real, allow_nan=False)


def test_real_cpu_trace_annotation_categories() -> None:
    """Pins what torch writes, so that a torch upgrade that renames these shows up here."""
    events = load_trace(FIXTURE)["traceEvents"]
    cats = {e["name"].split("#")[0]: e["cat"] for e in events if e.get("ph") == "X" and "#" in e.get("name", "")}
    assert cats == {
        "ProfilerStep": "user_annotation",
        "enumerate(DataLoader)": "user_annotation",
        "Optimizer.zero_grad": "user_annotation",
        "Optimizer.step": "user_annotation",
    }
