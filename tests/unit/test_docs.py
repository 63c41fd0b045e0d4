"""The docs are tested: what README.md and docs/**/*.md show a user must work as shown.

- every ```yaml block that is a policy (a mapping with a top-level `rules` key) passes
  `gate validate` (written to a file in the repository root, so relative paths resolve from
  there), unless its first line is `# needs: <what>` (a policy that needs a built artefact,
  a server, a trained head): then it is checked against schemas/policy.schema.json only;
  every other yaml block parses, and the shell scripts of CI jobs in it (`run:`, `script:`)
  are checked as shell blocks are;
- every `gate ...` command line in a ```bash / sh / shell / console block (after `$ `, env
  assignments FOO=bar, a .venv/bin/ or other path to gate; lines ending in \\ joined; `;`,
  `&&`, `||` and `|` separate commands) parses against the real click CLI: an unknown command
  or option, a bad choice or a missing argument fails; files need not exist;
- the reference pages are generated (scripts/docs_reference.py) and say everything the code
  declares.

A failure names the file and line of each offending block. The checkers are tested on bad
blocks of their own at the end.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from gate.cli import cli

ROOT = Path(__file__).resolve().parents[2]
SHELL = {"bash", "sh", "shell", "console", "shell-session", "zsh"}
YAML = {"yaml", "yml"}
# CI job files: the keys whose strings are shell scripts (GitHub Actions steps, GitLab CI jobs)
SCRIPT_KEYS = {"run", "script", "before_script", "after_script"}


def _load_reference() -> Any:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _load_reference()


# --- Finding the blocks --------------------------------------------------------------------


@dataclass
class Block:
    file: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")


def fenced_blocks(text: str, file: str) -> list[Block]:
    """Every fenced code block of a Markdown text, with its language (the info string's first
    word, `{.yaml ...}` and `title="..."` attributes allowed) and its lines less the fence's
    indentation (blocks inside lists, admonitions and content tabs are indented)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m.group("indent"), m.group("fence")
        info = m.group("info").strip().lstrip("{").lstrip(".")
        lang = re.split(r"[\s{}]", info, maxsplit=1)[0].lower() if info else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(fence[0] * len(fence)) and not close.strip(fence[0]):
                break
            line = lines[j]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            j += 1
        blocks.append(Block(file, i + 1, lang, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def all_blocks() -> list[Block]:
    out: list[Block] = []
    for path in markdown_files():
        if path.exists():
            out += fenced_blocks(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    return out


# --- Commands --------------------------------------------------------------------------------

ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {";", "&&", "||", "|", "&", ";;", "|&"}
REDIRECTION = re.compile(r"(?<![\w\"'=/-])\d*(?:>>?|<)(?:&\d+|\s*[^\s;&|]+)")
PLACEHOLDER = re.compile(r"<[A-Za-z][\w.\-/ ]*>")
# a CI system's template expression, expanded before the shell sees the line: ${{ matrix.shard }}
# (GitHub Actions), $[[ inputs.policy ]] (GitLab CI)
CI_EXPRESSION = re.compile(r"\$\{\{.*?\}\}|\$\[\[.*?\]\]")


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(0-based line, text) of each line of a shell block, lines ending in a backslash joined."""
    pending: list[str] = []
    start = 0
    for n, line in enumerate(text.splitlines()):
        if not pending:
            start = n
        if line.rstrip().endswith("\\"):
            pending.append(line.rstrip()[:-1])
            continue
        pending.append(line)
        yield start, " ".join(part.strip() for part in pending)
        pending = []
    if pending:
        yield start, " ".join(part.strip() for part in pending)


def gate_argv(words: list[str]) -> list[str] | None:
    """The arguments after `gate` when the simple command `words` runs gate (after env
    assignments, `time` or `exec`; as gate, a path ending in /gate, or python -m gate), else None."""
    while words and (ASSIGNMENT.match(words[0]) or words[0] in ("time", "exec", "command")):
        words = words[1:]
    if not words:
        return None
    head = words[0]
    if head == "gate" or head.endswith("/bin/gate") or head == "./gate":
        return words[1:]
    if re.fullmatch(r"(.*/)?python3?", head) and words[1:3] == ["-m", "gate"]:
        return words[3:]
    return None


def gate_commands(text: str) -> list[tuple[int, list[str] | str]]:
    """(0-based line, argv after `gate`) of every gate invocation in a shell script; argv is
    a string where the line cannot be split as a shell line (the reason)."""
    found: list[tuple[int, list[str] | str]] = []
    for n, line in logical_lines(text):
        line = line.strip()
        if line.startswith("$"):
            line = line[1:].lstrip()
        if not line or line.startswith("#") or not re.search(r"(^|[\s/;&|(])gate(\s|$)", line):
            continue
        line = CI_EXPRESSION.sub("CI_EXPRESSION", line)
        line = PLACEHOLDER.sub("PLACEHOLDER", line)
        line = REDIRECTION.sub(" ", line)
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            tokens = list(lexer)
        except ValueError as e:
            found.append((n, f"cannot split the line as a shell would ({e}): {line}"))
            continue
        simple: list[str] = []
        for token in [*tokens, ";"]:
            if token in SEPARATORS:
                argv = gate_argv(simple)
                if argv is not None:
                    found.append((n, argv))
                simple = []
            else:
                simple.append(token)
    return found


def parse_problem(argv: list[str]) -> str | None:
    """Why `gate ARGV` does not parse against the click CLI, or None when it does. Parses as
    click does before invoking (group options, the command's name, its options and arguments,
    their types and choices) but runs nothing; --help and --version parse. A file argument
    that must exist and does not is not a problem here."""
    with CliRunner().isolation():  # --help and --version print: keep it off the test's output
        try:
            command: click.Command = cli
            name = "gate"
            args = list(argv)
            parent = None
            while True:
                ctx = command.make_context(name, args, parent=parent)
                if not isinstance(command, click.Group):
                    return None
                rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
                if not rest:
                    return None if command.invoke_without_command else f"{name}: a command is missing"
                sub_name, sub, sub_args = command.resolve_command(ctx, rest)
                if sub is None or sub_name is None:
                    return f"{name}: no such command {rest[0]!r}"
                command, name, args, parent = sub, sub_name, sub_args, ctx
        except click.exceptions.Exit as e:
            return None if e.exit_code == 0 else f"exits {e.exit_code}"
        except click.exceptions.BadParameter as e:
            if "does not exist" in e.format_message():
                return None
            return e.format_message()
        except click.exceptions.UsageError as e:
            return e.format_message()


def command_problems(block: Block, script: str | None = None) -> list[str]:
    """Why the gate command lines of a shell block (or of a CI `script` inside a yaml block)
    do not parse, each with its file and line."""
    first = block.line + 1
    if script is not None:  # where the script starts in the block, when it can be found
        head = script.strip().splitlines()[0] if script.strip() else ""
        at = next((n for n, line in enumerate(block.text.splitlines()) if head and head in line), None)
        first = block.line + 1 + at if at is not None else block.line
    problems = []
    for n, argv in gate_commands(block.text if script is None else script.strip()):
        line = first + n
        if isinstance(argv, str):
            problems.append(f"{block.file}:{line}: {argv}")
            continue
        why = parse_problem(argv)
        if why:
            problems.append(f"{block.file}:{line}: `gate {shlex.join(argv)}`: {why}")
    return problems


# --- Policies ------------------------------------------------------------------------------

NEEDS = re.compile(r"^#\s*needs:\s*(\S.*)$")


def is_policy(data: Any) -> bool:
    return isinstance(data, dict) and "rules" in data


def needs(block: Block) -> str | None:
    """What a policy block says it needs (its first line `# needs: ...`), or None."""
    first = block.text.lstrip("\n").splitlines()[0] if block.text.strip() else ""
    m = NEEDS.match(first.strip())
    return m.group(1) if m else None


def validate_problem(text: str, root: Path = ROOT) -> str | None:
    """Why `gate validate` refuses the policy `text` written to a file in `root`, or None."""
    path = root / f".docs-check-{uuid.uuid4().hex[:12]}.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        result = CliRunner().invoke(cli, ["validate", str(path)], catch_exceptions=True)
    finally:
        path.unlink(missing_ok=True)
    if result.exit_code == 0:
        return None
    out = result.output.replace(str(path), "the block").replace(path.name, "the block")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        out += f"{type(result.exception).__name__}: {result.exception}"
    return f"gate validate exited {result.exit_code}:\n    " + "\n    ".join(out.strip().splitlines())


def schema_problem(data: Any) -> str | None:
    """Why `data` does not match schemas/policy.schema.json, or None."""
    schema = json.loads((ROOT / "schemas" / "policy.schema.json").read_text(encoding="utf-8"))
    errors = sorted(Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    return "; ".join(_schema_error(e) for e in errors[:5])


def _schema_error(error: Any) -> str:
    """One schema error in words; for a union (a draft or runner by its `kind`), the errors of
    the branch whose `kind` matched rather than "not valid under any of the given schemas"."""
    where = ".".join(map(str, error.absolute_path)) or "(document)"
    branches: dict[Any, list[Any]] = {}
    for sub in error.context or []:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    matched = [
        errs
        for errs in branches.values()
        if not any(
            list(e.relative_path) == ["kind"] or (e.validator == "required" and "'kind'" in e.message) for e in errs
        )
    ]
    if len(matched) == 1:
        return "; ".join(_schema_error(e) for e in matched[0])
    return f"{where}: {error.message[:300]}"


def yaml_problems(block: Block) -> list[str]:
    """What is wrong with a yaml block: it does not parse; a policy that gate validate (or,
    with `# needs:`, the schema) refuses; a CI script in it whose gate command does not parse."""
    try:
        docs = list(yaml.safe_load_all(block.text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = block.line + 1 + mark.line if mark is not None else block.line
        return [f"{block.file}:{line}: the yaml block does not parse: {e}"]
    problems: list[str] = []
    for data in docs:
        if is_policy(data):
            if needs(block):
                why = schema_problem(data)
                if why:
                    problems.append(f"{block.where}: policy (needs: {needs(block)}) fails the schema: {why}")
            else:
                why = validate_problem(block.text)
                if why:
                    problems.append(f"{block.where}: policy: {why}")
        else:
            for script in scripts(data):
                problems += command_problems(block, script)
    return problems


def scripts(data: Any) -> Iterator[str]:
    """The shell scripts of a CI job file: strings under run / script / before_script / after_script."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key in SCRIPT_KEYS and isinstance(value, str):
                yield value
            elif key in SCRIPT_KEYS and isinstance(value, list):
                yield from (v for v in value if isinstance(v, str))
            else:
                yield from scripts(value)
    elif isinstance(data, list):
        for item in data:
            yield from scripts(item)


# --- The docs themselves -------------------------------------------------------------------


@pytest.fixture(scope="module")
def blocks() -> list[Block]:
    found = all_blocks()
    assert (ROOT / "README.md").exists()
    return found


def _report(problems: list[str], what: str) -> str:
    return f"{len(problems)} {what}:\n" + "\n".join(problems)


def test_docs_yaml_blocks_parse_and_policies_validate(blocks: list[Block], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    problems = [p for b in blocks if b.lang in YAML for p in yaml_problems(b)]
    assert not problems, _report(problems, "yaml blocks in the docs are wrong")


def test_docs_gate_command_lines_parse(blocks: list[Block]) -> None:
    problems = [p for b in blocks if b.lang in SHELL for p in command_problems(b)]
    assert not problems, _report(problems, "gate command lines in the docs do not parse")


# --- The reference pages -------------------------------------------------------------------


def test_reference_pages_are_generated_by_the_hook() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8").replace("!!python", "#"))
    assert "scripts/docs_reference.py" in config.get("hooks", []), "mkdocs.yml must load the reference hook"
    nav = json.dumps(config["nav"])
    for name in reference.PAGES:
        page = ROOT / "docs" / "reference" / f"{name}.md"
        assert f"reference/{name}.md" in nav, f"reference/{name}.md is not in mkdocs.yml's nav"
        markers = reference.MARKER.findall(page.read_text(encoding="utf-8"))
        assert markers == [name], f"{page.relative_to(ROOT)}: expected the one marker <!-- gate-reference: {name} -->"


def test_policy_reference_names_every_field() -> None:
    from gate.policy.model import Policy, RuleSpec
    from gate.policy.schema import policy_schema

    page = reference.policy_page()
    for field in Policy.model_fields:
        assert f"| `{field}` |" in page, field
    for field in RuleSpec.model_fields:
        assert f"| `{field}` |" in page, field
    for name in policy_schema()["$defs"]:
        assert f"## {name} {{ #{name.lower()} }}" in page, f"{name} has no section"


def test_metrics_reference_names_every_metric_and_flag() -> None:
    from gate.metrics.catalogue import METRICS

    assert reference.metric_fields_not_described() == [], "a Metric field the metrics page does not explain"
    page = reference.metrics_page()
    for name, metric in METRICS.items():
        assert f"## `{name}` {{ #{name} }}" in page
        assert reference._escape(metric.description) in page


def test_rule_kinds_reference_names_every_kind() -> None:
    from gate.rules.kinds import registry

    page = reference.rule_kinds_page()
    for name in registry.names():
        assert f"## `{name}` {{ #{name} }}" in page
        for key in registry.get(name).keys:
            assert f"[`{key}`](policy.md#rulespec)" in page


def test_exit_codes_table_is_what_gate_returns() -> None:
    from gate.core import errors
    from gate.loop import interrupt

    assert set(errors.EXIT_CODES) == {
        errors.EXIT_PASS,
        errors.EXIT_FAIL,
        errors.EXIT_USAGE,
        errors.EXIT_MEASUREMENT,
        128 + int(signal.SIGINT),
        128 + int(signal.SIGTERM),
    }
    assert errors.EXIT_SIGINT == 128 + int(signal.SIGINT) and errors.EXIT_SIGTERM == 128 + int(signal.SIGTERM)
    if interrupt.received() is None:  # no signal seen: an interrupt is SIGINT's
        assert interrupt.exit_code() == errors.EXIT_SIGINT
    page = reference.exit_codes_page()
    for code in errors.EXIT_CODES:
        assert f"| `{code}` |" in page
    for name in cli.commands:
        assert f"[`gate {name}`](cli.md#gate-{name})" in page


def test_reports_and_cli_reference() -> None:
    from gate.report import registry
    from gate.report.document import report_schema

    page = reference.reports_page()
    for name in registry.names():
        assert f"| `{name}` |" in page
    for field in report_schema()["properties"]:
        assert f"| `{field}` |" in page
    cli_page = reference.cli_page()
    assert ":module: gate.cli" in cli_page and ":command: cli" in cli_page
    for name in cli.commands:
        assert f"[`gate {name}`](#gate-{name})" in cli_page


def test_reference_markdown_escapes_what_would_render_as_html() -> None:
    assert reference._escape("runs as '<name>.k<K>', *not* `<code>`") == (
        "runs as '&lt;name&gt;.k&lt;K&gt;', \\*not\\* `<code>`"
    )
    assert reference._escape("a | b\nc", cell=True) == "a \\| b c"
    with pytest.raises(ValueError, match="unknown reference page 'nope'"):
        reference.expand("<!-- gate-reference: nope -->", "x.md")
    assert "| `version` |" in reference.expand("intro\n\n<!-- gate-reference: policy -->\n")


# --- The checkers catch what they are for --------------------------------------------------

BAD_DOC = """# A page

Run it:

```bash
$ .venv/bin/gate check examples/smollm2/policy.yaml --no-such-option
GATE_LLAMA_SERVER=/opt/llama-server gate check policy.yaml \\
  --json out/r.json --junit-inconclusive sometimes
gate chek policy.yaml
gate validate examples/smollm2/policy.yaml && gate report out/r.json --html out/r.html
```

- In a list:

    ```yaml
    version: 1
    target: {model: smollm2-135m-instruct}
    drafts: {lookup: {kind: prompt_lookup, num_draft_tokens: 99}}
    rules:
      - {id: speedup, metric: speedup, aggregation: pooled, comparison: ">=", threshold: 1.0x}
    ```

```yaml
# needs: a trained head (make heads)
version: 1
drafts: {h: {kind: heads, path: /nowhere, unknown_key: 1}}
rules: [{id: overlap, metric: overlap, comparison: ">=", threshold: 0.5}]
```

```yaml
jobs:
  gate:
    steps:
      - run: gate check policy.yaml --shard ${{ matrix.shard }}/2 --json shard-${{ matrix.shard }}.json
      - run: gate check policy.yaml --shard 1/2 --bogus
key: [unclosed
```
"""

GOOD_POLICY = """version: 1
target: {model: smollm2-135m-instruct}
drafts: {lookup: {kind: prompt_lookup, num_draft_tokens: 4}}
workload: {source: mt_bench, per_category: 3, max_new_tokens: 24}
rules:
  - {id: speedup, metric: speedup, aggregation: pooled, comparison: ">=", threshold: 1.0x}
"""


def test_fenced_blocks_are_found_with_their_lines_and_indentation() -> None:
    found = fenced_blocks(BAD_DOC, "bad.md")
    assert [(b.lang, b.line) for b in found] == [("bash", 5), ("yaml", 15), ("yaml", 23), ("yaml", 30)]
    assert found[1].text.startswith("version: 1\ntarget:")  # the list's indentation is gone
    commands = gate_commands(found[0].text)
    assert [(n, argv[:1]) for n, argv in commands] == [
        (0, ["check"]),
        (1, ["check"]),
        (3, ["chek"]),
        (4, ["validate"]),
        (4, ["report"]),
    ]
    assert commands[1][1] == ["check", "policy.yaml", "--json", "out/r.json", "--junit-inconclusive", "sometimes"]


def test_command_checker_fails_unknown_options_commands_and_choices() -> None:
    bash = fenced_blocks(BAD_DOC, "bad.md")[0]
    problems = command_problems(bash)
    assert len(problems) == 3, problems
    assert problems[0].startswith("bad.md:6: `gate check examples/smollm2/policy.yaml --no-such-option`")
    assert "No such option" in problems[0] and "--no-such-option" in problems[0]
    assert problems[1].startswith("bad.md:7:") and "'sometimes' is not one of" in problems[1]
    assert problems[2].startswith("bad.md:9:") and "No such command 'chek'" in problems[2]
    # what parses: --help, --version, a missing file, shell around it
    for ok in (
        ["--help"],
        ["--version"],
        ["check", "--help"],
        ["validate", "no/such/file.yaml"],
        ["check", "p.yaml", "--shard", "1/2", "--fail-on-warn", "--markdown", "$GITHUB_STEP_SUMMARY"],
    ):
        assert parse_problem(ok) is None, ok
    assert parse_problem(["validate"]) is not None  # a missing argument
    assert parse_problem([]) is not None  # no command


def test_policy_checker_runs_gate_validate_and_the_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    listed, needing, ci = fenced_blocks(BAD_DOC, "bad.md")[1:]
    problems = yaml_problems(listed)
    assert len(problems) == 1 and problems[0].startswith("bad.md:15: policy: gate validate exited 2")
    assert "num_draft_tokens" in problems[0], problems
    assert needs(needing) == "a trained head (make heads)"
    problems = yaml_problems(needing)
    assert len(problems) == 1 and "fails the schema: drafts.h: Additional properties are not allowed" in problems[0]
    assert "'unknown_key'" in problems[0], problems
    problems = yaml_problems(ci)
    assert len(problems) == 1 and problems[0].startswith("bad.md:3") and "does not parse" in problems[0], problems
    ci.text = ci.text.replace("key: [unclosed\n", "")
    problems = yaml_problems(ci)
    assert len(problems) == 1 and problems[0].startswith("bad.md:35: `gate check policy.yaml --shard 1/2 --bogus`")
    assert validate_problem(GOOD_POLICY) is None


def test_policy_checker_removes_its_file(tmp_path: Path) -> None:
    assert validate_problem(GOOD_POLICY, root=tmp_path) is None
    assert validate_problem("version: 2\nrules: []\n", root=tmp_path) is not None
    assert list(tmp_path.iterdir()) == []
