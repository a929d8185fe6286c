"""The trained predictor in a process of its own (``length_predictor/process.py``): same answers as in the
worker's process, the child goes with the worker, a dead child fails one batch and comes back."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.fakes import tokenizer_dir, wait_until
from tests.stalling_predictor import StallsOnce
from tests.unit.test_length_predictor_served import mixed_batch, random_artifact
from tetriserve.common.length import PredictInput
from tetriserve.length_predictor import process
from tetriserve.length_predictor.baseline import BucketQuantilePredictor
from tetriserve.length_predictor.process import PredictorProcessError, ProcessPredictor
from tetriserve.length_predictor.served import TrainedPredictor


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_artifact(tmp_path_factory.mktemp("art"))


def trained(artifact: Path) -> TrainedPredictor:
    return TrainedPredictor(artifact, tokenizer_dir(), max_batch=4, pad_cutoff=16, encoder_dtype="float32")


def light() -> BucketQuantilePredictor:
    """For the tests of the child's life (start, death, restart, pickling): an inner predictor whose child is
    up in well under a second, where the trained one loads torch and MiniLM for seconds."""
    return BucketQuantilePredictor()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_answers_as_the_predictor_does_in_the_workers_process(artifact: Path) -> None:
    local, remote = trained(artifact), ProcessPredictor(trained(artifact), niceness=3)
    try:
        remote.warm_up()
        pid = remote.pid
        assert pid is not None and pid != os.getpid()
        assert os.getpriority(os.PRIO_PROCESS, pid) >= 3  # the whole child runs at the predictor's niceness
        batch = mixed_batch()
        assert remote.predict(batch) == local.predict(batch)
        assert remote.predict([]) == []
        assert remote.pid == pid  # one child serves every batch
        item = PredictInput(10, 100, (5, 6, 7))
        assert remote.instant(item) == local.instant(item)  # answered here, no model, no round trip
        for _ in range(5):
            remote.observe(10, 42)
            local.observe(10, 42)
        assert remote.instant(item) == local.instant(item)  # the local fallback learns from observe
    finally:
        remote.close()
    wait_until(lambda: not alive(pid), timeout=10, what="the child to exit")


def test_observe_never_waits_for_a_batch_in_flight() -> None:
    """``observe`` runs on the worker's event loop: it must not wait while the predictor thread holds the child."""
    remote = ProcessPredictor(light())
    try:
        remote.warm_up()
        with remote._lock:  # as while a batch is being computed
            done = threading.Event()
            threading.Thread(target=lambda: (remote.observe(10, 42), done.set()), daemon=True).start()
            assert done.wait(5)
        assert len(remote.predict([PredictInput(10, 100, (5, 6, 7))])) == 1  # the observation went with it
        assert not remote._observed
    finally:
        remote.close()


def test_a_child_that_cannot_start_does_not_fail_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "START_TIMEOUT_S", 0.01)  # no Python child starts that fast
    remote = ProcessPredictor(light())
    try:
        remote.warm_up()  # logged, not raised
        assert remote.pid is None
        with pytest.raises(PredictorProcessError):
            remote.predict([PredictInput(3, 64, (5, 6, 7))])  # the PredictionQueue answers with ``instant``
        assert (
            remote.instant(PredictInput(3, 64, (5, 6, 7))).source
            == remote.inner.instant(PredictInput(3, 64, (5, 6, 7))).source
        )
    finally:
        remote.close()


def test_pickles_without_its_child() -> None:
    remote = ProcessPredictor(light(), niceness=0)
    try:
        remote.warm_up()
        copy = pickle.loads(pickle.dumps(remote))
        assert copy.pid is None and copy.name == remote.name and copy.niceness == 0
    finally:
        remote.close()


def test_a_dead_child_fails_its_batch_and_is_started_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The child killed while a batch is in it (its predictor stalls in it): that batch fails, the next one goes to
    a new child."""
    monkeypatch.setattr(process, "RESTART_BACKOFF_S", 0.0)
    marker = tmp_path / "predicting"
    remote = ProcessPredictor(StallsOnce(marker))
    failed: list[BaseException] = []

    def in_flight() -> None:
        try:
            remote.predict([PredictInput(3, 64, (5, 6, 7))])
        except PredictorProcessError as exc:
            failed.append(exc)

    try:
        remote.warm_up()
        first = remote.pid
        assert first is not None
        batch = threading.Thread(target=in_flight)
        batch.start()
        wait_until(marker.exists, timeout=30, what="the batch in the child")
        os.kill(first, signal.SIGKILL)
        batch.join(30)
        assert not batch.is_alive() and len(failed) == 1, failed
        estimates = remote.predict([PredictInput(3, 64, (5, 6, 7))])
        assert len(estimates) == 1 and remote.pid not in (None, first)
    finally:
        remote.close()


def test_a_child_found_dead_between_batches_is_started_again_without_failing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process, "RESTART_BACKOFF_S", 0.0)
    remote = ProcessPredictor(light())
    try:
        remote.warm_up()
        first = remote.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: not alive(first), timeout=10, what="the child's death")
        estimates = remote.predict([PredictInput(3, 64, (5, 6, 7))])
        assert len(estimates) == 1 and remote.pid not in (None, first)
    finally:
        remote.close()


def test_restarts_are_spaced() -> None:
    remote = ProcessPredictor(light())
    try:
        remote.warm_up()
        os.kill(remote.pid or 0, signal.SIGKILL)
        with pytest.raises(PredictorProcessError):
            remote.predict([PredictInput(3, 64, (5, 6, 7))])
        with pytest.raises(PredictorProcessError, match="restarts in"):
            remote.predict([PredictInput(3, 64, (5, 6, 7))])  # within RESTART_BACKOFF_S of the last start
    finally:
        remote.close()


def test_the_child_exits_when_the_worker_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the process that owns the predictor (a worker killed by Ray) takes its child along."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(
        f"""
        import pathlib, time
        from tetriserve.length_predictor.baseline import BucketQuantilePredictor
        from tetriserve.length_predictor.process import ProcessPredictor
        p = ProcessPredictor(BucketQuantilePredictor())
        p.warm_up()
        pathlib.Path({str(pid_file)!r}).write_text(str(p.pid))
        time.sleep(600)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", timeout=120, what="the child")
        child = int(pid_file.read_text())
        assert alive(child)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child)
    finally:
        owner.kill()
