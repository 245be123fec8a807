"""Where a router sends each group of requests, and whether that moved: the evidence of a routing change.

A prefix-aware (or sticky) router keeps the requests that share a prefix on the servers that hold it:
a template's requests of one tenant land on one server, or a few. A router that stops doing so (a
switch to round-robin or random, a hash ring reshuffled) sends them elsewhere: the share of a
group's requests landing on the servers it landed on before falls. Counted per group and server,
from the request rollups; pure.
"""

from collections.abc import Hashable, Mapping
from typing import TypeVar

Group = TypeVar("Group", bound=Hashable)  # a template and tenant, say
Server = TypeVar("Server", bound=Hashable)


def share_stayed(
    before: Mapping[Group, Mapping[Server, int]],
    after: Mapping[Group, Mapping[Server, int]],
    *,
    min_requests: int,
) -> float | None:
    """Of requests counted per group and server: the share of those of `after` that landed where
    their group's requests of `before` did. Per group, the overlap of its two spreads over the servers
    (one minus their total variation distance: 1 when the group kept its servers in the same
    proportions, 0 when it moved wholly elsewhere), weighted by the group's requests in `after`.
    Groups with fewer than `min_requests` on either side are left out (the spread of three requests
    is noise); None when none is left."""
    weighted, total = 0.0, 0
    for group, later in after.items():
        earlier = before.get(group, {})
        n_before, n_after = sum(earlier.values()), sum(later.values())
        if n_before < min_requests or n_after < min_requests:
            continue
        overlap = sum(min(earlier.get(server, 0) / n_before, n / n_after) for server, n in later.items())
        weighted += overlap * n_after
        total += n_after
    return weighted / total if total else None
