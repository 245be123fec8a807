"""The TTFT quantile sketch (app/domain/sketch.py) in SQL: a value's bucket index, the sketches of
records, and sketches summed key by key over rows, all set-based (grouped queries, no aggregate
folding one row at a time: that made the rollup refresh 7.5 times slower)."""

import json
from collections.abc import Mapping, Sequence

from app.domain.sketch import GAMMA, MIN_SECONDS

NULLABLE_KEYS = frozenset({"template_id"})  # the rollups' keys that may be NULL (no template)


def index_sql(value: str) -> str:
    """The bucket index of the SQL expression `value` (seconds), as bucket_index() computes it."""
    return (
        f"CASE WHEN {value} > {MIN_SECONDS!r} "
        f"THEN greatest(ceil(ln({value} / {MIN_SECONDS!r}) / ln({GAMMA!r})), 0)::int ELSE 0 END"
    )


def _as_sketches(names: str, counted: str) -> str:
    """A query body: per `names`, the sketches {index: count} of `counted`'s rows (names, client: true
    for a client TTFT's, false for a server TTFT's, idx, n), as `client` and `server` ('{}' for none)."""
    return f"""
    SELECT {names},
           coalesce(jsonb_object_agg(idx, n) FILTER (WHERE client), '{{}}') AS client,
           coalesce(jsonb_object_agg(idx, n) FILTER (WHERE NOT client), '{{}}') AS server
    FROM ({counted}) counted
    GROUP BY {names}"""


def sketches_sql(where: str) -> str:
    """A CTE body: per server, template and minute of the records matching `where` (over `r`), the
    sketches of their client and server TTFTs (`client`, `server`; '{}' for none)."""
    return _as_sketches(
        "server_id, template_id, minute",
        f"""
        SELECT r.server_id, r.template_id, date_trunc('minute', r.arrived_at) AS minute, t.client,
               {index_sql("t.v")} AS idx, count(*) AS n
        FROM traffic_requestrecord r
        CROSS JOIN LATERAL (VALUES (true, r.client_ttft_seconds), (false, r.server_ttft_seconds)) t(client, v)
        WHERE {where} AND t.v IS NOT NULL
        GROUP BY 1, 2, 3, 4, 5""",
    )


def summed_sketches_sql(*, table: str, keys: Mapping[str, str], where: str) -> str:
    """A CTE body: per `keys` ({name: expression over `table`'s rows}) of the rows matching `where`,
    their client and server sketches summed index by index (`client`, `server`). Groups whose rows
    hold no sketch entry are left out. A row's count of one index is read as an int (sum() of ints
    is a bigint, of bigints a slower numeric): no row holds two billion TTFTs in one bucket."""
    names = ", ".join(keys)
    grouped = ", ".join(str(n) for n in range(1, len(keys) + 3))
    return _as_sketches(
        names,
        f"""
        SELECT {", ".join(f"{expr} AS {name}" for name, expr in keys.items())}, e.client, e.idx, sum(e.n) AS n
        FROM {table} x CROSS JOIN LATERAL (
            SELECT true, key::int, value::int FROM jsonb_each_text(x.client_ttft_sketch)
            UNION ALL SELECT false, key::int, value::int FROM jsonb_each_text(x.server_ttft_sketch)
        ) e(client, idx, n)
        WHERE {where}
        GROUP BY {grouped}""",
    )


def with_sketches(*, insert: str, totals: str, sketches: str | None, keys: Sequence[str]) -> str:
    """`insert` (an INSERT's head whose last two columns are the client and server sketches) of the
    rows of `totals` (a query whose first columns are `keys`), each with its sketches from
    `sketches` (a query of `keys`, client, server) and '{}' where it has none; '{}' for all when
    `sketches` is None."""
    if sketches is None:
        return f"{insert}\nSELECT t.*, '{{}}'::jsonb, '{{}}'::jsonb FROM ({totals}) t"
    on = " AND ".join(
        f"k.{key} IS NOT DISTINCT FROM t.{key}" if key in NULLABLE_KEYS else f"k.{key} = t.{key}"
        for key in keys
    )
    return f"""
WITH t AS ({totals}), k AS ({sketches})
{insert}
SELECT t.*, coalesce(k.client, '{{}}'), coalesce(k.server, '{{}}') FROM t LEFT JOIN k ON {on}"""


def loaded(value: object) -> dict[str, int]:
    """A sketch as a raw cursor returns it (jsonb as text, or already decoded; None for no rows)."""
    if value is None:
        return {}
    found = json.loads(value) if isinstance(value, str | bytes) else value
    assert isinstance(found, dict)
    return found


def merged_sketch_sql(*, rows: str, by: str, sketch: str) -> str:
    """A query: per `by` (a column of the query `rows`), the sketches in column `sketch` of its rows
    summed index by index (`by`, the sketch); groups whose rows hold no entry are left out."""
    return f"""
    SELECT {by}, jsonb_object_agg(idx, n) FROM (
        SELECT r.{by}, e.key::int AS idx, sum(e.value::int) AS n
        FROM ({rows}) r CROSS JOIN LATERAL jsonb_each_text(r.{sketch}) e
        GROUP BY 1, 2
    ) s
    GROUP BY 1"""
