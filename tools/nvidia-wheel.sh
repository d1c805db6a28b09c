#!/usr/bin/env bash
# Dev-time: the NVIDIA command-line tools a CUDA toolkit install may lack, from their PyPI
# wheels (pip download, no install):
#   bash tools/nvidia-wheel.sh SPEC DEST    e.g. 'nvidia-cuda-sanitizer-api==13.0.*' build/x
# puts the wheel's bin/ and lib/ files flat into DEST (as the toolkit's compute-sanitizer/
# folder holds the tool beside its libraries), executables marked so. The wheels are kept
# in build/nvidia-wheels/ so a second call needs no network. Exit 1 when pip cannot get it.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
[ $# -eq 2 ] || { echo "usage: bash tools/nvidia-wheel.sh SPEC DEST" >&2; exit 2; }
spec=$1 dest=$2
cache=build/nvidia-wheels
mkdir -p "$cache"
name=${spec%%[=<>]*}
whl=$(ls "$cache"/"$(echo "$name" | tr - _)"-*.whl 2>/dev/null | tail -1 || true)
if [ -z "$whl" ]; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$cache" "$spec" >&2 ||
        { echo "nvidia-wheel: pip could not download '$spec'" >&2; exit 1; }
    whl=$(ls "$cache"/"$(echo "$name" | tr - _)"-*.whl | tail -1)
fi
rm -rf "$dest"
mkdir -p "$dest"
python3 - "$whl" "$dest" <<'PY'
import os, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        parts = info.filename.split("/")
        if info.is_dir() or len(parts) < 3 or parts[0] != "nvidia" or parts[-2] not in ("bin", "lib"):
            continue
        out = os.path.join(dest, parts[-1])
        if os.path.exists(out):
            continue  # the same library in bin/ and lib/
        with open(out, "wb") as f:
            f.write(z.read(info))
        if parts[-2] == "bin" and not parts[-1].endswith(".so"):
            os.chmod(out, 0o755)
PY
echo "nvidia-wheel: $(basename "$whl") -> $dest ($(ls "$dest" | tr '\n' ' '))"
