"""Measurements: pure functions on tensors and records wherever possible."""
