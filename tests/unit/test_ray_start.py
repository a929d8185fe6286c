"""Starting a local Ray node (``control_plane/launcher.init_ray``): a start that misses Ray's fixed registration
wait is cleaned up and tried once more; any other error, and every error joining a cluster, reaches the caller."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import ray

from tetriserve.common.config import ClusterConfig
from tetriserve.control_plane import launcher

TIMED_OUT = Exception("The current node timed out during startup. This could happen because ...")


class Starts:
    """``ray.init`` that raises the given errors in turn, then succeeds; a failing start leaves a child process
    behind, as a half-started node leaves its GCS and raylet."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.left: list[subprocess.Popen[bytes]] = []

    def __call__(self, **_: Any) -> Any:
        self.calls += 1
        if self.errors:
            self.left.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
            raise self.errors.pop(0)
        return {"dashboard_url": ""}


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> Any:
    def use(*errors: Exception) -> Starts:
        fake = Starts(*errors)
        monkeypatch.setattr(ray, "init", fake)
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        monkeypatch.setattr(ray, "shutdown", lambda: None)
        return fake

    return use


def test_a_start_that_timed_out_is_cleaned_up_and_tried_once_more(starts: Any) -> None:
    fake = starts(TIMED_OUT)
    assert launcher.init_ray(ClusterConfig()) == (True, "")
    assert fake.calls == 2
    assert fake.left[0].wait(timeout=10) != 0  # what the failed start left was killed


def test_a_second_time_out_reaches_the_caller(starts: Any) -> None:
    fake = starts(TIMED_OUT, TIMED_OUT)
    with pytest.raises(Exception, match="timed out during startup"):
        launcher.init_ray(ClusterConfig())
    assert fake.calls == 2
    for child in fake.left:
        child.kill()


@pytest.mark.parametrize("address", [None, "10.0.0.1:6379"])
def test_other_errors_and_joining_errors_are_not_retried(starts: Any, address: str | None) -> None:
    error = TIMED_OUT if address else RuntimeError("port in use")
    fake = starts(error)
    with pytest.raises(type(error)):
        launcher.init_ray(ClusterConfig(ray_address=address))
    assert fake.calls == 1
    fake.left[0].kill()
