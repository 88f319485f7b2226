"""scripts/bench.py's peers and open loop, without starting a model: a peer that cannot start is an
error row; `--systems` is checked; Poisson arrivals have the asked rate."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_peer_that_cannot_start_is_an_error_row(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "TRANSFORMERS_CLI", (str(tmp_path / "no-such-transformers"),))
    args = bench.parse_args(["--systems", "transformers", "--out", str(tmp_path / "bench.md")])
    sut = bench.make_server("transformers", tmp_path / "no-model", 4, args)
    row, _ = bench.measure(sut, bench.LoadSpec(4, 1, 8, 8))
    assert row["system"] == "transformers" and row["num_errors"] == 1 and row["tokens_per_s"] == 0.0
    assert "FileNotFoundError" in row["errors"][0]


def test_systems_flag(bench: ModuleType) -> None:
    assert bench.parse_args(["--systems", "naive,surge"]).systems == ["naive", "surge"]
    assert bench.parse_args(["--smoke"]).systems == ["surge"]
    assert bench.parse_args(["--stack", "off"]).systems == ["surge"]
    assert {"surge", "naive"} <= set(bench.parse_args([]).systems)
    assert bench.parse_args([]).concurrency == [1, 8, 32, 64]
    for bad in ("vllm", "surge,surge", ","):
        with pytest.raises(SystemExit):
            bench.parse_args(["--systems", bad])


def test_on_a_gpu_the_python_servers_and_the_ceiling_move_there(bench: ModuleType, tmp_path: Path) -> None:
    out = ["--out", str(tmp_path / "bench.md")]
    args = bench.parse_args(["--device", "cuda", "--dtype", "bfloat16", "--systems", "surge,transformers,naive", *out])
    assert args.systems == ["surge", "transformers"]
    assert args.skipped == ["naive skipped: CPU only, and --device is cuda"]
    for system in args.systems:
        argv = bench.make_server(system, tmp_path / "model", 4, args).argv
        assert argv[argv.index("--device") + 1] == "cuda" and argv[argv.index("--dtype") + 1] == "bfloat16"
    for bad in (["--quantization", "int8"], ["--build-llama-server"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--device", "cuda", *bad, *out])
    cpu = bench.parse_args(["--systems", "surge", *out])
    argv = bench.make_server("surge", tmp_path / "model", 4, cpu).argv
    assert argv[argv.index("--device") + 1] == "cpu" and argv[argv.index("--dtype") + 1] == "float32"


def test_poisson_arrivals_have_the_asked_rate(bench: ModuleType) -> None:
    times = bench.arrival_times(20.0, 50.0, seed=0)
    assert times == sorted(times) and times[0] > 0 and times[-1] < 50.0
    assert len(times) == pytest.approx(1000, rel=0.1)
    assert bench.arrival_times(20.0, 50.0, seed=0) == times  # deterministic: the progress bar's total
    spec = bench.LoadSpec(4, 1, 8, 8, rate=20.0, duration_s=50.0)
    assert bench.num_requests(spec) == len(times) and bench.load_label(spec) == "poisson 20/s"
