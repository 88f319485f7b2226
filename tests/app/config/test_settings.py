"""Settings: flags, SURGE_* environment variables, defaults, and the table of docs/configuration.md."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app.config.arguments import parse_settings
from app.config.options import OPTIONS
from app.config.settings import Settings
from models.config import AUTO_THREADS


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


def test_prefix_caching_is_on_by_default_and_sized_in_bytes_or_as_a_share() -> None:
    default = parse_settings([], environ={}).engine.scheduler
    assert default.prefix_caching and (default.prefix_cache_bytes, default.prefix_cache_share) == (0, 1.0)
    off = parse_settings(["--prefix-caching", "off"], environ={}).engine.scheduler
    assert not off.prefix_caching
    sized = parse_settings(["--prefix-cache-size", "512MiB"], environ={}).engine.scheduler
    assert (sized.prefix_cache_bytes, sized.prefix_cache_share) == (512 * 2**20, 0.0)
    shared = parse_settings([], environ={"SURGE_PREFIX_CACHE_SIZE": "25%"}).engine.scheduler
    assert (shared.prefix_cache_bytes, shared.prefix_cache_share) == (0, 0.25)
    assert parse_settings(["--prefix-cache-size", "2GB"], environ={}).engine.scheduler.prefix_cache_bytes == 2 * 10**9


def test_the_kv_memory_is_a_share_of_the_device_by_default_bytes_or_unchecked() -> None:
    default = parse_settings([], environ={}).engine.scheduler
    assert (default.kv_cache_bytes, default.kv_cache_share) == (0, 0.9)
    sized = parse_settings(["--kv-cache-memory", "8GiB"], environ={}).engine.scheduler
    assert (sized.kv_cache_bytes, sized.kv_cache_share) == (8 * 2**30, 0.0)
    shared = parse_settings([], environ={"SURGE_KV_CACHE_MEMORY": "50%"}).engine.scheduler
    assert (shared.kv_cache_bytes, shared.kv_cache_share) == (0, 0.5)
    unchecked = parse_settings(["--kv-cache-memory", "0"], environ={}).engine.scheduler
    assert (unchecked.kv_cache_bytes, unchecked.kv_cache_share) == (0, 0.0)
    with pytest.raises(ValueError, match="share of the device's memory up to 100%"):
        parse_settings(["--kv-cache-memory", "150%"], environ={})


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "argv",
    [
        ["--port", "0"],
        ["--max-num-seqs", "0"],
        ["--max-num-batched-tokens", "8", "--max-num-seqs", "8"],
        ["--prefix-cache-size", "lots"],
        ["--prefix-cache-size", "12 parsecs"],
        ["--prefix-cache-size=-5%"],
        ["--num-threads", "-1"],
        ["--num-threads", "many"],
    ],
)
def test_invalid_values_raise(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        parse_settings(argv, environ={})


def test_help_lists_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: a `%` in one option's help (`50%`) made `surge serve --help` raise in argparse."""
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--help"], environ={})
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert all(option.flag in text for option in OPTIONS)
    assert "(`50%`)" in text


def test_bad_choice_exits() -> None:
    with pytest.raises(SystemExit):
        parse_settings(["--dtype", "int3"], environ={})


def test_every_option_is_in_the_configuration_table() -> None:
    table = (Path(__file__).parents[3] / "docs" / "configuration.md").read_text()
    for option in OPTIONS:
        assert f"| `{option.flag}` | `{option.env}` |" in table, option.flag


def test_num_threads_is_auto_by_default_or_a_count() -> None:
    assert parse_settings([], environ={}).engine.model.num_threads == AUTO_THREADS
    assert parse_settings(["--num-threads", "2"], environ={}).engine.model.num_threads == 2
    assert parse_settings([], environ={"SURGE_NUM_THREADS": "0"}).engine.model.num_threads == 0  # torch's default
    assert parse_settings(["--num-threads", "AUTO"], environ={}).engine.model.num_threads == AUTO_THREADS


@pytest.mark.parametrize(
    ("settings", "needs"),
    [
        ({"kv_events_endpoint": "localhost:5557"}, "ZeroMQ address"),
        ({"kv_events_endpoint": "tcp://*:5557", "prefix_caching": "off"}, "prefix_caching on"),
    ],
)
def test_kv_events_need_an_address_and_the_prefix_cache(settings: dict[str, str], needs: str) -> None:
    with pytest.raises(ValueError, match=needs):
        Settings(**settings)  # type: ignore[arg-type]
    assert Settings(kv_events_endpoint="tcp://*:5557").engine.scheduler.kv_events
    assert not Settings().engine.scheduler.kv_events
