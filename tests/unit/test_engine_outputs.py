"""How an engine loop hands a step's deltas over (engine/loop_messages.py ``dispatch``): to a request's inline sink
on the engine thread where it takes them, to its event loop's sink otherwise, a finish always to the loop."""

from __future__ import annotations

import asyncio
import threading

from tetriserve.engine.loop_messages import Delta, InlineSink, Output, dispatch


def test_inline_sinks_take_what_does_not_finish_and_the_loop_gets_the_rest_and_every_finish() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        on_loop: list[tuple[str, Delta]] = []
        inline: list[tuple[str, str, Delta]] = []
        flushes: list[str] = []

        def take(rid: str, delta: Delta) -> bool:
            if rid == "broken":
                raise RuntimeError("bug")
            inline.append((threading.current_thread().name, rid, delta))
            return rid != "declines"

        def flush() -> None:
            flushes.append(threading.current_thread().name)

        def output(rid: str, with_inline: bool = True) -> Output:
            sink = InlineSink(lambda d: take(rid, d), flush) if with_inline else None
            return Output(loop, lambda d: on_loop.append((rid, d)), sink)

        a, b, plain, declines, broken = (
            output("a"),
            output("b"),
            output("plain", False),
            output("declines"),
            output("broken"),
        )
        batch = [
            (a, Delta((1,))),
            (b, Delta((2,))),
            (plain, Delta((3,))),
            (declines, Delta((4,))),
            (broken, Delta((5,))),
            (a, Delta((6,), "stop")),
        ]
        thread = threading.Thread(target=dispatch, args=(batch,), name="eng")
        thread.start()
        thread.join()
        assert [(name, rid, d.token_ids) for name, rid, d in inline] == [
            ("eng", "a", (1,)),
            ("eng", "b", (2,)),
            ("eng", "declines", (4,)),
        ]
        assert flushes == ["eng"]  # one shared flush, once, after the batch
        await asyncio.sleep(0)
        assert [(rid, d.token_ids, d.finish_reason) for rid, d in on_loop] == [
            ("plain", (3,), None),
            ("declines", (4,), None),
            ("broken", (5,), None),  # its inline sink raised: the delta takes the ordinary way
            ("a", (6,), "stop"),
        ]

    asyncio.run(main())
