"""What a runner's engines cannot apply as gate does, against a plan's laws and constraints:
one check for every runner kind (Runner.law_refusals), raised at the YAML path that
declares the law field or the constraint."""

from __future__ import annotations

from typing import Any

from gate.core.errors import PolicyValueError
from gate.records import FALLBACK


def law_path(policy: Any, i: int) -> str:
    """The YAML path of the policy's i-th law: `law` for a single mapping, `law[i]` for a list."""
    return f"law[{i}]" if isinstance(getattr(policy, "law", None), list) else "law"


def constraint_path(plan: Any, fmt: Any) -> str:
    """The YAML path that declares constraint `fmt`: workload.constraints[j] for the first
    entry whose prompts carry it (a prompt's `constraint` label is the entry's name, or
    'prompt' for the entry that runs each prompt's own format), else workload.path (a
    prompt's own response_format in the prompt file, without workload.constraints)."""
    for j, entry in enumerate(getattr(plan.policy.workload, "constraints", None) or []):
        name = entry if entry == "prompt" else getattr(entry, "name", None)
        if name is not None and any(p.constraint == name and p.response_format == fmt for p in plan.workload.prompts):
            return f"workload.constraints[{j}]"
    return "workload.path"


def check_law_refusals(plan: Any, runner: Any) -> None:
    """Raise PolicyValueError at law[i].<field> (law.<field> for a single law), or at the
    constraint's path (constraint_path), for the first declared law, constraint, or law
    under a constraint that `runner` (a gate.runners.interface.Runner) cannot apply as gate
    does (Runner.law_refusals: the sources are there)."""
    formats: dict[Any, str] = {}  # constraint -> the first prompt that has it
    for p in plan.workload.prompts:
        fmt = p.response_format
        if fmt is not None and fmt not in formats:
            formats[fmt] = p.id
    names = [FALLBACK, *plan.policy.drafts]
    for i, law in enumerate(plan.laws):
        for fmt in [None, *formats]:
            for name in names:
                try:
                    found = runner.law_refusals(name, law, fmt)
                except (KeyError, ValueError):  # a runner name without an endpoint: validated elsewhere
                    continue
                for field, why in found:
                    if field == "constraint":
                        raise PolicyValueError(
                            constraint_path(plan, fmt),
                            f"runner {name!r} cannot apply the {fmt.describe()} constraint of prompt "
                            f"{formats[fmt]!r} as gate does: {why}",
                        )
                    under = (
                        f" under the {fmt.describe()} constraint of prompt {formats[fmt]!r}" if fmt is not None else ""
                    )
                    raise PolicyValueError(
                        f"{law_path(plan.policy, i)}.{field}",
                        f"runner {name!r} cannot apply {field} of law {law.name!r}{under} as gate does: {why}",
                    )
