"""The cache salts each tenant's requests carried (TenantSalt), kept up by the minute rollups: a salt
a tenant did not send before is a rotation, told as a notice (prefixscope_tenant_salts_total)."""

from datetime import datetime

from django.db import connection

_SALTS_SQL = """
INSERT INTO traffic_tenantsalt AS s (tenant, salt_hash, first_seen_at, last_seen_at)
SELECT tenant, salt_hash, min(arrived_at), max(arrived_at)
FROM traffic_requestrecord
WHERE arrived_at >= %(since)s AND arrived_at < %(until)s AND tenant <> ''
GROUP BY 1, 2
ON CONFLICT ON CONSTRAINT tenant_salt_identity DO UPDATE SET
    first_seen_at = least(s.first_seen_at, excluded.first_seen_at),
    last_seen_at = greatest(s.last_seen_at, excluded.last_seen_at)
"""


def refresh_tenant_salts(*, since: datetime, until: datetime) -> None:
    """Add the salts the records of [since, until) carried, per tenant (idempotent: a rerun of the
    same minutes changes nothing)."""
    with connection.cursor() as cursor:
        cursor.execute(_SALTS_SQL, {"since": since, "until": until})
