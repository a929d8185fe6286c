"""The session's order: single-process modules first, the modules on the shared integration cluster last.

The e2e modules that keep one core busy (``ONE_CORE``) run before the ones that start a service on both cores.
(``scripts/test.sh`` runs them in the unit tests' process, first, and the others in a process beside it.)

The shared integration cluster (``tests/integration/conftest.py``'s session-scoped ``cluster``) lives from its first
user to the end of the session. Idle, its workers, monitor and scheduler take about a sixth of a core (measured in
session 60), which every other module (the ones that start a cluster or a service of their own) would share the two
cores with. Run last, its users follow one another and nothing else runs beside it.
"""

from __future__ import annotations

import pytest


def _on_shared_cluster(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.get("cluster", ()) if info is not None else ()
    return bool(defs) and defs[-1].scope == "session"  # a module's own ``cluster`` fixture overrides it


ONE_CORE = ("tests/e2e/test_profile_cli.py", "tests/e2e/test_packaging.py")  # one engine; pip and one front door


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    shared = {item.module for item in items if _on_shared_cluster(item)}  # type: ignore[attr-defined]

    def key(item: pytest.Item) -> tuple[bool, bool]:
        return getattr(item, "module", None) in shared, not item.nodeid.startswith(ONE_CORE)

    items.sort(key=key)  # stable: the order otherwise stays
