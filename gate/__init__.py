"""gate: a release gate for speculative-decoding drafts.

Data flows one way: policy -> plan -> measure (engines, drafts, workloads) -> records
-> rules -> report.
"""

__version__ = "0.1.0"
