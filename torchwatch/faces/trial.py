"""A live trial's result as text lines (``torchwatch trial``, the report, ``compare``, the TUI)."""

from __future__ import annotations

from collections.abc import Sequence

from torchwatch import wire
from torchwatch.model.trials import Outcome, verdict

GUARANTEE = {
    "exact": "what the training computes is unchanged (the same seed gives the same loss)",
    "rounding": "the same arithmetic in another order: results may differ in their last bits, as between "
    "two runs with different settings",
    "precision": "less precise arithmetic (allowed by --allow-numerics): the loss may differ",
}
LOADER_GUARANTEE = (
    "the same samples in the same order (the sampler runs in the main process whatever the workers); random "
    "augmentation drawn inside the dataset comes from other generators with other workers"
)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def block_lines(blocks: Sequence[wire.TrialBlock]) -> list[str]:
    """One line per block: its number, on/off, steps measured (dropped), mean and median step."""
    return [
        f"  block {i + 1:2d}  {'on ' if b.on else 'off'}  {b.steps:4d} steps"
        + (f" (+{b.dropped} dropped)" if b.dropped else "")
        + f"  mean {_ms(b.mean_s)}  median {_ms(b.median_s)}"
        for i, b in enumerate(blocks)
    ]


def state_lines(state: wire.TrialState, blocks: bool = True) -> list[str]:
    """The trial of one process: its verdict, what was guaranteed, what was put back, its blocks."""
    v = verdict(state)
    lines = [v["text"]]
    if state.state in ("refused",):
        return [f"{state.setting}={state.value}: refused: {state.reason}"]
    what = LOADER_GUARANTEE if state.setting == "num_workers" else GUARANTEE.get(state.numerics, "")
    lines.append(f"  {state.state}: {state.reason}" if state.reason else f"  {state.state}")
    if what:
        lines.append(f"  numerics: {state.numerics}: {what}")
    if state.kept:
        lines.append(f"  kept: {state.setting} is now {state.now_value} (--keep, and it was faster)")
    elif state.restored is True:
        lines.append(f"  put back: {state.setting} is {state.now_value or state.old} again (read back in the training)")
    elif state.restored is False:
        lines.append(f"  NOT put back: {state.setting} reads {state.now_value!r}, was {state.old!r}")
    elif state.old:
        lines.append(f"  unchanged: {state.setting} stayed {state.old}")
    if state.mode == wire.ITERATOR and state.state != "refused":
        lines.append("  (a DataLoader setting: each block is one epoch, made with or without it)")
    if blocks and state.blocks:
        lines += block_lines(state.blocks)
    return lines


def outcome_lines(out: Outcome) -> list[str]:
    """Every line of ``torchwatch trial``'s result."""
    lines: list[str] = []
    head = out.headline()
    if head is not None:
        pid, state = head
        rank = out.ranks.get(pid)
        who = f"PID {pid}" + (f" (rank {rank})" if rank is not None else "")
        lines.append(f"trial on {who}: " + state_lines(state)[0])
        lines += state_lines(state)[1:]
        for other, st in sorted(out.states.items()):
            if other == pid or st is None:
                continue
            r = out.ranks.get(other)
            lines.append(f"PID {other}" + (f" (rank {r})" if r is not None else "") + ": " + verdict(st)["text"]
                         + ("" if st.restored is not False else "  NOT put back"))  # fmt: skip
    for pid, st in sorted(out.states.items()):
        if st is None and pid not in out.exited:
            lines.append(f"PID {pid}: no trial state with this id (the hook did not answer)")
    for pid in out.exited:
        lines.append(
            f"PID {pid} exited during the trial: nothing shows the trial caused it (its last state above); "
            "its exit status belongs to its parent"
        )
    for pid, why in sorted(out.not_sent.items()):
        lines.append(f"PID {pid}: not sent: {why}")
    if out.stopped_by is not None:
        lines.append(f"torchwatch was stopped (signal {out.stopped_by}): the trial was ended on every rank")
    return lines


def report_lines(trials: Sequence[wire.TrialState]) -> list[str]:
    """The report's ``trials`` (:attr:`torchwatch.model.report.Report.trials`) as one line each:
    the verdict, and ``NOT put back`` when the old value could not be restored."""
    return ["  " + verdict(st)["text"] + ("" if st.restored is not False else "  NOT put back") for st in trials]
