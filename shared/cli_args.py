"""Map frozen config dataclasses onto argparse flags, one flag per field.

A field `max_num_seqs` becomes `--max-num-seqs`; a bool field becomes a pair
(`--enable-prefix-caching` / `--no-enable-prefix-caching`). Help text,
choices and custom parsers come from the field's metadata, so the dataclass
stays the single source of truth for the flag set.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(text: str | int) -> int:
    """Parse a memory size such as `4GiB`, `512MB` or `1073741824`."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(
            f"not a memory size: {text!r} (use e.g. 4GiB, 512MiB, 2GB or a byte count)"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _base_type(tp: Any) -> Any:
    """`int | None` -> int; other types unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def add_dataclass_args(
    parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()
) -> None:
    """Add one flag per field of dataclass `cls` to `parser`."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        tp = _base_type(hints[f.name])
        kwargs: dict[str, Any] = {"dest": f.name, "help": f.metadata.get("help", "")}
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default"] = f.default_factory()
        else:
            kwargs["required"] = True
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = f.metadata.get("parse", tp if tp in (int, float, str) else str)
            if "choices" in f.metadata:
                kwargs["choices"] = f.metadata["choices"]
            if typing.get_origin(tp) in (list, tuple):
                kwargs["type"] = f.metadata.get("parse", str)
                kwargs["action"] = "append"
                kwargs["default"] = None
        group.add_argument(flag_name(f.name), *f.metadata.get("aliases", ()), **kwargs)


def dataclass_from_args(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """Build `cls` from the parsed flags that belong to it."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if f.init and hasattr(args, f.name) and getattr(args, f.name) is not None
    }
    for name, value in list(values.items()):
        if isinstance(value, list):
            values[name] = tuple(value)
    values.update(overrides)
    return cls(**values)


def dataclass_to_args(obj: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """The flags that rebuild `obj` through `add_dataclass_args` (the inverse of
    `dataclass_from_args`); fields at their defaults are left out."""
    args: list[str] = []
    for f in dataclasses.fields(obj):
        if f.name in skip or not f.init:
            continue
        value = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        if value == default or value is None:
            continue
        flag = flag_name(f.name)
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            for item in value:
                args += [flag, str(item)]
        else:
            args += [flag, str(value)]
    return args
