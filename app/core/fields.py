"""Model fields shared by the apps."""

from typing import Any

from django.db import models

from app.domain.blockhash import signed_to_wire, wire_to_signed


class UInt64Field(models.BigIntegerField[int | None, int | None]):
    """An unsigned 64-bit integer (vLLM's block hashes) stored in a PostgreSQL bigint.

    PostgreSQL has no unsigned type; values at or above 2**63 are stored as their two's
    complement, so equality and indexes work and the column stays 8 bytes. Python code
    always sees the unsigned value. Bulk writers (COPY) apply `wire_to_signed` themselves.
    """

    description = "Unsigned 64-bit integer"

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return None if value is None else wire_to_signed(int(value))

    def from_db_value(self, value: int | None, expression: Any, connection: Any) -> int | None:
        return None if value is None else signed_to_wire(value)

    @property
    def validators(self) -> list[Any]:
        # BigIntegerField's signed range validators would reject hashes >= 2**63.
        return []
