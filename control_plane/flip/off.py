"""``off`` flip policy: roles and counts stay as ``serve`` set them (operators still flip and scale by hand)."""

from __future__ import annotations

from tetriserve.control_plane.flip.base import ClusterSnapshot, Order


class NoFlip:
    name = "off"

    def decide(self, snapshot: ClusterSnapshot) -> list[Order]:
        return []
