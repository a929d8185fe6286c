"""A long-lived process of the service freezes its start-up heap, so the collector's full passes skip it.

Python's oldest-generation collection walks every object the collector tracks. A process that has loaded Ray,
transformers' tokenizer, the web frameworks (and, in a worker, vLLM and torch) tracks hundreds of thousands of
objects, and one full pass holds the interpreter lock for as long as half a second: every thread of the
process stops. Under a burst the many small objects each request makes set such passes off. With the heap not
frozen, one full pass in the front door takes 0.49 s in the middle of a burst of 200 prompts; with it frozen,
the front door makes no full pass in that burst (``python benchmarks/diagnostics/gc_pauses.py --num-prompts 200
--seed 0``, measured on ebdbf46 without and with the freeze). A pass that falls while the front door takes a
burst in holds back every placement until it is over.

Plain vLLM freezes its API server's and its engine core's heaps once they are up
(``vllm.utils.gc_utils.freeze_gc_heap``); our engines get the latter from vLLM already. ``freeze_heap`` does the
same for a process of ours once it is ready: one full collection, then ``gc.freeze()`` moves every surviving
object to a permanent generation that later passes leave alone. Objects made afterwards are collected as usual;
those alive at the freeze are still freed by reference counting, only a cycle among them is never reclaimed, which
suits what a process builds at start and keeps.
"""

from __future__ import annotations

import gc
import logging
import time

logger = logging.getLogger(__name__)


def freeze_heap(what: str) -> None:
    """Collect once, then freeze every object that survives (``what`` names the process in the log line)."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    logger.info(
        "%s: %d objects frozen out of the collector's passes (%.0f ms)",
        what,
        gc.get_freeze_count(),
        1e3 * (time.perf_counter() - t0),
    )
