#!/usr/bin/env bash
# The default model (98 MB) does not fit beside gpu-bundle/ in what a GPU run is sent
# (64 MiB with the working tree), so the first GPU run (`bash tools/gpu-check.sh --limit S`)
# goes without it. For the optional `--default-model` run it travels in two parts, with two
# consecutive runs on the same GPU machine (a fresh machine has lost part 1 and the check
# stops):
#   here:   bash tools/gpu-carry.sh split   -> gpu-carry/model.part1 (44 MiB), model.part2,
#                                              model.sha256 (git-ignored)
#   run 1:  the first GPU run, sent gpu-carry/model.part1 and model.sha256 as well
#   run 2 (at once): sent gpu-carry/model.part2; `bash tools/gpu-check.sh --limit S --default-model`
#   there:  bash tools/gpu-carry.sh join    -> models/<default>.gguf once both parts are there
#           and the sha256 matches (gpu-check.sh calls it first); exit 1 (and a message)
#           otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
DIR=gpu-carry
PART1_BYTES=$((44 << 20))
case "${1:-}" in
  split)
    [ -r "$MODEL" ] || { echo "gpu-carry: $MODEL missing (run bash tools/setup.sh --model-only)" >&2; exit 2; }
    mkdir -p "$DIR"
    head -c "$PART1_BYTES" "$MODEL" >"$DIR/model.part1"
    tail -c +$((PART1_BYTES + 1)) "$MODEL" >"$DIR/model.part2"
    (cd models && sha256sum "$(basename "$MODEL")") >"$DIR/model.sha256"
    cat "$DIR/model.part1" "$DIR/model.part2" | cmp -s - "$MODEL" \
      || { echo "gpu-carry: the parts do not rebuild $MODEL" >&2; exit 1; }
    ls -l "$DIR"
    # What each run is sent (at most 64 MiB, working tree included).
    tree=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
    bundle=$( [ -d gpu-bundle ] && du -sb gpu-bundle | cut -f1 || echo 0)
    c1=$((tree + bundle + $(stat -c %s "$DIR/model.part1") + $(stat -c %s "$DIR/model.sha256")))
    c2=$((tree + $(stat -c %s "$DIR/model.part2")))
    lim=$((64 << 20))
    echo "gpu-carry: run 1 (tree + gpu-bundle + part1) $c1 bytes, run 2 (tree + part2) $c2 bytes, limit $lim"
    [ "$c1" -le "$lim" ] && [ "$c2" -le "$lim" ] || { echo "gpu-carry: over the limit: rebalance PART1_BYTES" >&2; exit 1; }
    [ "$bundle" -gt 0 ] || echo "gpu-carry: gpu-bundle/ missing: run make gpu-bundle first (run 1 needs it)"
    ;;
  join)
    if [ -r "$MODEL" ] && (cd models && sha256sum -c --quiet "../$DIR/model.sha256" 2>/dev/null); then
      echo "gpu-carry: $MODEL present and verified"; exit 0
    fi
    for f in model.part1 model.part2 model.sha256; do
      [ -r "$DIR/$f" ] || { echo "gpu-carry: $DIR/$f not here yet: default model not assembled"; exit 1; }
    done
    mkdir -p models
    cat "$DIR/model.part1" "$DIR/model.part2" >"$MODEL.tmp"
    mv "$MODEL.tmp" "$MODEL"
    if (cd models && sha256sum -c --quiet "../$DIR/model.sha256"); then
      echo "gpu-carry: assembled $MODEL (sha256 verified)"
    else
      rm -f "$MODEL"; echo "gpu-carry: assembled model fails its sha256: removed" >&2; exit 1
    fi
    ;;
  *) echo "usage: bash tools/gpu-carry.sh split|join" >&2; exit 2 ;;
esac
