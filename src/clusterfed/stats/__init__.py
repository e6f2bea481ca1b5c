"""Statistical tests used to compare models on per-sample losses."""

from clusterfed.stats.wilcoxon_support import support_pvalues, supports

__all__ = ["support_pvalues", "supports"]
