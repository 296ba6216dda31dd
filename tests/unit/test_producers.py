"""Data from a hand-written producer (torchwatch.analysis.producers): synthetic windows of py-spy
stacks and thread states, through the features and every shipped rule."""

from __future__ import annotations

from torchwatch.analysis import features as feats
from torchwatch.analysis.diagnosis import Analysis, Diagnoser
from torchwatch.analysis.producers import handoff_wait, producer_texts
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.analysis.store import Window
from torchwatch.model.readings import Frame, ProcessSample, Role, StackSample, ThreadSample, Wait

PID, PRODUCER_TID, LOGGER_TID = 4000, 4007, 4009
LIB = "/usr/lib/python3.11"
TORCH = "/venv/lib/python3.11/site-packages/torch"

MODULE = Frame("<module>", "/home/u/train.py", 80)
QUEUE_GET = (
    MODULE,
    Frame("BackgroundGenerator.__next__", "/home/u/train.py", 30),
    Frame("Queue.get", f"{LIB}/queue.py", 171),
    Frame("Condition.wait", f"{LIB}/threading.py", 327),
)
MP_GET = (
    MODULE,
    Frame("Queue.get", f"{LIB}/multiprocessing/queues.py", 103),
    Frame("Connection.recv_bytes", f"{LIB}/multiprocessing/connection.py", 216),
    Frame("Connection._recv_bytes", f"{LIB}/multiprocessing/connection.py", 430),
    Frame("Connection._recv", f"{LIB}/multiprocessing/connection.py", 395),
)
FORWARD = (
    MODULE,
    Frame("Module._call_impl", f"{TORCH}/nn/modules/module.py", 1762),
    Frame("forward", "/home/u/m.py", 9),
)
BACKWARD = (
    MODULE,
    Frame("Tensor.backward", f"{TORCH}/_tensor.py", 648),
    Frame("backward", f"{TORCH}/autograd/__init__.py", 353),
)
OPTIM = (MODULE, Frame("SGD.step", f"{TORCH}/optim/sgd.py", 127))
LOADER_WAIT = (
    MODULE,
    Frame("_BaseDataLoaderIter.__next__", f"{TORCH}/utils/data/dataloader.py", 733),
    Frame("_MultiProcessingDataLoaderIter._next_data", f"{TORCH}/utils/data/dataloader.py", 1480),
    Frame("_MultiProcessingDataLoaderIter._get_data", f"{TORCH}/utils/data/dataloader.py", 1442),
    Frame("_MultiProcessingDataLoaderIter._try_get_data", f"{TORCH}/utils/data/dataloader.py", 1295),
    Frame("Queue.get", f"{LIB}/multiprocessing/queues.py", 113),
    Frame("Connection.poll", f"{LIB}/multiprocessing/connection.py", 257),
)
THREAD = (Frame("Thread._bootstrap", f"{LIB}/threading.py", 1002), Frame("Thread.run", f"{LIB}/threading.py", 982))
AUGMENT = (*THREAD, Frame("produce", "/home/u/train.py", 20), Frame("augment", "/home/u/train.py", 42))
PUT_FULL = (
    *THREAD,
    Frame("produce", "/home/u/train.py", 22),
    Frame("Queue.put", f"{LIB}/queue.py", 140),
    Frame("Condition.wait", f"{LIB}/threading.py", 331),
)
LOGGER_IDLE = (
    *THREAD,
    Frame("log_forever", "/home/u/log.py", 7),
    Frame("Queue.get", f"{LIB}/queue.py", 171),
    Frame("Condition.wait", f"{LIB}/threading.py", 327),
)
SLEEPER = (*THREAD, Frame("server", "/home/u/train.py", 12))  # in time.sleep (C: no frame of its own)

RULES = load_rules()


def stack(frames: tuple[Frame, ...], count: int, tid: int = PID, t: float = 10.0) -> StackSample:
    return StackSample(t, PID, tid, "MainThread" if tid == PID else "t", Role.MAIN, tid == PID, frames, count)


def thread(tid: int, busy: float, running: float, wait: Wait = Wait.SYNC) -> list[ThreadSample]:
    """10 s of one thread at 10 Hz: on a CPU ``busy`` of the time (schedstat), letters R
    ``running`` of the samples, ``wait`` the rest."""
    out = []
    for i in range(101):
        t = i / 10.0
        letter = Wait.RUNNING if (i % 10) < running * 10 else wait
        out.append(
            ThreadSample(
                t, PID, tid, Role.MAIN, tid == PID, "R" if letter is Wait.RUNNING else "S", letter,
                cpu_s=busy * t, sys_s=0.0, runq_s=0.0, run_s=busy * t,
            )
        )  # fmt: skip
    return out


def window(
    main: list[StackSample], threads: list[ThreadSample], processes: list[ProcessSample] | None = None
) -> Window:
    return Window(start=0.0, end=10.0, stacks=main, threads=threads, processes=processes or [])


def settle(w: Window) -> Analysis:
    f = feats.compute(w, PID)
    texts = feats.texts(w, PID)
    d = Diagnoser(RULES)
    d.evaluate(f, 0.0, texts)
    return d.evaluate(f, 10.0, texts)


def producer_thread_window(producer_busy: float = 0.95) -> Window:
    """The loop waits 45 % in queue.get(), computes 55 % (forward, backward, step); its producer
    thread augments (busy ``producer_busy``), blocked on a full queue now and then."""
    main = [stack(QUEUE_GET, 90), stack(FORWARD, 50), stack(BACKWARD, 50), stack(OPTIM, 10)]
    prod = [stack(AUGMENT, 180, PRODUCER_TID), stack(PUT_FULL, 20, PRODUCER_TID)]
    return window(main + prod, thread(PID, 0.55, 0.55) + thread(PRODUCER_TID, producer_busy, producer_busy))


def test_the_loop_waiting_on_a_busy_producer_thread_is_dataloader_bound_not_its_cpu() -> None:
    w = producer_thread_window()
    f = feats.compute(w, PID)
    assert f["producer_wait_share"] == 0.45 and f["producer_thread_wait_share"] == 0.45
    assert f["producer_cpu_share"] is not None and f["producer_cpu_share"] >= 0.9
    assert f["loop_cpu_share"] is not None and f["loop_cpu_share"] >= 0.5  # loop-cpu's own threshold
    a = settle(w)
    rules = [x.rule for x in a.findings]
    assert a.verdict.label == "dataloader-bound", (rules, a.verdict)
    assert "loader-producer-thread" in rules and "loop-cpu" not in rules
    finding = next(x for x in a.findings if x.rule == "loader-producer-thread")
    assert "augment (train.py:42)" in finding.summary
    fixes = " ".join(fx.detail for fx in finding.fixes)
    assert "GIL" in fixes and "DataLoader(num_workers=" in fixes
    assert 0.5 < a.verdict.confidence <= 0.95


def test_a_producer_that_sleeps_is_no_data_pipeline() -> None:
    # lock_wait: the loop waits on a queue that a sleeping helper fills: undetermined, not data
    main = [stack(QUEUE_GET, 140), stack(FORWARD, 30), stack(BACKWARD, 20), stack(OPTIM, 10)]
    helper = [stack(SLEEPER, 200, PRODUCER_TID)]
    w = window(main + helper, thread(PID, 0.25, 0.25) + thread(PRODUCER_TID, 0.01, 0.0, Wait.SLEEP))
    f = feats.compute(w, PID)
    assert f["producer_wait_share"] == 0.7 and f["producer_cpu_share"] == 0.0
    a = settle(w)
    assert "loader-producer-thread" not in {x.rule for x in a.findings}
    assert a.verdict.label == "undetermined"


def test_a_cpu_bound_loop_beside_an_idle_logging_thread_is_cpu_bound() -> None:
    main = [stack(FORWARD, 120), stack(BACKWARD, 60), stack(OPTIM, 20)]
    logger = [stack(LOGGER_IDLE, 200, LOGGER_TID)]
    w = window(main + logger, thread(PID, 0.95, 0.95) + thread(LOGGER_TID, 0.002, 0.0))
    f = feats.compute(w, PID)
    assert f["producer_wait_share"] == 0.0
    a = settle(w)
    rules = {x.rule for x in a.findings}
    assert "loop-cpu" in rules and "loader-producer-thread" not in rules
    assert a.verdict.label == "cpu-bound"
    assert producer_texts(w, PID) == {}  # the logger only waits: nothing it runs to quote


def test_a_dataloader_loop_is_no_hand_written_producer() -> None:
    # the DataLoader's own wait on its workers (multiprocessing queue under __next__)
    main = [stack(LOADER_WAIT, 120), stack(FORWARD, 40), stack(BACKWARD, 30), stack(OPTIM, 10)]
    w = window(main, thread(PID, 0.4, 0.4))
    f = feats.compute(w, PID)
    assert f["producer_wait_share"] == 0.0
    assert f["data_wait_queue_share"] == 0.6


def test_a_coordinator_that_only_waits_for_its_trainers_is_no_loop() -> None:
    # the main thread takes results from a queue and runs no model itself; the busy thread trains
    trainer = (*THREAD, Frame("train", "/home/u/hog.py", 30), *FORWARD[1:])
    main = [stack(QUEUE_GET, 200)]
    w = window([*main, stack(trainer, 200, PRODUCER_TID)], thread(PID, 0.01, 0.0) + thread(PRODUCER_TID, 0.95, 0.95))
    f = feats.compute(w, PID)
    assert f["producer_cpu_share"] == 0.0  # a thread that runs the model is no producer
    assert "loader-producer-thread" not in {x.rule for x in settle(w).findings}


def test_a_producer_process_is_counted_by_its_cpu() -> None:
    main = [stack(MP_GET, 100), stack(FORWARD, 50), stack(BACKWARD, 40), stack(OPTIM, 10)]
    procs = [
        ProcessSample(float(t), pid, PID, role, name, ("python", "train.py"), cpu, 10**8, None, None, 4)
        for t in range(11)
        for pid, role, name, cpu in ((PID, Role.MAIN, "python", 50.0), (4100, Role.WORKER, "python", 97.0))
    ]
    w = window(main, thread(PID, 0.5, 0.5), procs)
    f = feats.compute(w, PID)
    assert f["producer_process_wait_share"] == 0.5 and f["producer_thread_wait_share"] == 0.0
    assert f["producer_cpu_share"] == 0.97 and f["producer_count"] == 1.0
    a = settle(w)
    finding = next(x for x in a.findings if x.rule == "loader-producer-thread")
    assert "PID 4100 python 1.0 cores" in " ".join(fx.detail for fx in finding.fixes)
    assert a.verdict.label == "dataloader-bound"


def test_handoff_waits() -> None:
    assert handoff_wait(QUEUE_GET) == "thread"
    assert handoff_wait(MP_GET) == "process"
    assert handoff_wait(LOADER_WAIT) is None  # the DataLoader's own
    assert handoff_wait(FORWARD) is None
    join = (
        MODULE,
        Frame("Thread.join", f"{LIB}/threading.py", 1119),
        Frame("Thread._wait_for_tstate_lock", f"{LIB}/threading.py", 1139),
    )
    assert handoff_wait(join) is None  # waiting for a thread to end
    compile_pool = (*FORWARD, Frame("Future.result", f"{LIB}/concurrent/futures/_base.py", 451))
    assert handoff_wait(compile_pool) is None  # torch's own wait
    assert handoff_wait(()) is None
    # the loop blocked putting into a full queue waits for a consumer (a logger), not for data
    assert handoff_wait((MODULE, *PUT_FULL[2:])) is None
