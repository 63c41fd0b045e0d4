"""Engines: how tokens are produced and timed (transformers in-process today); stop strings."""
