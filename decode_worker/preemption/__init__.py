"""Preemption on the decode engine: victim order (CacheOpt §3.4) and swap vs recompute (CacheOpt §3.5)."""

from tetriserve.decode_worker.preemption.order import ORDER_NAMES, PreemptionOrder, make_preemption_order
from tetriserve.decode_worker.preemption.strategy import MODES, PreemptionCosts, PreemptionStrategy

__all__ = ["MODES", "ORDER_NAMES", "PreemptionCosts", "PreemptionOrder", "PreemptionStrategy", "make_preemption_order"]
