"""`surge serve`'s command line and environment: the arguments parser, and the one `Settings` built from them.

Precedence: a command-line flag, then `SURGE_<NAME>`, then the default (on `Settings`). List
settings repeat the flag or take a comma-separated variable. `--model` repeats too: the first is
the main model, each further one (`name=path`) one more served model (`Settings.models`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

from app.config.options import OPTIONS
from app.config.settings import Settings


def default_of(name: str) -> object:
    """An option's default: it lives once, on the Settings field of the same name."""
    return Settings.__dataclass_fields__[name].default


def add_serve_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    for option in OPTIONS:
        # argparse formats help with %: a literal one (`50%`) must be doubled, or --help raises.
        text = option.help.replace("%", "%%") + f" [{option.env}]"
        if option.multiple:
            # Resolved in settings_from_namespace: a flag given on the command line replaces the env list.
            parser.add_argument(option.flag, action="append", default=None, help=text)
            continue
        raw = environ.get(option.env)
        default = option.type(raw) if raw is not None else default_of(option.name)
        parser.add_argument(
            option.flag,
            type=option.type,
            default=default,
            choices=option.choices,
            help=text,
        )


def settings_from_namespace(ns: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    values: dict[str, Any] = {}
    for option in OPTIONS:
        value = getattr(ns, option.name)
        if option.multiple:
            if value is None:
                raw = environ.get(option.env)
                value = [v.strip() for v in (raw or "").split(",") if v.strip()]
                if option.name == "api_key" and raw is not None and not value:
                    # NOTE: a Secret that rendered empty must not silently turn auth off.
                    raise ValueError(f"{option.env} is set but holds no key; unset it to run without auth")
            elif option.name == "api_key" and not all(v.strip() for v in value):
                raise ValueError(f"{option.flag} needs a key, not an empty string")
            value = tuple(value)
            if option.name == "model":  # the first is the main model, each further one more
                values["models"] = value[1:]
                value = value[0] if value else default_of("model")
        values[option.name] = value
    return Settings(**values)


def parse_settings(argv: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog="surge serve")
    env = os.environ if environ is None else environ
    add_serve_arguments(parser, env)
    return settings_from_namespace(parser.parse_args(list(argv)), env)
