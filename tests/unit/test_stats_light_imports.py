"""A front door unpickles every worker's ``stats()`` on its event loop: nothing in them may import vLLM (seconds
of imports that would stall the front door's first status and metrics calls past their timeouts)."""

from __future__ import annotations

import subprocess
import sys


def test_a_workers_stats_unpickle_without_importing_vllm() -> None:
    code = (
        "import pickle, sys\n"
        "from tetriserve.engine.stats import EngineStats\n"
        "from tetriserve.transport.kv_counters import KVCounters\n"
        "blob = pickle.dumps({'kv': KVCounters(), 'engine': EngineStats()})\n"
        "pickle.loads(blob)\n"
        "assert 'vllm' not in sys.modules, sorted(m for m in sys.modules if m.startswith('vllm'))[:5]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
