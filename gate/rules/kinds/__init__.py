"""Rule kinds: what a policy rule's `kind:` names and how each kind is decided.

interface (RuleKind, Settings), registry (BUILTIN, one function per question), and one
module per kind: metric (an assertion on a gate.metrics.catalogue metric), exactness (the
declared law's tests, gate.exactness), envelope (the SLO load of a load.search) and
best_num_draft_tokens (the best K of a num_draft_tokens_sweep). A new rule kind is one module
declaring `KIND` plus its line in registry.BUILTIN.
"""
