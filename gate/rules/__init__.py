"""What decides: rule evaluation over measurement records (samples, aggregation, comparison,
outcomes); nothing here runs a model. The exactness tests and their verdict live in
gate.exactness (stats, verdict), which the exactness rule kind calls.

Modules, lowest first (tests/unit/test_layers.py checks there is no import cycle): status
(Status, TestVerdict, Role, Change), selection (Selection, aggregate, swept runners), samples
(how each metric of gate.metrics.catalogue is sampled: SAMPLES, checked against METRICS at
import), resampling (the units a bootstrap resamples), confidence (intervals and their
decision), outcome (Outcome), scope (scope keys, load points in scope), power (under-powered
plans), kinds/ (the rule kinds: interface, registry, one module per kind), evaluate (every
rule through its kind, waivers, exit code).
"""
