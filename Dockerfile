# surge: an OpenAI-compatible LLM inference server.
#
#   docker build -t surge .                                   # CPU image (python:3.11-slim, CPU torch)
#   docker build -t surge:cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu22.04 \
#     --build-arg TORCH_INDEX_URL= .                          # CUDA image (default torch wheel)
#   docker run -p 8000:8000 -e SURGE_MODEL=/models/my-model -v /path/to/model:/models/my-model:ro surge
#
# Both stages start from BASE_IMAGE so the virtual environment built in the first is copied
# onto the same Python at the same path in the second (a CUDA base gets its distribution's
# python3, 3.10 on Ubuntu 22.04). NOTE: this file is parsed and checked by
# tests/test_dockerfile.py; no image has been built in CI (there is no Docker engine there).
ARG BASE_IMAGE=python:3.11-slim

# ---- builder: a venv with torch first (pinned, from the CPU index by default), then surge ----
FROM ${BASE_IMAGE} AS builder
ARG TORCH_SPEC=torch==2.13.0
# Empty = the default index (the CUDA wheel); the CPU index keeps the CPU image about 1 GB.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN if ! command -v python3 >/dev/null 2>&1; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# torch before surge: surge lists torch without a version, so pip keeps this build.
RUN pip install --upgrade pip \
    && if [ -n "$TORCH_INDEX_URL" ]; then pip install --index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"; \
       else pip install "$TORCH_SPEC"; fi
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY models ./models
COPY middleware ./middleware
RUN pip install . && rm -rf /src
# The int8 block kernel (models/linear/block_kernel.py), built here into the package so the runtime stage
# needs no compiler. It is generic x86-64 (its AVX-512 code runs only where the CPU has it); off
# x86 there is nothing to build and `--quantization int8` takes oneDNN's kernel. Not from /src,
# which is gone: `models` must be the installed package, where the library is written.
WORKDIR /opt
RUN if [ "$(uname -m)" = "x86_64" ]; then \
        apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
        && python3 -m models.linear.block_kernel \
        && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*; \
    fi

# ---- runtime: the venv, jemalloc, a non-root user, nothing else ----
# jemalloc: the engine's process runs on it (models/runner/heap.py: a prefill's large tensors
# reuse the last step's pages instead of faulting fresh ones).
FROM ${BASE_IMAGE} AS runtime
RUN apt-get update && apt-get install -y --no-install-recommends libjemalloc2 \
        $(command -v python3 >/dev/null 2>&1 || echo python3) \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin surge
COPY --from=builder /opt/venv /opt/venv
# SURGE_MODEL: `tiny` (built offline at start-up), a model directory (mount it) or a hub id
# (downloaded into HF_HOME; mount a volume there to keep it across restarts).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SURGE_MODEL=tiny \
    SURGE_HOST=0.0.0.0 \
    SURGE_PORT=8000 \
    HF_HOME=/home/surge/.cache/huggingface
USER surge
WORKDIR /home/surge
EXPOSE 8000
# Liveness only (/health answers while the model loads); readiness is /ready, for the orchestrator.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD python3 -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('SURGE_PORT', '8000'), timeout=4)"
# SIGTERM starts the graceful shutdown (docs/operations.md, "Graceful shutdown"); a second one forces the exit.
STOPSIGNAL SIGTERM
ENTRYPOINT ["surge", "serve"]
