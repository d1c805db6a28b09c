#!/usr/bin/env bash
# Pipelined two-process timing: a drafter process and a target process (deploy/launch.sh)
# on random-weight models made on the spot, for AR and each speculative decoder at T=0.
# tools/gpu-check.sh runs it on the GPU machine with Llama-3.1-8B- and Llama-3.2-1B-shaped
# models, both processes on GPU 0; the twoproc test suite runs it on the CPU with tiny ones,
# so this script is exercised before a GPU session spends time on it.
#   PIPE_BIN      folder with rootspec-target and rootspec-draft     (default build/cuda)
#   PIPE_BACKEND  cpu | cuda                                         (default cuda)
#   PIPE_TARGET   target model                       (default random:llama3-8b,seed=1)
#   PIPE_DRAFT    drafter model                      (default random:llama3-1b,seed=2), or an
#                 EAGLE-3 head (random:eagle3-*, or a directory whose config.json names an
#                 Eagle3 architecture): rootspec-draft then gets --target-model PIPE_TARGET
#   PIPE_DECODERS speculative decoders              (default "draft pearl rootdraw")
#   PIPE_MAX_NEW  new tokens per decode (default 128); PIPE_PROMPT_LEN prompt ids (64)
#   PIPE_BUDGET   tree budget (59); PIPE_OUT log folder (default pipeline-out)
#   PIPE_RUN_LIMIT seconds per decode including start-up (default 60); a decode past it, or
#                 the script stopped by a signal, has its whole process group killed
#   PIPE_TIE_TOL  logit margin of a near-tie (default 0.05 on cuda, 0.001 on cpu)
#   PIPE_IDENTITY strict | report (default strict): whether a difference from AR beyond a
#                 near-tie fails the run or is only reported (IDENTITY DIFFERS)
# Prints each decode's summary line and per-round timing medians, one table at the end, and
# "IDENTITY ok|near-tie|FAIL" per decoder: its T=0 ids must be a prefix of AR's, or differ
# first where AR's best two logits were within PIPE_TIE_TOL (rounding between batch shapes);
# then one line per decoder, identity_DEC=ok|near-tie|FAIL|differs[,id=D,margin=M].
# Exit status 0 when every run succeeded and no identity FAILed.
set -u
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "pipeline-timing: no arguments (settings come from PIPE_* variables; see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
BIN=${PIPE_BIN:-build/cuda}
BACKEND=${PIPE_BACKEND:-cuda}
TARGET=${PIPE_TARGET:-random:llama3-8b,seed=1}
DRAFT=${PIPE_DRAFT:-random:llama3-1b,seed=2}
DECODERS=${PIPE_DECODERS:-draft pearl rootdraw}
MAX_NEW=${PIPE_MAX_NEW:-128}
PLEN=${PIPE_PROMPT_LEN:-64}
BUDGET=${PIPE_BUDGET:-59}
OUT=${PIPE_OUT:-pipeline-out}
RUN_LIMIT=${PIPE_RUN_LIMIT:-60} # seconds per decode, start-up included
# Logit margin under which a first difference from AR counts as a rounding-flipped near-tie:
# bf16 GPU activations vs f32 on the CPU.
if [ "$BACKEND" = cuda ]; then TIE_TOL=${PIPE_TIE_TOL:-0.05}; else TIE_TOL=${PIPE_TIE_TOL:-0.001}; fi
IDENTITY_MODE=${PIPE_IDENTITY:-strict}
mkdir -p "$OUT"
say() { echo "pipeline: $*"; }
idents=()

# Prompt ids below the smallest preset vocabulary (512), spread so no early repeats.
ids=$(awk -v n="$PLEN" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", i ? "," : "", (i * 37 + 11) % 509 }')
# One GPU: both processes on device 0 (launch.sh reads these).
export DRAFT_GPU=${DRAFT_GPU:-0} TARGET_GPU=${TARGET_GPU:-0}
common=(--model "$TARGET" --prompt-ids "$ids" --temp 0 --budget "$BUDGET" --output-ids --timing)
head_args=()
case "$DRAFT" in
  random:eagle3-*) head_args=(--draft-target-model "$TARGET") ;;
  *) [ -f "$DRAFT/config.json" ] && grep -qi eagle3 "$DRAFT/config.json" &&
       head_args=(--draft-target-model "$TARGET") ;;
esac
say "target $TARGET, drafter $DRAFT, backend $BACKEND, $PLEN prompt ids, $MAX_NEW new tokens"

# limited CMD...: CMD under timeout with RUN_LIMIT (TERM, then KILL 5 s later). timeout
# puts CMD in a process group of its own, which a timeout of this script's caller would not
# reach: so CMD runs in the background and a signal to this script kills that whole group
# (the target and the drafter launch.sh started) before the script exits.
CHILD=""
limited() {
    local rc
    timeout -k 5 "$RUN_LIMIT" "$@" &
    CHILD=$!
    wait "$CHILD"
    rc=$?
    CHILD=""
    return $rc
}
stop_child() {
    [ -n "$CHILD" ] && kill -TERM -- -"$CHILD" 2>/dev/null
    sleep 1
    [ -n "$CHILD" ] && kill -KILL -- -"$CHILD" 2>/dev/null
    exit 143
}
trap stop_child TERM INT HUP

# AR runs past the speculative decoders' MAX_NEW: they may stop a tree depth later.
run_ar() {
    limited "$BIN/rootspec-target" --backend "$BACKEND" "${common[@]}" --decoder ar \
        --max-new $((MAX_NEW + 16)) --log-rounds "$OUT/rounds-ar.jsonl" \
        >"$OUT/ar.out" 2>"$OUT/ar.err"
}
run_spec() {
    limited bash deploy/launch.sh --backend "$BACKEND" --bin "$BIN" --draft-model "$DRAFT" \
        "${head_args[@]}" -- \
        "${common[@]}" --decoder "$1" --max-new "$MAX_NEW" --draft-timeout-ms 120000 \
        --log-rounds "$OUT/rounds-$1.jsonl" >"$OUT/$1.out" 2>"$OUT/$1.err"
}

rm -f "$OUT"/rounds-*.jsonl
status=0
summary=()
for dec in ar $DECODERS; do
    t0=$(date +%s.%N)
    if [ "$dec" = ar ]; then run_ar; else run_spec "$dec"; fi
    rc=$?
    wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    say "--- $dec: exit $rc, ${wall}s including process start-up and model creation"
    grep -E "^rootspec-target: decoder=|^per-round|^  " "$OUT/$dec.err" | sed 's/^/  /'
    if [ "$rc" -ne 0 ]; then
        tail -5 "$OUT/$dec.err" | sed 's/^/  ERR /'
        status=1
        continue
    fi
    if grep -q "drafter failed" "$OUT/$dec.err"; then
        say "$dec: the drafter failed; timings are of an AR fallback"
        status=1
    fi
    # Backend counters over the decode, each round's share summed (CUDA: graph replays vs
    # eager launches).
    count() { grep -o "\"$1\":[0-9]*" "$OUT/rounds-$dec.jsonl" 2>/dev/null | cut -d: -f2 |
              awk '{ s += $1; n++ } END { if (n) print s }'; }
    gr=$(count graph_replays)
    eg=$(count eager_launches)
    line=$(grep "^rootspec-target: decoder=" "$OUT/$dec.err" | tail -1)
    tps=$(echo "$line" | grep -o '[0-9.]* tok/s' | cut -d' ' -f1)
    acc=$(echo "$line" | grep -o 'mean accepted [0-9.]*' | cut -d' ' -f3)
    med() { grep -F "  $1" "$OUT/$dec.err" | awk 'NR == 1 { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) { v = $i; break } } END { print v == "" ? "-" : v }'; }
    summary+=("$(printf '%-9s %9s %9s %10s %10s %10s %8s %7s/%s' "$dec" "${tps:--}" "${acc:--}" \
        "$(med 'whole round')" "$(med 'root pass (1')" "$(med 'drafting')" \
        "$(med 'root pass hidden')" "${gr:--}" "${eg:--}")")
    if [ "$dec" != ar ]; then
        n=$(wc -w <"$OUT/$dec.out")
        got=$(tr -s ' \n' '  ' <"$OUT/$dec.out" | cut -d' ' -f1-"$MAX_NEW")
        ref=$(tr -s ' \n' '  ' <"$OUT/ar.out" | cut -d' ' -f1-"$MAX_NEW")
        if [ "$n" -ge "$MAX_NEW" ] && [ "$got" = "$ref" ]; then
            say "IDENTITY ok: $dec's first $MAX_NEW ids equal AR's"
            idents+=("identity_$dec=ok")
        else
            # Greedy speculative output equals AR's in exact arithmetic; on a GPU a tree pass
            # of n rows and AR's 1-row pass round differently (GEMM shapes, attention order,
            # bf16 activations), which can flip a near-tie. So the first difference is judged
            # by AR's own margin there (best logit minus runner-up, from its round log): a
            # near-tie is reported, anything else is a defect.
            echo "$got" | tr ' ' '\n' >"$OUT/$dec.cmp"
            echo "$ref" | tr ' ' '\n' >"$OUT/ar.cmp"
            d=$(awk 'NR == FNR { a[FNR] = $0; next } FNR in a && a[FNR] != $0 { print FNR - 1; exit }' \
                "$OUT/ar.cmp" "$OUT/$dec.cmp")
            if [ -z "$d" ]; then
                say "IDENTITY FAIL: $dec emitted $n ids, fewer than $MAX_NEW"
                idents+=("identity_$dec=FAIL,short=$n")
                status=1
                continue
            fi
            x=$(sed -n "$((d + 1))p" "$OUT/ar.cmp"); y=$(sed -n "$((d + 1))p" "$OUT/$dec.cmp")
            m=$(sed -n "$((d + 1))p" "$OUT/rounds-ar.jsonl" | grep -o '"root_margin":[0-9.]*' | cut -d: -f2)
            if [ -n "$m" ] && awk -v m="$m" -v t="$TIE_TOL" 'BEGIN { exit !(m < t) }'; then
                say "IDENTITY near-tie: $dec equals AR up to id $d, where AR's best two logits are $m apart (< $TIE_TOL): AR $x, $dec $y; the continuations differ from there"
                idents+=("identity_$dec=near-tie,id=$d,margin=$m")
            elif [ "$IDENTITY_MODE" = report ]; then
                say "IDENTITY DIFFERS: $dec differs from AR at id $d (0-based): AR $x, $dec $y, AR's margin there ${m:-unknown} (>= $TIE_TOL; reported, not judged)"
                idents+=("identity_$dec=differs,id=$d,margin=${m:-unknown}")
            else
                say "IDENTITY FAIL: $dec differs from AR at id $d (0-based): AR $x, $dec $y, AR's margin there ${m:-unknown} (>= $TIE_TOL: not a near-tie)"
                idents+=("identity_$dec=FAIL,id=$d,margin=${m:-unknown}")
                status=1
            fi
        fi
    fi
done
echo
say "summary (medians per round; drafting is the drafter's own time; replays/eager: CUDA graph replays / eager launches of the target backend)"
printf '  %-9s %9s %9s %10s %10s %10s %8s %s\n' decoder "tok/s" accepted "round ms" "root ms" \
    "draft ms" "hidden%" "replays/eager"
for s in "${summary[@]}"; do echo "  $s"; done
for s in ${idents[@]+"${idents[@]}"}; do echo "$s"; done
exit $status
