"""Runners: the system under test, one module per kind (gate.runners.registry). A runner
takes planned requests (gate.core.requests.Request) and an offered load (gate.load) and returns a
timed stream per request; what it can give besides (per-step counters, CPU accounting,
first steps) it declares in its Capabilities. The target scoring tokens for overlap and
exactness checks is apart from it: gate.exactness.oracle.TargetOracle."""
