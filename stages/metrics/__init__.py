"""Evaluation metrics: pure functions over plain Python values."""
