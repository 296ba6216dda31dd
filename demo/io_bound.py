"""Demo training bottlenecked on storage I/O (expected torchwatch label: io-bound).

Bottleneck: each sample is 4 scattered 256 KiB records (1 MiB in all, the size of a large
image) of a 256 MiB data file, read in Dataset.__getitem__ with O_DIRECT (no page
cache) one pread at a time at queue depth 1, so the process sleeps in uninterruptible I/O
wait (thread state D) for most of every step; the sample keeps every 64th byte (a cheap
stand-in for decoding and resizing) and the MLP on top is tiny.  Records are large so that
the device's transfer, not the kernel CPU of each request, is most of a read: 4 KiB reads
cost about as much kernel CPU as disk wait on a virtual machine, and were labelled by the
CPU they burn there.  DEFAULT num_workers=0 (also --num-workers N).

The data file is created once (random bytes) and reused, in the first of these directories
whose file system takes O_DIRECT: $TORCHWATCH_DEMO_DIR, else $TMPDIR/torchwatch-demo (or
/tmp/torchwatch-demo), then /var/tmp/torchwatch-demo (/tmp is often a tmpfs, which keeps
files in RAM and refuses O_DIRECT).  If none does (EINVAL), it falls back to buffered reads
after posix_fadvise(DONTNEED) and warns once.

--relieve removes the storage wait from the loop: the whole file is read ONCE up
front with large sequential reads into RAM, and __getitem__ gathers the same
records from memory.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import sys
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

NAME = "io_bound"
FILE_SIZE, N_SAMPLES, BATCH = 256 << 20, 4096, 32
READS, RECORD = 4, 256 << 10
ALIGN, KEEP = 4096, 4096  # O_DIRECT offsets and buffers: 4 KiB aligned; bytes kept per record
STRIDE = RECORD // KEEP


def _dirs() -> list[str]:
    """Candidate data directories, in order (see the module docstring)."""
    given = os.environ.get("TORCHWATCH_DEMO_DIR")
    if given:
        return [given]
    found = [os.path.join(tempfile.gettempdir(), "torchwatch-demo"), "/var/tmp/torchwatch-demo"]
    return list(dict.fromkeys(found))


def _takes_o_direct(directory: str) -> bool:
    """Whether a file in ``directory`` can be read with O_DIRECT (a 4 KiB probe file)."""
    probe = os.path.join(directory, f".probe.{os.getpid()}")
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * ALIGN)
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
        try:
            os.preadv(fd, [memoryview(mmap.mmap(-1, ALIGN))], 0)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)


def _data_dir() -> str:
    """The first candidate directory that takes O_DIRECT, else the first one that could be made."""
    made = []
    for directory in _dirs():
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError:
            continue
        if _takes_o_direct(directory):
            return directory
        made.append(directory)
    return made[0] if made else _dirs()[0]


def data_file() -> str:
    """Path of the data file, created (random bytes, atomically) if missing."""
    path = os.path.join(_data_dir(), "io_bound.bin")
    if os.path.exists(path) and os.path.getsize(path) == FILE_SIZE:
        return path
    _common.say(NAME, f"creating {FILE_SIZE >> 20} MiB data file {path}")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.writelines(os.urandom(1 << 20) for _ in range(FILE_SIZE // (1 << 20)))
    os.replace(tmp, path)
    return path


class Records(Dataset[torch.Tensor]):
    """Sample i = READS fixed, scattered RECORD-sized records of the file, KEEP bytes kept of each:
    a (READS, KEEP) uint8 tensor."""

    def __init__(self, path: str, in_memory: bool) -> None:
        self.path = path
        g = torch.Generator().manual_seed(1)
        slots = (FILE_SIZE - RECORD) // ALIGN + 1
        self.offsets = (torch.randint(slots, (N_SAMPLES, READS), generator=g) * ALIGN).tolist()
        self.pid, self.fd, self.direct = -1, -1, True
        self.buf = mmap.mmap(-1, READS * RECORD)  # page-aligned, as O_DIRECT needs
        self.ram: torch.Tensor | None = self._read_all() if in_memory else None

    def __getstate__(self) -> dict[str, object]:
        """For spawn-started workers: they open their own fd and buffer."""
        return {**self.__dict__, "buf": None, "pid": -1, "fd": -1}

    def _open(self) -> None:
        """One fd per process (DataLoader workers are forked)."""
        if self.pid == os.getpid():
            return
        self.pid, self.buf = os.getpid(), mmap.mmap(-1, READS * RECORD)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            os.preadv(self.fd, [memoryview(self.buf)[:ALIGN]], 0)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            if self.fd >= 0:
                os.close(self.fd)
            self.fd, self.direct = os.open(self.path, os.O_RDONLY), False
            _common.say(
                NAME,
                "warning: O_DIRECT not supported here; using posix_fadvise(DONTNEED) + buffered reads instead",
            )

    def _read_all(self) -> torch.Tensor:
        """--relieve: the whole file, in 8 MiB sequential reads, into RAM."""
        self._open()
        ram, chunk = mmap.mmap(-1, FILE_SIZE), 8 << 20
        view = memoryview(ram)
        for off in range(0, FILE_SIZE, chunk):
            os.preadv(self.fd, [view[off : off + chunk]], off)
        return torch.frombuffer(ram, dtype=torch.uint8)

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.ram is not None:
            records = [self.ram[off : off + RECORD : STRIDE] for off in self.offsets[i]]
            return torch.stack(records)
        self._open()
        view = memoryview(self.buf)
        for j, off in enumerate(self.offsets[i]):  # queue depth 1: wait on each read
            if not self.direct:
                os.posix_fadvise(self.fd, off, RECORD, os.POSIX_FADV_DONTNEED)
            os.preadv(self.fd, [view[j * RECORD : (j + 1) * RECORD]], off)
        read = torch.frombuffer(self.buf, dtype=torch.uint8).view(READS, RECORD)
        return read[:, ::STRIDE].clone()


def main() -> None:
    args = _common.parse_args(NAME, __doc__, num_workers=True)
    _common.seed()
    device = torch.device(args.device)
    with _common.Run(NAME, device) as run:
        data = Records(data_file(), in_memory=args.relieve)
        loader = DataLoader(
            data,
            batch_size=BATCH,
            shuffle=True,
            drop_last=True,
            num_workers=args.num_workers,
            persistent_workers=args.num_workers > 0,
            pin_memory=device.type == "cuda",
        )
        model = nn.Sequential(nn.Linear(READS * 64, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(batch: torch.Tensor) -> torch.Tensor:
            raw = _common.to_device(batch, device)  # (BATCH, READS, KEEP) uint8
            x = raw.view(BATCH, READS, 64, 64).float().mean(-1).flatten(1) / 255.0
            y = (x[:, :64].mean(1) > 0.5).long()  # target: a function of the record bytes
            return _common.sgd_step(model, opt, (x - 0.5) * 10, y)

        run.train(loader, step, args.seconds)


if __name__ == "__main__":
    main()
