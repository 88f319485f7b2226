"""The keys file: parsing, start-up errors, per-key limits, and the tier in scope state."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request

from app.cli import main
from app.config.settings import Settings
from middleware.edge.auth import ApiKeyMiddleware
from middleware.keys_file import KeyEntry, KeysFileError, Limits, load_keys_file, per_key_limits
from tests.live_server import serve_app

YAML = """
sk-team-a: {rpm: 600, tpm: 200000, tier: 0}
sk-batch:
  tpm: 50000
  tier: 2
sk-plain:
sk-ops: {min_priority: -10}
"""


def write(tmp_path: Path, text: str, name: str = "keys.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_keys_with_optional_limits_and_tiers(tmp_path: Path) -> None:
    keys = load_keys_file(write(tmp_path, YAML))
    assert keys.entries == (
        KeyEntry("sk-team-a", rpm=600, tpm=200000, tier=0),
        KeyEntry("sk-batch", tpm=50000, tier=2),
        KeyEntry("sk-plain"),
        KeyEntry("sk-ops", min_priority=-10),
    )
    assert keys.keys == ("sk-team-a", "sk-batch", "sk-plain", "sk-ops")
    assert keys.priority_tiers() == {"sk-team-a": 0, "sk-batch": 2}
    assert keys.min_priorities() == {"sk-ops": -10}


def test_merge_similar_per_key(tmp_path: Path) -> None:
    keys = load_keys_file(write(tmp_path, "sk-a: {merge_similar: 0.95}\nsk-b: {merge_similar: 0}\nsk-c:\n", "k.yaml"))
    assert keys.merge_thresholds() == {"sk-a": 0.95, "sk-b": 0.0}


def test_json_keys(tmp_path: Path) -> None:
    keys = load_keys_file(write(tmp_path, '{"sk-a": {"rpm": 0}, "sk-b": null}', "keys.json"))
    assert keys.entries == (KeyEntry("sk-a", rpm=0), KeyEntry("sk-b"))


def test_per_key_limits_fall_back_to_the_server_wide_ones(tmp_path: Path) -> None:
    keys = load_keys_file(write(tmp_path, YAML))
    assert per_key_limits(keys, Limits(rpm=60, tpm=1000)) == {
        "sk-team-a": Limits(600, 200000),
        "sk-batch": Limits(60, 50000),
        "sk-plain": Limits(60, 1000),
        "sk-ops": Limits(60, 1000),
    }


@pytest.mark.parametrize(
    ("text", "name", "message"),
    [
        ("sk-a: [1, 2", "keys.yaml", "not valid YAML"),
        ('{"sk-a": ', "keys.json", "not valid JSON"),
        ("- sk-a\n- sk-b\n", "keys.yaml", "expected a non-empty mapping"),
        ("", "keys.yaml", "expected a non-empty mapping"),
        ("12345: {rpm: 1}", "keys.yaml", "is not a string (quote it)"),
        ('"sk a": {rpm: 1}', "keys.yaml", "empty or contains whitespace"),
        ("sk-a: 5", "keys.yaml", "expected a mapping with rpm, tpm, tier, min_priority, max_concurrent"),
        ("sk-a: {rpm: 1, burst: 5}", "keys.yaml", "unknown field(s) burst"),
        ("sk-a: {rpm: -1}", "keys.yaml", "rpm must be 0 (unlimited) or positive"),
        ("sk-a: {tpm: 1.5}", "keys.yaml", "tpm must be an integer"),
        ("sk-a: {merge_similar: 1.5}", "keys.yaml", "merge_similar must be a number from 0 (off) to 1"),
        ("sk-a: {merge_similar: yes}", "keys.yaml", "merge_similar must be a number"),
        ("sk-a: {merge_similar: .nan}", "keys.yaml", "merge_similar must be a number"),
        ("sk-a: {tier: yes}", "keys.yaml", "tier must be an integer"),
        ("sk-a: {min_priority: 3}", "keys.yaml", "min_priority must be 0 or negative"),
        ("sk-a: {min_priority: -2000000}", "keys.yaml", "min_priority must be 0 or negative"),
    ],
)
def test_invalid_files_fail_at_startup_naming_the_problem(tmp_path: Path, text: str, name: str, message: str) -> None:
    path = write(tmp_path, text, name)
    with pytest.raises(KeysFileError) as caught:
        load_keys_file(path)
    assert message in str(caught.value) and str(path) in str(caught.value)


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KeysFileError, match="cannot read it"):
        load_keys_file(tmp_path / "nope.yaml")


def test_errors_do_not_print_whole_keys(tmp_path: Path) -> None:
    with pytest.raises(KeysFileError) as caught:
        load_keys_file(write(tmp_path, "sk-very-secret-key: {rpm: -1}"))
    assert "sk-very-secret-key" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "name", "where"),
    [
        ("sk-very-secret-key-123: [1, 2\n", "keys.yaml", "line 2, column 1"),
        ("sk-very-secret-key-123: {rpm: 1}\n  bad: indent: x\n", "keys.yaml", "line 2, column 3"),
        ('{"sk-very-secret-key-123": {"rpm": 1}', "keys.json", "line 1, column 38"),
    ],
)
def test_a_file_that_does_not_parse_is_reported_without_its_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, name: str, where: str
) -> None:
    """The attack surface: PyYAML's message quotes the offending line, an API key, into the log."""
    path = write(tmp_path, text, name)
    with pytest.raises(KeysFileError) as caught:
        load_keys_file(path)
    assert "very-secret" not in str(caught.value) and where in str(caught.value)
    with pytest.raises(SystemExit):
        main(["serve", "--keys-file", str(path)])
    assert "very-secret" not in capsys.readouterr().err


def test_settings_load_the_file_and_the_cli_reports_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path, YAML)
    settings = Settings(keys_file=str(good))
    assert settings.keys is not None and settings.keys.keys == ("sk-team-a", "sk-batch", "sk-plain", "sk-ops")
    bad = write(tmp_path, "sk-a: {rpm: many}", "bad.yaml")
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--keys-file", str(bad)])
    assert exited.value.code == 2
    assert "rpm must be an integer" in capsys.readouterr().err


def test_the_tier_of_an_authenticated_key_is_in_scope_state() -> None:
    app = FastAPI()

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, object]:
        return {"tier": getattr(request.state, "priority_tier", None)}

    app.add_middleware(ApiKeyMiddleware, api_keys=["sk-a", "sk-b"], priority_tiers={"sk-a": 2})
    with serve_app(app) as url:
        tiers = [
            httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["tier"]
            for key in ("sk-a", "sk-b")
        ]
    assert tiers == [2, None]


def test_a_tier_for_an_unknown_key_is_refused() -> None:
    with pytest.raises(ValueError, match="priority tier"):
        ApiKeyMiddleware(FastAPI(), api_keys=["sk-a"], priority_tiers={"sk-b": 1})
