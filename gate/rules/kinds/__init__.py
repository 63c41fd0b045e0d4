"""Rule kinds: what a policy rule's `kind:` names and how each kind is decided.

interface (RuleKind, Settings), registry (BUILTIN, one function per question), and one
module per kind: metric (a Lighthouse-style assertion on a gate.metrics.catalogue metric), exactness
(the declared law's tests). A new rule kind is one module declaring `KIND` plus its line in
registry.BUILTIN.
"""
