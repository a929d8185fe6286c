"""A decode engine's thread can yield the CPU to prompts (``engine.cpu.decode_niceness``), and only that thread; a
prefill engine's goes first (``engine.cpu.prefill_niceness``); engine threads carry OS names."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from tetriserve.common.config import ClusterConfig
from tetriserve.engine.cores import name_os_thread, set_thread_niceness


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux behaviour")
def test_lowering_an_engine_threads_priority_leaves_the_rest_of_the_process_alone() -> None:
    before = os.getpriority(os.PRIO_PROCESS, 0)
    seen: dict[str, int] = {}

    def engine_thread() -> None:
        assert set_thread_niceness(before + 5)
        seen["engine"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    assert seen["engine"] == before + 5
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


def test_prefill_engines_go_first_by_default_and_the_setting_is_checked() -> None:
    assert ClusterConfig().engine.cpu.prefill_niceness == -10
    assert ClusterConfig.load(overrides={"engine": {"cpu": {"prefill_niceness": 0}}}).engine.cpu.prefill_niceness == 0
    for bad in (-21, 20):
        with pytest.raises(ValueError, match="prefill_niceness"):
            ClusterConfig.load(overrides={"engine": {"cpu": {"prefill_niceness": bad}}})


def test_decode_engines_yield_by_default_and_the_setting_is_checked() -> None:
    assert ClusterConfig().engine.cpu.decode_niceness == 5
    assert ClusterConfig.load(overrides={"engine": {"cpu": {"decode_niceness": 0}}}).engine.cpu.decode_niceness == 0
    with pytest.raises(ValueError, match="decode_niceness"):
        ClusterConfig.load(overrides={"engine": {"cpu": {"decode_niceness": 20}}})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names in /proc are Linux behaviour")
def test_engine_threads_carry_an_os_name() -> None:
    seen: dict[str, str] = {}

    def engine_thread() -> None:
        name_os_thread("eng-decode-0-and-more")
        seen["comm"] = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()

    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    assert seen["comm"] == "eng-decode-0-an"  # Linux keeps 15 bytes
