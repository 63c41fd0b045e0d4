"""gate: a release gate for speculative-decoding drafts.

Data flows one way: policy -> plan -> load + runners (drafts, workloads, the target
oracle) -> measure -> records -> rules -> report.
"""

__version__ = "0.1.0"
