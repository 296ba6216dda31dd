"""Before the first step (torchwatch.analysis.startup and the Diagnoser's cap): no label until the
training reaches its loop, and the words for what it does meanwhile."""

from __future__ import annotations

from torchwatch.analysis.diagnosis import Diagnoser
from torchwatch.analysis.features import CATALOGUE, MIN_STACK_SAMPLES, MIN_THREAD_SAMPLES, Features
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.analysis.startup import doing, import_share_now, waiting_for
from torchwatch.analysis.store import Store, Window
from torchwatch.faces.headless import status_line
from torchwatch.model.observation import TargetView
from torchwatch.model.readings import Frame, Role, StackSample
from torchwatch.watch.observe import Tick, Trends, observe

PID = 5000
SITE = "/venv/lib/python3.11/site-packages"
BOOT = "<frozen importlib._bootstrap>"
TRAIN = Frame("<module>", "/home/u/train.py", 3)
IMPORT_TORCH = (
    TRAIN,
    Frame("_find_and_load", BOOT, 1176),
    Frame("_load_unlocked", BOOT, 690),
    Frame("<module>", f"{SITE}/torch/__init__.py", 400),
    Frame("_find_and_load", BOOT, 1176),
    Frame("<module>", f"{SITE}/torch/nn/__init__.py", 2),
)
IMPORT_MINE = (TRAIN, Frame("_find_and_load", BOOT, 1176), Frame("<module>", "/home/u/slow_mod.py", 8))
DATASET = (
    Frame("<module>", "/home/u/train.py", 40),
    Frame("ImageDataset.__init__", "/home/u/data.py", 12),
    Frame("scan", "/home/u/data.py", 30),
)
SETUP = (Frame("<module>", "/home/u/train.py", 50), Frame("build_model", "/home/u/train.py", 20))
LOOP = (
    Frame("<module>", "/home/u/train.py", 60),
    Frame("Module._call_impl", f"{SITE}/torch/nn/modules/module.py", 1762),
)

RULES = load_rules()


def chunk(*parts: tuple[tuple[Frame, ...], int], t: float = 9.0) -> list[StackSample]:
    return [StackSample(t, PID, PID, "MainThread", Role.MAIN, True, frames, n) for frames, n in parts]


def window(stacks: list[StackSample]) -> Window:
    return Window(start=0.0, end=10.0, stacks=stacks)


def test_what_the_training_does_before_its_loop() -> None:
    assert doing(window(chunk((IMPORT_TORCH, 50), (SETUP, 10))), PID) == "importing torch"
    assert doing(window(chunk((IMPORT_MINE, 40))), PID) == "importing slow_mod"
    assert doing(window(chunk((DATASET, 40), (SETUP, 5))), PID) == "building the dataset (scan (data.py:30))"
    assert doing(window(chunk((SETUP, 40))), PID) == "running set-up code (build_model (train.py:20))"
    assert doing(window([]), PID) == "starting"
    # the newest chunk decides: the imports of an older one are over
    old_and_new = chunk((IMPORT_TORCH, 60), t=3.0) + chunk((SETUP, 60), t=6.0)
    assert doing(window(old_and_new), PID).startswith("running set-up code")
    assert import_share_now(window(old_and_new), PID) == 0.0


def test_the_first_step_with_the_hook_is_the_hooks() -> None:
    importing = window(chunk((IMPORT_TORCH, 60)))
    assert waiting_for(importing, PID, {"loop_started": 0.0}) == "importing torch"
    assert waiting_for(importing, PID, {"loop_started": 1.0}) is None  # a step or a batch: the loop
    # pre-loaded, torch not imported yet: the hook has published nothing
    assert waiting_for(window([]), PID, {"loop_started": None}, hook_pending=True) == "starting"
    assert waiting_for(importing, PID, {"loop_started": None}, hook_pending=True) == "importing torch"
    # set-up after the imports is still before the loop with the hook
    assert waiting_for(window(chunk((SETUP, 60))), PID, {"loop_started": 0.0}) == (
        "running set-up code (build_model (train.py:20))"
    )


def test_trainers_seen_stepping_are_the_loop_whatever_the_main_processs_hook_says() -> None:
    """A Hogwild main process has the hook and never steps (its trainers do, without it): before,
    the verdict waited for its first step for good (tests/integration/test_trainers.py)."""
    setup = window(chunk((SETUP, 60)))
    assert waiting_for(setup, PID, {"loop_started": 0.0, "trainer_count": 4.0}) is None
    assert waiting_for(setup, PID, {"loop_started": None, "trainer_count": 2.0}, hook_pending=True) is None
    assert waiting_for(setup, PID, {"loop_started": 0.0, "trainer_count": 0.0}) is not None  # none: the hook's


def test_the_first_step_without_the_hook_is_the_end_of_the_imports() -> None:
    no_hook: dict[str, float | None] = {"loop_started": None}
    assert waiting_for(window(chunk((IMPORT_TORCH, 60))), PID, no_hook) == "importing torch"
    assert waiting_for(window(chunk((IMPORT_TORCH, 10), (SETUP, 50))), PID, no_hook) is not None  # 17 %
    assert waiting_for(window(chunk((IMPORT_TORCH, 3), (LOOP, 57))), PID, no_hook) is None  # a lazy import
    assert waiting_for(window(chunk((SETUP, 60))), PID, no_hook) is None  # imports over: counted as the loop
    assert waiting_for(window([]), PID, no_hook, stacks_pending=True) == "starting"
    assert waiting_for(window([]), PID, no_hook) is None  # no py-spy, no hook: nothing tells, no cap


def features(**values: float) -> Features:
    f: Features = dict.fromkeys(CATALOGUE)
    f.update(stack_samples=float(4 * MIN_STACK_SAMPLES), thread_samples=float(4 * MIN_THREAD_SAMPLES))
    f.update(values)
    return f


# Imports reading files: the loop's thread in disk wait half the time (what storage-wait reads).
IMPORT_READS = features(storage_wait_share=0.5, main_disk_share=0.5, loop_cpu_share=0.1)
LOOP_CPU = features(
    main_running_share=0.9,
    loop_cpu_share=0.9,
    fetch_cpu_share=0.0,
    storage_wait_share=0.0,
    main_disk_share=0.0,
    loop_started=1.0,
)


def test_no_label_before_the_first_step_and_nothing_carried_into_the_loop() -> None:
    d = Diagnoser(RULES)
    for t in range(0, 12, 2):
        a = d.evaluate(IMPORT_READS, float(t), waiting="importing torch")
        assert a.verdict.label == "undetermined" and a.verdict.confidence <= 0.5
        assert a.verdict.waiting_for == "importing torch"
        assert "Waiting for the first step: importing torch" in a.verdict.summary
        assert all(f.label == "undetermined" for f in a.findings if f.severity != "info")
    # the loop starts: the import's storage finding does not carry over; the loop's own fires
    first = d.evaluate(LOOP_CPU, 12.0)
    assert "storage-wait" not in {f.rule for f in first.findings}
    assert first.verdict.waiting_for is None
    later = d.evaluate(LOOP_CPU, 14.0)
    assert later.verdict.label == "cpu-bound", later.verdict
    # once the loop has been seen, a lazy import later does not take the label away
    assert d.evaluate(LOOP_CPU, 16.0, waiting="importing scipy").verdict.label == "cpu-bound"


def test_the_status_line_says_what_the_training_waits_for() -> None:
    d = Diagnoser(RULES)
    analysis = d.evaluate(IMPORT_READS, 5.0, waiting="importing torch")
    tick = Tick(
        now=5.0,
        end=5.0,
        started=0.0,
        window_s=10.0,
        analysis=analysis,
        statuses=(),
        focus_pid=PID,
        target=TargetView(PID),
    )
    line = status_line(observe(Store(), tick, Trends()), 5.0)
    assert "undetermined (0.00) | waiting for the first step: importing torch |" in line
