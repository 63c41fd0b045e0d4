"""The tests of tests/unit/test_law_history.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import sharp_llama
from scipy import stats

from gate.constraints import bind
from gate.constraints.interface import ResponseFormat
from gate.drafts.model import ModelDraft
from gate.drafts.prompt_lookup import PromptLookupDraft
from gate.core.law import Law
from gate.exactness.oracle import TargetOracle
from gate.runners.transformers import TransformersRunner
from unit.test_law_history import engine, tok  # noqa: F401 - shared with that tier
from unit.test_law_history import CPU, JSON_FORMAT, SCHEMA, V


def sharp(seed: int, noise: float = 0.0) -> torch.nn.Module:
    """A tiny Llama over the byte vocabulary with its head scaled (random logits get shape)."""
    return sharp_llama(noise, seed, scale=15.0, vocab_size=V)


@pytest.fixture(scope="module")
def target():
    return sharp(0)


@pytest.fixture(scope="module")
def runner(target, tok, engine):
    # the noisy model proposes under the law (q masked and penalised too); prompt lookup proposes
    # point masses that know nothing of the grammar: its forbidden proposals must be rejected
    drafts = {"noisy": ModelDraft("noisy", "model", sharp(1, noise=0.4), 3, CPU),
              "lookup": PromptLookupDraft("lookup", 3, 3, V, CPU)}
    return TransformersRunner(target, {tok.eos_token_id}, CPU, drafts=drafts, grammars=engine)


def _valid(tok, output_ids):
    text = tok.decode(output_ids, skip_special_tokens=True)
    return json.loads(text)


@pytest.mark.parametrize("law", [Law("greedy", 0.0), Law("greedy-rp", 0.0, repetition_penalty=1.3, presence_penalty=0.4)])
def test_greedy_speculative_output_equals_the_fallback_under_penalties_and_a_grammar(runner, tok, law):
    prompt = tok.encode('data: {"id": 7, "ok": true} -> ')
    outs = {}
    for name in [None, *runner.drafts]:
        draft = runner.drafts[name] if name else None
        g = runner._generate(prompt, draft, bind(law, len(prompt), JSON_FORMAT, runner.grammars), 40, torch.Generator().manual_seed(0))
        outs[name] = g.output_ids
        if name:
            assert sum(g.step_proposed) > 0
    assert len({tuple(v) for v in outs.values()}) == 1, outs
    out = outs[None]
    if out[-1] == tok.eos_token_id:  # finished inside the budget: the text is the schema's
        import jsonschema

        jsonschema.validate(_valid(tok, out), SCHEMA)


def test_unconstrained_and_constrained_outputs_differ(runner, tok):
    prompt = tok.encode("abc")
    free = runner._generate(prompt, None, Law("g", 0.0).bind(len(prompt)), 12, None).output_ids
    fixed = runner._generate(prompt, None, bind(Law("g", 0.0), len(prompt), JSON_FORMAT, runner.grammars), 12, None).output_ids
    assert tok.decode(fixed).startswith("{") and free != fixed


def test_sampled_first_steps_follow_the_law_with_penalties_and_grammar(runner, tok, target):
    """The token after the first proposal is where the history inside a block matters: the
    committed tokens of many first steps, grouped by their first token, must follow the
    target's law given that token (G-test), and the first token the law at the prompt."""
    law = Law("t1-rp", 1.0, repetition_penalty=1.8, frequency_penalty=0.8, min_p=0.01)
    fmt = ResponseFormat.of_choices(["aab", "abb", "aba", "bab", "bba", "baa", "aaa"])
    prompt = tok.encode("ab ab")
    steps = runner.first_steps(prompt, "noisy", law, 800, seed=3, response_format=fmt)
    oracle = TargetOracle(target, CPU)
    checked = 0
    for prefix in [(), *{tuple(s[:1]) for s in steps if len(s) > 1}]:
        nexts = [s[len(prefix)] for s in steps if len(s) > len(prefix) and tuple(s[:len(prefix)]) == prefix]
        if len(nexts) < 100:
            continue
        bound = bind(law, len(prompt), fmt, runner.grammars)
        p = oracle.target_probs(prompt + list(prefix) + [0], len(prompt), bound)[-1]
        support = (p > 0).nonzero().flatten()
        counts = torch.bincount(torch.tensor(nexts), minlength=V)[support].double()
        assert int(counts.sum()) == len(nexts), "a token outside the law's support was committed"
        expected = p[support].double() * len(nexts)
        if support.numel() > 1:
            _, pvalue = stats.power_divergence(counts.numpy(), expected.numpy() / expected.sum().item() * len(nexts),
                                               lambda_="log-likelihood")
            assert pvalue > 1e-4, (prefix, counts.tolist(), expected.tolist())
        checked += 1
    assert checked >= 2


@pytest.fixture(scope="module")
def byte_model_dir(tmp_path_factory, target, tok):
    path = tmp_path_factory.mktemp("byte-target")
    target.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_gate_exactness_applies_a_samples_lines_grammar_and_penalties(tmp_path, byte_model_dir, prompts_file, runner, tok):
    """Greedy samples made under a choice grammar and a repetition penalty pass `gate exactness`
    when the line declares both, fail when it declares another grammar, and a malformed
    response_format is bad input naming the line."""
    from click.testing import CliRunner
    from conftest import tiny_policy, write_policy

    from gate.cli import cli

    law = Law("g", 0.0, repetition_penalty=1.5)
    fmt = {"type": "choice", "choices": ["abba", "baab", "bbbb"]}
    lines = []
    for text in ["ab", "ba", "aa"]:
        prompt = tok.encode(text)
        out = runner._generate(prompt, None, bind(law, len(prompt), ResponseFormat.of_choices(fmt["choices"]), runner.grammars),
                               8, None).output_ids
        assert tok.decode(out, skip_special_tokens=True) in fmt["choices"]
        lines.append({"prompt_ids": prompt, "output_ids": out, "law": {"temperature": 0, "repetition_penalty": 1.5},
                      "response_format": fmt})
    rule = "  - id: exact\n    kind: exactness\n    tie_tolerance: 0.0\n"
    policy = write_policy(tmp_path, tiny_policy(byte_model_dir, prompts_file, rule))

    def run(rows):
        samples = tmp_path / "samples.jsonl"
        samples.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
        result = CliRunner().invoke(cli, ["exactness", str(policy), str(samples), "--json", str(tmp_path / "r.json")])
        return result, (json.loads((tmp_path / "r.json").read_text()) if result.exit_code != 2 else None)

    result, report = run(lines)
    assert result.exit_code == 0, result.output
    assert [o["status"] for o in report["outcomes"]] == ["pass"]
    # the same outputs declared under a grammar that forbids them: every line diverges at once
    other = [dict(x, response_format={"type": "regex", "pattern": "[0-9]+"}) for x in lines]
    result, report = run(other)
    assert result.exit_code == 1 and [o["status"] for o in report["outcomes"]] == ["fail"], result.output
    bad = lines[:1] + [dict(lines[1], response_format={"type": "choice", "choices": []})]
    result, _ = run(bad)
    assert result.exit_code == 2 and "samples.jsonl:2: response_format:" in result.output and "Traceback" not in result.output
