#!/usr/bin/env bash
# Fetch into .whl/ the wheels scripts/device_check.sh installs on a GPU machine that has torch and
# transformers' own image but no FastAPI, pydantic, uvicorn or openai, and no network. Versions are
# this checkout's .venv's (`make install-dev`), for CPython 3.12 on manylinux x86_64 (that image's).
# Keep .whl/ out of git: `echo /.whl/ >> .git/info/exclude`.
set -euo pipefail
PACKAGES=(accelerate annotated_types anyio click distro fastapi h11 hf_xet httpcore2 httptools httpx2 huggingface_hub idna
  iniconfig jiter openai opentelemetry_api packaging pluggy prometheus_fastapi_instrumentator psutil pydantic pydantic_core
  pygments pytest pytest_asyncio pytest_timeout redis regex safetensors sniffio starlette tenacity tokenizers
  transformers truststore typing_extensions typing_inspection uvicorn)
PIN=$(.venv/bin/pip freeze | tr '[:upper:]-' '[:lower:]_')
mkdir -p .whl
for name in "${PACKAGES[@]}"; do
  spec=$(grep -E "^${name}==" <<<"$PIN" || true)
  [ -n "$spec" ] || { echo "$name is not in .venv" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d .whl "$spec"
done
du -sh .whl
