"""Lists a page at a time (`limit`, `offset`), with bounds PostgreSQL can take."""

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from django.db.models import Model, QuerySet
from ninja import Field, Schema
from ninja.pagination import LimitOffsetPagination

M = TypeVar("M", bound=Model)
PER_PAGE = 100
MAX_LIMIT = 1000
MAX_OFFSET = 2**31 - 1  # far beyond any list here; an offset (or limit) past bigint was a 500 (DataError)


class Pages(LimitOffsetPagination):
    """django-ninja's limit and offset, bounded: a larger one is a 400, not a 500."""

    class Input(Schema):
        limit: int = Field(PER_PAGE, ge=1, le=MAX_LIMIT)
        offset: int = Field(0, ge=0, le=MAX_OFFSET)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_limit=MAX_LIMIT, **kwargs)


class Rows(Generic[M]):
    """A queryset's rows as answers, read a page at a time: the paginator counts it and slices it,
    and only the page's rows are read and converted."""

    def __init__(self, found: QuerySet[M], answer: Callable[[M], dict[str, Any]]) -> None:
        self.found, self.answer = found, answer

    def __len__(self) -> int:
        return self.found.count()

    def __getitem__(self, page: slice) -> list[dict[str, Any]]:
        return [self.answer(row) for row in self.found[page]]
