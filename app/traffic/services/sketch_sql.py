"""The TTFT quantile sketch (app/domain/sketch.py) in SQL: a value's bucket index, and the aggregate
that sums sketches (created by migration traffic 0029)."""

import json

from app.domain.sketch import GAMMA, MIN_SECONDS

SKETCH_SUM = "prefixscope_sketch_sum"  # sums jsonb sketches {index: count} key by key

# The aggregate and the function it folds with (traffic 0029 creates them).
CREATE_SQL = f"""
CREATE OR REPLACE FUNCTION prefixscope_sketch_add(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(jsonb_object_agg(key, total), '{{}}'::jsonb) FROM (
        SELECT key, sum(value::bigint) AS total
        FROM (SELECT * FROM jsonb_each_text(a) UNION ALL SELECT * FROM jsonb_each_text(b)) e
        GROUP BY key
    ) t
$$;
CREATE OR REPLACE AGGREGATE {SKETCH_SUM}(jsonb) (
    SFUNC = prefixscope_sketch_add, STYPE = jsonb, INITCOND = '{{}}'
);
"""
DROP_SQL = (
    f"DROP AGGREGATE IF EXISTS {SKETCH_SUM}(jsonb); "
    "DROP FUNCTION IF EXISTS prefixscope_sketch_add(jsonb, jsonb);"
)


def index_sql(value: str) -> str:
    """The bucket index of the SQL expression `value` (seconds), as bucket_index() computes it."""
    return (
        f"CASE WHEN {value} > {MIN_SECONDS!r} "
        f"THEN greatest(ceil(ln({value} / {MIN_SECONDS!r}) / ln({GAMMA!r})), 0)::int ELSE 0 END"
    )


def sketches_sql(where: str) -> str:
    """A CTE body: per server, template and minute of the records matching `where` (over `r`), the
    sketches of their client and server TTFTs (`client`, `server`; '{}' for none)."""
    return f"""
    SELECT server_id, template_id, minute,
           coalesce(jsonb_object_agg(idx, n) FILTER (WHERE kind = 'c'), '{{}}') AS client,
           coalesce(jsonb_object_agg(idx, n) FILTER (WHERE kind = 's'), '{{}}') AS server
    FROM (
        SELECT r.server_id, r.template_id, date_trunc('minute', r.arrived_at) AS minute, t.kind,
               {index_sql("t.v")} AS idx, count(*) AS n
        FROM traffic_requestrecord r
        CROSS JOIN LATERAL (VALUES ('c', r.client_ttft_seconds), ('s', r.server_ttft_seconds)) t(kind, v)
        WHERE {where} AND t.v IS NOT NULL
        GROUP BY 1, 2, 3, 4, 5
    ) s
    GROUP BY 1, 2, 3"""


def loaded(value: object) -> dict[str, int]:
    """A sketch as a raw cursor returns it (jsonb as text, or already decoded; None for no rows)."""
    if value is None:
        return {}
    found = json.loads(value) if isinstance(value, str | bytes) else value
    assert isinstance(found, dict)
    return found
