"""Workload sources, one module each: jsonl.py, mt_bench.py, sharegpt.py, humaneval.py;
context.py builds context-length sweeps from their text."""
