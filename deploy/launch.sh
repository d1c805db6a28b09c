#!/usr/bin/env bash
# Starts a drafter process and a target process that talk over ZeroMQ (DESIGN.md §5).
#   CPU:  drafter pinned to core 1, target to core 0 (taskset), over ipc:// by default.
#   CUDA: drafter on CUDA_VISIBLE_DEVICES=1, target on CUDA_VISIBLE_DEVICES=0 (override with
#         DRAFT_GPU / TARGET_GPU, e.g. DRAFT_GPU=0 to share one GPU).
# Usage:
#   deploy/launch.sh [--backend cpu|cuda] [--bin DIR] [--endpoint EP] [--insecure]
#                    [--curve-dir DIR] --draft-model PATH [--draft-layers SPEC]
#                    [--draft-threads N] [--draft-target-model PATH]
#                    [--drafter KIND] [--corpus FILE] [--no-ahead] [--serve] -- TARGET_ARGS...
# --draft-target-model: the target an EAGLE-3 head (--draft-model HEAD) drafts for, passed
# to rootspec-draft as --target-model (its embeddings and vocabulary).
# --drafter suffix: the model-free drafter (--draft-model then only lends its tokenizer),
# with --corpus FILE a text it also looks in.
# TARGET_ARGS go to rootspec-target (--model, --prompt/--prompts, --decoder, ...); the
# launcher adds --draft-endpoint. The drafter is stopped when the target exits.
# --no-ahead: the drafter idles between requests instead of running ahead (rootspec-draft
# --no-ahead; DESIGN.md §5).
# --serve: the target side is rootspec-serve, the HTTP server (TARGET_ARGS: --model,
# --decoder, --port, ...), which runs until SIGINT or SIGTERM (deploy/serve.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
backend=cpu bin="" endpoint="" draft_model="" draft_layers="" insecure="" curve="" dthreads=1
draft_target="" drafter="" corpus="" prog=rootspec-target no_ahead=
need() { [ $# -ge 2 ] || { echo "launch.sh: option $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) need "$@"; backend=$2; shift 2 ;;
    --bin) need "$@"; bin=$2; shift 2 ;;
    --endpoint) need "$@"; endpoint=$2; shift 2 ;;
    --draft-model) need "$@"; draft_model=$2; shift 2 ;;
    --draft-layers) need "$@"; draft_layers=$2; shift 2 ;;
    --draft-threads) need "$@"; dthreads=$2; shift 2 ;;
    --draft-target-model) need "$@"; draft_target=$2; shift 2 ;;
    --drafter) need "$@"; drafter=$2; shift 2 ;;
    --corpus) need "$@"; corpus=$2; shift 2 ;;
    --insecure) insecure=--insecure; shift ;;
    --no-ahead) no_ahead=--no-ahead; shift ;;
    --curve-dir) need "$@"; curve=$2; shift 2 ;;
    --serve) prog=rootspec-serve; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "launch.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$draft_model" ] || { echo "launch.sh: --draft-model is required" >&2; exit 2; }
case "$backend" in
  cpu) bin=${bin:-$here/build} ;;
  cuda) bin=${bin:-$here/build/cuda} ;;
  *) echo "launch.sh: --backend must be cpu or cuda, not '$backend'" >&2; exit 2 ;;
esac
build_hint="make"; [ "$backend" = cuda ] && build_hint="make cuda"
for b in rootspec-draft "$prog"; do
  [ -x "$bin/$b" ] || { echo "launch.sh: $bin/$b not found or not executable (build with: $build_hint)" >&2; exit 2; }
done
tmp=$(mktemp -d /tmp/rootspec.XXXXXX)
endpoint=${endpoint:-ipc://$tmp/draft.sock}
dargs=(--model "$draft_model" --bind "$endpoint" --backend "$backend" --threads "$dthreads")
[ -n "$draft_layers" ] && dargs+=(--draft-layers "$draft_layers")
[ -n "$draft_target" ] && dargs+=(--target-model "$draft_target")
[ -n "$drafter" ] && dargs+=(--drafter "$drafter")
[ -n "$corpus" ] && dargs+=(--corpus "$corpus")
[ -n "$insecure" ] && dargs+=("$insecure")
[ -n "$no_ahead" ] && dargs+=("$no_ahead")
[ -n "$curve" ] && dargs+=(--curve-dir "$curve")
targs=(--backend "$backend" --draft-endpoint "$endpoint")
[ -n "$insecure" ] && targs+=("$insecure")
[ -n "$curve" ] && targs+=(--curve-dir "$curve")

pin_draft=() pin_target=()
if [ "$backend" = cpu ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  pin_draft=(taskset -c 1) pin_target=(taskset -c 0)
fi
if [ "$backend" = cuda ]; then
  CUDA_VISIBLE_DEVICES=${DRAFT_GPU:-1} "$bin/rootspec-draft" "${dargs[@]}" &
else
  "${pin_draft[@]}" "$bin/rootspec-draft" "${dargs[@]}" &
fi
dpid=$!
cleanup() { kill "$dpid" 2>/dev/null || true; wait "$dpid" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Both processes load their models at once; the target runs in the background so that a
# drafter which fails to start is noticed at once.
if [ "$backend" = cuda ]; then
  CUDA_VISIBLE_DEVICES=${TARGET_GPU:-0} "$bin/$prog" "${targs[@]}" "$@" &
else
  "${pin_target[@]}" "$bin/$prog" "${targs[@]}" "$@" &
fi
tpid=$!
# A background job ignores SIGINT, so pass an interrupt on as SIGTERM.
trap 'kill -TERM "$tpid" 2>/dev/null || true' INT TERM
# rootspec-draft exits with 1 or 2 only when it cannot start (bad option, model or endpoint;
# bad requests never stop it): then stop the target rather than let it wait for a HELLO
# reply until --draft-timeout-ms. A drafter killed mid-run is the target's to handle (it
# finishes autoregressively).
while kill -0 "$tpid" 2>/dev/null; do
  if ! kill -0 "$dpid" 2>/dev/null; then
    drc=0
    wait "$dpid" || drc=$?
    if [ "$drc" -eq 1 ] || [ "$drc" -eq 2 ]; then
      echo "launch.sh: rootspec-draft exited with status $drc before serving; stopping the target" >&2
      kill -TERM "$tpid" 2>/dev/null || true
      wait "$tpid" 2>/dev/null || true
      exit "$drc"
    fi
    break
  fi
  sleep 0.1
done
while :; do # a trapped signal interrupts wait: wait again for the target's own status
  trc=0
  wait "$tpid" || trc=$?
  kill -0 "$tpid" 2>/dev/null || break
done
exit "$trc"
