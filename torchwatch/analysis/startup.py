"""Before the loop: whether the training has reached its first step, and what it does until then.

Until its first step a training imports (torch alone is seconds of file reads and CPU), builds its
dataset and model and initialises CUDA, all on the loop's thread: readings of that time describe no
loop, and rules read them as one (recorded: ``run`` of a demo on a cold start said io-bound at 0.70-0.95
from 3 s to 14 s while torch was still importing, with 0 % disk wait at 14 s). So no label is given
before the first step (:class:`~torchwatch.analysis.diagnosis.Diagnoser` keeps the verdict
``undetermined`` and says what the training is waiting for, from :func:`waiting_for`).

The first step:

- trainers (children that run the steps themselves, Hogwild-style: ``trainer_count``) are the
  loop, whatever the hook says of a main process that only joins them;
- with the hook (``torchwatch run``, or ``attach`` once injected): the hook's first step, batch or
  batch being fetched (the feature ``loop_started``); while the hook was pre-loaded but has not
  published yet (torch not imported: the caller says ``hook_pending``) the training is starting;
- without it (``--no-hook``, ``attach`` without injection): from outside only the stacks tell, so the
  first step is the end of the import phase: the newest py-spy chunk of the loop's thread holds fewer
  than :data:`IMPORTING_SHARE` of its samples in ``<frozen importlib._bootstrap>``. Set-up after the
  imports (building the dataset and model) then counts as the loop: nothing outside the process
  tells it from a loop. Before py-spy's first chunk (``stacks_pending``) the training is starting;
  without py-spy and without the hook nothing tells, and no cap applies.

Pure functions over a :class:`~torchwatch.analysis.store.Window`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from torchwatch.analysis import stacks
from torchwatch.analysis.store import Window
from torchwatch.model.readings import Frame, StackSample

__all__ = ["IMPORTING_SHARE", "doing", "import_share_now", "waiting_for"]

IMPORTING_SHARE = 0.1
"""Share of the newest chunk's samples of the loop's thread in imports at or above which, without
the hook, the training is still importing (a loop that imports lazily now and then stays far
below: a few samples of a 3 s chunk, 60 samples)."""

_IMPORT_FILE = "<frozen importlib"
_SITE = ("site-packages/", "dist-packages/")


def _newest_chunk(window: Window, main_pid: int | None) -> list[StackSample]:
    """The loop's main-thread samples of the newest py-spy chunk in ``window`` (one ``t``)."""
    main = [s for s in window.stacks if s.is_main_thread and (main_pid is None or s.pid == main_pid)]
    if not main:
        return []
    newest = max(s.t for s in main)
    return [s for s in main if s.t == newest]


def import_share_now(window: Window, main_pid: int | None) -> float | None:
    """Share of the newest chunk's samples of the loop's thread spent importing, 0..1; ``None``
    when the window holds no stacks of it."""
    chunk = _newest_chunk(window, main_pid)
    total = sum(s.count for s in chunk)
    if not total:
        return None
    return sum(s.count for s in chunk if stacks.phase(s.frames) == "startup") / total


def _module(frames: Sequence[Frame]) -> str | None:
    """The top-level module an importing stack imports: the first ``<module>`` frame under the
    outermost import-machinery frame, as a name (``.../site-packages/torch/__init__.py`` ->
    ``torch``, ``/home/u/slow_mod.py`` -> ``slow_mod``)."""
    inside = False
    for f in frames:
        if f.filename.startswith(_IMPORT_FILE):
            inside = True
        elif inside and f.name == "<module>":
            path = f.filename.replace("\\", "/")
            for site in _SITE:
                if site in path:
                    return path.split(site, 1)[1].split("/", 1)[0].removesuffix(".py")
            parts = path.rsplit("/", 2)
            name = parts[-1].removesuffix(".py")
            return parts[-2] if name == "__init__" and len(parts) > 1 else name
    return None


def _where(frame: Frame) -> str:
    return f"{frame.name} ({frame.filename.replace(chr(92), '/').rsplit('/', 1)[-1]}:{frame.line})"


def doing(window: Window, main_pid: int | None) -> str:
    """What the loop's thread does before the first step, in words, from the newest chunk:
    ``importing torch`` (most of its samples import; the module most of them import),
    ``building the dataset (load_index (train.py:20))`` (a frame of a dataset's constructor or
    named after a dataset), ``running set-up code (build_model (train.py:31))`` (its hottest frame
    of user code, else its innermost), ``starting`` (no stacks, or none with a frame, yet)."""
    chunk = _newest_chunk(window, main_pid)
    if not chunk:
        return "starting"
    importing = [s for s in chunk if stacks.phase(s.frames) == "startup"]
    if 2 * sum(s.count for s in importing) >= sum(s.count for s in chunk):
        modules: Counter[str] = Counter()
        for s in importing:
            modules[_module(s.frames) or "modules"] += s.count
        return f"importing {modules.most_common(1)[0][0]}"
    rest = [s for s in chunk if s not in importing]

    def hottest(samples: Sequence[StackSample]) -> str | None:
        top: Counter[str] = Counter()
        for s in samples:
            frame = stacks.top_frame(s.frames)  # user code, else the innermost frame
            if frame is not None:
                top[_where(frame)] += s.count
        return top.most_common(1)[0][0] if top else None

    dataset = [s for s in rest if any("dataset" in (f.name + f.filename).lower() for f in s.frames)]
    if dataset and 2 * sum(s.count for s in dataset) >= sum(s.count for s in rest):
        where = hottest(dataset)
        return f"building the dataset ({where})" if where else "building the dataset"
    where = hottest(rest)
    return f"running set-up code ({where})" if where else "starting"


def waiting_for(
    window: Window,
    main_pid: int | None,
    features: Mapping[str, float | None],
    hook_pending: bool = False,
    stacks_pending: bool = False,
) -> str | None:
    """What the training does instead of its loop (:func:`doing`), or ``None`` once it has
    reached the loop as far as the readings tell (see the module's docstring).

    Args:
        window: readings of the last few seconds.
        main_pid: the diagnosed training process.
        features: its features (``loop_started`` from the hook; ``trainer_count``: trainers seen
            stepping, which is the loop).
        hook_pending: the hook was pre-loaded and has published nothing yet (torch not imported).
        stacks_pending: py-spy has read no chunk yet (it is starting, not unavailable).
    """
    if (features.get("trainer_count") or 0) > 0:
        # trainers (Hogwild-style children: analysis/roles.py) are named so from forward, backward
        # or optimizer frames in their own stacks: the loop runs, in processes the hook is not in
        # (a main process that only joins them never steps, and would wait here for good)
        return None
    started = features.get("loop_started")
    if started is not None:
        return None if started > 0 else doing(window, main_pid)
    if hook_pending:
        return doing(window, main_pid)
    share = import_share_now(window, main_pid)
    if share is None:
        return "starting" if stacks_pending else None
    return doing(window, main_pid) if share >= IMPORTING_SHARE else None
