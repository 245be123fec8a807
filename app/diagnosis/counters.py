"""Which servers' hit counters are not wired over a window (app/domain/hitcounter.py), from their
request records: the cached tokens they reported and the TTFT of repeats and first sightings."""

from datetime import datetime

from django.db import connection

from app.domain.hitcounter import CounterEvidence, counter_not_wired

# A repeat: a request whose first block the server had served before in the window (the first of
# each block is a first sighting). TTFT as vLLM measured it, else as the client saw it.
_EVIDENCE_SQL = """
WITH sighted AS (
  SELECT server_id, cached_tokens, COALESCE(server_ttft_seconds, client_ttft_seconds) AS ttft,
         row_number() OVER (PARTITION BY server_id, block_hashes[1] ORDER BY arrived_at) > 1 AS repeat
  FROM traffic_requestrecord
  WHERE arrived_at >= %s AND arrived_at < %s AND cardinality(block_hashes) > 0
    AND cached_tokens IS NOT NULL AND (%s::int8[] IS NULL OR server_id = ANY(%s))
)
SELECT server_id, count(*), sum(cached_tokens),
       count(ttft) FILTER (WHERE repeat),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft) FILTER (WHERE repeat),
       count(ttft) FILTER (WHERE NOT repeat),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft) FILTER (WHERE NOT repeat)
FROM sighted GROUP BY server_id
"""


def counter_evidence(
    *, since: datetime, until: datetime, only: list[int] | None = None
) -> dict[int, CounterEvidence]:
    """Each server's evidence over [since, until) (`only`: those servers; None: all)."""
    with connection.cursor() as cursor:
        cursor.execute(_EVIDENCE_SQL, [since, until, only, only])
        return {
            server: CounterEvidence(requests, int(cached), repeats, repeat_ttft, firsts, first_ttft)
            for server, requests, cached, repeats, repeat_ttft, firsts, first_ttft in cursor.fetchall()
        }


def unwired_counters(*, since: datetime, until: datetime, only: list[int] | None = None) -> set[int]:
    """The servers whose hit counter was not wired over [since, until)."""
    found = counter_evidence(since=since, until=until, only=only)
    return {server for server, evidence in found.items() if counter_not_wired(evidence)}
