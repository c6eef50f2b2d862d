"""Reproductions of published studies; each module runs as ``python -m rsketch.experiments.<name>``."""
