"""Who a watched training belongs to, as the kernel says (read by :mod:`torchwatch.sources.origin`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Origin"]


@dataclass(frozen=True)
class Origin:
    """A training's owner as the kernel knows it: what its environment cannot claim.

    Attributes:
        uid: the process's real uid (``None`` when it could not be read).
        container_id: its container's id, the first 12 hex digits (as docker and crictl show
            them); ``""`` outside a container.
        pod_uid: its Kubernetes pod's UID (dashed); ``""`` outside a pod.
    """

    uid: int | None = None
    container_id: str = ""
    pod_uid: str = ""

    def labels(self) -> tuple[str, str, str]:
        """``(uid, container_id, pod_uid)`` as label values (``""`` for what is unknown)."""
        return ("" if self.uid is None else str(self.uid), self.container_id, self.pod_uid)
