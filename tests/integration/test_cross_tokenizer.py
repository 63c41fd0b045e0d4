"""The tests of tests/unit/test_cross_tokenizer.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from conftest import VOCAB, sharp_llama, tiny_llama, tiny_tokenizer, tiny_policy, write_policy
from gate.drafts.cross_tokenizer import CrossTokenizerDraft, Translator
from gate.core.law import law_probs
from gate.measure.bill import BillInputs, DraftBill, bill_lines
from gate.measure.kv import KVFormat, cache_model
from gate.measure.tokenizers import compare_tokenizers
from gate.runners.transformers import TransformersRunner
from unit.test_cross_tokenizer import permutation, permuted_tokenizer, piece_tokenizer  # noqa: F401 - shared with that tier
from unit.test_cross_tokenizer import GREEDY, PROMPTS, SAMPLED


def permuted_draft_model(target: torch.nn.Module) -> torch.nn.Module:
    """The target with its embedding and head rows moved to the permuted ids: the same law
    in the permuted vocabulary."""
    import copy

    perm = torch.tensor(permutation())
    model = copy.deepcopy(target)
    with torch.no_grad():
        for weight in (model.model.embed_tokens.weight, model.lm_head.weight):
            moved = torch.empty_like(weight)
            moved[perm] = weight
            weight.copy_(moved)
    return model


@pytest.fixture(scope="module")
def target():
    return sharp_llama(0)


def draft(kind: str, mapping: str, target: torch.nn.Module, gamma: int = 3) -> CrossTokenizerDraft:
    t_tok = tiny_tokenizer()
    if kind == "permuted":
        d_tok, model = permuted_tokenizer(), permuted_draft_model(target)
    else:
        d_tok = piece_tokenizer()
        model = tiny_llama(3, vocab_size=len(d_tok), num_hidden_layers=3, num_key_value_heads=1, bos_token_id=2,
                           eos_token_id=1, pad_token_id=0)
    translator = Translator(t_tok, d_tok, VOCAB, int(model.config.vocab_size))
    return CrossTokenizerDraft(kind, model, translator, mapping, gamma, torch.device("cpu"),
                               compare_tokenizers(kind, t_tok, d_tok))


def runner(target: torch.nn.Module, drafts: dict) -> TransformersRunner:
    return TransformersRunner(target, {2}, torch.device("cpu"), drafts=drafts)


@pytest.mark.parametrize("kind,mapping", [("permuted", "retokenize"), ("permuted", "shared_vocab"),
                                          ("pieces", "retokenize"), ("pieces", "shared_vocab")])
def test_greedy_output_equals_the_fallback_and_records_mapping(target, kind, mapping):
    d = draft(kind, mapping, target)
    r = runner(target, {"d": d})
    for prompt in PROMPTS:
        spec = r._generate(prompt, d, GREEDY, 16, None)
        base = r._generate(prompt, None, GREEDY, 16, None)
        assert spec.output_ids == base.output_ids
        steps = [i for i, n in enumerate(spec.step_draft_tokens) if n]
        assert steps and all(spec.step_mapping_ms[i] > 0 for i in steps)
        assert len(spec.step_mapping_ms) == len(spec.step_committed)
        assert not any(base.step_mapping_ms) and not any(base.step_draft_tokens)
        if kind == "permuted":  # the draft's law is the target's: every proposal accepted, nothing lost
            assert spec.step_accepted == spec.step_proposed
            assert sum(spec.step_proposed) == sum(spec.step_draft_tokens)
            assert sum(spec.step_accepted) > 0


@pytest.mark.parametrize("kind,mapping", [("pieces", "retokenize"), ("permuted", "shared_vocab"),
                                          ("pieces", "shared_vocab")])
def test_sampled_first_token_law_is_the_targets(target, kind, mapping):
    """Chi-square goodness of fit of the first committed token of 2000 independent
    speculative steps against the target's law there (categories with expected count < 5
    pooled); a fault such as a point mass verified as if q were the draft's own law would
    move mass by far more than this test's noise."""
    d = draft(kind, mapping, target)
    r = runner(target, {"d": d})
    prompt = PROMPTS[0]
    n = 2000
    steps = r.first_steps(prompt, "d", SAMPLED, n, seed=11)
    with torch.no_grad():
        p = law_probs(target(torch.tensor([prompt])).logits[0, -1], SAMPLED).numpy().astype(float)
    p = p / p.sum()  # float32 probabilities sum to 1 within ~1e-7; chisquare wants equal totals to 1.5e-8
    counts = np.bincount([s[0] for s in steps], minlength=len(p)).astype(float)
    expected = p * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
        exp = exp * obs.sum() / exp.sum()
    assert big.sum() >= 10  # the law has real shape
    assert stats.chisquare(obs, exp).pvalue > 1e-3
    assert max(len(s) for s in steps) > 1 or kind == "pieces"  # proposals were accepted


def test_teacher_forced_overlap_on_target_positions(target):
    ids = PROMPTS[0] + [10, 11, 12, 13]
    start = len(PROMPTS[0])
    with torch.no_grad():
        p = law_probs(target(torch.tensor([ids[:-1]])).logits[0, start - 1:], SAMPLED)
    shared = draft("permuted", "shared_vocab", target).teacher_forced(ids, start, SAMPLED, VOCAB)
    assert shared.shape == (4, VOCAB)
    support = torch.tensor([2] + list(range(4, VOCAB)))  # the words and the end of text (EOS maps to EOS)
    restricted = p[:, support] / p[:, support].sum(-1, keepdim=True)
    assert torch.allclose(shared[:, support], restricted, atol=1e-5)  # the law restricted to the shared tokens
    assert shared[:, [0, 1, 3]].sum() == 0
    point = draft("pieces", "retokenize", target)
    q1, q2 = point.teacher_forced(ids, start, SAMPLED, VOCAB), point.teacher_forced(ids, start, SAMPLED, VOCAB)
    assert torch.equal(q1, q2)  # seeded: reproducible
    assert set(q1.sum(-1).tolist()) <= {0.0, 1.0}  # one-hot rows (or none)
    greedy = draft("permuted", "retokenize", target).teacher_forced(ids, start, GREEDY, VOCAB)
    assert torch.equal(greedy.argmax(-1), p.argmax(-1))  # the same law: the draft's first proposal is the target's argmax


def test_bill_counts_the_drafts_own_cache_and_vocabulary():
    target_cfg, draft_cfg = tiny_llama(0).config, tiny_llama(3, vocab_size=300, num_hidden_layers=3,
                                                                 num_key_value_heads=1).config
    fmt = KVFormat("float32")
    common = dict(runner="d", target_cache=cache_model(target_cfg, fmt), target_weight_bytes=0, vocab_size=VOCAB,
                  context_tokens=10, num_draft_tokens=4, draft_cache=cache_model(draft_cfg, fmt))
    lines = {x.name: x for x in bill_lines(BillInputs(**common, draft_vocab_size=300))}
    assert lines["draft logits"].bytes == 4 * 300 * 4
    assert lines["draft KV cache"].bytes == 2 * 3 * 1 * 8 * 4 * 10  # its own layers, KV heads, head_dim
    assert lines["draft KV cache"].bytes != lines["target KV cache"].bytes
    assert "draft logits" not in {x.name for x in bill_lines(BillInputs(**common))}  # other kinds: unchanged
    assert DraftBill("d", 4, None, 0, False).vocab_size is None


@pytest.fixture(scope="module")
def cross_dirs(tmp_path_factory):
    """(target dir, piece-tokenizer draft dir): model directories with different tokenizers."""
    t = tmp_path_factory.mktemp("ct-target")
    sharp_llama(0).save_pretrained(t)
    tiny_tokenizer().save_pretrained(t)
    d = tmp_path_factory.mktemp("ct-draft")
    tok = piece_tokenizer()
    tiny_llama(3, vocab_size=len(tok), num_hidden_layers=3, num_key_value_heads=1).save_pretrained(d)
    tok.save_pretrained(d)
    return t, d


def _policy(tmp_path, cross_dirs, prompts_file, kind: str, rules: str = ""):
    target_dir, draft_dir = cross_dirs
    drafts = f"  other:\n    kind: {kind}\n    model: {draft_dir}\n    num_draft_tokens: 3\n"
    return write_policy(tmp_path, tiny_policy(target_dir, prompts_file, drafts=drafts, extra_rules=rules, max_new_tokens=8,
                                              laws="  - temperature: 0\n  - temperature: 0.7\n"))


def test_validate_accepts_cross_tokenizer_and_refuses_kind_model_with_a_hint(tmp_path, cross_dirs, prompts_file):
    from gate.core.errors import InputError
    from gate.plan.validate import validate

    plan = validate(_policy(tmp_path, cross_dirs, prompts_file, "cross_tokenizer"))
    assert list(plan.policy.drafts) == ["other"]
    with pytest.raises(InputError) as e:
        validate(_policy(tmp_path, cross_dirs, prompts_file, "model"))
    text = str(e.value)
    assert "drafts.other.model" in text and "tokenizer mismatch" in text and "kind: cross_tokenizer" in text


def test_bad_mapping_names_the_yaml_path(tmp_path, cross_dirs, prompts_file):
    from gate.core.errors import InputError
    from gate.plan.validate import validate

    path = _policy(tmp_path, cross_dirs, prompts_file, "cross_tokenizer")
    path.write_text(path.read_text().replace("    num_draft_tokens: 3\n", "    num_draft_tokens: 3\n    mapping: words\n", 1))
    with pytest.raises(InputError) as e:
        validate(path)
    assert "drafts.other.mapping" in str(e.value)


def test_check_end_to_end_reports_tokenizers_and_mapping(tmp_path, cross_dirs, prompts_file):
    from gate.commands.check import check

    rules = ("  - id: mapping-share\n    metric: mapping_share\n    aggregation: mean\n    comparison: '<='\n    threshold: 100%\n"
             "  - id: lost\n    metric: translation_loss\n    aggregation: pooled\n    comparison: '<='\n    threshold: 100%\n"
             "  - id: mapping-ms\n    metric: mapping_ms\n    aggregation: p99\n    comparison: '<='\n    threshold: 10 s\n")
    path = _policy(tmp_path, cross_dirs, prompts_file, "cross_tokenizer", rules)
    report = check(path, warmup=False).report
    m = report.measurements
    assert not m.failures, m.failures
    assert [c.draft for c in m.tokenizers] == ["other"] and not m.tokenizers[0].identical
    status = {o.rule_id: o.status for o in report.outcomes}
    assert status["lost"] == "pass"  # counters: no clock
    # timed metrics: a contended machine (three helpers on two cores) makes them inconclusive, never failed
    assert status["mapping-share"] in ("pass", "inconclusive") and status["mapping-ms"] in ("pass", "inconclusive")
    reqs = [r for r in m.requests if r.draft == "other"]
    assert reqs and all(r.step_mapping_ms and r.mapping_ms > 0 for r in reqs)
    bill = next(b for b in m.bills if b.draft == "other")
    assert next(x for x in bill.lines if x.name == "draft logits").bytes == 3 * len(piece_tokenizer()) * 4
    assert {o.draft for o in m.overlaps} == {"other"}
    from gate.report.registry import get as report_format

    for name in ("console", "markdown", "html"):
        text = report_format(name)().render(report)
        assert "Cross-tokenizer drafts" in text and "mapping" in text and "first differing id" in text


