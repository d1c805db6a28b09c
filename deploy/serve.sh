#!/usr/bin/env bash
# Starts rootspec-serve, the OpenAI-compatible HTTP server, with a drafter process beside
# it (deploy/launch.sh --serve: drafter pinned to core 1, server to core 0; on CUDA, one
# GPU each). Runs until interrupted. Environment: MODEL, DRAFT_LAYERS (the self-drafter's
# target layers), DECODER, BUDGET, PORT, BACKEND; further arguments go to rootspec-serve.
#   deploy/serve.sh                         # http://127.0.0.1:8080/v1, rootdraw, B=59
#   PORT=9000 deploy/serve.sh --queue 32
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
exec deploy/launch.sh --serve --backend "${BACKEND:-cpu}" --draft-model "$model" \
  --draft-layers "${DRAFT_LAYERS:-0-14}" -- --model "$model" --decoder "${DECODER:-rootdraw}" \
  --budget "${BUDGET:-59}" --port "${PORT:-8080}" --draft-timeout-ms 60000 "$@"
