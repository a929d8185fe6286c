"""``freeze_heap`` (common/gc_heap.py): what is alive at the freeze leaves the collector's passes, what comes after
does not. In a subprocess, so the test process's own heap is not frozen."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import gc, weakref
from tetriserve.common.gc_heap import freeze_heap

class Node:
    pass

old = Node()
old.me = old  # a cycle alive at the freeze
freeze_heap("test")
assert gc.get_freeze_count() > 0
young = Node()
young.me = young
young_ref, old_ref = weakref.ref(young), weakref.ref(old)
del young, old
gc.collect()
assert young_ref() is None, "a cycle made after the freeze is collected"
assert old_ref() is not None, "a frozen cycle is left alone by the passes"
print("ok")
"""


def test_freeze_heap_leaves_later_objects_to_the_collector() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
