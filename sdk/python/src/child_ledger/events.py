"""Server-sent events: the typed Event and an incremental parser."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, List, Optional

__all__ = ["Event", "SSEParser"]


@dataclass(frozen=True)
class Event:
    """One server-sent event: ``event`` (snapshot, progress, completed, paused,
    resumed), its ``id`` and its ``data`` parsed as JSON (a Parent, a Queue, or
    ``{"queue", "paused"}``)."""

    event: str
    id: Optional[str]
    data: Any


class SSEParser:
    """Feed it lines (without their line ending); it returns an Event at each blank line."""

    def __init__(self) -> None:
        self.last_id: Optional[str] = None
        self.retry_ms: Optional[int] = None
        self._event: Optional[str] = None
        self._data: List[str] = []

    def line(self, line: str) -> Optional[Event]:
        if not line:
            if not self._data:
                self._event = None
                return None
            raw = "\n".join(self._data)
            try:
                data: Any = json.loads(raw)
            except ValueError:
                data = raw
            event = Event(self._event or "message", self.last_id, data)
            self._event, self._data = None, []
            return event
        if line[0] == ":":  # a comment (keep-alive)
            return None
        field, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id":
            if "\0" not in value:
                self.last_id = value
        elif field == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None
