"""gate: a release gate for speculative-decoding drafts.

Data flows one way: policy -> plan -> loop (runners at the load points, with drafts,
workloads, constraints, models) -> records -> rules (with the metrics catalogue) -> analysis
-> report; commands are the functions behind cli.py, core the primitives everyone imports.
"""

__version__ = "0.1.0"
