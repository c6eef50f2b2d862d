"""Statistical efficiency of sketched least squares (Raskutti & Mahoney 2016) and its bounds."""

from rsketch.stats._bounds import Bound, SketchBounds, bounds
from rsketch.stats._efficiency import EfficiencyResult, efficiency

__all__ = ["Bound", "EfficiencyResult", "SketchBounds", "bounds", "efficiency"]
