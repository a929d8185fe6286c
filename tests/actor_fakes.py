"""Fake Ray actor handles: ``handle.method.remote(...)`` over a plain object, for unit tests without Ray.

A call returns an awaitable (plain and coroutine methods) or an async iterator
of awaitables (async-generator methods), as Ray's ``ObjectRef`` and
``ObjectRefGenerator`` do. Every call is recorded in ``handle.calls``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any


class _Ref:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Any:
        async def get() -> Any:
            return self.value

        return get().__await__()


async def _refs(agen: AsyncIterator[Any]) -> AsyncIterator[_Ref]:
    async for item in agen:
        yield _Ref(item)


class _Method:
    def __init__(self, handle: FakeHandle, name: str) -> None:
        self._handle = handle
        self._name = name

    def remote(self, *args: Any) -> Any:
        self._handle.calls.append((self._name, args))
        result = getattr(self._handle.obj, self._name)(*args)
        if inspect.isasyncgen(result):
            return _refs(result)
        if inspect.iscoroutine(result):
            return asyncio.ensure_future(result)
        return _Ref(result)


class FakeHandle:
    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.calls if n == name]
