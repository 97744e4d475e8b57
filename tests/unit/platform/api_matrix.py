"""Every endpoint under /api/, found by walking the URL resolver, for permission-matrix tests.

    from tests.unit.platform.api_matrix import api_endpoints
    for endpoint in api_endpoints():
        endpoint.key          # "POST /api/rewards/{pk}/try/"
        endpoint.url(pk=3)    # "/api/rewards/3/try/"

An endpoint is one (method, route) pair. Methods come from the view itself: a viewset's
action map (`{"get": "list", "post": "create"}`), an APIView's handlers or an `@api_view`'s
declared methods; HEAD and OPTIONS are left out (DRF answers them for every view). Routes whose
only difference is a `.json` format suffix (DefaultRouter's extra patterns) are skipped: they
are the same view. Route parameters appear as `{name}`, whatever the converter or regex.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver

IGNORED_METHODS = frozenset({"HEAD", "OPTIONS"})
_ROUTE_PARAM = re.compile(r"<(?:[^:<>]+:)?(?P<name>\w+)>")


@dataclass(frozen=True, order=True)
class Endpoint:
    route: str  # "/api/models/{pk}/"
    method: str  # "GET"
    name: str | None  # URL name, for reverse()
    params: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.method} {self.route}"

    def url(self, **params: Any) -> str:
        missing = set(self.params) - set(params)
        if missing:
            raise KeyError(f"{self.key} needs route parameters {sorted(missing)}")
        return self.route.format(**{k: params[k] for k in self.params})


def api_endpoints(prefix: str = "/api/") -> list[Endpoint]:
    """Every (method, route) served under `prefix`, sorted by route then method."""
    found: set[Endpoint] = set()
    for route, pattern in _walk(get_resolver().url_patterns, ""):
        if not route.startswith(prefix):
            continue
        params = tuple(re.findall(r"\{(\w+)\}", route))
        if "format" in params:
            continue
        for method in _methods(pattern.callback):
            found.add(Endpoint(route=route, method=method, name=pattern.name, params=params))
    return sorted(found)


def _walk(patterns: list[Any], prefix: str):
    for pattern in patterns:
        route = prefix + _route_text(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield "/" + route.lstrip("/"), pattern


def _route_text(pattern: Any) -> str:
    """`models/<int:pk>/` or `^models/(?P<pk>[^/.]+)/$` -> `models/{pk}/`."""
    text = str(pattern)
    if hasattr(pattern, "regex") and type(pattern).__name__ == "RegexPattern":
        return _regex_to_route(text)
    return _ROUTE_PARAM.sub(lambda m: "{" + m.group("name") + "}", text)


def _regex_to_route(regex: str) -> str:
    text = regex.removeprefix("^").removesuffix("$").removesuffix("\\Z")
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("(?P<", i):
            end = text.index(">", i)
            name = text[i + 4 : end]
            depth, j = 1, end + 1
            while depth and j < len(text):  # skip to the group's closing parenthesis
                if text[j] == "\\":
                    j += 2
                    continue
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            out.append("{" + name + "}")
            i = j
        elif text[i] == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _methods(callback: Any) -> list[str]:
    actions = getattr(callback, "actions", None)  # a DRF viewset bound by a router
    if actions:
        methods = {m.upper() for m in actions}
    else:
        view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        if view_class is None:
            return ["GET"]  # a plain function view: it cannot tell; assume a page
        methods = {m.upper() for m in view_class.http_method_names if hasattr(view_class, m)}
    return sorted(methods - IGNORED_METHODS)
