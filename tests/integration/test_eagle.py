"""EAGLE drafts (gate.drafts.eagle) on tiny random Llamas: a module trained in-process in seconds
raises the teacher-forced overlap over an untrained one; the draft's incremental proposals (its own
KV cache, the features the runner passes) give the same q as the teacher-forced pass; greedy
output equals the fallback's; the first committed token of a step follows the target's law while
the draft's own q does not; the checkpoint in vLLM's EAGLE format round-trips and refuses another
backbone; the bill counts fc and the layer alone and one layer's cache; gate validate and
gate check run an eagle draft end to end, and its vLLM mapping is {"method": "eagle", ...}."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import sharp_llama, tiny_llama, tiny_policy, write_policy

from gate.cli import cli
from gate.core.errors import PolicyValueError
from gate.core.law import Law, law_probs
from gate.drafts import registry as draft_kinds
from gate.drafts.eagle import (KIND, LAYER_KEYS, EagleDraft, EagleModule, eagle_config, load_module, save_checkpoint,
                               train_eagle)
from gate.drafts.heads import base_identity
from gate.drafts.interface import VLLMContext
from gate.measure.kv import KVFormat
from gate.measure.overlap import overlap
from gate.models.cache import forward
from gate.models.loading import weight_bytes
from gate.runners.transformers import TransformersRunner
from integration.test_heads import CYCLE, _chisquare, cycle_text

CPU = torch.device("cpu")
GREEDY = Law("greedy", 0.0)
T1 = Law("t1", 1.0)


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return sharp_llama().requires_grad_(False)


@pytest.fixture(scope="module")
def trained(target):
    """An EAGLE module trained on the target's own greedy continuations of seven prompts."""
    runner = TransformersRunner(target, set(), CPU)
    texts = [cycle_text(i, 12) + runner._generate(cycle_text(i, 12), None, GREEDY, 48, None).output_ids
             for i in range(len(CYCLE))]
    module, training = train_eagle(target, texts, steps=100, batch=4, lr=3e-3, seed=0)
    return module, training, texts


def test_every_hidden_state_is_the_final_norms_output(target):
    ids = torch.tensor([cycle_text(0, 10)])
    logits, every = forward(target, ids, None, 1, hidden="all")
    _, kept = forward(target, ids, hidden=True)
    assert logits.shape[1] == 1 and every.shape == kept.shape and torch.allclose(every, kept)


def test_training_raises_the_overlap_and_is_deterministic(target, trained):
    module, training, texts = trained
    assert training.last_loss < training.first_loss and training.wall_s < 60
    ids = texts[3]
    with torch.no_grad():
        p = law_probs(forward(target, torch.tensor([ids[:-1]]))[0, 11:], T1)
    untrained = EagleModule(eagle_config(target.config), target.get_input_embeddings()).eval()
    means = {label: float(overlap(p, EagleDraft("e", target, m, 3, CPU).teacher_forced(ids, 12, T1, 96)).mean())
             for label, m in (("untrained", untrained), ("trained", module))}
    assert means["trained"] > means["untrained"] + 0.2 and means["trained"] > 0.5, means
    again, _ = train_eagle(target, texts, steps=100, batch=4, lr=3e-3, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(again.eagle_state_dict().values(), module.eagle_state_dict().values()))


def test_incremental_proposals_match_the_teacher_forced_pass(target, trained):
    """The draft's first proposal after committing ids[:i] (its cache fed pair by pair, rolled back after
    speculative entries) has the q the teacher-forced pass gives at position i."""
    module, _, texts = trained
    ids = texts[2]
    draft = EagleDraft("e", target, module, 3, CPU)
    reference = draft.teacher_forced(ids, 12, T1, 96)
    draft.start()
    with torch.no_grad():
        _, every = forward(target, torch.tensor([ids[:11]]), hidden="all")
    draft.observe_target_states(every[0])  # the prefill: features of positions 0..10
    g = torch.Generator().manual_seed(0)
    for i in range(12, len(ids) - 1):
        q = draft.propose(ids[:i], 3, T1, g).q  # three proposals: two speculative cache entries to roll back
        assert torch.allclose(q[0], reference[i - 12], atol=1e-5), i
        with torch.no_grad():
            _, every = forward(target, torch.tensor([ids[: i]]), hidden="all")
        draft.observe_target_states(every[0, i - 1 : i])  # the step committed one token: its position's feature


def test_greedy_output_equals_the_fallback_and_proposals_are_accepted(target, trained):
    runner = TransformersRunner(target, set(), CPU)
    draft = EagleDraft("e", target, trained[0], 3, CPU)
    for offset in (0, 4):
        prompt = cycle_text(offset, 12)
        fallback = runner._generate(prompt, None, GREEDY, 40, None)
        spec = runner._generate(prompt, draft, GREEDY, 40, None)
        assert spec.output_ids == fallback.output_ids
        assert sum(spec.step_accepted) >= 10, spec.step_accepted
        assert max(spec.step_proposed) == 3 and spec.draft_kv_cache_bytes > 0  # its own one-layer cache


@pytest.mark.parametrize("law", [T1, Law("t0.7", 0.7, top_p=0.9)], ids=["t1", "t0.7-top-p"])
def test_the_first_committed_token_follows_the_target_law(target, trained, law):
    runner = TransformersRunner(target, set(), CPU, drafts={"e": EagleDraft("e", target, trained[0], 3, CPU)})
    text = trained[2][1]
    with torch.no_grad():
        p_all = law_probs(forward(target, torch.tensor([text[:-1]]))[0, 11:], law)
    beta = overlap(p_all, runner.drafts["e"].teacher_forced(text, 12, law, 96))
    prompt = text[:12 + int((beta - 0.6).abs().argmin())]  # accepted often, rejected often
    n = 2500
    steps = runner.first_steps(prompt, "e", law, n, 7)
    counts = np.bincount([s[0] for s in steps], minlength=96)
    with torch.no_grad():
        p = law_probs(forward(target, torch.tensor([prompt]))[0, -1], law)
    assert n // 4 < sum(len(s) > 1 for s in steps) < n - n // 10  # acceptance and the residual both exercised
    assert _chisquare(counts, p, n).pvalue > 1e-3
    draft = runner.drafts["e"]  # the same test rejects the draft's own q_1
    draft.start()
    with torch.no_grad():
        _, every = forward(target, torch.tensor([prompt[:-1]]), hidden="all")
    draft.observe_target_states(every[0])
    g = torch.Generator().manual_seed(7)
    proposals = np.bincount([int(draft.propose(prompt, 1, law, g).tokens[0]) for _ in range(n)], minlength=96)
    assert _chisquare(proposals, p, n).pvalue < 1e-6


def test_the_checkpoint_is_vllms_eagle_format_and_round_trips(tmp_path, target, trained):
    module = trained[0]
    folder = save_checkpoint(tmp_path / "eagle", module, base_identity(target, "tiny"), {"steps": 100})
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 1
    from safetensors import safe_open
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        h = target.config.hidden_size
        assert tuple(f.get_slice("fc.weight").get_shape()) == (h, 2 * h)
    assert names == {"fc.weight", *(f"layers.0.{k}" for k in LAYER_KEYS)}  # no embeddings, no lm_head, no input norm
    loaded = load_module(folder, target, "drafts.e.checkpoint")
    ids = texts_ids = trained[2][0]
    a = EagleDraft("e", target, module, 3, CPU).teacher_forced(texts_ids, 12, T1, 96)
    b = EagleDraft("e", target, loaded, 3, CPU).teacher_forced(ids, 12, T1, 96)
    assert torch.allclose(a, b, atol=1e-6)
    other = tiny_llama(3, hidden_size=64)
    with pytest.raises(PolicyValueError, match="hidden_size is 32, the target's 64"):
        load_module(folder, other, "drafts.e.checkpoint")


def test_the_bill_counts_fc_and_the_layer_and_one_layers_cache(target, trained):
    draft = EagleDraft("e", target, trained[0], 3, CPU)
    bill = draft_kinds.loaded_bill("e", draft, target, lambda dtype: KVFormat(dtype))
    h, i = target.config.hidden_size, target.config.intermediate_size
    head_dim = h // target.config.num_attention_heads
    kv = target.config.num_key_value_heads * head_dim
    own = 4 * (2 * h * h + h * h + 2 * h * kv + h * h + 3 * h * i + h)  # fc, q, k, v, o, mlp, post norm (float32)
    assert bill.own_weight_bytes == own and bill.own_weight_bytes < weight_bytes(trained[0])  # embeddings excluded
    assert bill.cache.bytes(10) == 10 * 2 * kv * 4  # one layer's keys and values, float32


def test_gate_validate_and_check_run_an_eagle_draft(tmp_path, tiny_model_dir, prompts_file):
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    module = EagleModule(eagle_config(base.config), base.get_input_embeddings())
    save_checkpoint(tmp_path / "eagle", module, base_identity(base, str(tiny_model_dir)))
    drafts = f"  e:\n    kind: eagle\n    checkpoint: {tmp_path / 'eagle'}\n    num_draft_tokens: 3\n"
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, "  - {id: exact, kind: exactness}\n",
                                                drafts=drafts))
    result = CliRunner().invoke(cli, ["validate", str(policy)])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / "r.json"), "--no-warmup"])
    assert result.exit_code != 2, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    m = report["measurements"]
    assert not [f for f in m["failures"] if f["draft"] == "e"], m["failures"]
    bills = {b["draft"]: {x["name"]: x["bytes"] for x in b["lines"]} for b in m["bills"]}
    assert bills["e"]["draft weights"] > 0 and bills["e"]["draft KV cache"] > 0
    exact = [o for o in report["outcomes"] if o["draft"] == "e" and o["rule_id"] == "exact"]
    assert exact and all(o["status"] in ("pass", "inconclusive") for o in exact), exact
    bill = CliRunner().invoke(cli, ["bill", str(policy), "--json"])  # from configs and the safetensors header
    assert bill.exit_code == 0, bill.output
    from_files = {b["draft"]: {x["name"]: x["bytes"] for x in b["lines"]} for b in json.loads(bill.output)}
    assert from_files["e"]["draft weights"] == bills["e"]["draft weights"]


def test_vllm_runs_it_as_its_eagle_method(tmp_path):
    spec = KIND.spec(kind="eagle", checkpoint="ckpt", num_draft_tokens=4, method="eagle3")
    served = KIND.vllm("e", spec, VLLMContext(None, tmp_path, tmp_path))
    assert served.speculative_config == {"method": "eagle3", "model": str(tmp_path / "ckpt"),
                                         "num_speculative_tokens": 4}


def _save_eagle3_shaped(folder, base) -> None:
    """A checkpoint whose fc reads three layers' features (EAGLE-3's fc.weight [H, 3H])."""
    from safetensors.torch import load_file, save_file
    module = EagleModule(eagle_config(base.config), base.get_input_embeddings())
    save_checkpoint(folder, module, base_identity(base, "tiny"))
    tensors = load_file(str(folder / "model.safetensors"))
    h = base.config.hidden_size
    tensors["fc.weight"] = torch.zeros(h, 3 * h)
    save_file(tensors, str(folder / "model.safetensors"))


def test_a_checkpoint_declared_with_the_wrong_method_is_refused_naming_it(tmp_path, tiny_model_dir, prompts_file):
    """SGLang #21272: an EAGLE-3 checkpoint loaded as EAGLE gives acceptance length 1.0 with no
    warning (vLLM 0.32 refuses it at start). gate validate reads the method off the tensors."""
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    _save_eagle3_shaped(tmp_path / "e3", base)
    drafts = f"  e:\n    kind: eagle\n    checkpoint: {tmp_path / 'e3'}\n    method: eagle\n"
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, drafts=drafts))
    result = CliRunner().invoke(cli, ["validate", str(policy)])
    assert result.exit_code == 2 and "drafts.e.method" in result.output, result.output
    assert "method eagle, but the checkpoint is an eagle3 draft" in result.output
    assert "fc.weight [32, 96]" in result.output and "set method: eagle3" in result.output
    fixed = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, drafts=drafts.replace(
        "method: eagle\n", "method: eagle3\n")), "fixed.yaml")
    result = CliRunner().invoke(cli, ["validate", str(fixed)])  # in-process: eagle3 is served only
    assert result.exit_code == 2 and "gate's own loop runs EAGLE-1 drafts" in result.output, result.output


def test_a_served_eagle_draft_accepting_nothing_fails_naming_the_declared_method(tmp_path, tiny_model_dir, prompts_file):
    """The case the tensors cannot tell (a server that loads whatever it is given): a served EAGLE
    draft whose counters say it accepted nothing fails the acceptance rule, saying the likely cause."""
    from served_stub import Stub
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    save_checkpoint(tmp_path / "e", EagleModule(eagle_config(base.config), base.get_input_embeddings()),
                    base_identity(base, "tiny"))
    with Stub() as fallback, Stub(vllm_counters=(4, [0, 0, 0]), vllm_steps=([3] * 4, [0] * 4)) as draft:
        policy = tmp_path / "policy.yaml"
        policy.write_text(f"""\
version: 1
target: {{model: {tiny_model_dir}, device: cpu}}
drafts:
  e: {{kind: eagle, checkpoint: {tmp_path / 'e'}, num_draft_tokens: 3}}
law: {{temperature: 0}}
runner:
  kind: openai
  endpoints:
    fallback: {{base_url: '{fallback.url}', api: completions, engine: vllm}}
    e: {{base_url: '{draft.url}', api: completions, engine: vllm, metrics_url: '{draft.url}/metrics'}}
load: {{concurrency: [2]}}
workload: {{source: jsonl, path: {prompts_file}, max_new_tokens: 8, seed: 0}}
measurement: {{repetitions: 3, warmup_requests: 0, max_cpu_stall: null, max_client_lag_ms: null}}
rules:
  - {{id: acceptance, metric: acceptance_rate, aggregation: pooled, comparison: '>=', threshold: 0.3}}
""")
        result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / "r.json"), "--no-progress"])
    report = json.loads((tmp_path / "r.json").read_text())
    (o,) = [o for o in report["outcomes"] if o["rule_id"] == "acceptance"]
    assert o["status"] == "fail" and o["measured"] == 0.0, o["message"]
    assert "it accepted 0.0% of its proposals: the likely cause is the declared method (eagle)" in o["message"]
    assert "SGLang #21272" in o["message"] and result.exit_code == 1
