#!/usr/bin/env bash
# Optional slow check (make test-default-model): on the default model, every speculative
# decoder at B=8 and B=59 emits exactly plain greedy decoding's tokens (T=0) on 8 prompts.
# --max-new is an exact cap for every decoder, so the ids must equal AR's, count included.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
prompts=${PROMPTS:-../shared/data/spec_bench_question.jsonl}
n=${N_PROMPTS:-8} max_new=${MAX_NEW:-24} layers=${DRAFT_LAYERS:-0-14}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0 checked=0
for i in $(seq 1 "$n"); do
  text=$(sed -n "${i}p" "$prompts" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["turns"][0])' 2>/dev/null) ||
    text=$(sed -n "${i}p" "$prompts")
  ./build/rootspec-target --model "$model" --chat --prompt "$text" --decoder ar --max-new "$max_new" \
    --output-ids > "$tmp/ar" 2>/dev/null
  for dec in draft pearl rootdraw root; do
    for b in 8 59; do
      ./build/rootspec-target --model "$model" --chat --prompt "$text" --decoder $dec --budget $b \
        --draft-layers "$layers" --max-new "$max_new" --output-ids > "$tmp/sp" 2>/dev/null
      got=$(head -n1 "$tmp/sp"); ref=$(head -n1 "$tmp/ar")
      checked=$((checked + 1))
      case "$ref" in
        "$got") ;;
        *) echo "MISMATCH prompt $i $dec B=$b"; echo " got: $got"; echo " ar:  $ref"; fail=$((fail + 1)) ;;
      esac
    done
  done
  echo "prompt $i: checked"
done
echo "default-model identity: $((checked - fail)) passed, $fail failed"
[ "$fail" = 0 ]
