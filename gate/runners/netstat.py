"""The kernel's own count of connections a listening socket turned away, read around a
served run so that an error or a slow TTFT can name its cause where the kernel saw one.

Linux counts, per network namespace, in /proc/net/netstat (the "TcpExt:" header and value
lines):
  ListenOverflows  a SYN (or the handshake's final ACK) that arrived while the listener's
                   accept queue was full (its listen backlog): dropped (net/ipv4/tcp_input.c,
                   tcp_conn_request; tcp_ipv4.c, tcp_v4_syn_recv_sock).
  ListenDrops      every connection attempt dropped at a listener, overflows included.
A dropped SYN is retransmitted by the client after its initial RTO (1 s), then 2 s and 4 s
later (1 s, 3 s, 7 s after the first): a request that got through after a drop has that
wait in its TTFT; one that did not fails at connect.

The counters are the namespace's, not one server's: another listener's overflows on the
same machine count too, and notes say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

NETSTAT = Path("/proc/net/netstat")


@dataclass(frozen=True)
class ListenCounters:
    """TcpExt ListenOverflows and ListenDrops (counts since boot; None: not in the file)."""

    overflows: int | None
    drops: int | None


def listen_counters(path: Path | str = NETSTAT) -> ListenCounters | None:
    """The kernel's TcpExt ListenOverflows and ListenDrops now, read from `path`
    (/proc/net/netstat). None where the file cannot be read or has neither counter (not
    Linux, a sandbox without /proc/net). Never raises."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith("TcpExt:")]
    if len(rows) < 2 or len(rows[0]) != len(rows[1]):
        return None
    values: dict[str, int] = {}
    for name, value in zip(rows[0], rows[1], strict=False):
        try:
            values[name] = int(value)
        except ValueError:
            continue
    found = ListenCounters(values.get("ListenOverflows"), values.get("ListenDrops"))
    return None if found.overflows is None and found.drops is None else found


def _rise(before: int | None, after: int | None) -> int:
    return after - before if before is not None and after is not None and after > before else 0


def listen_note(before: ListenCounters | None, after: ListenCounters | None, runner: str, at: str) -> str | None:
    """A report note when the kernel's listen-queue counters rose between `before` and
    `after` (listen_counters) while runner `runner` ran at `at` (e.g. "concurrency 64,
    200 requests"); None when they did not rise or either reading is None."""
    if before is None or after is None:
        return None
    overflows, drops = _rise(before.overflows, after.overflows), _rise(before.drops, after.drops)
    if not overflows and not drops:
        return None
    if overflows:
        counted = (
            f"{overflows} listen-queue overflow(s) (TcpExt ListenOverflows, each dropped SYN or handshake, a "
            f"retransmitted one again; {drops} ListenDrops)"
        )
        why = "connections were dropped at SYN because a server's accept backlog (its listen queue) was full"
    else:
        counted = (
            f"{drops} dropped connection attempt(s) at a listening socket (TcpExt ListenDrops; no ListenOverflows)"
        )
        why = "connection attempts were dropped before a server accepted them"
    return (
        f"the kernel counted {counted} while runner {runner!r} ran at {at}: {why}; requests that got through "
        "waited for SYN retransmits (1 s, 3 s, 7 s, ... after the first SYN), which their TTFT includes, and the "
        "others timed out or failed at connect (the counters are this machine's network namespace's: another "
        "listener's drops "
        "count too)"
    )


__all__ = ["ListenCounters", "NETSTAT", "listen_counters", "listen_note"]
