"""The names the core gives its ops where the name itself carries facts: a peer copy's devices and route.

The core names its ops; the trace and the analysis read the names back (``parse_peer_copy``).
"""

from __future__ import annotations

import re

#: A peer copy (``Buffer.copy_from`` between two devices of one backend) is a ``d2d`` span on the destination's stream
#: whose name ends in ``[SRC → DST, ROUTE]`` (device specs): ROUTE "direct" went device to device, "staged" went
#: through host memory as no direct path exists, "staged, direct path unused" went through the host although one does.
PEER_ROUTES: tuple[str, ...] = ("direct", "staged", "staged, direct path unused")
_PEER_NAME = re.compile(r"\[(\S+) → (\S+), (" + "|".join(map(re.escape, PEER_ROUTES)) + r")\]$")


def peer_copy_name(label: str, src: str, dst: str, route: str) -> str:
    """The span name of a peer copy: ``label`` followed by both devices and the route (one of PEER_ROUTES)."""
    if route not in PEER_ROUTES:
        raise ValueError(f"unknown peer route {route!r}; expected one of {PEER_ROUTES}")
    return f"{label} [{src} → {dst}, {route}]"


def parse_peer_copy(name: str) -> tuple[str, str, str] | None:
    """(source, destination, route) of a peer copy's span name, or None when ``name`` is not one."""
    match = _PEER_NAME.search(name)
    return None if match is None else (match[1], match[2], match[3])
