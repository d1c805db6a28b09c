#!/usr/bin/env bash
# Starts rootspec-serve, the OpenAI-compatible HTTP server, with make run's speculative
# configuration as every request's default: draft selection, the suffix drafter inside the
# server process, --budget auto (never much slower than AR, faster where output repeats
# input). Runs until interrupted. DRAFTER=self puts a self-drafter (DRAFT_LAYERS, default
# 0-14) in a process of its own beside it (deploy/launch.sh --serve: drafter on core 1,
# server on core 0; on CUDA, one GPU each), root-draw selection by default.
# Environment: MODEL, DRAFTER (suffix | self), DRAFT_LAYERS, DECODER, BUDGET (auto), PORT,
# BACKEND; further arguments go to rootspec-serve.
#   deploy/serve.sh                         # http://127.0.0.1:8080/v1
#   PORT=9000 deploy/serve.sh --queue 32
#   DRAFTER=self deploy/serve.sh            # two processes, rootdraw
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
budget=${BUDGET:-auto}
backend=${BACKEND:-cpu}
common=(--budget "$budget" --port "${PORT:-8080}") # launch.sh adds --backend itself
case "${DRAFTER:-suffix}" in
  suffix)
    pin=()
    if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then pin=(taskset -c 0); fi
    exec "${pin[@]}" build/rootspec-serve --model "$model" --backend "$backend" \
      --drafter suffix --decoder "${DECODER:-draft}" "${common[@]}" "$@" ;;
  self)
    exec deploy/launch.sh --serve --backend "$backend" --draft-model "$model" \
      --draft-layers "${DRAFT_LAYERS:-0-14}" -- --model "$model" \
      --decoder "${DECODER:-rootdraw}" "${common[@]}" --draft-timeout-ms 60000 "$@" ;;
  *) echo "serve.sh: DRAFTER must be suffix or self, not '${DRAFTER}'" >&2; exit 2 ;;
esac
