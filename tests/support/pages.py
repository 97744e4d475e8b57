"""Checks on served pages that random tokens cannot make pass or fail by chance.

A page carries a fresh CSRF token (64 random letters and digits) in every form: a substring check such as
`"beta" not in page` fails once in a while when the token happens to spell it. Check the page without its
tokens, or check what the test means (the assets a page loads) instead.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

_CSRF_VALUE = re.compile(r'(name="csrfmiddlewaretoken"\s+value=")[^"]*"')


def without_tokens(html: str) -> str:
    """The page with every CSRF token's value emptied, for substring checks."""
    return _CSRF_VALUE.sub(r'\1"', html)


class _AssetUrls(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        for attribute in ("src", "href") if tag in ("script", "link", "img", "iframe") else ():
            if named.get(attribute):
                self.urls.append(str(named[attribute]))


def foreign_assets(html: str) -> list[str]:
    """The scripts, stylesheets, images and frames a page loads from another host."""
    parser = _AssetUrls()
    parser.feed(html)
    return [url for url in parser.urls if urlsplit(url).netloc]
