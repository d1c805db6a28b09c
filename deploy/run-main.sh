#!/usr/bin/env bash
# The main job (`make run`): both processes on the default model, a handful of prompts
# decoded with root-draw selection, the text, and a per-round timing summary.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
layers=${DRAFT_LAYERS:-0-14}
exec deploy/launch.sh --draft-model "$model" --draft-layers "$layers" -- \
  --model "$model" --prompts deploy/prompts.jsonl --decoder rootdraw --budget "${BUDGET:-59}" \
  --temp 0 --max-new "${MAX_NEW:-64}" --draft-timeout-ms 60000 "$@"
