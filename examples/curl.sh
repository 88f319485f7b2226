#!/usr/bin/env bash
# curl against surge: one JSON request and one streamed with `curl -N` (no output buffering, so
# each SSE event prints as it arrives).
#
#   SURGE_BASE_URL=http://127.0.0.1:8000/v1 bash examples/curl.sh
#
# Environment: SURGE_BASE_URL (default http://127.0.0.1:8000/v1), SURGE_API_KEY (sent as a Bearer
# token when set), SURGE_MODEL_NAME (default: the first id /v1/models lists).
set -euo pipefail

BASE_URL="${SURGE_BASE_URL:-http://127.0.0.1:8000/v1}"
AUTH=(-H "Authorization: Bearer ${SURGE_API_KEY:-unused}")
MODEL="${SURGE_MODEL_NAME:-$(curl -sf "${AUTH[@]}" "$BASE_URL/models" | sed -E 's/"id" *: *"([^"]+)".*/\n\1/; s/.*\n//')}"

echo "== non-streaming"
curl -sS --fail-with-body "$BASE_URL/chat/completions" "${AUTH[@]}" -H 'Content-Type: application/json' \
  -d '{"model": "'"$MODEL"'", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16}'
echo

echo "== streaming"
curl -N -sS --fail-with-body "$BASE_URL/chat/completions" "${AUTH[@]}" -H 'Content-Type: application/json' \
  -d '{"model": "'"$MODEL"'", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16,
       "stream": true, "stream_options": {"include_usage": true}}'
