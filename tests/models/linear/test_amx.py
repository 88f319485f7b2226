"""AMX tiles for int8 prefills: used only where the CPU advertises AMX-BF16 and a bfloat16 product
in a child process came back right; a fault or a wrong product there leaves them off."""

from __future__ import annotations

import logging

import pytest

from models.linear import amx
from models.runner.cpus import ChildFailed, CpuFeatures

AMX = CpuFeatures("Intel Xeon", frozenset({"avx512f", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"}))
NO_AMX = CpuFeatures("Intel Xeon", frozenset({"avx512f", "avx512_vnni", "avx512_bf16"}))


def test_without_the_flags_or_with_the_isa_capped_nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(amx, "run_in_child", lambda code, args, timeout: ran.append(code) or "0.0")
    assert not amx.check_bf16_tiles(NO_AMX, capped=False)
    assert not amx.check_bf16_tiles(AMX, capped=True)
    assert ran == []
    assert amx.check_bf16_tiles(AMX, capped=False) and len(ran) == 1


def test_the_probe_itself_gives_float32s_product_to_bfloat16s_rounding() -> None:
    """The child's code, run here for real (torch's bfloat16 matmul runs on any CPU, slowly
    without units): its relative error is bfloat16's, well inside the bound."""
    done = amx.run_in_child(amx._PROBE, [], amx.PROBE_TIMEOUT_S)
    assert isinstance(done, str)
    assert 0.0 < float(done.strip().splitlines()[-1]) < amx.MAX_ERROR


@pytest.mark.parametrize(
    ("child", "said"),
    [(ChildFailed("died with signal 4"), "died with signal 4"), ("0.5\n", "off by 0.500"), ("nonsense", "printed")],
)
def test_a_fault_or_a_wrong_product_leaves_the_tiles_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, child: object, said: str
) -> None:
    monkeypatch.setattr(amx, "run_in_child", lambda code, args, timeout: child)
    with caplog.at_level(logging.WARNING, logger="surge.engine"):
        assert not amx.check_bf16_tiles(AMX, capped=False)
    assert said in caplog.text
