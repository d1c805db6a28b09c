#!/usr/bin/env bash
# The main job (`make run`) on the default model, in three parts:
#  1. deploy/prompts.jsonl (everyday prompts) and deploy/code_edit.jsonl (code edits that
#     repeat most of their input), each decoded twice at T=0: autoregressively with the
#     target alone (the baseline), then with the default speculative configuration. The
#     speculative text is shown, then the per-round timing.
#  2. A table of the two sets: AR tok/s, speculative tok/s, ratio, same text.
#  3. The default pair in two processes (DESIGN.md §5): the default model's values in F16
#     as the target (tools/setup.sh --pair) on core 0, its shipped Q4_1 file drafting in a
#     process of its own on core 1 (deploy/launch.sh), pools a chain of best nodes with
#     their siblings (--pool-shape). Both sets at T=0: AR with the F16 target alone, then
#     draft, pearl, rootdraw and root; a table of speeds and ratios to AR (whole decodes,
#     and after the prompt's prefill, which both decoders share), same text, tokens
#     per round, the share of the root pass hidden behind drafting and the share of rounds
#     whose commit the drafter had guessed while the target verified (run-ahead, DESIGN.md
#     §5; PAIR_AHEAD=0 turns it off); then the rules'
#     expected acceptance on this pair at T=1 (the paper's Table 2 shape).
#  4. Expected acceptance of each selection rule at B=8 and B=59 (the shape of the paper's
#     Table 2), measured offline on a few prompts with a model drafter (--score-all-rules:
#     every rule's tree scored on the same pools), so the selection rules' effect shows
#     even where this machine's speed cannot.
# Default speculative configuration: draft selection with the suffix drafter and the
# cost-aware budget (--budget auto): it verifies what is likely and takes plain AR steps
# otherwise, so it is never much slower than AR and faster where output repeats input.
# The suffix drafter runs inside the target process: it grows a pool in microseconds, so
# there is nothing to overlap and a process hop would only add a message round trip.
# DRAFTER=self puts a self-drafter (DRAFT_LAYERS, default 0-14) in a process of its own
# (deploy/launch.sh), the two-process layout of a model drafter.
# Environment: MODEL, DECODER (draft), BUDGET (auto), DRAFTER (suffix | self),
# DRAFT_LAYERS, MAX_NEW (48), CODE_MAX_NEW (128), SCORE_PROMPTS (3), SCORE_MAX_NEW (16),
# SCORE_LAYERS (0-13,15-29), SCORE=0 to skip part 4; PAIR=0 to skip part 3, PAIR_TARGET
# (the F16 file), PAIR_SHAPE (5,1), PAIR_BUDGET (5), PAIR_DECODERS, PAIR_AHEAD (1); further arguments go
# to the speculative rootspec-target of part 1.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
decoder=${DECODER:-draft}
budget=${BUDGET:-auto}
drafter=${DRAFTER:-suffix}
tmp=$(mktemp -d /tmp/rootspec-run.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# The baseline runs where launch.sh puts the target: alone on core 0.
pin=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then pin=(taskset -c 0); fi
case "$drafter" in
  suffix) spec=("${pin[@]}" build/rootspec-target --drafter suffix) where="in the target process" ;;
  self) spec=(deploy/launch.sh --draft-model "$model" --draft-layers "${DRAFT_LAYERS:-0-14}" --
              --draft-timeout-ms 60000) where="in its own process" ;;
  *) echo "run-main.sh: DRAFTER must be suffix or self, not '$drafter'" >&2; exit 2 ;;
esac

# "rootspec-target: N prompts, T tokens in S s: X tok/s" -> X
speed() { sed -n 's/^rootspec-target: [0-9]* prompts, .*: \([0-9.]*\) tok\/s$/\1/p' "$1" | tail -1; }
# "rootspec-target: after the prompts' prefill: T tokens in S s: X tok/s" -> X
decode_speed() { sed -n "s/^rootspec-target: after the prompts' prefill: .*: \([0-9.]*\) tok\/s$/\1/p" "$1" | tail -1; }

# run_set NAME FILE MAX_NEW [TARGET_ARGS...]: both decodes of one prompt set; leaves
# $tmp/NAME.{ar,sd}.{out,err}.
run_set() {
  local name=$1 file=$2 max_new=$3
  shift 3
  local common=(--model "$model" --prompts "$file" --temp 0 --max-new "$max_new")
  echo "== $name ($file): baseline, autoregressive decoding, target alone (--max-new $max_new, T=0)"
  if ! "${pin[@]}" build/rootspec-target "${common[@]}" --decoder ar \
       >"$tmp/$name.ar.out" 2>"$tmp/$name.ar.err"; then
    cat "$tmp/$name.ar.err" >&2
    exit 1
  fi
  grep -E '^rootspec-target: [0-9]+ prompts' "$tmp/$name.ar.err" || true
  echo "== $name: speculative, $decoder selection, B=$budget, $drafter drafter $where"
  if ! "${spec[@]}" "${common[@]}" --decoder "$decoder" --budget "$budget" "$@" \
       >"$tmp/$name.sd.out" 2>"$tmp/$name.sd.err"; then
    cat "$tmp/$name.sd.err" >&2
    exit 1
  fi
  # the text first, then the statistics: never one glued to the other
  cat "$tmp/$name.sd.out"
  echo
  grep -v '^rootspec-target: decoder=' "$tmp/$name.sd.err" | sed 's/^/  /'
}

# One row of the table: name, AR and speculative tok/s, ratio, same text.
table_row() {
  local name=$1 ar sd same=NO
  ar=$(speed "$tmp/$name.ar.err")
  sd=$(speed "$tmp/$name.sd.err")
  cmp -s "$tmp/$name.ar.out" "$tmp/$name.sd.out" && same=yes
  awk -v n="$name" -v a="${ar:-0}" -v s="${sd:-0}" -v same="$same" \
    'BEGIN { printf "| %-10s | %8.2f | %8.2f | %6.2fx | %-9s |\n", n, a, s, (a > 0 ? s / a : 0), same }'
}

run_set prompts deploy/prompts.jsonl "${MAX_NEW:-48}" "$@"
run_set code_edit deploy/code_edit.jsonl "${CODE_MAX_NEW:-128}" "$@"

echo
echo "== $decoder (B=$budget, $drafter drafter) against the autoregressive baseline, T=0"
echo "| prompts    | AR tok/s | spec tok/s | ratio | same text |"
echo "|------------|----------|------------|-------|-----------|"
table_row prompts
table_row code_edit

# "emitted N tokens in R rounds" lines of a decode's stderr -> tokens per round
per_round() {
  sed -n 's/.* emitted \([0-9]*\) tokens in \([0-9]*\) rounds.*/\1 \2/p' "$1" |
    awk '{ t += $1; r += $2 } END { printf "%.2f", r ? t / r : 0 }'
}
# "root pass hidden behind drafting  X %" -> X
hidden() { sed -n 's/^ *root pass hidden behind drafting *\([0-9.]*\) %.*/\1/p' "$1" | tail -1; }
# "commits the drafter guessed ahead  X %" -> X (0 when the line is absent: none guessed)
guessed() { sed -n 's/^ *commits the drafter guessed ahead *\([0-9.]*\) %.*/\1/p' "$1" | tail -1; }

# pair_set NAME FILE MAX_NEW: AR with the F16 target alone, then each decoder with the Q4_1
# drafter in its own process; one table row each.
pair_set() {
  local name=$1 file=$2 max_new=$3 dec ar ard
  local common=(--model "$pair_target" --prompts "$file" --temp 0 --max-new "$max_new")
  "${pin[@]}" build/rootspec-target "${common[@]}" --decoder ar \
    >"$tmp/p_$name.ar.out" 2>"$tmp/p_$name.ar.err" || { cat "$tmp/p_$name.ar.err" >&2; exit 1; }
  ar=$(speed "$tmp/p_$name.ar.err") ard=$(decode_speed "$tmp/p_$name.ar.err")
  printf "| %-9s | %-8s | %8.2f | %5.2fx | %8.2f | %5.2fx | %-4s | %6s | %6s | %7s |\n" "$name" ar \
    "${ar:-0}" 1 "${ard:-0}" 1 yes 1.00 - -
  for dec in $pair_decoders; do
    deploy/launch.sh --draft-model "$model" "${ahead[@]}" -- "${common[@]}" --decoder "$dec" \
      --budget "$pair_budget" --pool-shape "$pair_shape" --draft-timeout-ms 60000 \
      >"$tmp/p_$name.$dec.out" 2>"$tmp/p_$name.$dec.err" || { cat "$tmp/p_$name.$dec.err" >&2; exit 1; }
    local sd sdd same=NO
    sd=$(speed "$tmp/p_$name.$dec.err") sdd=$(decode_speed "$tmp/p_$name.$dec.err")
    cmp -s "$tmp/p_$name.ar.out" "$tmp/p_$name.$dec.out" && same=yes
    awk -v n="$name" -v d="$dec" -v a="${ar:-0}" -v s="${sd:-0}" -v ad="${ard:-0}" \
      -v sdd="${sdd:-0}" -v same="$same" \
      -v tpr="$(per_round "$tmp/p_$name.$dec.err")" -v h="$(hidden "$tmp/p_$name.$dec.err")" \
      -v g="$(guessed "$tmp/p_$name.$dec.err")" \
      'BEGIN { printf "| %-9s | %-8s | %8.2f | %5.2fx | %8.2f | %5.2fx | %-4s | %6s | %6s | %7s |\n",
               n, d, s, (a > 0 ? s / a : 0), sdd, (ad > 0 ? sdd / ad : 0), same, tpr,
               (h == "" ? "-" : sprintf("%.1f%%", h)), sprintf("%.0f%%", g == "" ? 0 : g) }'
  done
}

# Expected acceptance (tau) of each rule on this pair, T=1, with every rule's tree scored
# on the same full pools.
tau_table() {
  local label=$1 target=$2 temp=$3 drafter_args=("${@:4}")
  echo "| B  | pearl (given X1) | rootdraw (given X1) | rootdraw vs pearl | draft | root | oracle |"
  echo "|----|------------------|---------------------|-------------------|-------|------|--------|"
  for B in 8 59; do
    build/rootspec-target --model "$target" --prompts "$tmp/score.jsonl" --temp "$temp" \
      --max-new "${SCORE_MAX_NEW:-16}" --decoder rootdraw --budget "$B" --score-all-rules \
      "${drafter_args[@]}" >/dev/null 2>"$tmp/score$label$B.err" ||
      { cat "$tmp/score$label$B.err" >&2; exit 1; }
    # "... given X1: pearl P rootdraw R (rootdraw +G%); from the root: draft D root O oracle Q"
    sed -n 's/.*given X1: pearl \([0-9.]*\) rootdraw \([0-9.]*\)\( (rootdraw \([-+0-9.]*%\))\)\{0,1\}; from the root: draft \([0-9.]*\) root \([0-9.]*\) oracle \([0-9.]*\)/\1|\2|\4|\5|\6|\7/p' \
      "$tmp/score$label$B.err" | while IFS='|' read -r pe rd g dr ro or; do
        printf "| %-2s | %16s | %19s | %17s | %5s | %4s | %6s |\n" "$B" "$pe" "$rd" "${g:--}" "$dr" "$ro" "$or"
      done
  done
}

n_score=${SCORE_PROMPTS:-3}
head -n "$n_score" deploy/prompts.jsonl >"$tmp/score.jsonl"

if [ "${PAIR:-1}" != 0 ]; then
  pair_target=${PAIR_TARGET:-models/SmolLM2-135M-Instruct.F16.gguf}
  pair_shape=${PAIR_SHAPE:-5,1} pair_budget=${PAIR_BUDGET:-5}
  pair_decoders=${PAIR_DECODERS:-draft pearl rootdraw root}
  ahead=()
  [ "${PAIR_AHEAD:-1}" = 0 ] && ahead=(--no-ahead)
  [ -f "$pair_target" ] || { echo "run-main.sh: $pair_target missing (tools/setup.sh --pair)" >&2; exit 1; }
  echo
  echo "== the default pair in two processes: F16 target (core 0), Q4_1 drafter process (core 1),"
  echo "   T=0, B=$pair_budget, pools $pair_shape (depth,width); same text = the F16 target's AR text"
  echo "   tok/s: the whole decode, prompt prefill included; decode: after the prompt's prefill"
  echo "| prompts   | decoder  | tok/s    | ratio  | decode   | ratio  | same | tok/rd | hidden | guessed |"
  echo "|-----------|----------|----------|--------|----------|--------|------|--------|--------|---------|"
  pair_set prompts deploy/prompts.jsonl "${MAX_NEW:-48}"
  pair_set code_edit deploy/code_edit.jsonl "${CODE_MAX_NEW:-128}"
  echo
  echo "== expected acceptance per round (tau) on the pair, offline (--score-all-rules):"
  echo "   first $n_score prompts, --max-new ${SCORE_MAX_NEW:-16}, T=1, Q4_1 drafter, full pools (8,10)"
  tau_table pair "$pair_target" 1 --draft-model "$model"
fi

[ "${SCORE:-1}" = 0 ] && exit 0
echo
echo "== expected acceptance per round (tau) of each rule, offline (--score-all-rules):"
layers=${SCORE_LAYERS:-0-13,15-29}
echo "   first $n_score prompts, --max-new ${SCORE_MAX_NEW:-16}, T=0, self-drafter of target layers $layers"
tau_table self "$model" 0 --draft-layers "$layers"
