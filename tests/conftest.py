"""The session's order: the test modules on the shared integration cluster run last.

That cluster (``tests/integration/conftest.py``'s session-scoped ``cluster``) lives from its first user to the end
of the session. Idle, its workers, monitor and scheduler still use CPU, which every other module (the ones that
start a cluster or a service of their own, and the unit tests) would share the two cores with. Run last, its users
follow one another and nothing else runs beside it.
"""

from __future__ import annotations

import pytest


def _on_shared_cluster(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.get("cluster", ()) if info is not None else ()
    return bool(defs) and defs[-1].scope == "session"  # a module's own ``cluster`` fixture overrides it


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    shared = {item.module for item in items if _on_shared_cluster(item)}  # type: ignore[attr-defined]
    items.sort(key=lambda item: getattr(item, "module", None) in shared)  # stable: the order otherwise stays
