"""A model-backed length predictor in a process of its own beside the prefill worker (TetriInfer §3.3.2).

TetriInfer's parallel mode runs the predictor while the request is prefilled. In
the worker's own process the trained predictor (MiniLM, Python-heavy at these
sizes) shares the interpreter lock with the engine's stepping thread and the
actor's event loop: with one stream of 20-word prompts the prefill's compute
takes a median 12.99 ms with the prediction in a thread against 10.25 ms with it
in a process of its own (``python benchmarks/diagnostics/ttft_spans.py --requests 40 --variant process=
--variant thread=--config benchmarks/diagnostics/predictor_in_thread.yaml``). Here the model runs in a
child process with its own interpreter and its own niceness; the worker keeps what costs nothing::

    ProcessPredictor(inner)                      child: python -m tetriserve.length_predictor.process
      warm_up()  ── starts the child, sends inner ─▶  inner.warm_up() ─▶ Reply   (loads MiniLM once)
      predict(b) ── Predict(b) ───────────────▶  inner.predict(b) ─▶ Reply(estimates | error)
      observe()  ── Observe, with the next batch ▶  inner.observe()      (and the local copy's, at once)
      instant()  ── local: ``inner.instant`` (the fallback's quantiles, kept warm by ``observe``)

Messages are typed and pickled over a socket pair. The child exits when the
worker goes (its end of the socket reads EOF), whatever killed the worker. A
child that dies fails the batch it was computing (the ``PredictionQueue``
answers those requests with ``instant``) and is started again on the next
``predict``, at most once per ``RESTART_BACKOFF_S``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

from tetriserve.common.length import LengthEstimate, LengthPredictor, PredictInput

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
RESTART_BACKOFF_S = 10.0
START_TIMEOUT_S = 300.0  # the child loads torch and MiniLM before it says it is ready
PREDICT_TIMEOUT_S = 60.0  # a batch that takes longer: the child is taken as stuck, killed and started again
OBSERVED_MAX = 10_000  # finished requests' lengths waiting for the next batch (the oldest go first)


@dataclass(frozen=True)
class Predict:
    items: tuple[PredictInput, ...]
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class Observe:
    prompt_len: int
    output_len: int
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class Reply:
    estimates: tuple[LengthEstimate, ...] = ()
    error: str | None = None
    version: int = PROTOCOL_VERSION


class PredictorProcessError(RuntimeError):
    """The predictor's process is gone or answered with an error."""


class ProcessPredictor:
    """``LengthPredictor`` whose ``predict`` runs ``inner.predict`` in a child process (niceness ``niceness``)."""

    def __init__(self, inner: LengthPredictor, niceness: int = 0) -> None:
        self.inner = inner
        self.name = inner.name
        self.niceness = niceness
        self._init_runtime()

    # -- pickling (the launcher ships it to the worker): the child is started where it is used -------------------
    def _init_runtime(self) -> None:
        self._lock = threading.Lock()  # one exchange at a time on the socket
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._started_at = -RESTART_BACKOFF_S
        self._closed = False
        self._observed: deque[Observe] = deque(maxlen=OBSERVED_MAX)  # for the child, sent with the next batch

    def __getstate__(self) -> dict[str, object]:
        return {"inner": self.inner, "name": self.name, "niceness": self.niceness}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # -- the protocol --------------------------------------------------------------------
    def warm_up(self) -> None:
        """Start the child and load the model there; a failure is logged, never raised (the worker starts
        anyway, and ``predict`` tries again; until then the instant estimate answers)."""
        with self._lock:
            try:
                self._ensure()
            except PredictorProcessError:
                logger.exception("length predictor %s: its process did not start", self.name)

    def predict(self, batch: Sequence[PredictInput]) -> list[LengthEstimate]:
        if not batch:
            return []
        with self._lock:
            reply = self._exchange(Predict(tuple(batch)))
        if reply.error is not None:
            raise PredictorProcessError(f"length predictor process: {reply.error}")
        return list(reply.estimates)

    def instant(self, item: PredictInput) -> LengthEstimate:
        return self.inner.instant(item)

    def observe(self, prompt_len: int, output_len: int) -> None:
        """Called on the worker's event loop: never waits for the child (a batch may be running); the child gets
        it with the next ``predict``."""
        self.inner.observe(prompt_len, output_len)  # ``instant`` answers from this copy
        self._observed.append(Observe(prompt_len, output_len))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop(None)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # -- the child -----------------------------------------------------------------------
    def _exchange(self, message: Predict) -> Reply:
        conn = self._ensure()
        try:
            while self._observed:
                conn.send(self._observed.popleft())
            conn.send(message)
            if not conn.poll(PREDICT_TIMEOUT_S):
                self._drop(f"no answer in {PREDICT_TIMEOUT_S:g} s", kill=True)
                raise PredictorProcessError(f"the length predictor's process did not answer in {PREDICT_TIMEOUT_S:g} s")
            reply = conn.recv()
        except (OSError, EOFError) as exc:
            self._drop(f"{type(exc).__name__}")
            raise PredictorProcessError("the length predictor's process is gone") from exc
        if not isinstance(reply, Reply):
            self._drop("it answered out of protocol")
            raise PredictorProcessError(f"the length predictor's process answered {type(reply).__name__}")
        return reply

    def _ensure(self) -> Connection:
        if self._closed:
            raise PredictorProcessError("the length predictor is closed")
        if self._conn is not None and self._proc is not None and self._proc.poll() is None:
            return self._conn
        if self._proc is not None:
            self._drop(f"exited with {self._proc.poll()}")
        wait = self._started_at + RESTART_BACKOFF_S - time.monotonic()
        if wait > 0:
            raise PredictorProcessError(f"the length predictor's process restarts in {wait:.1f} s")
        self._started_at = time.monotonic()
        ours, theirs = socket.socketpair()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, "-m", __name__, str(theirs.fileno()), str(self.niceness)]
        try:
            self._proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        t0 = time.perf_counter()
        try:
            self._conn.send(self.inner)
            if not self._conn.poll(START_TIMEOUT_S):
                raise PredictorProcessError(f"the length predictor's process did not start in {START_TIMEOUT_S:g} s")
            reply = self._conn.recv()
        except (OSError, EOFError) as exc:
            self._drop(type(exc).__name__)
            raise PredictorProcessError("the length predictor's process exited while starting") from exc
        except PredictorProcessError:
            self._drop("it did not start")
            raise
        if not isinstance(reply, Reply) or reply.error is not None:
            self._drop("it failed to start")
            raise PredictorProcessError(f"the length predictor's process failed to start: {reply}")
        logger.info(
            "length predictor %s: process %d ready in %.2f s", self.name, self._proc.pid, time.perf_counter() - t0
        )
        return self._conn

    def _drop(self, why: str | None, kill: bool = False) -> None:
        """Close the socket and reap the child (it exits on the socket's EOF; a stuck one is killed)."""
        conn, proc, self._conn, self._proc = self._conn, self._proc, None, None
        if conn is not None:
            conn.close()
        if proc is None:
            return
        if why is not None:
            logger.warning("length predictor %s: process %d lost (%s)", self.name, proc.pid, why)
        if kill:
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(fd: int, niceness: int) -> None:
    """The child: load the predictor the parent sent, answer until the parent hangs up."""
    if niceness:  # absolute: the parent's thread that started it may be niced already (the prediction thread)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, max(niceness, os.getpriority(os.PRIO_PROCESS, 0)))
    conn = Connection(fd)
    predictor: LengthPredictor = conn.recv()  # what the parent sends: its ``inner``
    try:
        predictor.warm_up()
        conn.send(Reply())
    except Exception as exc:
        conn.send(Reply(error=f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the worker is gone
        if isinstance(message, Observe):
            predictor.observe(message.prompt_len, message.output_len)
            continue
        try:
            if isinstance(message, Predict):
                reply = Reply(tuple(predictor.predict(message.items)))
            else:
                reply = Reply(error=f"unknown message {type(message).__name__}")
        except Exception as exc:
            logging.getLogger(__name__).exception("length prediction failed in the predictor's process")
            reply = Reply(error=f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except OSError:
            return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # by its package name, so that its messages pickle as the worker's classes, not ``__main__``'s
    from tetriserve.length_predictor.process import serve as serve_here

    serve_here(int(sys.argv[1]), int(sys.argv[2]))
