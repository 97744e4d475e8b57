"""Server-Sent Events as the run stream sends them (`id:`, `event:`, `data:` lines, a blank line
ends a message, `:` lines are keep-alives)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Message:
    event: str
    data: Any
    id: int | None = None


def read_stream(lines: Iterable[str]) -> Iterator[Message]:
    event = "message"
    data: list[str] = []
    message_id: int | None = None
    for line in lines:
        line = line.rstrip("\r\n")
        if not line:
            if data:
                text = "\n".join(data)
                try:
                    payload: Any = json.loads(text)
                except ValueError:
                    payload = text
                yield Message(event, payload, message_id)
            event, data, message_id = "message", [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id" and value.isdigit():
            message_id = int(value)
