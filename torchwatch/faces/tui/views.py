"""The TUI's own choices over the Observation's rows: their order, which stacks back a finding,
how wide each part of the breakdown bar is, how a long name is cut (pure, no Textual).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from torchwatch.model.observation import ProcessRow, StackRow
from torchwatch.wire import CATEGORIES

SORT_KEYS = ("cpu", "rss", "read", "pid")


def ellipsize(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the cut marked with ``…``."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def short_path(filename: str) -> str:
    """The last two parts of a path (``data/dataloader.py``), enough to recognise a file."""
    parts = filename.replace("\\", "/").rstrip("/").split("/")
    return "/".join(parts[-2:])


# -- processes --------------------------------------------------------------------------------


def sort_rows(rows: Iterable[ProcessRow], key: str) -> list[ProcessRow]:
    """Rows by ``key`` (one of :data:`SORT_KEYS`): biggest first, unknown values last; pid ascending."""
    if key == "pid":
        return sorted(rows, key=lambda r: r.pid)
    attr = {"cpu": "cpu_pct", "rss": "rss_bytes", "read": "read_bytes_per_s"}[key]

    def value(r: ProcessRow) -> tuple[bool, float, int]:
        v = getattr(r, attr)
        return (v is None, -(v or 0.0), r.pid)

    return sorted(rows, key=value)


# -- stacks -----------------------------------------------------------------------------------


def category_shares(rows: Iterable[StackRow], who: str) -> dict[str, float]:
    """``{category: share}`` of one thread group's samples (rows of :func:`stack_rows`)."""
    out: dict[str, float] = defaultdict(float)
    for r in rows:
        if r.who == who:
            out[r.category] += r.share
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# Categories of stacks that back a finding, by the evidence it shows.
_EVIDENCE_PHASES: tuple[tuple[tuple[str, ...], frozenset[str]], ...] = (
    (("data_wait", "fetch_", "input_", "storage_", "workers_", "worker_"), frozenset({"data"})),
    (("forward_share",), frozenset({"forward"})),
    (("backward_share",), frozenset({"backward"})),
    (("optimizer_share",), frozenset({"optimizer"})),
    (("other_code_share",), frozenset({"other"})),
    (
        ("loop_cpu_share", "main_running_share", "main_cpu_pct"),
        frozenset({"forward", "backward", "optimizer", "other"}),
    ),
)


def phases_for(evidence: Iterable[str]) -> frozenset[str] | None:
    """Loop phases whose stacks back a finding with this evidence; ``None`` means all of them.

    The first matching group decides (a finding's evidence lists its main feature first).
    """
    for name in evidence:
        for prefixes, phases in _EVIDENCE_PHASES:
            if name.startswith(prefixes):
                return phases
    return None


def rows_behind(rows: Iterable[StackRow], evidence: Sequence[str]) -> list[StackRow]:
    """The stack rows behind a finding: the loop's rows in its phases, and the workers' rows
    when the finding is about data loading."""
    phases = phases_for(evidence)
    out = []
    for r in rows:
        if r.who == "main":
            keep = phases is None or r.category.partition("/")[0] in phases
        else:  # workers only produce data
            keep = phases is None or "data" in phases
        if keep:
            out.append(r)
    return out


# -- GPUs and memory --------------------------------------------------------------------------


# -- history of live values -------------------------------------------------------------------


# -- burst breakdown --------------------------------------------------------------------------
BREAKDOWN_ORDER = CATEGORIES  # the burst summary's step-time categories, in their priority order


def bar_widths(
    shares: Mapping[str, float], width: int, order: Sequence[str] = BREAKDOWN_ORDER
) -> list[tuple[str, int]]:
    """Split ``width`` cells between named shares (largest remainder), in ``order``.

    Shares need not sum to 1; they are normalised. A share too small for one cell gets none.

    Returns:
        ``[(name, cells)]`` for the names with at least one cell; the cells sum to ``width``
        (or 0 when every share is 0).
    """
    names = [n for n in order if shares.get(n, 0.0) > 0] + [n for n in shares if n not in order and shares[n] > 0]
    total = sum(shares[n] for n in names)
    if total <= 0 or width <= 0:
        return []
    exact = {n: shares[n] / total * width for n in names}
    cells = {n: int(exact[n]) for n in names}
    left = width - sum(cells.values())
    for n in sorted(names, key=lambda n: -(exact[n] - cells[n]))[:left]:
        cells[n] += 1
    return [(n, cells[n]) for n in names if cells[n] > 0]
