"""Command-line flags derived from a settings model (router/serve/settings.py).

Each field becomes `--field-name` with the field's description, default and environment
variable in its help. A flag left out is absent from the parsed namespace (not filled with
the default), so `KVROUTE_<NAME>` still applies to it: see `load_settings`'s precedence.
Values stay strings here; the model coerces and validates them, as it does for the
environment and `serve run key=value`.
"""

from __future__ import annotations

import argparse
import typing
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from router.serve.settings import env_name


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _choices(field: FieldInfo) -> tuple[str, ...] | None:
    if typing.get_origin(field.annotation) is Literal:
        return tuple(typing.get_args(field.annotation))
    return None


def _help(name: str, field: FieldInfo) -> str:
    default = "unset" if field.default is None else field.default
    # argparse %-formats help strings: a literal % must be doubled.
    text = f"{field.description} (default: {default}; env ${env_name(name)})"
    return text.replace("%", "%%")


def add_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One flag per field of `model`; booleans get --name and --no-name."""
    group = parser.add_argument_group(model.__name__, model.__doc__)
    for name, field in model.model_fields.items():
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS,
                                  "help": _help(name, field)}
        if field.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            choices = _choices(field)
            kwargs["metavar"] = "{" + ",".join(choices) + "}" if choices else name.upper()
        group.add_argument(flag_name(name), **kwargs)


def given_flags(ns: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The fields of `model` set on the command line."""
    return {name: getattr(ns, name) for name in model.model_fields if hasattr(ns, name)}
