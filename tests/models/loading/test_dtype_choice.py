"""`--dtype auto` on a CPU: float32 where bfloat16 has no hardware, else what a probe in a child
process measures on the model's shape; a probe that faults or errs leaves float32, and the verdict
is cached per CPU and shape."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from models.config import ModelConfig
from models.loading import dtype_choice
from models.loading.dtype_choice import DtypeChoice, choose_cpu_dtype, run_probe, verdict
from models.loading.loader import load_model, resolve_dtype
from models.runner.cpus import CpuFeatures, cpu_features

AVX2 = CpuFeatures("AMD EPYC", frozenset({"avx2", "fma"}))
BF16 = CpuFeatures("Intel Xeon", frozenset({"avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}))


def _measured(decode: float, prefill: float, error: float = 0.004) -> dict[str, dict[str, float]]:
    return {
        "decode": {"rows": 32, "threads": 1, "float32_s": decode, "bfloat16_s": 1.0, "error": error},
        "prefill": {"rows": 512, "threads": 2, "float32_s": prefill, "bfloat16_s": 1.0, "error": error},
    }


def test_without_bf16_hardware_it_is_float32_and_nothing_is_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_probe(*args: object) -> object:
        raise AssertionError("probed a CPU without bf16 units")

    monkeypatch.setattr(dtype_choice, "run_probe", no_probe)
    choice = choose_cpu_dtype(AVX2, 896, 4864)
    assert choice.dtype == "float32" and "AMD EPYC (AVX2)" in choice.reason and "AVX512_BF16" in choice.reason


@pytest.mark.parametrize(
    ("measured", "dtype", "said"),
    [
        (_measured(2.1, 2.9), "bfloat16", "2.10x at 32 rows (decode), 2.90x at 512 rows (prefill)"),
        (_measured(1.1, 1.1), "float32", "not worth its rounding"),  # under MIN_SPEEDUP
        (_measured(3.0, 0.8), "float32", "not worth its rounding"),  # prefill slower
        (_measured(2.0, 2.0, error=0.2), "float32", "off by 0.200"),
        ("died with signal 4", "float32", "the bfloat16 probe died with signal 4"),
        ({"decode": {}}, "float32", "unreadable"),
    ],
)
def test_the_verdict_follows_the_measurement(measured: object, dtype: str, said: str) -> None:
    choice = verdict(BF16, measured)  # type: ignore[arg-type]
    assert choice.dtype == dtype and said in choice.reason, choice


def test_the_real_probe_times_both_dtypes_on_the_shape() -> None:
    measured = run_probe(256, 1024, 2)
    assert isinstance(measured, dict), measured
    assert set(measured) == {"decode", "prefill"}
    for phase in measured.values():
        assert phase["float32_s"] > 0 and phase["bfloat16_s"] > 0
        assert phase["error"] < dtype_choice.MAX_ERROR  # bf16's rounding, not a broken kernel
    here = cpu_features()
    choice = verdict(here, measured)
    if not here.native_bf16:
        # No hardware bf16 here: the probe itself shows why the flag check is enough.
        assert measured["prefill"]["bfloat16_s"] > measured["prefill"]["float32_s"]
    assert choice.dtype in ("float32", "bfloat16")


def test_a_probe_killed_by_a_signal_is_float32_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dtype_choice, "_PROBE", "import os, signal\nos.kill(os.getpid(), signal.SIGILL)")
    failure = run_probe(256, 1024, 1)
    assert failure == "died with signal 4"
    assert verdict(BF16, failure) == DtypeChoice(
        "float32", "Intel Xeon (AMX-BF16/INT8) advertises bfloat16, but the bfloat16 probe died with signal 4"
    )


def test_the_verdict_is_cached_per_cpu_and_shape(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SURGE_CACHE_DIR", str(tmp_path))
    runs: list[tuple[int, int, int]] = []

    def probe(hidden: int, intermediate: int, threads: int) -> dict[str, dict[str, float]]:
        runs.append((hidden, intermediate, threads))
        return _measured(2.0, 2.5)

    monkeypatch.setattr(dtype_choice, "run_probe", probe)
    assert choose_cpu_dtype(BF16, 896, 4864).dtype == "bfloat16"
    assert choose_cpu_dtype(BF16, 896, 4864).dtype == "bfloat16"
    assert len(runs) == 1 and len(list((tmp_path / "probes").glob("dtype-*.json"))) == 1
    choose_cpu_dtype(BF16, 1536, 8960)  # another shape: measured again
    assert len(runs) == 2


def test_auto_resolves_with_a_reason_and_explicit_dtypes_are_kept(tiny_model_dir: Path) -> None:
    cpu = torch.device("cpu")
    assert resolve_dtype("bfloat16", cpu, str(tiny_model_dir)) == (torch.bfloat16, "as asked (--dtype)")
    dtype, why = resolve_dtype("auto", cpu, str(tiny_model_dir), quantization="int8")
    assert dtype == torch.float32 and "int8" in why
    dtype, why = resolve_dtype("auto", cpu, str(tiny_model_dir))
    assert why.startswith("auto: ") and cpu_features().summary() in why
    if not cpu_features().native_bf16:
        assert dtype == torch.float32


def test_the_loader_logs_the_choice(tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="surge.loader"):
        loaded = load_model(ModelConfig(model=str(tiny_model_dir)))
    assert loaded.model is not None
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("dtype "))
    assert line.startswith(f"dtype {str(next(loaded.model.parameters()).dtype).removeprefix('torch.')} (auto: ")
