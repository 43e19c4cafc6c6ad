"""Command-line options generated from a config dataclass: one ``--field-name`` per field, typed from its
annotation, defaulting to its default, its help from ``metadata``; bools as ``--x`` / ``--no-x``.

Every trainer's config is the one description of what it takes (as sentence-transformers' one
``TrainingArguments`` family), so a new field is an option without touching the command line. Stdlib only:
``cloze --help`` builds every option without loading torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def option(
    help: str = "",
    *,
    flags: Sequence[str] = (),
    choices: Sequence[str] = (),
    parse: Callable[[str], Any] | None = None,
    required: bool = False,
) -> dict[str, Any]:
    """A field's ``metadata``: its help, other spellings (the first replaces ``--field-name``), its choices,
    a parser for one argument that replaces the annotation's (e.g. a comma-separated list), and whether a
    field with a placeholder default must be given all the same."""
    return {
        "help": help,
        "flags": tuple(flags),
        "choices": tuple(choices),
        "parse": parse,
        "required": required,
    }


def parse_bool(text: str) -> bool:
    if text.lower() in TRUE_WORDS:
        return True
    if text.lower() in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def add_config_options(
    parser: argparse.ArgumentParser, config: type, *, overrides: bool = False, skip: Sequence[str] = ()
) -> None:
    """One option per field of ``config``. With ``overrides`` every option defaults to None (the caller
    layers the given ones over defaults of its own, e.g. a recipe file) and none is required."""
    hints = typing.get_type_hints(config)
    for field in dataclasses.fields(config):
        if field.name not in skip:
            _add_field(parser, field, hints[field.name], overrides)


def config_from_args(config: type, args: argparse.Namespace, **values: Any):
    """The config the parsed options describe (``values`` replace fields the command line does not carry)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(config) if hasattr(args, f.name)}
    return config(**{**given, **values})


def _add_field(parser: argparse.ArgumentParser, field: dataclasses.Field, hint: Any, overrides: bool) -> None:
    meta = field.metadata
    flags = list(meta.get("flags") or ()) or ["--" + field.name.replace("_", "-")]
    default = _default(field)
    required = not overrides and (default is dataclasses.MISSING or meta.get("required", False))
    shown = "" if required or default in (None, "", []) else f" (default: {_shown(default)}"
    shown = shown and shown + (", or the recipe's)" if overrides else ")")
    kwargs: dict[str, Any] = {
        "dest": field.name,
        "help": (meta.get("help", "") + shown).strip().replace("%", "%%"),
    }
    if required:
        kwargs["required"] = True
    else:
        kwargs["default"] = None if overrides else default
    if choices := meta.get("choices"):
        kwargs["choices"] = list(choices)
    inner, is_list = _unwrap(hint)
    if meta.get("parse"):
        kwargs["type"] = meta["parse"]
    elif inner is bool:
        _add_bool(parser, flags, kwargs)
        return
    elif is_list:
        kwargs.update(nargs="+", type=inner)
    elif inner in (int, float):
        kwargs["type"] = inner
    parser.add_argument(*flags, **kwargs)


def _add_bool(parser: argparse.ArgumentParser, flags: list[str], kwargs: dict[str, Any]) -> None:
    """``--x`` (or ``--x true|false``, as ``cloze adapt`` always took) and ``--no-x``; the last one given wins."""
    negatives = ["--no-" + flag.removeprefix("--") for flag in flags]
    kwargs["help"] = f"{kwargs['help']}; {negatives[0]} turns it off".lstrip("; ")
    parser.add_argument(*flags, nargs="?", const=True, type=parse_bool, metavar="BOOL", **kwargs)
    parser.add_argument(
        *negatives,
        dest=kwargs["dest"],
        action="store_false",
        default=kwargs.get("default"),
        help=argparse.SUPPRESS,
    )


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _shown(default: Any) -> str:
    return " ".join(map(str, default)) if isinstance(default, list) else str(default)


def _unwrap(hint: Any) -> tuple[type, bool]:
    """The element type of ``X``, ``X | None``, ``list[X]`` or ``list[X] | None``, and whether it is a list."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in args if arg is not type(None))
        args = typing.get_args(hint)
    if typing.get_origin(hint) is list:
        return args[0], True
    return hint, False
