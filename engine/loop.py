"""The one loop that owns a vLLM engine: typed commands in, per-step outputs out.

    asyncio side (the worker actor)                engine thread (the only one that touches vLLM)
    add(AddRequest) / abort(id) / call(fn) ──▶ command queue ──▶ apply, then engine.step()
          ▲                                                          │
          └── one call_soon_threadsafe per step: every Delta that ◀──┘
              no inline sink took, to its sink (a callback or an asyncio.Queue)

A request added with an ``inline`` sink is offered its deltas on the engine thread first (``Output``): the decode
worker sends its tokens to their stream from there, and its event loop wakes only for a finish. With
``stream_interval_s`` (the config's ``engine.stream_interval_ms``) the thread hands deltas over at most that often
instead, each request's tokens of the steps between joined into one delta; a finish goes at once.

Nothing else reads or writes the engine's vLLM scheduler while it steps:
``call(fn)`` runs ``fn(scheduler)`` on the engine thread between two steps and resolves an asyncio future with the
result (policy changes, slice marks). Every 50 ms of steps (and on going idle) the thread publishes ``snapshot``, a
frozen ``EngineSnapshot`` the actor reads without locks (stats, and whatever ``snapshot_fn`` derives from the
scheduler, e.g. the decode batch's views). The stats include the time spent inside steps by two clocks, wall and
the engine thread's own CPU time, and its context switches inside them: where the CPU time falls well below the
wall, the engine slept (waited for its process's interpreter lock) or was preempted (waited for a core), and
the voluntary and involuntary switches tell which (``python benchmarks/diagnostics/engine_steps.py --scenario
saturation`` reports them per step in service; ``benchmarks/diagnostics/engine_thread_contention.py`` times a step
beside a second thread offline).

A decode engine's thread may run at a lower CPU priority (``niceness``, the config's ``engine.cpu.decode_niceness``,
default 5; 0: equal shares), so that where it shares cores with a prefill engine and the front door the prompts
go first; a prefill engine's thread runs at a higher one (``engine.cpu.prefill_niceness``, default -10, where the
process may raise its priority), ahead of the front door, Ray and the predictor on the cores it shares with them.
The thread carries an OS name, ``eng-<worker id>`` (``top -H``, ``/proc/<pid>/task/*/comm``). On CPUs each engine
posts on the machine's core board whether it is stepping (``cores``, engine/cores.py), and a borrowing engine sets
its thread count before each step from what the board leaves idle and the size of its running batch
(``borrowed_steps`` counts the steps it took with borrowed cores).

The engine thread blocks on the command queue when idle and never waits on a transfer: requests whose KV is
still in flight sit in vLLM's WAITING_FOR_REMOTE_KVS state while the loop keeps stepping (with a 1 ms pause after
a step that produced nothing and ran no model, so a waiting engine does not burn a core; a step that computed a
prompt's chunk, which also produces nothing, is followed at once by the next). It also steps while vLLM's
scheduler still holds finished requests: the blocks of one aborted while its KV was in flight are freed only in a
later step. A failure inside ``step`` finishes every in-flight request with an error and the loop goes on serving
new ones. An ``add``'s ``on_added`` hook runs on the engine thread once vLLM has the request (the decode
worker's tracing spans time the wait for the step in progress with it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from tetriserve.engine.core_layout import ENGINE_THREAD_PREFIX, pin_engine_thread
from tetriserve.engine.cores import MIN_IDLE_CORES, CoreShare, name_os_thread, set_engine_threads, set_thread_niceness
from tetriserve.engine.loop_messages import (
    AbortRequest,
    AddRequest,
    CallScheduler,
    Command,
    Delta,
    EngineSnapshot,
    Hook,
    InlineSink,
    Output,
    Sink,
    Stop,
    delta_of,
    dispatch,
    merged,
)
from tetriserve.engine.stats import EngineStats, StatsCollector, stat_loggers, thread_switches
from tetriserve.engine.vllm_engine import EngineCore, GeneratedOutput, open_engine

if TYPE_CHECKING:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

logger = logging.getLogger(__name__)

SNAPSHOT_INTERVAL_S = 0.05  # a busy engine publishes its snapshot at most this often (and when it goes idle)

T = TypeVar("T")  # what a function run on the scheduler returns


class EngineLoop:
    def __init__(
        self,
        engine_args: EngineArgs,
        name: str,
        cores: CoreShare | None = None,
        stream_interval_s: float = 0.0,
    ) -> None:
        """A worker's role gives the engine its ``snapshot_fn`` and niceness (``take_role``). ``stream_interval_s``:
        hand deltas over at most this often (0: after every step); finishes go at once."""
        self.name = name
        self.collector = StatsCollector()
        self.engine = open_engine(engine_args, stat_loggers(self.collector))
        cache = self.engine.vllm_config.cache_config
        self.collector.set_capacity(cache.num_gpu_blocks or 0, cache.block_size)
        self._computed = False  # whether the last step ran the model (vLLM's ``model_executed``, see _note_steps)
        self._note_steps(self.engine.engine_core.engine_core)
        self._snapshot_fn: Callable[[Scheduler], object] | None = None
        self._niceness = 0  # the engine thread's, as take_role last set it
        self._cores = cores
        self._threads = cores.own if cores is not None else 0  # what the engine thread steps with now
        self._commands: queue.Queue[Command] = queue.Queue()
        self._outputs: dict[str, Output] = {}  # engine thread's view of live requests
        self.stream_interval_s = stream_interval_s  # may be changed while the engine runs
        self._held: list[tuple[Output, Delta]] = []  # deltas not handed over yet (stream interval)
        self._held_since = 0.0
        self._live = 0  # actor's count of requests added and not finished
        self.steps = 0  # engine steps taken (the liveness heartbeat's proof that the engine moves)
        self.busy_s = 0.0  # seconds spent inside engine steps (published as the stats' ``step_seconds``)
        self.busy_cpu_s = 0.0  # the engine thread's own CPU time inside them (below busy_s: it waited)
        self.borrowed_steps = 0  # steps taken with more threads than the engine's own (borrowed cores)
        self.step_sleeps = self.step_preemptions = 0  # the engine thread's context switches inside steps
        self._stale = False
        self._published = 0.0
        self.snapshot = EngineSnapshot(self.collector.snapshot(), self._extra())
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"engine-{name}", daemon=True)
        self._thread.start()

    # -- actor side --------------------------------------------------------------------
    def stats(self) -> EngineStats:
        return self.snapshot.stats

    @property
    def in_flight(self) -> int:
        return self._live

    def add(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        sink: Sink,
        on_added: Hook | None = None,
        inline: InlineSink | None = None,
    ) -> None:
        """Start a request; ``sink`` gets its deltas on this event loop, the last with ``finish_reason``.
        ``on_added`` runs on the engine thread once vLLM has the request (between two steps): it must be quick.
        ``inline``: the engine thread's own sink for the deltas before the finish (``Output``)."""
        from vllm.sampling_params import RequestOutputKind

        loop = asyncio.get_running_loop()
        params.output_kind = RequestOutputKind.DELTA
        self._live += 1

        def counted(delta: Delta) -> None:
            if delta.finish_reason is not None:
                self._live -= 1
            sink(delta)

        self._commands.put(
            AddRequest(request_id, tuple(prompt_token_ids), params, Output(loop, counted, inline), on_added)
        )

    async def generate(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[Delta]:
        """Run one request; yields deltas until one carries ``finish_reason``. Closing early aborts it."""
        deltas: asyncio.Queue[Delta] = asyncio.Queue()
        self.add(request_id, prompt_token_ids, params, deltas.put_nowait)
        finished = False
        try:
            while not finished:
                delta = await deltas.get()
                finished = delta.finish_reason is not None
                yield delta
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(AbortRequest(request_id))

    async def call(self, fn: Callable[[Scheduler], T]) -> T:
        """Run ``fn(scheduler)`` on the engine thread between two steps; returns (or raises) what it did."""
        return await asyncio.wrap_future(self._schedule(fn))

    def call_now(self, fn: Callable[[Scheduler], T], timeout_s: float = 60.0) -> T:
        """``call`` for synchronous callers that are not on the engine's event loop (start-up, tests)."""
        return self._schedule(fn).result(timeout_s)

    def take_role(
        self,
        install: Callable[[Scheduler], object],
        snapshot_fn: Callable[[Scheduler], object],
        niceness: int,
        borrows: bool,
        borrow_min_batch: int = 0,
        borrow_min_idle: float = MIN_IDLE_CORES,
        cores: frozenset[int] | None = None,
    ) -> None:
        """Give the engine to a worker role (at start, and at a flip, with the engine idle): on the engine
        thread, between steps, ``install(scheduler)`` makes the scheduler the role's, and the thread takes the
        role's niceness and ``cores`` (its role's in the machine's ``CoreLayout``; None: where it is); the
        role's ``snapshot_fn`` and core borrowing (for steps of at least ``borrow_min_batch`` running requests,
        while the rest of the machine leaves ``borrow_min_idle`` cores idle) apply from the next step."""

        def switch(scheduler: Scheduler) -> None:
            install(scheduler)
            self._snapshot_fn = snapshot_fn
            if niceness != self._niceness:
                if set_thread_niceness(niceness):
                    self._niceness = niceness
                else:
                    why, left = "below the thread's own needs CAP_SYS_NICE", self._niceness
                    logger.warning("engine %s: no niceness %d (%s); it stays %d", self.name, niceness, why, left)
            pin_engine_thread(cores)
            if self._cores is not None:
                self._cores.set_borrows(borrows, borrow_min_batch, borrow_min_idle)
            self._publish()

        self.call_now(switch)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the engine thread (requests still in flight end with an error) and shut the engine down, so that
        another engine can start in this process (vLLM keeps its KV connector process-wide until then)."""
        self._commands.put(Stop())
        self._thread.join(timeout_s)
        self.engine.engine_core.shutdown()

    def _schedule(self, fn: Callable[[Scheduler], T]) -> concurrent.futures.Future[T]:
        result: concurrent.futures.Future[T] = concurrent.futures.Future()
        call: CallScheduler[T] = CallScheduler(fn, result)
        self._commands.put(call)
        return result

    def scheduler(self) -> Scheduler:
        """The engine's vLLM scheduler, for code that runs *on the engine thread* (``call``) and for tests."""
        return self.engine.engine_core.engine_core.scheduler

    # -- engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        name_os_thread(f"{ENGINE_THREAD_PREFIX}{self.name}")
        while not self._stopped:  # daemon thread: lives as long as the worker process, or until ``close``
            if self._has_work():
                self._drain(block=False)
            else:  # idle: say so before waiting for work, not after
                self._emit([], force=True)
                if self._cores is not None:
                    self._cores.stepping(False)
                if self._stale:  # vLLM reports stats only from steps; an idle engine holds nothing
                    self._stale = False
                    self.collector.mark_idle()
                    self._publish()
                self._drain(block=True)
            if self._has_work() and not self._stopped:
                self._step_once()

    def _has_work(self) -> bool:
        """Requests to step, or finished ones whose blocks vLLM frees only in a later step (one aborted
        while its KV load was pending is freed once the connector reports the load over)."""
        return bool(self.engine.has_unfinished_requests() or self.scheduler().has_requests())

    def _step_once(self) -> None:
        if self._cores is not None:
            self._cores.stepping(True)
            threads = self._cores.threads(len(self.scheduler().running))
            if threads != self._threads:
                set_engine_threads(threads)
                self._threads = threads
            if threads > self._cores.own:
                self.borrowed_steps += 1
        self.steps += 1
        switches = thread_switches()
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            outputs = self.engine.step()
        except Exception as exc:  # engine bug: fail what is in flight, keep serving
            logger.exception("engine %s: step failed", self.name)
            self._fail_all(f"engine step failed: {exc}")
            return
        finally:
            self.busy_s += time.perf_counter() - started
            self.busy_cpu_s += time.thread_time() - cpu
            slept, preempted = thread_switches()
            self.step_sleeps += slept - switches[0]
            self.step_preemptions += preempted - switches[1]
        self._stale = True
        batch = [d for d in (self._delta(out) for out in outputs) if d is not None]
        if time.monotonic() - self._published >= SNAPSHOT_INTERVAL_S:
            self._publish()
        self._emit(batch)
        if not outputs and not self._computed:  # nothing to compute, only KV in flight: do not spin
            time.sleep(0.001)

    def _note_steps(self, core: EngineCore) -> None:
        """Keep what vLLM's in-process client drops: whether each step ran the model (it passes the flag only
        to ``EngineCore.post_step``), so that a step that computed a prompt's chunk is not taken for a wait."""
        post_step = core.post_step

        def noted(model_executed: bool) -> None:
            self._computed = model_executed
            post_step(model_executed)

        core.post_step = noted

    def _publish(self) -> None:
        self._published = time.monotonic()
        snap = self.collector.snapshot()
        usage = self._block_pool_usage()
        stats = replace(
            snap,
            kv_usage=snap.kv_usage if usage is None else usage,
            steps=self.steps,
            step_seconds=self.busy_s,
            step_cpu_seconds=self.busy_cpu_s,
            borrowed_steps=self.borrowed_steps,
            step_sleeps=self.step_sleeps,
            step_preemptions=self.step_preemptions,
        )
        self.snapshot = EngineSnapshot(stats, self._extra())

    def _extra(self) -> object:
        if self._snapshot_fn is None:
            return None
        try:
            return self._snapshot_fn(self.scheduler())
        except Exception:
            logger.exception("engine %s: snapshot failed", self.name)
            return None

    def _block_pool_usage(self) -> float | None:
        try:
            return float(self.scheduler().kv_cache_manager.block_pool.get_usage())
        except AttributeError:
            return None

    def _emit(self, batch: list[tuple[Output, Delta]], force: bool = False) -> None:
        """Hand ``batch`` over now, or hold it with the deltas not handed over yet until ``stream_interval_s``
        has passed since the oldest of them; a finish (or ``force``) hands over everything held, in order."""
        if batch:
            if not self._held:
                self._held_since = time.monotonic()
            self._held.extend(batch)
        if not self._held:
            return
        if (
            force
            or self.stream_interval_s <= 0
            or time.monotonic() - self._held_since >= self.stream_interval_s
            or any(delta.finish_reason is not None for _, delta in batch)
        ):
            held, self._held = self._held, []
            dispatch(merged(held) if self.stream_interval_s > 0 else held)  # 0: one step's, one per request

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        out: list[tuple[Output, Delta]] = []
        while True:
            self._apply(cmd, out)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
        self._emit(out, force=True)  # after what was held: an abort's delta is its request's last

    def _apply(self, cmd: Command, out: list[tuple[Output, Delta]]) -> None:
        if isinstance(cmd, AddRequest):
            self._outputs[cmd.request_id] = cmd.output
            try:
                prompt: TokensPrompt = {"prompt_token_ids": list(cmd.prompt_token_ids)}
                self.engine.add_request(cmd.request_id, prompt, cmd.params)
            except Exception as exc:  # rejected by vLLM's own validation
                del self._outputs[cmd.request_id]
                out.append((cmd.output, Delta((), "error", f"{type(exc).__name__}: {exc}")))
                return
            if cmd.on_added is not None:
                try:
                    cmd.on_added()
                except Exception:  # a hook's bug must not stop the engine thread
                    logger.exception("engine %s: on_added of %s failed", self.name, cmd.request_id)
        elif isinstance(cmd, Stop):
            self._stopped = True
            self._fail_all("engine closed")
        elif isinstance(cmd, AbortRequest):
            output = self._outputs.pop(cmd.request_id, None)
            if output is not None:
                self.engine.abort_request([cmd.request_id])
                out.append((output, Delta((), "abort")))
        else:
            try:
                cmd.result.set_result(cmd.fn(self.scheduler()))
            except Exception as exc:
                cmd.result.set_exception(exc)

    def _delta(self, out: GeneratedOutput) -> tuple[Output, Delta] | None:
        output = self._outputs.get(out.request_id)
        if output is None:
            return None
        if out.finished:
            del self._outputs[out.request_id]
        return output, delta_of(out)

    def _fail_all(self, error: str) -> None:
        ids = list(self._outputs)
        self._emit([(self._outputs.pop(rid), Delta((), "error", error)) for rid in ids], force=True)
        try:
            self.engine.abort_request(ids)
        except Exception:
            logger.exception("engine %s: abort after failure also failed", self.name)
