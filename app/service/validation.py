"""Checks that depend on settings, with errors that name the field."""

from __future__ import annotations

from app.service.errors import ApiError
from app.settings import Settings


def text_list(value: str | list[str], field: str, settings: Settings) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise ApiError(422, f"{field}: empty list: send at least one text", field)
    if len(texts) > settings.max_inputs:
        raise ApiError(
            422, f"{field}: {len(texts)} texts, more than the limit of {settings.max_inputs}", field
        )
    for position, text in enumerate(texts):
        where = field if isinstance(value, str) else f"{field}[{position}]"
        if not text.strip():
            raise ApiError(422, f"{where}: empty text", where)
        if len(text) > settings.max_chars:
            raise ApiError(
                422, f"{where}: {len(text)} characters, over the limit of {settings.max_chars}", where
            )
    return texts
