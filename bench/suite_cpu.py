"""Where the test suite's CPU goes: every process the README's test command starts, by test file and kind.

    python bench/suite_cpu.py [--top 30] [-- PYTEST ARGS]      (root, Linux, the ``acct`` package)
    python bench/suite_cpu.py --parse ACCT_FILE ARGV_LOG START END [--top 30]

The suite is CPU-bound on the 2-core development machine (docs/development.md, "Where the time
goes"): its wall time is what its processes use over 2 cores, and the processes are mostly trainings,
each paying torch's import (and torch._dynamo's, which ``torch.optim.Optimizer.__init__`` imports) before
its first step. This measures it instead of guessing:

1. BSD process accounting (``accton FILE``) records each process as it exits: its PID, parent, start
   (s), CPU (user + system, 1/100 s) and command name, threads included, killed processes too.
2. A ``.pth`` file put in this interpreter's ``site-packages`` for the run (removed after it, whatever
   ends it) makes every Python of this environment append one line at start-up: PID, parent, time,
   ``PYTEST_CURRENT_TEST`` (pytest sets it in the worker; the processes a test starts inherit it) and
   the command line.
3. ``python -m pytest -q -p no:cacheprovider [ARGS]`` runs; accounting stops.

Each accounting record is joined to its log line by PID and start time (PIDs are reused), or to its
nearest logged ancestor (a fork, py-spy, gcc); a record neither reaches (a throw-away user's Python,
which cannot write the log; a process in another PID namespace, whose PID differs) counts as
"(no test)". Printed: the total, CPU-s by kind (training, helper ``python -c``, the xdist workers'
own tests, torchwatch, py-spy...), by test file and by test, and how many Python processes used at
least 1 CPU-s (about what a start that imports torch costs; ``python -c 'import torch'`` alone is
~1.5 CPU-s here, a training that builds an optimizer ~3.5).

Run nothing else meanwhile: the accounting file records every process of the machine.
Standard library only.
"""

from __future__ import annotations

import argparse
import collections
import os
import site
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# flag, version, tty, exitcode, uid, gid, pid, ppid, btime (epoch s), etime, utime, stime (comp_t, 1/AHZ s)
ACCT_V3 = struct.Struct("<bBHIIIIIIfHH")
RECORD = 64  # bytes of one acct_v3 record (linux/acct.h)
AHZ = 100.0  # the accounting clock: utime/stime are in 1/AHZ s

LOGGER = """import os, time
try:
    with open("/proc/self/cmdline", "rb") as _f:
        _cmd = _f.read().replace(b"\\0", b" ").decode("utf-8", "replace")[:300].replace("\\n", " ").replace("\\t", " ")
    _fd = os.open({log!r}, os.O_WRONLY | os.O_APPEND)
    os.write(_fd, ("%d\\t%d\\t%.3f\\t%s\\t%s\\n" % (os.getpid(), os.getppid(), time.time(),
        os.environ.get("PYTEST_CURRENT_TEST", "-").replace("\\t", " "), _cmd)).encode("utf-8", "replace"))
    os.close(_fd)
except Exception:
    pass
"""


@dataclass(frozen=True)
class Proc:
    """One accounting record: ``pid``/``ppid``, ``start`` (epoch s), ``cpu_s`` (user + system, s), ``comm``."""

    pid: int
    ppid: int
    start: int
    cpu_s: float
    comm: str


@dataclass(frozen=True)
class Started:
    """One line of the start-up log: ``at`` (epoch s), the ``test`` (``-``: none) and the command line."""

    at: float
    test: str
    cmd: str


def _comp_t(v: int) -> int:
    """A ``comp_t``: 13-bit mantissa, 3-bit base-8 exponent."""
    return (v & 0x1FFF) << (3 * (v >> 13))


def read_acct(path: Path) -> list[Proc]:
    """The acct v3 records of ``path``; raises ``ValueError`` when one is not version 3."""
    data = path.read_bytes()
    out = []
    for off in range(0, len(data) - RECORD + 1, RECORD):
        rec = data[off : off + RECORD]
        _flag, version, _tty, _exit, _uid, _gid, pid, ppid, btime, _etime, ut, st = ACCT_V3.unpack(rec[:36])
        if version & 0x0F != 3:
            raise ValueError(f"{path}: record {off // RECORD} is acct version {version & 0x0F}, not 3")
        comm = rec[48:64].split(b"\0")[0].decode("utf-8", "replace")
        out.append(Proc(pid, ppid, btime, (_comp_t(ut) + _comp_t(st)) / AHZ, comm))
    return out


def read_log(path: Path) -> dict[int, list[Started]]:
    """``{pid: [Started, ...]}`` of the start-up log, each PID's lines in time order."""
    out: dict[int, list[Started]] = collections.defaultdict(list)
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) == 5:
            out[int(parts[0])].append(Started(float(parts[2]), parts[3], parts[4]))
    for lines in out.values():
        lines.sort(key=lambda s: s.at)
    return out


def kind_of(cmd: str) -> str:
    """What a logged Python process was, from its command line."""
    if "exec(eval(sys.stdin" in cmd or " -m pytest" in cmd:
        return "pytest and its xdist workers (in-process tests)"
    if " -m torchwatch" in cmd or "/bin/torchwatch" in cmd:
        return "torchwatch"
    if " -c " in cmd and "multiprocessing" in cmd:
        return "training (multiprocessing child)"
    if "/demo/" in cmd or "/scenarios/" in cmd or "/tests/" in cmd or "pytest-of-" in cmd:
        return "training"
    if " -c " in cmd:
        return "python -c (a test's helper or training)"
    return "python (other)"


def attribute(procs: list[Proc], log: dict[int, list[Started]]) -> list[tuple[Proc, str, str]]:
    """``(proc, test, kind)`` for each record: its own log line, else its nearest logged ancestor's
    test (kind ``fork of …`` for a Python fork, ``exe: COMM`` for another program)."""
    by_pid: dict[int, list[Proc]] = collections.defaultdict(list)
    for p in procs:
        by_pid[p.pid].append(p)

    def own(p: Proc) -> Started | None:
        return next((s for s in log.get(p.pid, ()) if p.start - 2 <= s.at <= p.start + 30), None)

    def ancestor(p: Proc) -> Started | None:
        cur = p
        for _ in range(40):
            parents = [q for q in by_pid.get(cur.ppid, ()) if q.start <= cur.start + 1]
            if not parents:  # the parent outlived the accounting (an xdist worker): its last log line
                lines = [s for s in log.get(cur.ppid, ()) if s.at <= cur.start + 1]
                return lines[-1] if lines else None
            cur = parents[-1]
            s = own(cur)
            if s is not None:
                return s
        return None

    out = []
    for p in procs:
        s = own(p)
        if s is not None:
            out.append((p, s.test, kind_of(s.cmd)))
            continue
        a = ancestor(p)
        test = a.test if a is not None else "-"
        if a is not None and p.comm.startswith(("python", "pt_")):
            out.append((p, test, "fork of " + kind_of(a.cmd)))
        else:
            out.append((p, test, "exe: " + p.comm))
    return out


def report(rows: list[tuple[Proc, str, str]], top: int) -> None:
    """Print the totals, by kind, by test file and by test (CPU-s)."""
    total = sum(p.cpu_s for p, _, _ in rows)
    by_kind: collections.Counter[str] = collections.Counter()
    by_file: collections.Counter[str] = collections.Counter()
    by_test: collections.Counter[str] = collections.Counter()
    starts = collections.Counter()
    for p, test, kind in rows:
        name = test.rsplit(" (", 1)[0] if test != "-" else "(no test)"
        by_kind[kind] += p.cpu_s
        by_file[name.split("::")[0]] += p.cpu_s
        by_test[name] += p.cpu_s
        if not kind.startswith(("fork", "exe", "pytest")) and p.cpu_s >= 1.0:
            starts[kind] += 1
    print(f"{len(rows)} processes, {total:.0f} CPU-s")
    print(f"Python starts of >= 1 CPU-s (about one torch import each): {sum(starts.values())} {dict(starts)}")
    for title, counter in (("kind", by_kind), ("test file", by_file), ("test", by_test)):
        print(f"\nCPU-s by {title}:")
        for name, cpu in counter.most_common(top):
            print(f"{cpu:8.1f}  {100 * cpu / max(total, 1e-9):4.1f} %  {name}")


def measure(pytest_args: list[str], top: int) -> int:
    """Run the suite under accounting with the start-up logger; print the report; pytest's exit code.
    Raises ``SystemExit`` with one line when not root or ``accton`` is missing."""
    if os.geteuid() != 0:
        raise SystemExit("suite_cpu: process accounting needs root (accton)")
    if subprocess.run(["sh", "-c", "command -v accton"], capture_output=True).returncode != 0:
        raise SystemExit("suite_cpu: no accton: apt-get install acct")
    work = Path(tempfile.mkdtemp(prefix="suite-cpu-"))
    work.chmod(0o755)
    acct, log = work / "acct", work / "argv.log"
    acct.touch()
    log.touch()
    log.chmod(0o666)  # the processes of throw-away test users may log too
    pth_dir = Path(site.getsitepackages()[0])
    module, pth = pth_dir / "_suite_cpu_logger.py", pth_dir / "zz_suite_cpu_logger.pth"
    module.write_text(LOGGER.format(log=str(log)))
    pth.write_text("import _suite_cpu_logger\n")
    start = time.time()
    try:
        subprocess.run(["accton", str(acct)], check=True, capture_output=True)
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]).returncode
    finally:
        subprocess.run(["accton", "off"], capture_output=True)
        pth.unlink(missing_ok=True)
        module.unlink(missing_ok=True)
    end = time.time()
    print(f"\nsuite_cpu: pytest exit {rc}, {end - start:.0f} s wall; records in {work}")
    procs = [p for p in read_acct(acct) if start - 5 <= p.start <= end + 5]
    report(attribute(procs, read_log(log)), top)
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=30, help="lines per table (default 30)")
    ap.add_argument("--parse", nargs=4, metavar=("ACCT", "LOG", "START", "END"), help="report on an earlier run")
    ap.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = ap.parse_args()
    if args.parse:
        acct, log, t0, t1 = args.parse
        procs = [p for p in read_acct(Path(acct)) if float(t0) - 5 <= p.start <= float(t1) + 5]
        report(attribute(procs, read_log(Path(log))), args.top)
        return 0
    return measure(args.pytest_args, args.top)


if __name__ == "__main__":
    sys.exit(main())
