"""The ingest benches' baseline: raw psycopg COPY of prepared rows into traffic_requestrecord."""

import time
from collections.abc import Sequence

from django.db import connection, transaction


def copy_seconds(columns: Sequence[str], rows: Sequence[tuple[object, ...]], *, batch: int) -> float:
    """Seconds to COPY the rows (built before the clock starts), `batch` rows per COPY, each
    COPY committed on its own."""
    started = time.perf_counter()
    for start in range(0, len(rows), batch):
        with (
            transaction.atomic(),
            connection.cursor() as cursor,
            cursor.cursor.copy(f"COPY traffic_requestrecord ({', '.join(columns)}) FROM STDIN") as copy,
        ):
            for row in rows[start : start + batch]:
                copy.write_row(row)
    return time.perf_counter() - started
