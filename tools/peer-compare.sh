#!/usr/bin/env bash
# rootspec against llama.cpp on one GGUF (dev-time): runs rootspec-micro and
# tools/llama_peer.py, pairs the key=value lines both print (ar_tok_s_t1, pass_ms_n9_t2,
# rss_mb, ...) and prints each pair with its ratio, oriented so that > 1 means rootspec is
# better (tok/s: rootspec / llama.cpp; ms and MB: llama.cpp / rootspec). Keys only one
# side prints are listed as they are.
#
#   tools/peer-compare.sh [MODEL.gguf]
#   PEER_PYTHON   python with llama_cpp (default /work/venv-peer/bin/python; see the
#                 install command in tools/llama_peer.py; a llama_cpp package elsewhere
#                 works through PYTHONPATH, e.g. PYTHONPATH=/work/peer-pkg)
#   MICRO_CMD     rootspec side (default: build/rootspec-micro --model MODEL)
#   PEER_ARGS     extra arguments for llama_peer.py (e.g. "--iters 5")
#   CTX           context before AR and the passes on both sides (rootspec-micro --ctx,
#                 llama_peer.py --context; default: each tool's own, 128)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
py=${PEER_PYTHON:-/work/venv-peer/bin/python}
micro=${MICRO_CMD:-build/rootspec-micro --model $model}
peer_args=${PEER_ARGS:-}
if [ -n "${CTX:-}" ]; then
    case $CTX in ''|*[!0-9]*) echo "peer-compare: CTX '$CTX' is not a positive integer" >&2; exit 2;; esac
    micro="$micro --ctx $CTX"
    peer_args="$peer_args --context $CTX"
fi
[ -f "$model" ] || { echo "peer-compare: no such model '$model'" >&2; exit 2; }
[ -x "$py" ] || { echo "peer-compare: no python at '$py' (set PEER_PYTHON)" >&2; exit 2; }
"$py" -c 'import llama_cpp' 2>/dev/null || {
    echo "peer-compare: '$py' cannot import llama_cpp (set PEER_PYTHON, or PYTHONPATH to" \
         "the package's folder)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== load before: $(uptime) (the figures are only comparable on a quiet machine)"
echo "== rootspec: $micro"
$micro | tee "$tmp/rootspec.txt"
echo "== llama.cpp: $py tools/llama_peer.py $model $peer_args"
# shellcheck disable=SC2086
"$py" tools/llama_peer.py "$model" $peer_args | tee "$tmp/llama.txt"

echo "== load after: $(uptime)"
echo "== ratios (> 1: rootspec better)"
awk -F= '
    /^[a-z0-9_]+=/ { k = $1; v = substr($0, length(k) + 2)
                     if (FILENAME ~ /rootspec/) r[k] = v; else { l[k] = v; order[++n] = k } }
    END {
        printf "%-22s %12s %12s %8s\n", "key", "rootspec", "llama.cpp", "ratio"
        for (i = 1; i <= n; i++) {
            k = order[i]
            if (!(k in r) || l[k] !~ /^[0-9.]+$/) continue
            if (k ~ /tok_s/) ratio = (l[k] > 0) ? r[k] / l[k] : 0
            else ratio = (r[k] > 0) ? l[k] / r[k] : 0
            printf "%-22s %12s %12s %7.2fx\n", k, r[k], l[k], ratio
        }
        for (k in r) if (!(k in l)) printf "%-22s %12s %12s\n", k, r[k], "-"
    }' "$tmp/rootspec.txt" "$tmp/llama.txt"
