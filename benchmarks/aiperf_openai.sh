#!/usr/bin/env bash
# aiperf (NVIDIA's LLM benchmark tool) against specctl's OpenAI-compatible front end: chat and
# completions, streaming, with vLLM-shaped speculative metrics so aiperf's report lists acceptance,
# and ignore_eos so every request generates exactly OSL tokens.
#
#   benchmarks/aiperf_openai.sh [URL] [TOKENIZER_DIR]
#
# URL: the front end (default http://127.0.0.1:8000, as printed by `specctl serve`);
# TOKENIZER_DIR: the target's tokenizer for aiperf's synthetic prompts (default engines/cpu/target).
# aiperf runs from its own environment: AIPERF (default: aiperf on PATH), e.g.
#   python -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf
#   AIPERF=/tmp/aiperf-venv/bin/aiperf benchmarks/aiperf_openai.sh
# Knobs: REQUESTS (64), CONCURRENCY (4), ISL (64), OSL (48), OUT (runs/aiperf).
set -euo pipefail

URL=${1:-http://127.0.0.1:8000}
TOKENIZER=${2:-engines/cpu/target}
AIPERF=${AIPERF:-aiperf}
REQUESTS=${REQUESTS:-64}
CONCURRENCY=${CONCURRENCY:-4}
ISL=${ISL:-64}
OSL=${OSL:-48}
OUT=${OUT:-runs/aiperf}

command -v "$AIPERF" >/dev/null || { echo "aiperf not found ($AIPERF): pip install aiperf (in its own venv) and set AIPERF" >&2; exit 2; }
[ -f "$TOKENIZER/tokenizer.json" ] || { echo "no tokenizer.json in $TOKENIZER: pass the target's model directory" >&2; exit 2; }
curl -fsS "$URL/v1/models" >/dev/null || { echo "no OpenAI API at $URL/v1/models: is \`specctl serve\` running?" >&2; exit 2; }

for TYPE in chat completions; do
  echo "== aiperf --endpoint-type $TYPE against $URL"
  "$AIPERF" profile --model llm --url "$URL" --endpoint-type "$TYPE" --streaming \
    --tokenizer "$TOKENIZER" --request-count "$REQUESTS" --concurrency "$CONCURRENCY" \
    --prompt-input-tokens-mean "$ISL" --prompt-input-tokens-stddev 0 \
    --prompt-output-tokens-mean "$OSL" --prompt-output-tokens-stddev 0 \
    --extra-inputs spec_decode_metrics:true --extra-inputs temperature:0 --extra-inputs ignore_eos:true \
    --random-seed 0 --ui-type none --no-server-metrics --no-gpu-telemetry \
    --output-artifact-dir "$OUT/$TYPE"
done
