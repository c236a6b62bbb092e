"""The repository stays small and portable: kept benchmark data under 3 MB, BENCHMARKS.md a reference of at most
250 lines, no absolute path of the machine that wrote a file, and every file the documents name present."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH_BYTES = 3 * 1024 * 1024
BLOCK = 4096                      # what `du` counts per file: whole blocks
# built from parts so that this file does not hold what it looks for
MACHINE_PATH = re.compile("|".join("/" + p for p in ("tmp/", "root/", "home/[a-z]", "work/")))
# a repository path in running text; "<rev>:docs/..." names a file of an older tree (git's syntax) and is skipped
NAMED_PATH = re.compile(r"(?<![\w:/.-])(?:ds_configs|docs)/[^\s`'\")\]|,;]*")
TEMPLATE = re.compile(r"[{*<]")    # ds_configs/<model>_dense.json, docs/bench/x-{a,b}/: a pattern, not a file
LINK = re.compile(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)")
HEADING = re.compile(r"^#+ (.+)$", re.M)


def _tracked(*patterns: str) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *patterns], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.stdout.decode().split("\0") if p and (ROOT / p).is_file()]


def _documents() -> list[Path]:
    return [p for p in _tracked("README.md", "docs/*.md", "ds_configs/README.md")]


def _named(text: str) -> list[str]:
    """The repository paths a document names in its text (sentence punctuation stripped, patterns left out)."""
    return [m.group(0).rstrip(".:") for m in NAMED_PATH.finditer(text) if not TEMPLATE.search(m.group(0))]


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a document's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in HEADING.findall(markdown)}


def test_kept_benchmark_data_is_at_most_3_mb() -> None:
    files = _tracked("docs/bench")
    size = sum(-(-p.stat().st_size // BLOCK) * BLOCK for p in files)
    assert size <= BENCH_BYTES, f"docs/bench holds {size / 2**20:.1f} MiB in {len(files)} files (at most 3 MiB)"


def test_benchmarks_md_is_a_reference_of_at_most_250_lines() -> None:
    lines = (ROOT / "docs" / "BENCHMARKS.md").read_text().splitlines()
    assert len(lines) <= 250, f"docs/BENCHMARKS.md has {len(lines)} lines: the chronology goes to BENCHMARKS_HISTORY.md"


def test_no_tracked_text_file_holds_an_absolute_machine_path() -> None:
    hits = []
    for path in _tracked():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue                          # binary (plots)
        hits += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1)
                 if MACHINE_PATH.search(line)]
    assert not hits, f"absolute machine paths (use relative paths, basenames or tempfile): {hits[:20]}"


LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\] \[[A-Z]+\]")


def test_no_document_holds_a_pasted_log_line() -> None:
    """A tool's output pasted into a document brings the libraries' log lines with it (DeepSpeed's accelerator
    warning went into SCALE.md's table that way)."""
    hits = [f"{doc.relative_to(ROOT)}:{n}" for doc in _documents()
            for n, line in enumerate(doc.read_text().splitlines(), 1) if LOG_LINE.match(line)]
    assert not hits, f"log lines in documents: {hits}"
    assert LOG_LINE.match("[2026-12-02 10:42:54,405] [WARNING] [real_accelerator.py:213:get_accelerator] x")


def test_every_path_the_documents_name_exists() -> None:
    missing = []
    for doc in _documents():
        text = doc.read_text()
        rel = doc.relative_to(ROOT)
        if rel.name != "BENCHMARKS_HISTORY.md":        # the chronology names older trees' files as written then
            missing += [f"{rel}: {name}" for name in _named(text) if not (ROOT / name).exists()]
        for target, anchor in LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            linked = doc.parent / target
            if not linked.exists():
                missing.append(f"{rel}: link {target}")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked.read_text()):
                missing.append(f"{rel}: link {target}#{anchor}")
    assert not missing, f"named but not in the repository: {missing}"


def test_the_path_pattern_finds_what_it_should() -> None:
    """The checks above are only as good as their patterns: a guard against a pattern that matches nothing."""
    text = ("see ds_configs/x.json, `docs/bench/a.json` and 921a7a5:docs/bench/old/ or ds_configs/<model>_dense.json "
            "and docs/bench/r-{1gbit,100mbit}/ (docs/zero.md).")
    assert _named(text) == ["ds_configs/x.json", "docs/bench/a.json", "docs/zero.md"]
    assert _anchors("# A title\n## 9. Cost-model selection\n## Method") == {"a-title", "9-cost-model-selection", "method"}
    assert MACHINE_PATH.search("out = " + "/" + "tmp/x") and not MACHINE_PATH.search("tempfile.gettempdir()")


CODE_DIRS = ("ds_gravac", "ds_gravac_bench", "runners", "tests")


def backslash_continuations(source: str) -> list[int]:
    """Lines that end in a backslash continuation (outside strings and comments)."""
    import io
    import tokenize

    in_strings: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING:
            in_strings.update(range(tok.start[0], tok.end[0]))
    return [i for i, line in enumerate(source.splitlines(), 1)
            if line.rstrip().endswith("\\") and i not in in_strings and not line.lstrip().startswith("#")]


def test_the_code_has_no_backslash_continuations() -> None:
    """Parentheses, not backslashes, continue a line (a backslash breaks on a trailing space)."""
    found = [f"{p.relative_to(ROOT)}:{i}" for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py"))
             for i in backslash_continuations(p.read_text(encoding="utf-8"))]
    assert not found, found


def test_the_continuation_scan_sees_one() -> None:
    assert backslash_continuations('x = 1 + \\\n    2\ny = "a \\\nb"\n') == [1]
