"""The policy's JSON Schema, generated from the pydantic models (schemas/policy.schema.json)."""

from __future__ import annotations

from typing import Any

from gate.policy.model import Policy


def policy_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a version-1 policy."""
    schema = Policy.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gate policy"
    return schema
