"""Statistical efficiency of sketched least squares (Raskutti & Mahoney 2016) and its bounds."""

from rsketch.stats.efficiency import EfficiencyResult, efficiency

__all__ = ["EfficiencyResult", "efficiency"]
