"""README.md and docs/ are for people: no internal issue numbers, and every relative link goes somewhere.

The checkers are tried on planted samples first, so a finder that finds nothing cannot pass vacuously.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# A bench's report.md is a committed record, written by `pdctl bench` beside plots that are not always committed.
WRITTEN_PAGES = [page for page in PAGES if page.name != "report.md"]

# "issue 29", "Issue #30", "issues 18", "item 4", a bare "#28"; not an upstream "vllm-project/vllm#43094"
ISSUE_REF = re.compile(r"\b[Ii]ssues?\s*#?\d+|\b[Ii]tems?\s+\d+\b|(?<![\w/.#-])#\d+\b")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEFINITION = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?([^\s>]+)>?")  # [label]: target "title"
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=[\"']([^\"']+)[\"']", re.IGNORECASE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(text: str, *, keep_code: bool = False) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code removed unless `keep_code`."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line if keep_code else INLINE_CODE.sub("", line)))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lowercase, spaces to dashes."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose(text, keep_code=True):  # GitHub slugs a heading's inline code as text
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path, text: str) -> list[str]:
    """`page:line: target (why)` for each relative link whose file, or anchor, does not exist."""
    problems = []
    for number, line in prose(text):
        definition = REF_DEFINITION.match(line)
        for target in [*LINK.findall(line), *HTML_LINK.findall(line), *([definition.group(1)] if definition else [])]:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            where = f"{page.name}:{number}: {target}"
            if path_part and not dest.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md":
                headings = anchors(dest.read_text(encoding="utf-8") if path_part else text)
                if anchor not in headings:
                    problems.append(f"{where} (no heading #{anchor} in {dest.name})")
    return problems


def issue_refs(text: str) -> list[str]:
    return [f"{number}: {match.group(0)}" for number, line in prose(text) for match in ISSUE_REF.finditer(line)]


def test_the_link_finder_finds_a_planted_bad_link_and_anchor(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A page\n\n## Its `pdctl up` part\n", encoding="utf-8")
    page = tmp_path / "README.md"
    text = ("See [there](there.md), [its part](there.md#its-pdctl-up-part), [top](#intro) and ![p](there.md).\n"
            "# Intro\n"
            "Broken: [gone](docs/missing.md), [bad](there.md#nowhere), [web](https://example.com/x), [me](#outro).\n"
            "```\n[in a code block](not/checked.md)\n```\n"
            "`[inline code](not/checked.md)`\n"
            "[ref]: there.md#its-pdctl-up-part\n"
            "[gone-ref]: <docs/gone.md> \"a title\"\n"
            '<img src="docs/missing.png" alt="x"> <a href="there.md">fine</a>\n')

    assert broken_links(page, text) == [
        "README.md:3: docs/missing.md (no such file)",
        "README.md:3: there.md#nowhere (no heading #nowhere in there.md)",
        "README.md:3: #outro (no heading #outro in README.md)",
        "README.md:9: docs/gone.md (no such file)",
        "README.md:10: docs/missing.png (no such file)",
    ]


def test_the_issue_finder_finds_internal_numbers_only() -> None:
    text = ("Issue #30, item 1. Measured for issue 29 (#28).\n"
            "vLLM does not check it: [vllm-project/vllm#43094](https://github.com/vllm-project/vllm/issues/43094).\n"
            "`issue 12 in code` is left alone; colour #1f77b4 too.\n")

    assert issue_refs(text) == ["1: Issue #30", "1: item 1", "1: issue 29", "1: #28"]


def test_slug_matches_githubs() -> None:
    assert slug("Try it (no GPU needed)") == "try-it-no-gpu-needed"
    assert slug("Benchmark: `pdctl bench`") == "benchmark-pdctl-bench"
    assert slug("Router, replicas & HAProxy") == "router-replicas--haproxy"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_internal_issue_numbers(page: Path) -> None:
    assert issue_refs(page.read_text(encoding="utf-8")) == [], f"{page.relative_to(ROOT)}: say what, not which issue"


@pytest.mark.parametrize("page", WRITTEN_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page, page.read_text(encoding="utf-8")) == []


def test_readme_is_short_and_starts_with_the_demo_the_picture_and_the_tests() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_screen = "\n".join(text.splitlines()[:60])

    assert len(text.splitlines()) <= 300
    assert "scripts/demo" in first_screen
    assert "scripts/test" in first_screen
    assert re.search(r"!\[[^\]]+\]\(docs/results/[^)]+\.png\)", first_screen)


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The body of the `## heading` section, up to the next heading of level 2."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"no '## {heading}' section"
    return match.group(1)


def test_readme_test_command_is_exactly_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = re.search(r"^exec (\S+)", ci, re.MULTILINE)
    assert command, ".ci/run no longer execs one command"
    first_screen = "\n".join(_readme().splitlines()[:60])

    assert re.search(rf"^```bash\n{re.escape(command.group(1))}\n```$", first_screen, re.MULTILINE)


def test_readme_links_every_guide_and_lists_them_in_its_contents() -> None:
    text = _readme()
    targets = {target for _, line in prose(text) for target in LINK.findall(line)}
    contents = next(line for _, line in prose(text) if line.startswith("**Contents:**"))
    contents_block = text[text.index(contents):].split("\n\n")[0]

    assert {"docs/cluster-guide.md", "docs/router-replicas.md", "docs/observability.md", "docs/slurm.md",
            "docs/configuration.md", "docs/results/README.md", "docs/benchmarking.md"} <= targets
    for anchor in ("#router-replicas-and-haproxy", "#observability", "#slurm", "#configuration", "#results",
                   "#glossary"):
        assert f"]({anchor})" in contents_block, anchor


def test_readme_glossary_defines_the_paths_a_report_names() -> None:
    glossary = _section(_readme(), "Glossary")

    for term in ("OFF", "ON via the prefill", "ON on the decode alone", "Eviction"):
        assert f"- **{term}**" in glossary, term
    assert "router.local_prefill_tokens=0" in glossary  # how to get ON via the prefill


def test_readme_prose_has_no_internal_jargon() -> None:
    words = " ".join(line for _, line in prose(_readme()))  # a report's `ON local` label in code is fine

    for jargon in ("anchor", "ON local", "reference recipe"):
        assert jargon not in words, jargon


def test_readme_vllm_pin_says_what_ran_on_gpus() -> None:
    from pdctl.topology.model import Python

    default = Python.model_fields["vllm_version"].default
    paragraph = next(p for p in _readme().split("\n\n") if p.startswith("**vLLM version.**"))

    assert f"vLLM {default}" in paragraph
    assert "0.26.0" in paragraph and "checked against its wheel" in paragraph


def test_live_membership_does_not_call_replicas_unbuilt() -> None:
    text = (ROOT / "docs" / "live-membership.md").read_text(encoding="utf-8")

    assert "not built" not in text
    assert "router-replicas.md" in text.split("\n## ")[0]  # the opening links the built replicas


def test_cluster_guide_says_unknown_host_keys_are_refused_and_the_flag_exists() -> None:
    from typer.testing import CliRunner

    from pdctl.cli import app

    guide = (ROOT / "docs" / "cluster-guide.md").read_text(encoding="utf-8")
    keys = next(p for p in guide.split("\n\n") if p.startswith("Host keys are checked"))
    commands = re.findall(r"`([a-z-]+)`", keys.split("`accept-new`)")[1].split("all take it")[0])

    assert "**refused**" in keys and "--accept-new-host-keys" in keys
    assert len(commands) >= 5, commands
    for command in commands:
        # rich sizes the help by COLUMNS, not by the runner's terminal width: a narrow value left in the environment
        # by anything earlier in the process would cut the option's name short
        result = CliRunner().invoke(app, [command, "--help"], terminal_width=200,
                                    env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
        assert result.exit_code == 0 and "--accept-new-host-keys" in result.output, command


def test_cluster_guide_bench_says_how_to_measure_the_read_back() -> None:
    guide = (ROOT / "docs" / "cluster-guide.md").read_text(encoding="utf-8")
    bench = guide[guide.index("## 6."):guide.index("## 7.")]

    assert re.search(r"--leg '?on-prefill:connector\.bidirectional_kv_xfer=true,router\.local_prefill_tokens=0", bench)
    named = set(re.findall(r"scripts/[\w/.-]*\w", guide))
    assert "scripts/gpu/build-wheelhouse.sh" in named
    assert [n for n in sorted(named) if not (ROOT / n).exists()] == []  # every script it names, a clone has
