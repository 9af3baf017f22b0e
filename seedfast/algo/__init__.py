"""The math of docs/algorithms.md in plain torch: advantages, losses and gates, GRSD modulation.

    from seedfast.algo import advantage, grsd, losses
"""

from . import advantage, aggregation, grsd, losses

__all__ = ["advantage", "aggregation", "grsd", "losses"]
