"""Trained draft heads (gate.drafts.heads) on tiny random Llamas: heads trained in-process in
well under a second raise overlap over untrained ones; the runner hands the draft the hidden
state of the row that gave the last committed token; greedy output equals the fallback's;
the first committed token of a speculative step follows the target's law; the checkpoint
round-trips and refuses another backbone; the bill counts the heads alone; gate validate and
gate check run a heads draft end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import sharp_llama, tiny_llama, tiny_policy, tiny_tokenizer, write_policy
from scipy import stats

from gate.cli import cli
from gate.drafts import registry as draft_kinds
from gate.drafts.heads import (HEADER, KIND, HeadsDraft, MedusaHeads, base_identity, head_logits, load_heads,
                               output_head, read_header, save_checkpoint, teacher_states, train_heads)
from gate.drafts.interface import BuildContext
from gate.core.errors import PolicyValueError
from gate.core.law import Law, law_probs
from gate.measure.bill import bills_for
from gate.measure.kv import KVFormat, cache_model
from gate.measure.overlap import overlap
from gate.models.cache import forward
from gate.runners.transformers import TransformersRunner

CPU = torch.device("cpu")
GREEDY = Law("greedy", 0.0)
T1 = Law("t1", 1.0)
CYCLE = [5, 7, 9, 11, 13, 17, 19]
AT = "drafts.h.checkpoint"


def cycle_text(offset: int, length: int) -> list[int]:
    return [1] + (CYCLE[offset:] + CYCLE * (length // len(CYCLE) + 1))[:length]


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return sharp_llama().requires_grad_(False)


@pytest.fixture(scope="module")
def trained(target):
    """Three heads trained on the target's own greedy continuations of seven prompts (self-distillation)."""
    runner = TransformersRunner(target, set(), CPU)
    texts = []
    for i in range(len(CYCLE)):
        prompt = cycle_text(i, 12)
        texts.append(prompt + runner._generate(prompt, None, GREEDY, 48, None).output_ids)
    heads, training = train_heads(target, teacher_states(target, texts), 3, steps=300, batch_size=32, lr=3e-3, seed=0)
    return heads, training, texts


def test_hidden_states_are_the_lm_head_input(target):
    ids = torch.tensor([cycle_text(0, 10)])
    logits, hidden = forward(target, ids, hidden=True)
    assert hidden.shape == (1, 11, target.config.hidden_size)
    assert torch.allclose(target.lm_head(hidden), logits, atol=1e-5)
    kept, hidden_kept = forward(target, ids, None, 2, hidden=True)  # logits_to_keep: the kept rows only
    assert torch.allclose(hidden_kept, hidden[:, -2:]) and torch.allclose(kept, logits[:, -2:], atol=1e-5)
    assert torch.equal(forward(target, ids), logits)  # the plain return is unchanged


def test_untrained_heads_are_the_targets_next_token_head(target):
    hidden = torch.randn(4, target.config.hidden_size)
    logits = head_logits(MedusaHeads(3, target.config.hidden_size), target.lm_head, hidden)
    assert logits.shape == (3, 4, target.config.vocab_size)
    for k in range(3):  # W = 0, b = 0: h + SiLU(0) = h (Medusa's initialisation)
        assert torch.allclose(logits[k], target.lm_head(hidden))


def test_training_raises_every_heads_overlap_and_is_deterministic(target, trained):
    heads, training, texts = trained
    assert training.steps == 300 and training.wall_s < 30
    assert all(last < first for first, last in zip(training.first_loss, training.last_loss))
    ids = texts[3]
    with torch.no_grad():
        p = law_probs(forward(target, torch.tensor([ids[:-1]]))[0, 11:], T1)  # positions 12.. of ids
    means = {}
    for label, h in (("untrained", MedusaHeads(3, target.config.hidden_size)), ("trained", heads)):
        q = HeadsDraft("h", target, h, 3, CPU).teacher_forced_heads(ids, 12, T1, target.config.vocab_size)
        assert q.shape == (3, len(ids) - 12, target.config.vocab_size)
        means[label] = [float(overlap(p, q[j]).mean()) for j in range(3)]
    assert all(t > u + 0.2 for u, t in zip(means["untrained"], means["trained"])), means
    assert means["trained"][0] > 0.5, means
    # teacher_forced is head 1's row of teacher_forced_heads
    draft = HeadsDraft("h", target, heads, 3, CPU)
    assert torch.equal(draft.teacher_forced(ids, 12, T1, 96), draft.teacher_forced_heads(ids, 12, T1, 96)[0])
    again, _ = train_heads(target, teacher_states(target, texts), 3, steps=300, batch_size=32, lr=3e-3, seed=0)
    assert torch.equal(again.weight, heads.weight) and torch.equal(again.bias, heads.bias)


class Recording(HeadsDraft):
    """Records, at each proposal, the context and the hidden state the runner passed."""

    def start(self) -> None:
        super().start()
        self.seen: list[tuple[list[int], torch.Tensor]] = []

    def propose(self, context, n, law, generator):
        self.seen.append((list(context), self._hidden.clone()))
        return super().propose(context, n, law, generator)


def test_the_runner_passes_the_state_whose_logits_gave_the_last_token(target, trained):
    draft = Recording("h", target, trained[0], 3, CPU)
    runner = TransformersRunner(target, set(), CPU)
    out = runner._generate(cycle_text(2, 12), draft, Law("t", 0.8), 30, torch.Generator().manual_seed(1))
    assert len(draft.seen) == sum(n > 0 for n in out.step_proposed) == len(out.step_committed) - 2  # not the prefill, not the last token
    assert any(0 < a for a in out.step_accepted)
    for context, hidden in draft.seen:
        with torch.no_grad():
            _, full = forward(target, torch.tensor([context[:-1]]), hidden=True)
        assert torch.allclose(hidden, full[0, -1], atol=1e-4)  # row len(context) - 2: it predicted context[-1]


def test_greedy_output_equals_the_fallback_and_heads_are_accepted(target, trained):
    runner = TransformersRunner(target, set(), CPU)
    draft = HeadsDraft("h", target, trained[0], 3, CPU)
    for offset in (0, 4):
        prompt = cycle_text(offset, 12)
        fallback = runner._generate(prompt, None, GREEDY, 40, None)
        spec = runner._generate(prompt, draft, GREEDY, 40, None)
        assert spec.output_ids == fallback.output_ids
        assert spec.step_committed == [a + 1 for a in spec.step_accepted]
        assert sum(spec.step_accepted) >= 10, spec.step_accepted  # trained on these continuations
        assert max(spec.step_proposed) == 3 and spec.draft_kv_cache_bytes == 0


def _first_token_counts(runner, prompt, law, n, seed):
    steps = runner.first_steps(prompt, "h", law, n, seed)
    return np.bincount([s[0] for s in steps], minlength=96), steps


def _chisquare(counts, p, n):
    """Pearson's chi-square of counts against n * p, pooling categories expected under 5."""
    expected = n * p.numpy().astype(float)
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp * obs.sum() / exp.sum())


@pytest.mark.parametrize("law", [Law("t1-k8", 1.0, top_k=8), Law("t07", 0.7)])
def test_the_first_committed_token_follows_the_target_law(target, trained, law):
    runner = TransformersRunner(target, set(), CPU, drafts={"h": HeadsDraft("h", target, trained[0], 3, CPU)})
    # the position of a text the heads were trained on where head 1 agrees most with the target:
    # proposals are often accepted there, so acceptance and the residual are both exercised
    text = trained[2][1]
    with torch.no_grad():
        p_all = law_probs(forward(target, torch.tensor([text[:-1]]))[0, 11:], law)
    beta = overlap(p_all, runner.drafts["h"].teacher_forced(text, 12, law, 96))
    prompt = text[:12 + int(beta.argmax())]
    n = 4000
    counts, steps = _first_token_counts(runner, prompt, law, n, seed=7)
    with torch.no_grad():
        p = law_probs(forward(target, torch.tensor([prompt]))[0, -1], law)
    assert n // 4 < sum(len(s) > 1 for s in steps) < n - n // 10  # acceptance and the residual both exercised
    assert _chisquare(counts, p, n).pvalue > 1e-3
    # the same test rejects the draft's own law q_1 (the first proposal, before verification)
    draft = runner.drafts["h"]
    g = torch.Generator().manual_seed(7)
    draft.start()
    with torch.no_grad():
        _, hidden = forward(target, torch.tensor([prompt[:-1]]), hidden=True)
    draft.observe_target_hidden(hidden[0, -1])
    proposals = np.bincount([int(draft.propose(prompt, 1, law, g).tokens[0]) for _ in range(n)], minlength=96)
    assert _chisquare(proposals, p, n).pvalue < 1e-6


def test_checkpoint_round_trip_and_header(tmp_path, target, trained):
    heads = trained[0]
    folder = save_checkpoint(tmp_path / "ck", heads, base_identity(target, "sharp"), {"steps": 300})
    header = json.loads((folder / HEADER).read_text())
    assert header["format"] == "gate-heads" and header["version"] == 1 and header["head_type"] == "medusa1-resblock"
    assert (header["num_heads"], header["hidden_size"], header["vocab_size"]) == (3, 32, 96)
    assert header["lm_head"] == "target" and header["dtype"] == "float32" and header["training"] == {"steps": 300}
    assert header["base"]["model_type"] == "llama" and header["base"]["num_hidden_layers"] == 2
    loaded, read = load_heads(folder, target, AT)
    assert read == header and torch.equal(loaded.weight, heads.weight) and torch.equal(loaded.bias, heads.bias)
    assert not loaded.weight.requires_grad
    # the same checkpoint at a bfloat16 target: its lm_head's dtype (fingerprint not checked here)
    bf16 = sharp_llama().to(torch.bfloat16)
    assert load_heads(folder, bf16, AT, check_fingerprint=False)[0].weight.dtype == torch.bfloat16


def test_checkpoint_errors_name_the_yaml_path(tmp_path, target, trained):
    folder = save_checkpoint(tmp_path / "ck", trained[0], base_identity(target, "sharp"))
    with pytest.raises(PolicyValueError, match="another backbone: base fingerprint") as e:
        load_heads(folder, tiny_llama(1), AT)  # same config, other weights
    assert e.value.path == AT
    with pytest.raises(PolicyValueError, match="hidden_size is 32 in heads.json, 64"):
        load_heads(folder, tiny_llama(0, hidden_size=64), AT)
    with pytest.raises(PolicyValueError, match="no heads checkpoint folder"):
        read_header(tmp_path / "missing", AT)
    header = json.loads((folder / HEADER).read_text())
    (folder / HEADER).write_text(json.dumps({**header, "version": 2}))
    with pytest.raises(PolicyValueError, match="version 2; this gate reads version 1"):
        read_header(folder, AT)
    (folder / HEADER).write_text(json.dumps({**header, "num_heads": 4}))
    with pytest.raises(PolicyValueError, match=r"tensor 'weight' has shape \(3, 32, 32\), heads.json says \(4, 32, 32\)"):
        load_heads(folder, target, AT)
    (folder / HEADER).write_text("{not json")
    with pytest.raises(PolicyValueError, match="cannot read"):
        read_header(folder, AT)


def test_build_checks_num_draft_tokens_and_resolves_relative_paths(tmp_path, target, trained):
    save_checkpoint(tmp_path / "ck", trained[0], base_identity(target, "sharp"))
    spec = KIND.spec(kind="heads", checkpoint="ck", num_draft_tokens=3)
    ctx = BuildContext(target, tiny_tokenizer(), CPU, 96, "float32", tmp_path)
    built = draft_kinds.build_draft("h", spec, ctx)
    assert isinstance(built.draft, HeadsDraft) and built.draft.uses_target_hidden and built.info.kind == "heads"
    assert built.info.parameters == 3 * (32 * 32 + 32)
    with pytest.raises(PolicyValueError, match="has 3 heads") as e:
        draft_kinds.build_draft("h", KIND.spec(kind="heads", checkpoint="ck", num_draft_tokens=4), ctx)
    assert e.value.path == "drafts.h.num_draft_tokens"
    with pytest.raises(PolicyValueError, match="another backbone: hidden_size"):
        draft_kinds.check_files("h", spec, tmp_path, tiny_llama(0, hidden_size=64).config)


def test_the_bill_counts_the_heads_alone(target, trained):
    draft = HeadsDraft("h", target, trained[0], 3, CPU)
    bill = draft_kinds.loaded_bill("h", draft, target, lambda dtype: KVFormat(dtype))
    assert bill.cache is None and bill.has_distribution and bill.num_draft_tokens == 3
    assert bill.own_weight_bytes == 3 * (32 * 32 + 32) * 4  # backbone and lm_head billed to the target
    assert output_head(target) is draft.lm_head
    from gate.policy.model import ResourcesSpec

    target_cache = cache_model(target.config, KVFormat("float32"))
    records = {b.draft: b for b in bills_for(ResourcesSpec(), 100, 96, target_cache, 1000, [bill])}
    lines = {x.name: x.bytes for x in records["h"].lines}
    assert lines["draft weights"] == bill.own_weight_bytes and "draft KV cache" not in lines
    assert lines["draft probabilities"] == 3 * 96 * 4


def _save_dir(tmp_path: Path, trained) -> Path:
    """The sharp target as a model folder, and heads trained on it beside it (heads/)."""
    model_dir = tmp_path / "target"
    model = sharp_llama()
    model.save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    save_checkpoint(tmp_path / "heads", trained[0], base_identity(model, str(model_dir)))
    return model_dir


def test_gate_validate_and_check_run_a_heads_draft(tmp_path, trained, prompts_file):
    model_dir = _save_dir(tmp_path, trained)
    drafts = "  h:\n    kind: heads\n    checkpoint: heads\n    num_draft_tokens: 3\n"
    rule = "  - id: exact\n    kind: exactness\n    next_token_samples: 1500\n    detect_tv: 0.1\n    tie_tolerance: 0.0\n"
    text = tiny_policy(model_dir, prompts_file, rule, drafts=drafts, laws="  - temperature: 0\n  - {temperature: 1.0, top_k: 8}\n",
                       max_new_tokens=32)
    policy = write_policy(tmp_path, text)
    result = CliRunner().invoke(cli, ["validate", str(policy)])
    assert result.exit_code == 0, result.output
    bad = write_policy(tmp_path, text.replace("checkpoint: heads", "checkpoint: nowhere"), "bad.yaml")
    result = CliRunner().invoke(cli, ["validate", str(bad)])
    assert result.exit_code == 2 and "drafts.h.checkpoint" in result.output and "no heads checkpoint folder" in result.output
    result = CliRunner().invoke(cli, ["bill", str(policy), "--json"])  # from heads.json, no weights loaded
    assert result.exit_code == 0, result.output
    lines = {x["name"]: x["bytes"] for b in json.loads(result.output) if b["draft"] == "h" for x in b["lines"]}
    assert lines["draft weights"] == 3 * (32 * 32 + 32) * 4 and "draft KV cache" not in lines
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / "r.json"), "--no-warmup"])
    report = json.loads((tmp_path / "r.json").read_text())
    exact = {o["scope"]: o for o in report["outcomes"] if o["rule_id"] == "exact"}
    assert exact["h/greedy"]["status"] == "pass", exact["h/greedy"]["message"]
    assert exact["h/t1-k8"]["status"] == "pass", exact["h/t1-k8"]["message"]
    summary = {(s["runner"], s["law"]): s for s in report["summary"]}
    assert summary[("h", "greedy")]["overlap_mean"] is not None
    bill = next(b for b in report["measurements"]["bills"] if b["draft"] == "h")
    lines = {x["name"]: x["bytes"] for x in bill["lines"]}
    assert lines["draft weights"] == 3 * (32 * 32 + 32) * 4 and "draft KV cache" not in lines
