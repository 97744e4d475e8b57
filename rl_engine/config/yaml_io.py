"""Reading, validating and writing run configs: YAML/JSON text or files, and the JSON schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rl_engine.config.error_messages import config_error_from
from rl_engine.config.errors import ConfigError
from rl_engine.config.schema import RunConfig


def validate_config(data: object) -> RunConfig:
    """Validate a plain dict (form, API body, parsed YAML) into a RunConfig or raise ConfigError (anything
    but a dict included)."""
    if not isinstance(data, dict):
        raise ConfigError([{"loc": "", "msg": f"a run config must be a mapping, got {type(data).__name__}"}])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise config_error_from(e) from None


def load_config(path_or_text: str | Path) -> RunConfig:
    """Load a RunConfig from a YAML/JSON file path (str or Path) or from YAML/JSON text."""
    text = _read_source(path_or_text)
    return validate_config(parse_text(text))


def dump_config(cfg: RunConfig, *, exclude_defaults: bool = False) -> str:
    """YAML text with keys in declaration order; `load_config(dump_config(c)) == c`."""
    data = cfg.model_dump(mode="json", exclude_defaults=exclude_defaults)
    if exclude_defaults:
        # Required fields and the version always stay, so the text is a complete config on its own.
        data = {"schema_version": cfg.schema_version, "name": cfg.name, **data}
        data["rewards"] = [{"type": r.type, **d} for r, d in zip(cfg.rewards, data.get("rewards", []), strict=True)]
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


def config_json_schema() -> dict[str, Any]:
    """JSON schema of RunConfig (every field has a description); the browser form is built from it."""
    return RunConfig.model_json_schema()


def _read_source(path_or_text: str | Path) -> str:
    if isinstance(path_or_text, Path):
        return _read_file(path_or_text)
    s = path_or_text
    if "\n" not in s and s.strip():
        p = Path(s)
        try:
            is_file = p.is_file()
        except OSError:  # e.g. a name too long to be a path: it is text
            is_file = False
        if is_file:
            return _read_file(p)
        if p.suffix.lower() in (".yaml", ".yml", ".json") and ": " not in s:
            raise ConfigError([{"loc": "", "msg": f"config file not found: {s}"}])
    return s


def _read_file(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([{"loc": "", "msg": f"cannot read config file {p}: {e.strerror or e}"}]) from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # let construct_mapping raise its own error
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_text(text: str) -> Any:
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass  # flow-style YAML, or broken JSON: YAML gives the line-numbered error
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as e:
        raise ConfigError([{"loc": "", "msg": _yaml_error_message(e)}]) from None
    if data is None:
        raise ConfigError([{"loc": "", "msg": "the config is empty"}])
    return data


def _yaml_error_message(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    context = getattr(e, "context", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    detail = f"{context}, {problem}" if context and context not in problem else problem
    return f"YAML syntax error{where}: {detail}"
