"""Coalesce concurrent ``predict`` calls from many threads into few model calls (leader/follower).

    thread A ─predict([a])─┐                       ┌─▶ [ea]
    thread B ─predict([b])─┼─▶ pending ─▶ leader ──┼─▶ [eb]      one fn([a, b, c]) call
    thread C ─predict([c])─┘   (FIFO)    runs fn   └─▶ [ec]

The prefill worker calls ``predict`` once per request from ``asyncio.to_thread``;
requests of one PrefillSchedBatch arrive together. Whoever finds no batch running
becomes the leader: it takes up to ``max_items`` pending items (whole calls, FIFO),
runs ``fn`` once, hands each caller its slice, and gives up leadership; a caller
whose items are still pending then leads the next batch. An idle predictor adds no
wait: a lone call runs at once. An exception in ``fn`` is raised in every caller of
that batch.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    __slots__ = ("error", "finished", "items", "result")

    def __init__(self, items: list[T]) -> None:
        self.items = items
        self.result: list[R] = []
        self.error: BaseException | None = None
        self.finished = False


class CoalescingBatcher(Generic[T, R]):
    def __init__(self, fn: Callable[[list[T]], list[R]], max_items: int = 64) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        self._fn = fn
        self._max_items = max_items
        self._cond = threading.Condition()
        self._pending: deque[_Slot[T, R]] = deque()
        self._running = False
        self.calls = 0  # fn invocations, for tests and stats

    def __call__(self, items: Sequence[T]) -> list[R]:
        slot: _Slot[T, R] = _Slot(list(items))
        with self._cond:
            self._pending.append(slot)
        while True:
            with self._cond:
                while self._running and not slot.finished:
                    self._cond.wait()
                if slot.finished:
                    break
                self._running = True
                group = self._take()
            try:
                self._run(group)
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()
        if slot.error is not None:
            raise slot.error
        return slot.result

    def _take(self) -> list[_Slot[T, R]]:
        group = [self._pending.popleft()]
        total = len(group[0].items)
        while self._pending and total + len(self._pending[0].items) <= self._max_items:
            total += len(self._pending[0].items)
            group.append(self._pending.popleft())
        return group

    def _run(self, group: list[_Slot[T, R]]) -> None:
        flat = [item for slot in group for item in slot.items]
        try:
            self.calls += 1
            results = self._fn(flat) if flat else []
            if len(results) != len(flat):
                raise RuntimeError(f"batched fn returned {len(results)} results for {len(flat)} items")
            start = 0
            for slot in group:
                slot.result = results[start : start + len(slot.items)]
                start += len(slot.items)
        except BaseException as exc:
            for slot in group:
                slot.error = exc
        finally:
            for slot in group:
                slot.finished = True
