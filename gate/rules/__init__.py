"""Rule evaluation over measurement records: samples, aggregation, comparison, outcomes.
Every pass/fail decision of gate is made here; nothing here runs a model.

Modules, lowest first (each imports only those before it; tests/unit/test_layers.py checks there
is no import cycle): status (Status, TestVerdict, Role, Change), selection (Selection,
aggregate), samples (how each metric of gate.metrics.catalogue is sampled: SAMPLES, checked against
METRICS at import), units (resampling units), confidence (intervals and their decision),
outcome (Outcome), scope (scope keys, load points in scope), exactness_tests (exactness tests,
Holm, verdicts), exactness (exactness rules), kinds/ (the rule kinds: interface, registry, one
module per kind), evaluate (every rule through its kind, waivers, exit code); power and
summary beside them.
"""
