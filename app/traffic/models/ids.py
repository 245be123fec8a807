"""The rollup tables' ids: each table's own sequence, filled in by the database."""

from django.db import models


def next_id(table: str) -> models.Func:
    """The next value of a rollup table's own id sequence (the initial migration makes it).

    The rollups' primary key is (server, id), so that Citus can distribute them by server
    (tests/core/test_shardable_schema.py): `id` is no longer the primary key, so it cannot be an
    AutoField, and the database fills it in as an AutoField's identity did.
    """
    return models.Func(
        models.Value(f"{table}_id_seq"), function="nextval", output_field=models.BigIntegerField()
    )
