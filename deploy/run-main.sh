#!/usr/bin/env bash
# The main job (`make run`): a handful of prompts decoded twice on the default model, first
# autoregressively (the baseline: the target alone), then with root-draw selection (both
# processes, deploy/launch.sh). Shows the speculative decode's text and per-round timing,
# then both speeds, their ratio, whether the texts agree (T=0: they must) and where a
# round's time goes. Environment: MODEL, DRAFT_LAYERS, PROMPTS, DECODER, BUDGET, MAX_NEW;
# further arguments go to the speculative rootspec-target.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
layers=${DRAFT_LAYERS:-0-14}
prompts=${PROMPTS:-deploy/prompts.jsonl}
decoder=${DECODER:-rootdraw}
max_new=${MAX_NEW:-48}
common=(--model "$model" --prompts "$prompts" --temp 0 --max-new "$max_new")
tmp=$(mktemp -d /tmp/rootspec-run.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# The baseline runs where launch.sh puts the target: alone on core 0.
pin=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then pin=(taskset -c 0); fi

echo "== baseline: autoregressive decoding, target alone (--max-new $max_new, T=0)"
if ! "${pin[@]}" build/rootspec-target "${common[@]}" --decoder ar >"$tmp/ar.out" 2>"$tmp/ar.err"; then
  cat "$tmp/ar.err" >&2
  exit 1
fi
grep -E '^rootspec-target: [0-9]+ prompts' "$tmp/ar.err" || true

echo "== speculative: $decoder, B=${BUDGET:-59}, drafter = target layers $layers in its own process"
# stdout (the text) to the terminal and a file, stderr (stats, timing) likewise.
{ deploy/launch.sh --draft-model "$model" --draft-layers "$layers" -- \
    "${common[@]}" --decoder "$decoder" --budget "${BUDGET:-59}" --draft-timeout-ms 60000 "$@" \
    2>&1 1>&3 3>&- | tee "$tmp/sd.err" >&2; } 3>&1 | tee "$tmp/sd.out"

# "rootspec-target: N prompts, T tokens in S s: X tok/s" -> X
speed() { sed -n 's/^rootspec-target: [0-9]* prompts, .*: \([0-9.]*\) tok\/s$/\1/p' "$1" | tail -1; }
ar=$(speed "$tmp/ar.err")
sd=$(speed "$tmp/sd.err")
echo
echo "== $decoder against the autoregressive baseline (same prompts, --max-new $max_new, T=0)"
printf '  %-10s %s tok/s\n' ar "${ar:-?}" "$decoder" "${sd:-?}"
if [ -n "$ar" ] && [ -n "$sd" ]; then
  awk -v a="$ar" -v s="$sd" -v d="$decoder" \
    'BEGIN { if (a > 0) printf "  speed ratio %s / ar: %.2fx\n", d, s / a }'
fi
if cmp -s "$tmp/ar.out" "$tmp/sd.out"; then echo "  same text as the baseline: yes"
else echo "  same text as the baseline: NO (T=0 decoders must agree)"; fi
grep "^where a round's time goes" "$tmp/sd.err" | sed 's/^/  /' || true
