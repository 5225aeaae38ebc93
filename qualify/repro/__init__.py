"""Reproducibility: build twice, read both image archives, explain every difference."""
