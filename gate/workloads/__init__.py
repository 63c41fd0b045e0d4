"""Workload sources, one module each: jsonl.py, mt_bench.py, sharegpt.py, humaneval.py, each
registering itself in registry.py (the policy's workload.source is assembled from it);
interface.py holds Prompt, WorkloadSource and the seeded selection; context.py builds
context-length sweeps from their text."""
