"""A small HTTP/1.1 keep-alive client on asyncio streams, for AsyncLedger's JSON calls.

httpx costs about a millisecond of CPU per request; the worker makes one per
chunk, so its calls go through this instead (~0.1 ms). Plain ``http://`` only;
streams (events, results) and ``https://`` stay on httpx.
"""
from __future__ import annotations

import asyncio
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

import httpx

Answer = Tuple[int, Dict[str, str], bytes]


class RawPool:
    def __init__(self, url: str, headers: Dict[str, str]) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        base = f"Host: {parts.netloc}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._base_headers = base
        self._idle: List[Tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    @staticmethod
    def usable(url: str) -> bool:
        return urlsplit(url).scheme == "http"

    async def request(self, method: str, target: str, body: Optional[bytes], headers: Optional[Dict[str, str]],
                      timeout: float) -> Answer:
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else ""
        head = (f"{method} {self.prefix}{target} HTTP/1.1\r\n{self._base_headers}{extra}"
                f"Content-Length: {len(body) if body else 0}\r\n\r\n").encode("latin-1")
        data = head + body if body else head
        for attempt in (0, 1):
            reused = bool(self._idle)
            try:
                conn = self._idle.pop() if reused else await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), timeout)
            except asyncio.TimeoutError:
                raise httpx.ConnectTimeout(f"connecting to {self.host}:{self.port} timed out") from None
            except OSError as err:
                raise httpx.ConnectError(f"{self.host}:{self.port}: {err}") from None
            try:
                answer, keep = await asyncio.wait_for(self._exchange(conn, data), timeout)
            except asyncio.TimeoutError:
                conn[1].close()
                raise httpx.ReadTimeout(f"{method} {target}: no answer within {timeout}s") from None
            except (OSError, asyncio.IncompleteReadError, ValueError) as err:
                conn[1].close()
                if (reused and attempt == 0 and isinstance(err, (ConnectionError, asyncio.IncompleteReadError))
                        and not getattr(err, "partial", b"") and not conn[0]._buffer):  # type: ignore[attr-defined]
                    # Not a byte of an answer on a connection that sat idle: the service had closed it
                    # before reading the request. Once more, on a new connection.
                    continue
                raise httpx.ReadError(f"{method} {target}: {type(err).__name__}: {err}") from None
            except BaseException:  # cancelled mid-exchange: the connection's state is unknown
                conn[1].close()
                raise
            if keep:
                self._idle.append(conn)
            else:
                conn[1].close()
            return answer
        raise AssertionError("unreachable")

    @staticmethod
    async def _exchange(conn: Tuple[asyncio.StreamReader, asyncio.StreamWriter], data: bytes) -> Tuple[Answer, bool]:
        reader, writer = conn
        writer.write(data)
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        keep = headers.get("connection", "").lower() != "close"
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            body = b"".join(parts)
        elif status in (204, 304) or 100 <= status < 200:
            body = b""
        else:
            body, keep = await reader.read(), False
        return (status, headers, body), keep

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()
