"""A one-machine service on CPU gives its decode engines cores of their own (engine/core_layout.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tetriserve.common.config import ClusterConfig
from tetriserve.engine.core_layout import (
    LAYOUT_ENV,
    CoreLayout,
    RoleCpu,
    building_on,
    claim_decode_cores,
    pin_engine_thread,
    plan_layout,
)

linux_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or not Path("/proc/self/task").is_dir(), reason="Linux CPU affinity"
)


def on_a_thread(fn: Callable[[], None]) -> None:
    """Run ``fn`` on a thread of its own (affinity is per thread) and wait for it."""
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def test_the_decode_engines_take_the_lowest_cores_and_leave_at_least_one() -> None:
    assert plan_layout({0, 1}, 1, 1) == CoreLayout(frozenset({0}), frozenset({0, 1}))
    assert plan_layout({0, 1, 2, 3}, 2, 1) == CoreLayout(frozenset({0, 1}), frozenset({0, 1, 2, 3}))
    assert plan_layout({0, 1, 2, 3}, 1, 2) == CoreLayout(frozenset({0, 1}), frozenset({0, 1, 2, 3}))
    assert plan_layout({7, 2, 5}, 1, 1) == CoreLayout(frozenset({2}), frozenset({2, 5, 7}))
    assert plan_layout({0, 1}, 1, 1).rest == {1}  # type: ignore[union-attr]
    assert plan_layout({0, 1}, 2, 1) is None  # nothing left for the front door and Ray
    assert plan_layout({0}, 1, 1) is None
    assert plan_layout({0, 1, 2}, 0, 1) is None


def test_the_layout_travels_in_the_environment_and_a_bad_one_is_ignored() -> None:
    layout = CoreLayout(frozenset({0, 1}), frozenset({0, 1, 2, 3}))
    assert CoreLayout.from_env({LAYOUT_ENV: layout.to_env()}) == layout
    assert CoreLayout.from_env({}) is None
    for bad in ("0;", "x;0,1", "0,1;0,1", "2;0,1", "0;1;2", ";0,1"):
        assert CoreLayout.from_env({LAYOUT_ENV: bad}) is None, bad


def test_with_its_own_cores_a_decode_engine_neither_yields_nor_borrows_and_prefill_runs_on_the_rest(
    tmp_path: Path,
) -> None:
    cfg = ClusterConfig().engine.cpu
    layout = CoreLayout(frozenset({0}), frozenset({0, 1}))
    shared = RoleCpu(cfg.decode_niceness, cfg.borrow_idle_cores, None)
    assert RoleCpu.decode(cfg, None, None) == shared
    assert RoleCpu.decode(cfg, layout, None) == RoleCpu(shared.niceness, shared.borrows, frozenset({0, 1}))
    claim = claim_decode_cores(layout, 1, tmp_path)
    assert RoleCpu.decode(cfg, layout, claim) == RoleCpu(0, False, frozenset({0}))
    assert RoleCpu.prefill(cfg, None) == RoleCpu(cfg.prefill_niceness, False, None)
    assert RoleCpu.prefill(cfg, layout) == RoleCpu(cfg.prefill_niceness, False, frozenset({1}))
    raised = cfg.model_copy(update={"prefill_niceness": -5})
    assert RoleCpu.prefill(raised, layout) == RoleCpu(-5, False, frozenset({1}))


def test_sharing_its_cores_a_decode_engine_goes_first_there_and_only_all_brings_the_prefill_engines(
    tmp_path: Path,
) -> None:
    layout = CoreLayout(frozenset({0}), frozenset({0, 1}))
    claim = claim_decode_cores(layout, 1, tmp_path)
    base = ClusterConfig().engine.cpu
    assert base.share_decode_cores == "none"
    for shared, decode_niceness, prefill_cores in (("none", 0, {1}), ("rest", -20, {1}), ("all", -20, {0, 1})):
        cfg = base.model_copy(update={"share_decode_cores": shared})
        assert RoleCpu.decode(cfg, layout, claim) == RoleCpu(decode_niceness, False, frozenset({0})), shared
        assert RoleCpu.prefill(cfg, layout) == RoleCpu(cfg.prefill_niceness, False, frozenset(prefill_cores)), shared
        assert RoleCpu.prefill(cfg, None) == RoleCpu(cfg.prefill_niceness, False, None)
    loaded = ClusterConfig.load(overrides={"engine.cpu.share_decode_cores": "rest"})
    assert loaded.engine.cpu.share_decode_cores == "rest"


def test_the_reservation_is_on_by_default_and_a_setting() -> None:
    assert ClusterConfig().engine.cpu.reserve_decode_cores is True
    loaded = ClusterConfig.load(overrides={"engine.cpu.reserve_decode_cores": False})
    assert loaded.engine.cpu.reserve_decode_cores is False


def test_shared_placement_turns_every_cpu_placement_trick_off() -> None:
    shared = ClusterConfig.load(overrides={"engine.cpu_placement": "shared"})
    placement = shared.engine.placement()
    assert (placement.reserve_decode_cores, placement.borrow_idle_cores, placement.share_decode_cores) == (
        False,
        False,
        "none",
    )
    assert (placement.decode_niceness, placement.prefill_niceness) == (0, 0)
    assert ClusterConfig().engine.placement() == ClusterConfig().engine.cpu  # auto: the settings as they are


def test_a_cpu_setting_at_its_old_place_is_refused_naming_the_new_one() -> None:
    with pytest.raises(ValueError, match=r"engine\.reserve_decode_cores is now engine\.cpu\.reserve_decode_cores"):
        ClusterConfig.load(overrides={"engine.reserve_decode_cores": False})


@linux_affinity
def test_an_engine_thread_moves_itself_and_only_itself() -> None:
    before = os.sched_getaffinity(0)
    one = frozenset({min(before)})
    seen: dict[str, set[int]] = {}

    def engine_thread() -> None:
        pin_engine_thread(one)
        seen["engine"] = os.sched_getaffinity(0)
        pin_engine_thread(None)  # no layout: stays where it is
        seen["after_none"] = os.sched_getaffinity(0)

    on_a_thread(engine_thread)
    assert seen == {"engine": set(one), "after_none": set(one)}
    assert os.sched_getaffinity(0) == before


_RESERVE = """
import json, os, subprocess, sys, threading
from tetriserve.engine.core_layout import (ENGINE_THREAD_PREFIX, building_on, pin_engine_thread,
                                          reserve_decode_cores, settle_on_rest)
from tetriserve.engine.cores import name_os_thread

def affinity(tid):
    return sorted(os.sched_getaffinity(tid))

layout = reserve_decode_cores(1, 1)
booting = affinity(0)
ray_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # as Ray's, at start
engines, done, up = {}, threading.Event(), threading.Semaphore(0)

def engine(name, cores):
    name_os_thread(ENGINE_THREAD_PREFIX + name)  # as the engine loop names its thread
    pin_engine_thread(cores)
    helper = threading.Thread(target=done.wait, daemon=True)  # e.g. an OMP thread the engine starts
    helper.start()
    engines[name] = threading.get_native_id()
    engines[name + "-helper"] = helper.native_id
    up.release()
    done.wait()

threads = [threading.Thread(target=engine, args=a, daemon=True) for a in (("decode", layout.decode),
                                                                          ("shared", layout.every))]
other = threading.Thread(target=done.wait, daemon=True)  # a thread a worker's engine build starts
with building_on(layout.every):  # the builder (this thread) is no engine thread: it settles too
    for t in [*threads, other]:
        t.start()
for _ in threads:
    up.acquire()
moved = settle_on_rest(layout)
later = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                       capture_output=True, text=True, check=True).stdout
print(json.dumps({"decode_cores": sorted(layout.decode), "rest": sorted(layout.rest), "booting": booting,
                  "main": affinity(0), "other": affinity(other.native_id), "ray": affinity(ray_process.pid),
                  **{name: affinity(tid) for name, tid in engines.items()},
                  "later": json.loads(later), "moved": moved, "env": os.environ["TETRISERVE_CORE_LAYOUT"]}))
done.set()
ray_process.kill()
"""


@linux_affinity
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to reserve one")
def test_serve_starts_on_every_core_then_settles_all_but_the_engines_on_the_rest() -> None:
    env = {k: v for k, v in os.environ.items() if k != LAYOUT_ENV}
    env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU machine, whatever this one has
    out = subprocess.run([sys.executable, "-c", _RESERVE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    cores = sorted(os.sched_getaffinity(0))
    assert got["decode_cores"] == cores[:1] and got["rest"] == cores[1:]
    assert got["booting"] == cores  # the start runs on every core
    assert got["main"] == got["other"] == got["ray"] == cores[1:]  # then this process and its children settle
    assert got["decode"] == got["decode-helper"] == cores[:1]  # engine threads and their helpers stay
    assert got["shared"] == got["shared-helper"] == cores  # a decode engine without a claim shares every core
    assert got["later"] == cores[1:]  # a process started afterwards inherits the rest
    assert got["moved"] >= 3
    assert CoreLayout.from_env({LAYOUT_ENV: got["env"]}) == CoreLayout(frozenset(cores[:1]), frozenset(cores))


@linux_affinity
def test_an_engine_is_built_on_every_core_and_its_builder_goes_back() -> None:
    before = os.sched_getaffinity(0)
    one = frozenset({min(before)})
    seen: dict[str, set[int]] = {}

    def worker_thread() -> None:
        pin_engine_thread(one)  # a worker's thread on the rest
        with building_on(frozenset(before)):
            seen["building"] = os.sched_getaffinity(0)
        seen["after"] = os.sched_getaffinity(0)
        with building_on(None):
            seen["no_layout"] = os.sched_getaffinity(0)

    on_a_thread(worker_thread)
    assert seen == {"building": before, "after": set(one), "no_layout": set(one)}


def test_two_decode_engines_never_claim_the_same_cores_and_a_third_shares(tmp_path: Path) -> None:
    layout = CoreLayout(frozenset({0, 1}), frozenset({0, 1, 2}))
    first, second = claim_decode_cores(layout, 1, tmp_path), claim_decode_cores(layout, 1, tmp_path)
    assert first is not None and second is not None
    assert {first.cores, second.cores} == {frozenset({0}), frozenset({1})}
    assert claim_decode_cores(layout, 1, tmp_path) is None  # one a flip or scaling added: every core, shared
    first.release()
    again = claim_decode_cores(layout, 1, tmp_path)
    assert again is not None and again.cores == first.cores
    (tmp_path / "wide").mkdir()
    wide = claim_decode_cores(CoreLayout(frozenset({0, 1, 2, 3}), frozenset(range(6))), 2, tmp_path / "wide")
    assert wide is not None and wide.cores == {0, 1}  # threads_per_engine cores a claim


def test_a_dead_decode_engines_cores_are_claimed_again(tmp_path: Path) -> None:
    layout = CoreLayout(frozenset({0}), frozenset({0, 1}))
    code = (
        "import os, sys; from pathlib import Path; from tetriserve.engine.core_layout import CoreLayout, "
        "claim_decode_cores; c = claim_decode_cores(CoreLayout(frozenset({0}), frozenset({0, 1})), 1, "
        f"Path({str(tmp_path)!r})); print(c is not None, flush=True); os._exit(0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
    claim = claim_decode_cores(layout, 1, tmp_path)  # the OS dropped the dead process's lock
    assert claim is not None and claim.cores == {0}


def test_a_cpu_setting_under_shared_placement_is_refused_rather_than_ignored() -> None:
    with pytest.raises(ValueError, match=r"engine\.cpu\.decode_niceness: engine\.cpu applies under cpu_placement auto"):
        ClusterConfig.load(overrides={"engine.cpu_placement": "shared", "engine.cpu.decode_niceness": 7})
