#!/usr/bin/env bash
# One short, prepared check of surge's CUDA path on a lent GPU machine, run from the repo root:
#
#     OUT=/some/empty/dir bash scripts/device_check.sh
#
# The machine has torch (CUDA build) and transformers but neither FastAPI nor pydantic, nor any
# network: the wheels in .whl/ (fetched here by scripts/device_wheels.sh, carried to the machine)
# are installed into /tmp/site first. Then, each step under its own `timeout`, so one hang costs
# only its own step and the script always goes on to the next:
#   (a) tests/models/runner/test_model_runner.py and test_architectures.py with SURGE_TEST_DEVICE    -> pytest.log
#   (b) `surge serve` on the tiny m model, default dtype, driven by the openai SDK; /metrics   -> serve.log
#   (c) python -m scripts.bench_engine on m and l                                                    -> bench_engine.log
#   (d) python -m scripts.bench: surge, `transformers serve` and the ceiling on the device          -> serving_bench.log
# Versions, nvidia-smi and one line per step (exit status, seconds) go to device_check.log.
# Every step's timeout is also cut to what is left of BUDGET seconds, so the whole run ends in time.
#
# A trial on a CPU machine: DEVICE=cpu QUICK=1 SKIP_WHEELS=1 PYTHON=.venv/bin/python OUT=/tmp/devout \
#     bash scripts/device_check.sh   (model s, a handful of requests, the llama tests only)
set -u

PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-0}
SKIP_WHEELS=${SKIP_WHEELS:-0}
BUDGET=${BUDGET:-480}
MODELS=${MODELS:-/tmp/models}
PORT=${PORT:-8011}
OUT=${OUT:-/tmp/devout}
mkdir -p "$OUT" "$MODELS"
SUMMARY="$OUT/device_check.log"
: >"$SUMMARY"
START=$SECONDS

# Nothing can be downloaded there: every model is built here, and no code may reach a hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SURGE_CACHE_DIR=/tmp/surge-cache PYTHONUNBUFFERED=1

note() { echo "$*" | tee -a "$SUMMARY"; }

# The timeout for a step that wants $1 seconds: never past the budget's end (5 s at least).
limit() {
  local left=$((BUDGET - (SECONDS - START)))
  ((left < 5)) && left=5
  echo $(($1 < left ? $1 : left))
}

# step NAME WANT_S LOG CMD...: run CMD under its timeout, appending its output to LOG.
step() {
  local name=$1 want=$2 log=$3 t began rc
  shift 3
  t=$(limit "$want")
  began=$SECONDS
  echo "=== $name (timeout ${t} s): $*" >>"$log"
  timeout -k 10 "$t" "$@" >>"$log" 2>&1
  rc=$?
  note "step $name: rc=$rc$( ((rc == 124 || rc == 137)) && echo ' (TIMED OUT)') in $((SECONDS - began)) s"
  return $rc
}

# --- set-up: wheels, versions ---------------------------------------------------------------------
if [ "$SKIP_WHEELS" != 1 ]; then
  step wheels 120 "$SUMMARY" "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

{
  echo "=== nvidia-smi"
  nvidia-smi 2>&1 || echo "(no nvidia-smi)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 || true
} >>"$SUMMARY"
step versions 60 "$SUMMARY" "$PYTHON" - <<'EOF'
import importlib, platform, sys
import torch
print("python", platform.python_version(), sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0),
          "bf16", torch.cuda.is_bf16_supported())
for name in ("transformers", "accelerate", "tokenizers", "huggingface_hub", "safetensors", "fastapi", "starlette", "pydantic",
             "uvicorn", "httptools", "uvloop", "openai", "httpx2", "pytest", "pytest_asyncio", "pynvml"):
    try:
        module = importlib.import_module(name)
        print(f"{name:16s} {getattr(module, '__version__', '?'):12s} {module.__file__}")
    except Exception as exc:
        print(f"{name:16s} MISSING: {exc!r}")
import app.server.factory, models.process.child, middleware.edge.auth  # noqa: E401,F401  everything surge imports
print("surge imports: ok")
EOF

if [ "$QUICK" = 1 ]; then SIZES="s"; SERVE_SIZE=s; else SIZES="m l"; SERVE_SIZE=m; fi
for size in $SIZES; do
  step "build-$size" 120 "$SUMMARY" "$PYTHON" -m app.cli build-tiny --size "$size" --out "$MODELS/$size"
done

# --- (a) the engine's model tests on the device ---------------------------------------------------
# No -x: one run has to show every failure. Per-test timeout 90 s (CPU: under 5 s each). Only the
# two plugins the tests use: whatever else is installed there cannot break the collection.
TESTS=(tests/models/runner/test_model_runner.py tests/models/runner/test_architectures.py)
if [ "$QUICK" = 1 ]; then TESTS+=(-k llama); fi
export SURGE_TEST_DEVICE=$DEVICE
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 step pytest 200 "$OUT/pytest.log" "$PYTHON" -m pytest -q -rfE \
  -p no:cacheprovider -p pytest_asyncio.plugin -p pytest_timeout --timeout 90 "${TESTS[@]}"
tail -n 3 "$OUT/pytest.log"

# --- (b) surge serve on the device, driven by the openai SDK ---------------------------------------
if [ "$QUICK" = 1 ]; then NUM_STREAMS=4; NUM_TOKENS=16; else NUM_STREAMS=32; NUM_TOKENS=64; fi
SERVE_LOG="$OUT/serve.log"
SERVER_LOG=/tmp/surge-serve.log
: >"$SERVER_LOG"
# Default dtype (bfloat16 on CUDA), the engine in its own process (the default), as users run it.
# Dedup off: identical greedy requests would share one result instead of filling the batch.
timeout -k 10 "$(limit 170)" "$PYTHON" -m app.cli serve --model "$MODELS/$SERVE_SIZE" --device "$DEVICE" \
  --host 127.0.0.1 --port "$PORT" --served-model-name tiny --max-num-seqs 32 --max-model-len 512 \
  --dedup-ttl-seconds 0 --shutdown-delay-seconds 0 --shutdown-grace-seconds 5 >"$SERVER_LOG" 2>&1 &
SERVER_PID=$!
step serve-client 150 "$SERVE_LOG" "$PYTHON" - "http://127.0.0.1:$PORT" "$NUM_STREAMS" "$NUM_TOKENS" "$DEVICE" <<'EOF'
"""Drive the server: one chat, one streamed chat, N concurrent streams; then /metrics."""
import asyncio, sys, time
import httpx, openai

base, num_streams, num_tokens, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
failures = []

def check(name, ok, detail=""):
    print("PASS" if ok else "FAIL", name, detail, flush=True)
    if not ok:
        failures.append(name)

began = time.monotonic()
while True:
    try:
        if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.monotonic() - began > 90:
        check("ready", False, "not ready after 90 s")
        sys.exit(1)
    time.sleep(0.25)
check("ready", True, f"after {time.monotonic() - began:.1f} s")

extra = {"ignore_eos": True}
messages = [{"role": "user", "content": "Tell me a story about a fisherman and his cat."}]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=60)
reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0, extra_body=extra)
check("chat", reply.usage.completion_tokens == 16 and reply.choices[0].finish_reason == "length",
      f"{reply.usage} finish={reply.choices[0].finish_reason} text={reply.choices[0].message.content[:60]!r}")

stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=num_tokens, temperature=0,
                                        stream=True, stream_options={"include_usage": True}, extra_body=extra)
chunks = list(stream)
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
usage = chunks[-1].usage
check("streamed chat", chunks[0].choices[0].delta.role == "assistant" and usage is not None
      and usage.completion_tokens == num_tokens, f"{len(chunks)} chunks, usage={usage}")
print("INFO greedy prefix agrees with the chat above:", text.startswith(reply.choices[0].message.content))

async def one(aclient, i):
    started = time.perf_counter()
    first = None
    usage = finish = None
    stream = await aclient.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": f"Request {i}: count to {i + 3}, slowly."}],
        max_tokens=num_tokens, temperature=0, stream=True, stream_options={"include_usage": True}, extra_body=extra)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter() - started
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        if chunk.usage is not None:
            usage = chunk.usage
    return (usage.completion_tokens if usage else None), finish, first, time.perf_counter() - started

async def many():
    aclient = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=60)
    began = time.perf_counter()
    results = await asyncio.gather(*(one(aclient, i) for i in range(num_streams)), return_exceptions=True)
    return results, time.perf_counter() - began

results, wall = asyncio.run(many())
errors = [r for r in results if isinstance(r, BaseException)]
done = [r for r in results if not isinstance(r, BaseException)]
counts = sorted({r[0] for r in done}, key=str)
check(f"{num_streams} concurrent streams", not errors and len(done) == num_streams
      and all(r[0] == num_tokens and r[1] == "length" for r in done),
      f"token counts {counts}, finish {sorted({str(r[1]) for r in done})}, errors {[repr(e) for e in errors[:3]]}")
if done:
    ttfts = sorted(r[2] for r in done if r[2] is not None)
    print(f"INFO {sum(r[0] or 0 for r in done)} tokens in {wall:.2f} s = {sum(r[0] or 0 for r in done) / wall:.0f} tok/s;"
          f" TTFT median {1000 * ttfts[len(ttfts) // 2]:.0f} ms, max {1000 * ttfts[-1]:.0f} ms" if ttfts else "")

time.sleep(1.5)  # the engine process ships GPU figures about once a second
metrics = httpx.get(f"{base}/metrics", timeout=10).text
gpu = [line for line in metrics.splitlines() if line.startswith("surge_gpu")]
print("\n".join(gpu) or "(no surge_gpu lines)")
if device.startswith("cuda"):
    check("GPU memory gauge", any(line.startswith("surge_gpu_memory_used_bytes{") for line in gpu))
# The K/V budget read the device's free memory (torch.cuda.mem_get_info) after loading the weights.
budget = [line for line in metrics.splitlines()
          if line.startswith(("surge_kv_cache_budget_bytes{", "surge_max_num_seqs{"))]
print("\n".join(budget))
check("K/V budget from the device's memory", len(budget) == 2 and all(float(line.split()[-1]) > 0 for line in budget))
print("INFO", len(metrics.splitlines()), "metrics lines;", sum(1 for line in metrics.splitlines()
      if line.startswith("surge_") and not line.startswith("#")), "surge_ samples")
print("client:", "FAILED " + ", ".join(failures) if failures else "all passed")
sys.exit(1 if failures else 0)
EOF
kill -TERM "$SERVER_PID" 2>/dev/null
for _ in $(seq 1 40); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
kill -KILL "$SERVER_PID" 2>/dev/null
wait "$SERVER_PID" 2>/dev/null
note "server exit status: $?"
{
  echo "=== server log (last 80 lines of $(wc -l <"$SERVER_LOG"))"
  tail -n 80 "$SERVER_LOG"
} >>"$SERVE_LOG"
grep -E "^(PASS|FAIL|INFO|client:)" "$SERVE_LOG"

# --- (c) the engine alone: packed vs split vs the raw ceiling -------------------------------------
BENCH_LOG="$OUT/bench_engine.log"
if [ "$QUICK" = 1 ]; then
  step bench-s 90 "$BENCH_LOG" "$PYTHON" -m scripts.bench_engine --device "$DEVICE" --model-dir "$MODELS/s" \
    --concurrency 4 --requests 8 --max-tokens 6 --rounds 1 --ramp 1
else
  step bench-m 75 "$BENCH_LOG" "$PYTHON" -m scripts.bench_engine --device "$DEVICE" --model-dir "$MODELS/m" \
    --concurrency 32 --requests 96 --max-tokens 64 --rounds 3
  step bench-l-bf16 75 "$BENCH_LOG" "$PYTHON" -m scripts.bench_engine --device "$DEVICE" --dtype bfloat16 \
    --model-dir "$MODELS/l" --concurrency 32 --requests 64 --max-tokens 64 --rounds 2
fi
grep -E "^(\||packed|ceiling|model )" "$BENCH_LOG"

# --- (d) the serving bench on the device: surge against the ceiling and `transformers serve` -----
# Unique prompts, 32 streams, the default dtype of a GPU run; its table and JSON land in $OUT/serving.
SERVING_LOG="$OUT/serving_bench.log"
if [ "$QUICK" = 1 ]; then
  step serving-s 120 "$SERVING_LOG" "$PYTHON" -m scripts.bench --device "$DEVICE" --model-dir "$MODELS/s" \
    --systems surge,transformers --concurrency 4 --max-tokens 8 --requests-per-client 1 --rounds 1 \
    --no-plots --no-progress --out "$OUT/serving/bench.md"
else
  step serving-m 150 "$SERVING_LOG" "$PYTHON" -m scripts.bench --device "$DEVICE" --dtype bfloat16 \
    --model-dir "$MODELS/m" --systems surge,transformers --concurrency 32 --max-tokens 64 --rounds 1 \
    --no-plots --no-progress --out "$OUT/serving/bench.md"
fi
grep -E "^\| (system|surge|transformers|ceiling)" "$OUT/serving/bench.md" 2>/dev/null | head -8

note "total: $((SECONDS - START)) s"
