"""The tests of tests/unit/test_html_report.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations


from click.testing import CliRunner

from gate.cli import cli
from unit.test_html_report import Page  # noqa: F401 - shared with that tier


def test_gate_check_writes_the_page_and_links_it_from_the_markdown(tmp_path, tiny_model_dir, prompts_file):
    import torch

    from conftest import tiny_policy, write_policy

    drafts = "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n"
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, drafts=drafts, max_new_tokens=6))
    page, md = tmp_path / "out" / "gate-report.html", tmp_path / "summary.md"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(cli, ["check", str(policy), "--junit", str(tmp_path / "j.xml"), "--json", str(tmp_path / "r.json"),
                                          "--markdown", str(md), "--html", str(page), "--no-progress", "--no-warmup"])
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code in (0, 1, 3) and "Traceback" not in result.output, result.output
    text = page.read_text(encoding="utf-8")
    plots = Page(text).plots()
    assert {"speedup", "ttft-cdf", "itl-cdf", "memory-bill"} <= set(plots) and all(plots.values())
    assert md.read_text(encoding="utf-8").rstrip().endswith(f"Plots: [gate-report.html]({page}) (self-contained HTML report).")
