"""The README's first screen is short and plain: at most 120 lines, no sentence over 40 words (prose only: code
blocks and table rows are not sentences). Its quick start runs as written: tests/launcher/test_readme_quickstart.py."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES, MAX_WORDS = 120, 40


def prose_sentences(markdown: str) -> list[str]:
    """Sentences of the prose: code blocks, table rows and headings dropped, list items and paragraphs joined."""
    text = re.sub(r"```.*?```", "\n\n", markdown, flags=re.S)
    kept = [line for line in text.splitlines() if not line.lstrip().startswith(("|", "#"))]
    paragraphs = re.split(r"\n\s*\n|\n(?=- )", "\n".join(kept))
    out = []
    for para in paragraphs:
        flat = " ".join(para.split())
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*])|(?<=:)\s+(?=-)", flat) if s]
    return out


def test_the_sentence_splitter() -> None:
    text = "# Title\n\nOne two. Three four five.\n\n```bash\nnot a sentence here.\n```\n| a | b |\n- Item one.\n"
    assert prose_sentences(text) == ["One two.", "Three four five.", "- Item one."]


def test_readme_is_short_and_its_sentences_are_plain() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES
    long = [s for s in prose_sentences(text) if len(s.split()) > MAX_WORDS]
    assert not long, long
