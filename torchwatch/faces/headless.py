"""The live status line of ``--headless`` (on stderr): one line per label change, or every few seconds."""

from __future__ import annotations

from torchwatch.faces.compile import compile_news
from torchwatch.faces.hang import notice
from torchwatch.model.observation import Observation
from torchwatch.model.units import fmt_value


def status_line(obs: Observation | None, elapsed_s: float) -> str:
    """One line: the label and confidence, then data wait, loop CPU, disk wait, workers, steps/s
    and GPU (with its SM activity when GPM reads it), and for a job of several ranks the
    straggler (or none), the MFU once a burst counted FLOPs, the torch.compile findings (rule id,
    the latest such event in words and its file:line), a recorded hang or stall with its likely
    cause, and the samplers' cadence (``sampling: fast|steady``); ``starting`` before the first
    verdict; before the training's first step, what it does instead (``waiting for the first step:
    importing torch``: :attr:`~torchwatch.model.findings.Verdict.waiting_for`).

    Args:
        obs: the latest Observation (``None``: none yet).
        elapsed_s: seconds since watching started.
    """
    if obs is None or obs.verdict is None:
        return f"torchwatch [{elapsed_s:4.0f}s] starting"
    f, v = obs.features, obs.verdict

    def value(name: str) -> str:
        return fmt_value(f.get(name), obs.unit(name))

    sm = f.get("gpu_sm_active_mean")
    parts = [
        f"torchwatch [{elapsed_s:4.0f}s] {v.label} ({v.confidence:.2f})",
        *([f"waiting for the first step: {v.waiting_for}"] if v.waiting_for else []),
        f"data wait {value('data_wait_share')}",
        f"loop CPU {value('main_running_share')}",
        f"disk wait {value('storage_wait_share')}",
        f"workers {value('worker_count')}",
        *([f"{f['hook_steps_per_s']:.2f} steps/s"] if f.get("hook_steps_per_s") is not None else []),
        f"GPU {value('gpu_util_mean')}" + (f" (SM {value('gpu_sm_active_mean')})" if sm is not None else ""),
    ]
    if len(obs.ranks) > 1:
        st = obs.straggler
        parts.append(
            f"{len(obs.ranks)} ranks, straggler rank {st.rank} (score {st.score:.2f})"
            if st is not None
            else f"{len(obs.ranks)} ranks, no straggler"
        )
    if f.get("mfu") is not None:
        parts.append(f"MFU {value('mfu')}")
    compiled = [x.rule for x in obs.findings if x.rule.startswith("compile-")]
    if compiled:
        parts.append("compile: " + "; ".join(compile_news(rule, obs.focus.compile) for rule in compiled))
    hang = notice(obs.hang)
    if hang is not None:
        parts.append(hang)
    prog = obs.focus.progress
    if prog is not None:
        parts.append(prog.line())
    health = [x.rule for x in obs.findings if x.scope == "health"]
    if health:
        parts.append("health: " + ", ".join(health))
    parts.append(f"sampling: {obs.sampling.mode}")
    return " | ".join(parts)
