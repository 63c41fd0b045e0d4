"""The connection pool of one run() call: one single-connection client per request in flight."""

from __future__ import annotations

from typing import Any

import httpx


class Clients:
    """One single-connection httpx.AsyncClient per request in flight, reused (keep-alive)
    by the next request. One shared pool of N connections costs O(N) per request start and
    end in httpcore (its pool scan), which at concurrency 64 delays the client by tens of ms
    and smears token times; single-connection clients keep the client's cost per event flat.
    trust_env=False: no proxy from the environment sits between gate and the server it measures.
    `timeout`: each client's; `tls`: whether the server is https (one TLS context for all)."""

    def __init__(self, timeout: httpx.Timeout, tls: bool):
        self.timeout = timeout
        self.verify: Any = httpx.create_ssl_context() if tls else False  # one TLS context for all (loading certificates is slow)
        self.free: list[httpx.AsyncClient] = []
        self.all: list[httpx.AsyncClient] = []

    def prepare(self, n: int) -> None:
        """Make clients now until there are `n` (idle until taken)."""
        while len(self.all) < n:
            self.free.append(self._new())

    def take(self) -> httpx.AsyncClient:
        """An idle client, or a new one when none is idle."""
        return self.free.pop() if self.free else self._new()

    def _new(self) -> httpx.AsyncClient:
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                                   timeout=self.timeout, trust_env=False, verify=self.verify)
        self.all.append(client)
        return client

    def give(self, client: httpx.AsyncClient) -> None:
        """Hand `client` back (idle) once its request ended."""
        self.free.append(client)

    async def aclose(self) -> None:
        """Close every client made."""
        for client in self.all:
            await client.aclose()
