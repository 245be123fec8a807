"""`manage.py check` (and so every start) refuses a tokenizer file it cannot load, naming why."""

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error


def tokenizer_file_loads(**kwargs: Any) -> list[CheckMessage]:
    from app.compare.tokenization import local_tokenizer

    path = settings.PREFIXSCOPE_TOKENIZER_FILE
    if not path:
        return []
    try:
        local_tokenizer(path, settings.PREFIXSCOPE_TOKENIZER_PATTERN)
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises bare Exceptions
        return [Error(f"PREFIXSCOPE_TOKENIZER_FILE={path}: {exc}", id="prefixscope.E001")]
    return []
