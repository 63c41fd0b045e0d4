"""The law-part faults (tests/unit/test_law_mutations.py) on the teacher-forced logits of a tiny
random-weight Llama and its early exit: the correct sampler passes under each fault's law and
every fault fails."""

from __future__ import annotations

import pytest

import gate.exactness.stats as ex
from integration.test_exactness import tiny_tables  # noqa: F401 - the fixture
from reference import Fault
from unit.test_exactness import explain
from unit.test_law_mutations import NEW_FAULTS, gate_decision, table_prompt, tiny_setup


@pytest.mark.parametrize("fault", [Fault.NONE, *NEW_FAULTS], ids=lambda f: f.value)
def test_gate_on_tiny_model_tables(tiny_tables, fault):
    target, draft = tiny_tables
    faults = NEW_FAULTS if fault is Fault.NONE else [fault]
    for f in faults:  # the correct sampler under each fault's law
        law, grammar = tiny_setup(f)
        verdict, tests = gate_decision(target, draft, law, fault, table_prompt(target), grammar, seed=500)
        if fault is Fault.NONE:
            assert verdict == ex.PASS, (law.name, explain(tests))
        else:
            assert verdict == ex.FAIL, explain(tests)
