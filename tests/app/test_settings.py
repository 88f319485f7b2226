"""Settings: flags, SURGE_* environment variables, defaults, and the table of docs/configuration.md."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app.options import OPTIONS
from app.settings import Settings, parse_settings


def test_defaults() -> None:
    settings = parse_settings([], environ={})
    assert settings == Settings()
    assert settings.model == "tiny" and settings.port == 8000 and settings.api_key == ()


def test_environment_then_flag_precedence() -> None:
    env = {"SURGE_MAX_NUM_SEQS": "7", "SURGE_PORT": "9001", "SURGE_API_KEY": "a, b", "SURGE_MODEL": "/m"}
    settings = parse_settings(["--port", "9002"], environ=env)
    assert settings.max_num_seqs == 7
    assert settings.port == 9002
    assert settings.api_key == ("a", "b")
    assert settings.engine.scheduler.max_num_seqs == 7
    assert settings.engine.model.model == "/m"
    # A repeated flag replaces the environment's list, it does not extend it.
    assert parse_settings(["--api-key", "c"], environ=env).api_key == ("c",)


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "argv",
    [["--port", "0"], ["--max-num-seqs", "0"], ["--max-num-batched-tokens", "8", "--max-num-seqs", "8"]],
)
def test_invalid_values_raise(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        parse_settings(argv, environ={})


def test_bad_choice_exits() -> None:
    with pytest.raises(SystemExit):
        parse_settings(["--dtype", "int3"], environ={})


def test_every_option_is_in_the_configuration_table() -> None:
    table = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    for option in OPTIONS:
        assert f"| `{option.flag}` | `{option.env}` |" in table, option.flag
