"""What every report format says of the target's identity (gate.loop.identity measures it):
its classification against the pinned release and the drift of its law along the workload."""

from __future__ import annotations

import math
from typing import Any

from gate.records import FailureStage


def identity_lines(m: Any) -> list[str]:
    """What every report says of the target's identity: nothing without a pinned release (and
    no identity failure); else its classification with the figures and, per law, the drift
    along the workload (mean TV, mean KL, top-1 agreement over the positions measured)."""
    ident = getattr(m, "target_identity", None)
    failed = [f for f in getattr(m, "failures", []) if f.stage in (FailureStage.IDENTITY, FailureStage.DRIFT)]
    out: list[str] = []
    if ident is not None and ident.release is not None:
        c = ident.release
        out.append(f"target identity: {c.classification.upper()} against the release ({c.release}): {c.reason}")
        if c.differences:
            out.append("target identity: differs in " + "; ".join(c.differences))
    elif failed:
        out.append("target identity: could not be compared with the release (see the failed measurements)")
    drift = getattr(m, "drift", [])
    for law in dict.fromkeys(d.law for d in drift):
        rows = [d for d in drift if d.law == law]
        tv = [v for d in rows for v in d.tv]
        kl = [math.inf if v is None else v for d in rows for v in d.kl]
        top1 = [bool(v) for d in rows for v in d.top1]
        if not tv:
            continue
        infinite = sum(math.isinf(v) for v in kl)
        kl_mean = sum(kl) / len(kl)
        out.append(
            f"target drift against the release ({law}, {len(tv)} positions of {len(rows)} continuations): TV mean "
            f"{sum(tv) / len(tv):.4g} (max {max(tv):.4g}), KL(target || release) mean "
            + (
                f"{kl_mean:.4g} nats"
                if not math.isinf(kl_mean)
                else f"inf ({infinite} position{'s' if infinite != 1 else ''} infinite)"
            )
            + f", top-1 agreement {sum(top1) / len(top1):.4g}"
        )
    return out
