"""Guidelines and rubrics: a campaign's instructions, each question's help and each rating point's rubric
are markdown, rendered here to HTML once for the pages (no database).

markdown-it-py with CommonMark and raw HTML off: any HTML a researcher types comes out escaped as text,
and links with a script, `vbscript:`, `file:` or `data:` target (other than images) are left as text by
markdown-it's own link check, so the pages may insert the result as HTML. Tables and strikethrough are
on (GitHub's two most used additions to CommonMark).
"""

from __future__ import annotations

from typing import Any

from markdown_it import MarkdownIt

_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


def render_markdown(text: str) -> str:
    """The text as safe HTML ("" for no text)."""
    return _MARKDOWN.render(text) if text and text.strip() else ""


def question_guidelines(question: dict[str, Any]) -> dict[str, Any]:
    """A question's help and, for ratings, its rubric, rendered: {"help_html", "rubric_html": [per point]}."""
    rubric = question.get("rubric") or []
    return {"help_html": render_markdown(question.get("help", "")), "rubric_html": [render_markdown(r) for r in rubric]}
