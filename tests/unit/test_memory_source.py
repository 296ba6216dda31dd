"""The memory source's readers (torchwatch.sources.memory) on cgroup trees and a kernel log built here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchwatch.sources import memory as m

MIB = 1 << 20


def _own_groups() -> list[tuple[str, str]]:
    return m._groups(os.getpid())


def _write(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


def test_a_v1_limit_is_the_hierarchical_one_and_the_working_set_leaves_out_inactive_file(tmp_path):
    rel = next((p for c, p in _own_groups() if "memory" in c.split(",")), None)
    if rel is None:
        pytest.skip("this process has no cgroup v1 memory line")
    _write(tmp_path / "memory" / rel, {
        "memory.stat": f"total_inactive_file {100 * MIB}\nhierarchical_memory_limit {1024 * MIB}\n",
        "memory.usage_in_bytes": str(700 * MIB),
        "memory.limit_in_bytes": str(m.UNLIMITED * 8),  # this group's own: none; an ancestor's binds
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
    })  # fmt: skip
    lim = m.read_limit(os.getpid(), root=tmp_path)
    assert lim is not None
    if lim.source.startswith("the machine"):
        pytest.skip("this machine has less memory than 1 GiB + swap")
    assert (lim.limit, lim.used, lim.oom_kills) == (1024 * MIB, 600 * MIB, 3)
    assert "cgroup v1" in lim.source


def test_no_cgroup_limit_is_the_machine(tmp_path):
    lim = m.read_limit(os.getpid(), root=tmp_path)  # an empty cgroup mount: nothing limits
    assert lim is not None and lim.source.startswith("the machine")
    info = Path("/proc/meminfo").read_text()
    assert lim.limit >= int(info.split("MemTotal:")[1].split()[0]) * 1024
    assert 0 < lim.used < lim.limit


def test_a_v2_limit_of_an_ancestor_binds_and_memory_high_is_kept(tmp_path):
    rel = next((p for c, p in _own_groups() if c == ""), None)
    if rel is None:
        pytest.skip("no cgroup v2 line")
    root = tmp_path / "v2"
    _write(root, {"cgroup.controllers": "memory\n"})
    group = root / rel if rel else root
    _write(
        group, {"memory.max": "max\n", "memory.current": str(300 * MIB), "memory.stat": f"inactive_file {50 * MIB}\n"}
    )
    if group != root:
        _write(group.parent, {
            "memory.max": str(512 * MIB), "memory.current": str(400 * MIB), "memory.high": str(480 * MIB),
            "memory.stat": f"inactive_file {60 * MIB}\n", "memory.events": "low 0\nhigh 2\nmax 5\noom 1\noom_kill 1\n",
        })  # fmt: skip
    else:
        _write(root, {"memory.max": str(512 * MIB), "memory.current": str(400 * MIB), "memory.high": str(480 * MIB),
                      "memory.stat": f"inactive_file {60 * MIB}\n", "memory.events": "oom_kill 1\n"})  # fmt: skip
    lim = m.read_limit(os.getpid(), root=root)
    assert lim is not None and lim.limit == 512 * MIB and lim.used == 340 * MIB
    assert lim.high == 480 * MIB and lim.oom_kills == 1 and "cgroup v2" in lim.source


def test_smaps_rollup_of_this_process_adds_up():
    got = m.read_smaps_rollup(os.getpid())
    assert got is not None
    rss, pss, uss, shared, _swap = got
    assert rss > 0 and 0 < pss <= rss and uss + shared == pytest.approx(rss, rel=0.01, abs=64 * 1024)
    assert m.read_smaps_rollup(2**22 + 12345) is None  # no such PID


def test_the_kernel_log_reader_takes_only_oom_kill_lines():
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        for line in (
            b"6,404,1,-;memory: usage 102400kB, limit 102400kB, failcnt 0",
            b"3,454,2,-;Memory cgroup out of memory: Killed process 10904 (pt_data_worker) total-vm:119004kB, "
            b"anon-rss:108936kB, file-rss:3700kB, shmem-rss:0kB, UID:0 pgtables:264kB oom_score_adj:0",
        ):
            os.write(w, line)
            kills = m.read_kmsg(r, 5.0)
            if b"Killed" in line:
                assert [(k.pid, k.name, k.anon_bytes) for k in kills] == [(10904, "pt_data_worker", 108936 * 1024)]
            else:
                assert kills == []
    finally:
        os.close(r)
        os.close(w)


def test_the_source_reads_smaps_every_few_rounds_and_forgets_gone_pids():
    src = m.MemorySource(lambda: [os.getpid()], kmsg=False)
    rounds = [src.sample(0.0)]
    every = src.smaps_every  # SMAPS_EVERY, or more when the read cost more than SMAPS_BUDGET
    assert every >= m.SMAPS_EVERY
    rounds += [src.sample(float(i)) for i in range(1, every + 1)]
    with_procs = [i for i, r in enumerate(rounds) if r and r[0].procs]
    assert with_procs == [0, every]
    first = rounds[0][0].procs[0]
    assert first.pid == os.getpid() and first.uss_start == first.uss and first.age_s == 0.0
    assert all(r[0].limit is not None for r in rounds)
    src.close()
    src.close()


@pytest.mark.parametrize(
    ("state", "flags", "exited"),
    [("S", 0x400000, False), ("R", 0x400000 | m.PF_EXITING, True), ("Z", 0x400000, True), ("D", 0x404, True)],
)
def test_a_process_in_do_exit_has_no_limit_reading(monkeypatch, state, flags, exited):
    """The kernel moves an exiting task to the root cgroup before it is a zombie: a read in that
    window (state R or D, PF_EXITING set) must give no reading, not the root group's "no limit"."""
    stat = f"4242 (py thon) {state} 1 4242 4242 0 -1 {flags} 10 0 0 0 5 6 0 0 20 0 1 0 99 0 0\n"
    files = {"/proc/4242/stat": stat, "/proc/4242/cgroup": "4:memory:/\n0::/\n"}
    real = m._read
    monkeypatch.setattr(m, "_read", lambda p: files.get(str(p), real(p) if "4242" not in str(p) else None))
    assert m._exited(4242) is exited
    assert (m.read_limit(4242) is None) is exited
