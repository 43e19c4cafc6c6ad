"""What the generated models (``models.py``) stand on: dataclasses read from and written to JSON by their own
annotations. Hand-written, and small, so that the client needs no pydantic (it installs with httpx
alone) while its models still come from the service's schemas (tools/generate_client.py)."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from itertools import repeat
from typing import Any, NamedTuple, TypeVar, Union, get_args, get_origin

M = TypeVar("M", bound="Model")


class Model:
    """A generated model's base. ``from_json`` reads an answer leniently: it keeps the fields the class
    declares (a newer service may send more) and builds nested models, lists and tuples from their
    annotations; ``to_json`` leaves out optional fields left None (the service then applies its default)."""

    @classmethod
    def from_json(cls: type[M], data: Mapping[str, Any]) -> M:
        declared = _fields(cls)
        values = {name: _load(declared[name].kind, value) for name, value in data.items() if name in declared}
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for name, field in _fields(type(self)).items():
            value = getattr(self, name)
            if value is None and field.optional:
                continue
            body[name] = _dump(field.kind, value)
        return body


class _Field(NamedTuple):
    kind: Any  # the annotation, evaluated
    optional: bool  # its default is None: left out of a request when None


_FIELDS: dict[type, dict[str, _Field]] = {}


def _fields(cls: type) -> dict[str, _Field]:
    """A model's fields, their annotations evaluated once (in its module: models.py's names, ``Mode``...)."""
    if cls not in _FIELDS:
        hints = typing.get_type_hints(cls)
        _FIELDS[cls] = {f.name: _Field(hints[f.name], f.default is None) for f in dataclasses.fields(cls)}
    return _FIELDS[cls]


def _load(kind: Any, value: Any) -> Any:
    if value is None:
        return None
    origin, args = get_origin(kind), get_args(kind)
    if origin is Union or origin is types.UnionType:
        options = [option for option in args if option is not type(None)]
        return _load(options[0], value) if len(options) == 1 else value
    if origin is list:
        return [_load(args[0], item) for item in value]
    if origin is tuple:
        return tuple(_load(item_kind, item) for item_kind, item in zip(args, value, strict=False))
    if isinstance(kind, type) and issubclass(kind, Model):
        return kind.from_json(value)
    return value


def _dump(kind: Any, value: Any) -> Any:
    """``value`` as JSON can hold it: models as objects, tuples as lists, numbers where ``float`` is declared
    as floats (a numpy float32 or an int in a vector is sent as a JSON number)."""
    if value is None:
        return None
    if isinstance(value, Model):
        return value.to_json()
    origin, args = get_origin(kind), get_args(kind)
    if origin is Union or origin is types.UnionType:
        options = [option for option in args if option is not type(None)]
        return _dump(options[0], value) if len(options) == 1 else value
    if origin in (list, tuple):
        item_kinds = args if origin is tuple else repeat(args[0])
        return [_dump(item_kind, item) for item_kind, item in zip(item_kinds, value, strict=False)]
    if kind is float:
        return float(value)
    return value
