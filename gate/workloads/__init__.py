"""Workload sources, one module each: mt_bench.py, jsonl.py."""
