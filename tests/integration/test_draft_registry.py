"""The draft-kind registry is the seam: the policy union, the loader's kind messages, the JSON
schema, the bill and validation come from it, so a new kind is one module plus its line in
gate.drafts.registry.BUILTIN."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Literal, get_args

import pytest
from pydantic import BaseModel, ValidationError

from gate.drafts import registry
from gate.drafts.interface import BuiltDraft, ConfigContext, DraftKind, DraftSpecBase
from gate.core.errors import PolicyValueError
from gate.policy import reader as policy_load
from gate.policy import model as policy_model
from gate.policy.schema import policy_schema


class ToyDraftSpec(DraftSpecBase):
    """A kind made up for this test."""

    kind: Literal["toy"]
    width: int = 2


TOY = DraftKind("toy", ToyDraftSpec, "point_mass", build=lambda name, spec, ctx: BuiltDraft(None))  # type: ignore[arg-type]


def test_builtin_kinds_in_registration_order() -> None:
    assert registry.names() == ["model", "prompt_lookup", "early_exit", "cross_tokenizer", "heads", "eagle", "mtp"]


def test_policy_union_and_schema_come_from_the_registry() -> None:
    union, _ = get_args(policy_model.DraftSpec)
    assert get_args(union) == tuple(k.spec for k in registry.kinds())
    drafts = policy_schema()["properties"]["drafts"]["patternProperties"]
    (member,) = drafts.values()
    assert sorted(member["discriminator"]["mapping"]) == sorted(registry.names())
    assert len(member["oneOf"]) == len(registry.names())


def _tag_error(kind: str) -> dict:
    return {"type": "union_tag_invalid", "msg": "", "input": {"kind": kind}, "loc": ("drafts", "x")}


def test_a_registered_kind_is_listed_parsed_and_unregistered() -> None:
    assert "toy" not in policy_load._message(_tag_error("toi"))
    registry.register(TOY)
    try:
        assert registry.names()[-1] == "toy"
        message = policy_load._message(_tag_error("toi"))
        assert "expected one of: model, prompt_lookup, early_exit, cross_tokenizer, heads, eagle, mtp, toy" in message and "did you mean 'toy'?" in message
        missing = policy_load._message({"type": "union_tag_not_found", "msg": "", "input": {}, "loc": ("drafts", "x")})
        assert missing == "a draft needs a 'kind': model, prompt_lookup, early_exit, cross_tokenizer, heads, eagle, mtp or toy"

        class Drafts(BaseModel):  # a union built after registering parses the new kind
            drafts: dict[str, registry.draft_spec_union()]  # type: ignore[valid-type]

        parsed = Drafts.model_validate({"drafts": {"a": {"kind": "toy", "width": 3}, "b": {"kind": "prompt_lookup"}}})
        assert isinstance(parsed.drafts["a"], ToyDraftSpec) and parsed.drafts["a"].num_draft_tokens == 4
        # defaults: no model, nothing to check, no separate tokenizer, no policy problem
        spec = parsed.drafts["a"]
        assert registry.model_config("a", spec, ConfigContext(None, "float32", lambda *a: None)) is None
        assert registry.tokenizer_sources("a", spec) == [] and registry.policy_problems("a", spec, None) == []
        assert registry.has_distribution(spec) is False
        with pytest.raises(ValueError, match="already registered"):
            registry.register(TOY)
    finally:
        registry.unregister("toy")
    assert registry.names() == ["model", "prompt_lookup", "early_exit", "cross_tokenizer", "heads", "eagle", "mtp"]
    assert "toy" not in policy_load._message(_tag_error("toi"))


def test_a_spec_whose_tag_is_not_its_name_is_refused() -> None:
    with pytest.raises(ValueError, match="Literal"):
        registry.register(DraftKind("other", ToyDraftSpec, "point_mass", build=TOY.build))
    assert "other" not in registry.names()


def test_kind_checks_through_the_registry() -> None:
    class Config:
        num_hidden_layers = 4

    Drafts = type("Drafts", (BaseModel,), {"__annotations__": {"d": registry.draft_spec_union()}})
    deep = Drafts.model_validate({"d": {"kind": "early_exit", "num_layers": 4}}).d
    with pytest.raises(PolicyValueError) as e:
        registry.check_target_config("deep", deep, Config())
    assert (e.value.path, e.value.message) == ("drafts.deep.num_layers", "must be below the target's 4 layers (got 4)")
    registry.check_target_config("ok", Drafts.model_validate({"d": {"kind": "early_exit", "num_layers": 3}}).d, Config())
    separate = Drafts.model_validate({"d": {"kind": "model", "model": "some/dir", "gguf_file": "m.gguf"}}).d
    (ref,) = registry.tokenizer_sources("small", separate)
    assert (ref.model, ref.gguf_file, ref.yaml_path) == ("some/dir", "m.gguf", "drafts.small.model")
    same = Drafts.model_validate({"d": {"kind": "model"}}).d
    assert registry.tokenizer_sources("same", same) == []
    target = policy_model.TargetSpec()
    assert registry.policy_problems("same", same, target) == [
        ("drafts.same", "this draft is the target itself (same weights, dtype, quantization)")]
    # int8_dynamic on a bfloat16 target's inherited dtype: refused at validate (a new user's finding: gate check refused
    # it after 19 s of loading, naming a dtype key the policy did not have)
    int8 = Drafts.model_validate({"d": {"kind": "model", "quantization": "int8_dynamic"}}).d
    assert registry.policy_problems("int8", int8, target) == []
    ((at, why),) = registry.policy_problems("int8", int8, policy_model.TargetSpec(dtype="bfloat16"))
    assert at == "drafts.int8.quantization" and "bfloat16, the target's, which it inherits" in why


TOY_MODULE = '''
from typing import Literal
from gate.drafts.interface import BuiltDraft, DraftKind, DraftSpecBase


class ToyDraftSpec(DraftSpecBase):
    """A kind that lives in its own module."""

    kind: Literal["toy"]


KIND = DraftKind("toy", ToyDraftSpec, "point_mass", build=lambda name, spec, ctx: BuiltDraft(None))
'''


def test_one_module_plus_its_registration_line_is_a_new_kind(tmp_path: Path) -> None:
    """In a fresh interpreter: the toy module's line in BUILTIN (made before gate.policy is
    imported) is all the real policy loader, its messages and the schema need."""
    (tmp_path / "toy_kind.py").write_text(TOY_MODULE)
    policy = tmp_path / "policy.yaml"
    policy.write_text(textwrap.dedent("""\
        version: 1
        drafts:
          t:
            kind: toy
            num_draft_tokens: 2
        rules:
          - id: fast
            metric: speedup
            aggregation: pooled
            comparison: ">="
            threshold: 1.0
        """))
    script = textwrap.dedent(f"""\
        import json, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from gate.drafts import registry
        registry.BUILTIN = registry.BUILTIN + ("toy_kind",)
        from gate.core.errors import InputError
        from gate.policy.reader import load_policy
        from gate.policy.schema import policy_schema
        loaded = load_policy({str(policy)!r})
        out = {{"kind": type(loaded.policy.drafts["t"]).__name__, "gamma": loaded.policy.drafts["t"].num_draft_tokens}}
        mapping = next(iter(policy_schema()["properties"]["drafts"]["patternProperties"].values()))["discriminator"]["mapping"]
        out["schema"] = sorted(mapping)
        bad = {str(tmp_path / "bad.yaml")!r}
        open(bad, "w").write(open({str(policy)!r}).read().replace("kind: toy", "kind: tyo"))
        try:
            load_policy(bad)
        except InputError as e:
            out["error"] = str(e)
        print(json.dumps(out))
        """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["kind"] == "ToyDraftSpec" and out["gamma"] == 2
    assert out["schema"] == ["cross_tokenizer", "eagle", "early_exit", "heads", "model", "mtp", "prompt_lookup", "toy"]
    assert "expected one of: model, prompt_lookup, early_exit, cross_tokenizer, heads, eagle, mtp, toy (did you mean 'toy'?)" in out["error"]


def test_policy_draft_specs_are_strict() -> None:
    with pytest.raises(ValidationError):
        policy_model.Policy.model_validate({"version": 1, "drafts": {"a": {"kind": "prompt_lookup", "nope": 1}},
                                            "rules": [{"id": "r", "kind": "exactness"}]})
