"""The front door's submits and aborts: over the worker's intake where it attached one, over Ray where not
(frontdoor/worker_streams.py, frontdoor/ray_backend.py, channel/intake.py)."""

from __future__ import annotations

import asyncio

from tests.data_path_support import fake_cluster, make_request, wait_until
from tetriserve.channel.intake import Abort, Submit
from tetriserve.frontdoor.ray_backend import RayBackend


def test_submits_and_aborts_take_the_intake_where_the_worker_attached_it() -> None:
    async def main() -> None:
        cluster, _ = fake_cluster(decode=1)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        streams = backend.streams()
        attached: set[str] = set()  # a probe each until it goes through: the worker's side has connected

        def attach() -> bool:
            attached.update(wid for wid in {"prefill-0", "decode-0"} - attached if streams.send(wid, Abort("probe")))
            return len(attached) == 2

        await wait_until(attach)
        stream = backend.generate(make_request("a"))
        first = asyncio.ensure_future(anext(stream))
        await wait_until(lambda: "a" in w["prefill-0"].submitted)
        assert not cluster.prefill["prefill-0"].called("submit")  # the request went over the intake, not Ray
        assert isinstance(w["prefill-0"].intake[-1], Submit) and w["prefill-0"].intake[-1].request.request_id == "a"
        w["prefill-0"].emit("a", (10,), 0)
        await asyncio.wait_for(first, 5)
        await stream.aclose()  # the client left while the request was on the prefill worker
        await wait_until(lambda: w["prefill-0"].aborted == ["probe", "a"])
        assert not cluster.prefill["prefill-0"].called("abort")
        routes = w["prefill-0"].routes
        assert routes and routes[0][1].startswith(b"prefill-0/") and routes[0][0] == streams.address

    asyncio.run(main())


def test_a_worker_whose_intake_is_not_attached_yet_gets_the_submit_and_its_abort_over_ray() -> None:
    async def main() -> None:
        cluster, gs = fake_cluster(decode=1)
        w = cluster.workers
        w["prefill-0"].early_attaches = 10**9  # every attach call comes before its subscription
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        stream = backend.generate(make_request("b"))
        first = asyncio.ensure_future(anext(stream))
        await wait_until(lambda: "b" in w["prefill-0"].submitted)
        assert [args[0].request_id for args in cluster.prefill["prefill-0"].called("submit")] == ["b"]
        assert not w["prefill-0"].routes
        w["prefill-0"].emit("b", (10,), 0)
        await asyncio.wait_for(first, 5)
        await stream.aclose()  # the abort follows its submit over Ray: over the intake it could overtake it
        await wait_until(lambda: cluster.prefill["prefill-0"].called("abort") == [("b", 0)])
        assert not w["prefill-0"].intake
        await wait_until(lambda: not gs.table)

    asyncio.run(main())


def test_an_attach_that_came_before_its_subscription_is_asked_again() -> None:
    async def main() -> None:
        cluster, _ = fake_cluster(decode=1)
        w = cluster.workers
        w["prefill-0"].early_attaches = 1
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        streams = backend.streams()
        await wait_until(lambda: len(w["prefill-0"].routes) == 1)  # asked again by the next tend, under the same route
        assert len(cluster.prefill["prefill-0"].called("attach_intake")) == 2
        await wait_until(lambda: streams.send("prefill-0", Abort("probe")))
        stream = backend.generate(make_request("a"))
        first = asyncio.ensure_future(anext(stream))
        await wait_until(lambda: "a" in w["prefill-0"].submitted)
        assert not cluster.prefill["prefill-0"].called("submit")
        w["prefill-0"].emit("a", (10,), 0, finish="length")
        assert (await asyncio.wait_for(first, 5)).token_ids == (10,)

    asyncio.run(main())
