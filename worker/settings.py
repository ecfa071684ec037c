"""Settings as pydantic models, and the three ways they are given: command-line flags,
`KVROUTE_<NAME>` environment variables and explicit values (a Serve config's args).

One model is the single source of a component's settings: `kvroute serve`
(router/serve/settings.py) and `kvroute engine` (worker/engine/config.py `EngineSettings`,
which the serve settings extend) derive their flags, their variables, their validation and
their help from it.

Precedence, lowest to highest: the field's default < `KVROUTE_<NAME>` in the environment <
an explicit value (a flag, a `key=value` arg, a Serve config arg). A field marked
`FLAG_ONLY` has no variable: Kubernetes injects `KVROUTE_PORT=tcp://...` (and other
`KVROUTE_*` service-link variables) into every pod of a namespace with a Service named
kvroute, so a setting named `port` must never be read from the environment. A value given
as a string (env, `serve run key=value`, a flag) is coerced by pydantic ("2" -> 2, "true"
-> True, "inf" -> inf); a bad one raises one `SettingsError` naming the setting and where
its value came from.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo

ENV_PREFIX = "KVROUTE_"
# `Field(..., json_schema_extra=FLAG_ONLY)`: the setting is never read from the environment.
FLAG_ONLY = {"env": False}


class SettingsError(ValueError):
    """A bad setting: the message names each bad setting and where its value came from."""


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def reads_env(field: FieldInfo) -> bool:
    """Whether the setting is read from `KVROUTE_<NAME>` (all but `FLAG_ONLY` ones)."""
    extra = field.json_schema_extra
    return not (isinstance(extra, dict) and extra.get("env") is False)


SettingsT = TypeVar("SettingsT", bound=BaseModel)


def load_settings(cls: type[SettingsT], explicit: Mapping[str, Any], env: Mapping[str, str],
                  label: Callable[[str], str] = lambda name: f"arg {name}") -> SettingsT:
    """`cls` from its defaults, then `KVROUTE_<NAME>` in `env`, then `explicit` values.

    An explicit `None` or "" (a Serve config's `null`, `serve run key=`) counts as not given.
    `label(name)` says how the caller spells an explicit setting in errors (e.g. a flag).
    """
    unknown = sorted(set(explicit) - set(cls.model_fields))
    if unknown:
        raise SettingsError(f"unknown kvroute setting(s) {', '.join(unknown)}; known: "
                            f"{', '.join(cls.model_fields)}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, field in cls.model_fields.items():
        if reads_env(field) and env.get(env_name(name), "") != "":
            values[name], sources[name] = env[env_name(name)], f"${env_name(name)}"
        if explicit.get(name) not in (None, ""):
            values[name], sources[name] = explicit[name], label(name)
    try:
        return cls.model_validate(values)
    except ValidationError as err:
        raise SettingsError(_describe(cls, err, values, sources)) from None


def is_secret(field: FieldInfo) -> bool:
    """A secret's value (a key) is never printed, in an error or anywhere else."""
    return SecretStr in (field.annotation, *typing.get_args(field.annotation))


def _describe(cls: type[BaseModel], err: ValidationError, values: dict[str, Any],
              sources: dict[str, str]) -> str:
    problems = []
    for error in err.errors(include_url=False):
        name = str(error["loc"][0]) if error["loc"] else None
        msg = error["msg"].removeprefix("Value error, ")
        if name in values:
            shown = "(hidden)" if is_secret(cls.model_fields[name]) else repr(values[name])
            problems.append(f"{name} = {shown} (from {sources[name]}): {msg}")
        else:
            problems.append(msg)
    return "invalid kvroute settings: " + "; ".join(problems)


# ---- command-line flags ----
# Each field becomes `--field-name` with the field's description, default and environment
# variable in its help. A flag left out is absent from the parsed namespace (not filled with
# the default), so `KVROUTE_<NAME>` still applies to it. Values stay strings here; the model
# coerces and validates them, as it does for the environment and `serve run key=value`.

def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _choices(field: FieldInfo) -> tuple[str, ...] | None:
    if typing.get_origin(field.annotation) is Literal:
        return tuple(typing.get_args(field.annotation))
    return None


def _help(name: str, field: FieldInfo, env: bool) -> str:
    default = "unset" if field.default is None else field.default
    where = f"; env ${env_name(name)}" if env else ""
    # argparse %-formats help strings: a literal % must be doubled.
    return f"{field.description} (default: {default}{where})".replace("%", "%%")


def add_flags(parser: argparse.ArgumentParser, model: type[BaseModel], env: bool = True
              ) -> None:
    """One flag per field of `model`; booleans get --name and --no-name. `env`: the help
    names each field's `KVROUTE_<NAME>` variable (the caller loads them)."""
    group = parser.add_argument_group(model.__name__, model.__doc__)
    for name, field in model.model_fields.items():
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS,
                                  "help": _help(name, field, env and reads_env(field))}
        if field.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            choices = _choices(field)
            kwargs["metavar"] = "{" + ",".join(choices) + "}" if choices else name.upper()
        group.add_argument(flag_name(name), **kwargs)


def given_flags(ns: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The fields of `model` set on the command line."""
    return {name: getattr(ns, name) for name in model.model_fields if hasattr(ns, name)}
