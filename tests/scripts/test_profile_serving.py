"""scripts/profile_serving.py's reading of py-spy's collapsed stacks (the profiling run itself needs
py-spy, of the `bench` extra, and is run by hand)."""

from __future__ import annotations

from pathlib import Path

from scripts.profile_serving import read_collapsed, render_profile

REPO = str(Path(__file__).resolve().parents[2])
SITE = "/x/.venv/lib/python3.11/site-packages"
ROOT = f"<module> ({REPO}/app/cli.py:62);run ({REPO}/models/engine/core.py:185)"
STEP = f"step ({REPO}/models/engine/core.py:202)"
RAW = f"""{ROOT};{STEP};forward ({SITE}/torch/nn/modules/linear.py:134) 60
{ROOT};{STEP};_forward ({REPO}/models/runner/model_runner.py:104);forward ({SITE}/torch/nn/modules/linear.py:134) 20
{ROOT};step ({REPO}/models/engine/core.py:230);__call__ ({REPO}/models/sampling/sampler.py:89) 15
{ROOT};__call__ ({SITE}/uvicorn/middleware/proxy_headers.py:63) 5
not a stack line
"""


def test_self_and_inclusive_times_from_collapsed_stacks(tmp_path: Path) -> None:
    path = tmp_path / "engine.txt"
    path.write_text(RAW)
    profile = read_collapsed(path, "engine")
    assert profile.num_samples == 100
    # Self time: the top frame, paths shortened to the package or the repo.
    assert profile.self_time()[:2] == [
        ("forward (torch/nn/modules/linear.py:134)", 80),
        ("__call__ (models/sampling/sampler.py:89)", 15),
    ]
    inclusive = dict(profile.inclusive_own())
    # Own code only (uvicorn's middleware/ is not surge's middleware/), one count per sample
    # whatever the line, so `step` at two lines counts each sample once.
    assert inclusive["step (models/engine/core.py)"] == 95
    assert inclusive["run (models/engine/core.py)"] == 100
    assert inclusive["_forward (models/runner/model_runner.py)"] == 20
    assert not any("proxy_headers" in function for function in inclusive)
    text = "\n".join(render_profile(profile, 0.97, top=3))
    assert "engine process: 0.97 cores, 100 samples" in text
    assert "| 80.0 | `forward (torch/nn/modules/linear.py:134)` |" in text
