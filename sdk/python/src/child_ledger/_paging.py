"""Splits a registration's children into pages (bounded memory: one page at a time)."""
from __future__ import annotations

from typing import Any, List, Mapping, Optional

from ._base import _dumps

MAX_PAGE_CHILDREN = 10_000
MAX_PAGE_BYTES = 4 * 1024 * 1024 - 64 * 1024  # ~4 MiB of JSON, with room for the envelope


def encode_child(spec: Any) -> bytes:
    if not isinstance(spec, Mapping):
        raise TypeError(f"each child is a mapping such as {{'payload': ...}}, not {type(spec).__name__}")
    return _dumps(spec if isinstance(spec, dict) else dict(spec)).encode()


class Chunker:
    """Collects encoded children; ``add`` hands back a full page once the next item
    would not fit in it (so a full page always has at least one child after it)."""

    def __init__(self) -> None:
        self.items: List[bytes] = []
        self.size = 0

    def add(self, spec: Any) -> Optional[List[bytes]]:
        enc = encode_child(spec)
        full = None
        if self.items and (len(self.items) >= MAX_PAGE_CHILDREN or self.size + len(enc) + 24 > MAX_PAGE_BYTES):
            full, self.items, self.size = self.items, [], 0
        self.items.append(enc)
        self.size += len(enc) + 24  # a comma and, when appended, `"sequence":N,`
        return full


def put_body(registration: Mapping[str, Any], children: Optional[List[bytes]]) -> bytes:
    """A PUT body: the registration's members and, when given, the children (decomposed)."""
    if children is None:
        return _dumps(dict(registration, decomposed=False)).encode()
    head = _dumps(dict(registration, decomposed=True)).encode()[:-1]
    return head + b',"children":[' + b",".join(children) + b"]}"


def append_body(start: int, children: List[bytes]) -> bytes:
    parts = []
    for i, enc in enumerate(children, start):
        parts.append(b'{"sequence":%d}' % i if enc == b"{}" else b'{"sequence":%d,' % i + enc[1:])
    return b'{"children":[' + b",".join(parts) + b"]}"
