"""The YAML policy: pydantic models (single source of the schema) and loading with line numbers."""

from gate.policy.model import Policy
from gate.policy.reader import LoadedPolicy, load_policy

__all__ = ["LoadedPolicy", "Policy", "load_policy"]
