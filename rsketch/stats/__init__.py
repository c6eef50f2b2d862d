"""Statistical efficiency of sketched least squares (Raskutti & Mahoney 2016) and its bounds."""

from rsketch.stats.bounds import Bound, SketchBounds, bounds
from rsketch.stats.efficiency import EfficiencyResult, efficiency

__all__ = ["Bound", "EfficiencyResult", "SketchBounds", "bounds", "efficiency"]
