"""Which addresses a port listens on, read from /proc/net/tcp and tcp6 (Linux)."""

from __future__ import annotations

import socket
from pathlib import Path


def listening_on(port: int) -> set[str]:
    """The addresses with a socket listening on ``port`` (IPv4-mapped IPv6 ones as IPv4)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state != "0A" or int(p, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(addr)
            if len(raw) == 16:  # IPv6: four little-endian words; an IPv4-mapped address ends in the IPv4 one
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                text = socket.inet_ntop(socket.AF_INET6, raw)
                out.add(text.removeprefix("::ffff:"))
            else:
                out.add(socket.inet_ntoa(raw[::-1]))
    return out

