"""A training's owner from the kernel: real uid and container / pod from /proc/PID/cgroup."""

from __future__ import annotations

import os

import pytest

from torchwatch.sources.origin import Origin, origin_of, parse_cgroup

CID = "4f3c2a1b0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b"
POD = "1b4c6d2e-9f2e-4a1b-8c3d-5e6f7a8b9c0d"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # Kubernetes, systemd cgroup driver, containerd (v2)
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope\n",
            (CID[:12], POD),
        ),
        # Kubernetes, cgroupfs driver (v1, several hierarchies)
        (
            f"12:memory:/kubepods/besteffort/pod{POD}/{CID}\n11:cpu,cpuacct:/kubepods/besteffort/pod{POD}/{CID}\n",
            (CID[:12], POD),
        ),
        (f"0::/system.slice/docker-{CID}.scope\n", (CID[:12], "")),  # docker
        (f"0::/machine.slice/libpod-{CID}.scope/container\n", (CID[:12], "")),  # podman
        (f"0::/../libpod-{CID}.scope/container\n", (CID[:12], "")),  # podman, a cgroup namespace's view
        (f"12:memory:/docker/{CID}\n0::/\n", (CID[:12], "")),  # docker, cgroupfs v1 beside an empty v2 line
        ("0::/user.slice/user-1000.slice/session-3.scope\n", ("", "")),  # a login session
        ("0::/\n", ("", "")),
        ("", ("", "")),
        (f"0::/x-{CID}0.scope\n", ("", "")),  # 65 hex digits: no container id
    ],
)
def test_container_and_pod_from_the_cgroup_path(text: str, want: tuple[str, str]) -> None:
    assert parse_cgroup(text) == want


def test_origin_of_this_process_is_its_real_uid() -> None:
    got = origin_of(os.getpid())
    assert got.uid == os.getuid()
    assert got.labels()[0] == str(os.getuid())


def test_origin_of_no_process_is_unknown_not_an_error() -> None:
    assert origin_of(1 << 30) == Origin()
    assert Origin().labels() == ("", "", "")
