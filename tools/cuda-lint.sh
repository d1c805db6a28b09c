#!/usr/bin/env bash
# Resource and SASS lint of the CUDA kernels (needs nvcc, no GPU; `make cuda-resources`):
#   bash tools/cuda-lint.sh [--archs "80 86 89 90"] [--out DIR]
# 1. ptxas -v over every kernels/cuda/*.cu for each architecture: per kernel registers,
#    static shared memory, stack frame (local memory) and spill bytes, and the threads of
#    its launch sites (CUK_LAUNCH / CUK_KERNEL_LAUNCH in the sources, macros resolved).
#    Fails on any spill, on a block over 1024 threads or registers x threads over the 65536
#    of a block, on static shared memory over the 48 KiB a block may have without opting
#    in, and on a kernel whose launch size it cannot find.
# 2. For sm_90, the SASS (nvdisasm -gi: source lines and inlining, kept by -lineinfo) of
#    every innermost loop, with its 16-byte global loads (LDG.E.128) per iteration,
#    attributed to the device functions whose source lines they come from; the hot loops:
#    attention's K scores (att_scores) and V accumulation (att_values), the one-row GEMV
#    (k_gemv) and the GEMM lane loop (dot_rows). nvdisasm comes from the toolkit, else from its PyPI wheel
#    (tools/nvidia-wheel.sh; without network the SASS part is skipped, said so, not failed).
# Writes DIR/resources.txt (the table) and DIR/sass-loops.txt; prints both. CUDA_LINT_FLAGS
# adds nvcc flags to the ptxas pass (CUDA_LINT_FLAGS=-maxrregcount=32 shows a spill failing).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHS="80 86 89 90"
OUT=build/cuda/lint
while [ $# -gt 0 ]; do
    case "$1" in
      --archs) ARCHS=$2; shift ;;
      --out) OUT=$2; shift ;;
      -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
      *) echo "cuda-lint: unknown option '$1' (--archs, --out, --help)" >&2; exit 2 ;;
    esac
    shift
done
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
[ -x "$NVCC" ] || command -v "$NVCC" >/dev/null || { echo "cuda-lint: no nvcc ($NVCC)" >&2; exit 2; }
mkdir -p "$OUT"
SRCS=$(ls kernels/cuda/*.cu)
GENCODE=""
for a in $ARCHS; do GENCODE="$GENCODE -gencode arch=compute_$a,code=sm_$a"; done

# ---- launch sizes from the sources: "kernel threads" lines ----
launch_sizes() {
    awk '
    FNR == 1 { delete def }
    /^#define [A-Z_][A-Z0-9_]* +[(0-9]/ { v = $0; sub(/^#define [A-Z_0-9]+ +/, "", v); sub(/ *\/\*.*/, "", v); def[$2] = v }
    function resolve(e,   n, out, rest, name) { # macros of the file, recursively
        for (n = 0; n < 8; n++) {
            out = ""; rest = e
            while (match(rest, /[A-Z_][A-Z0-9_]*/)) {
                name = substr(rest, RSTART, RLENGTH)
                out = out substr(rest, 1, RSTART - 1) ((name in def) ? "(" def[name] ")" : name)
                rest = substr(rest, RSTART + RLENGTH)
            }
            if (out rest == e) break
            e = out rest
        }
        gsub(/dim3/, "", e)
        return e
    }
    function args(s,   i, c, depth, cur, n) { # top-level comma split of s into A[]
        n = 0; depth = 0; cur = ""
        for (i = 1; i <= length(s); i++) {
            c = substr(s, i, 1)
            if (c == "(") depth++
            if (c == ")") { if (depth == 0) break; depth-- }
            if (c == "," && depth == 0) { A[++n] = cur; cur = ""; continue }
            cur = cur c
        }
        A[++n] = cur
        return n
    }
    /CUK_(KERNEL_)?LAUNCH\(k_/ { buf = $0; pending = 1 }
    pending && !/CUK_(KERNEL_)?LAUNCH\(k_/ { buf = buf " " $0 }
    pending {
        s = buf; sub(/.*LAUNCH\(/, "", s)
        if (args(s) < 4) next
        pending = 0
        k = A[1]; gsub(/ /, "", k); t = resolve(A[3]); gsub(/ /, "", t)
        print k, t
    }' $SRCS | while read -r k expr; do
        # the size expression holds only numbers and operators once macros are resolved
        if [[ "$expr" =~ ^[0-9()*/+-]+$ ]]; then echo "$k $(( expr ))"; else echo "$k ?"; fi
    done | sort -u
}
launch_sizes >"$OUT/launches.txt"

# ---- ptxas -v per file, all architectures in one nvcc run ----
: >"$OUT/ptxas.txt"
for f in $SRCS; do
    b=$(basename "$f" .cu)
    "$NVCC" -O3 -std=c++17 $GENCODE -lineinfo -I. ${CUDA_LINT_FLAGS:-} -Xptxas -v -c "$f" -o "$OUT/$b.o" \
        2>"$OUT/$b.ptxas" || { cat "$OUT/$b.ptxas" >&2; exit 1; }
    sed "s|^|$b |" "$OUT/$b.ptxas" >>"$OUT/ptxas.txt"
done

# One row per (kernel, arch): file arch kernel regs smem stack spill_st spill_ld threads
awk -v LF="$OUT/launches.txt" '
BEGIN { while ((getline l < LF) > 0) { split(l, p, " "); thr[p[1]] = p[2] } }
/Compiling entry function/ {
    k = $0; sub(/.*function .[^_]*_Z[0-9]+/, "", k)
    # _Z<len><name>...: the name is the first <len> characters after the length
    m = $0; sub(/.*function ._Z/, "", m); len = m + 0; sub(/^[0-9]+/, "", m); k = substr(m, 1, len)
    a = $0; sub(/.* for .sm_/, "", a); sub(/.$/, "", a); file = $1; entry = 1; next
}
entry && /bytes stack frame/ { st = $2; ss = $6; sl = $10; next } # after the file prefix
entry && /Used [0-9]+ registers/ {
    r = $0; sub(/.*Used /, "", r); r += 0
    sm = 0; if ($0 ~ /bytes smem/) { sm = $0; sub(/ bytes smem.*/, "", sm); sub(/.* /, "", sm) }
    t = (k in thr) ? thr[k] : "?"
    printf "%s %s %s %d %d %d %d %d %s\n", file, a, k, r, sm, st, ss, sl, t
    entry = 0; st = ss = sl = 0
}' "$OUT/ptxas.txt" | sort -k3,3 -k2,2n >"$OUT/resources.raw"

{
    printf '%-16s %-4s %-22s %5s %7s %9s %7s %6s %6s  %s\n' file arch kernel regs threads "regs*thr" smem_B stack_B spill_B verdict
    awk '{
        bad = ""
        if ($7 + $8 > 0) bad = bad " SPILLS"
        if ($9 == "?") bad = bad " NO-LAUNCH-SIZE"
        else if ($9 > 1024) bad = bad " THREADS>1024"
        else if ($4 * $9 > 65536) bad = bad " REGS*THREADS>65536"
        if ($5 > 49152) bad = bad " SMEM>48KiB"
        rt = ($9 == "?") ? "?" : $4 * $9
        printf "%-16s sm%-2s %-22s %5d %7s %9s %7d %7d %6d  %s\n", $1, $2, $3, $4, $9, rt, $5, $6, $7 + $8, bad == "" ? "ok" : "FAIL" bad
    }' "$OUT/resources.raw"
} >"$OUT/resources.txt"
cat "$OUT/resources.txt"
nbad=$(grep -c ' FAIL' "$OUT/resources.txt" || true)

# ---- SASS of the hot loops (sm_90) ----
NVDISASM=""
for c in "$CUDA_HOME/bin/nvdisasm" build/nvidia-tools/nvdisasm/nvdisasm; do
    [ -x "$c" ] && { NVDISASM=$c; break; }
done
if [ -z "$NVDISASM" ] && ! bash tools/nvidia-wheel.sh 'nvidia-cuda-nvdisasm' build/nvidia-tools/nvdisasm >/dev/null; then
    echo "cuda-lint: no nvdisasm (toolkit or PyPI wheel): SASS loop table skipped"
else
    NVDISASM=${NVDISASM:-build/nvidia-tools/nvdisasm/nvdisasm}
    case " $ARCHS " in *" 90 "*) SASS_ARCH=90 ;; *) SASS_ARCH=${ARCHS##* } ;; esac
    : >"$OUT/sass-loops.txt"
    for f in $SRCS; do
        b=$(basename "$f" .cu)
        "$NVCC" -O3 -std=c++17 -arch=sm_$SASS_ARCH -lineinfo -I. -cubin -o "$OUT/$b.cubin" "$f"
        "$NVDISASM" -c -gi "$OUT/$b.cubin" >"$OUT/$b.sass"
        # innermost backward-branch loops: label .. BRA back to it, no other loop inside
        awk -v src="$f" -v file="$b" '
        BEGIN { # source line -> the function it belongs to (a definition starts in column 0)
            n = 0
            while ((getline l < src) > 0) {
                n++
                if (l ~ /^(static |extern |__device__|__global__|template|[a-zA-Z_][a-zA-Z0-9_ *]*\()/ && l ~ /\(/ && l !~ /;[ \t]*$/) {
                    name = l; sub(/\(.*/, "", name); sub(/.*[ *]/, "", name); cur = name
                }
                fn[n] = cur
            }
        }
        /^\/\/-+ \.text\./ { flush(); fname = $0; sub(/.*\.text\._Z[0-9]*/, "", fname); m = $0; sub(/.*\.text\._Z/, "", m); len = m + 0; sub(/^[0-9]+/, "", m); fname = substr(m, 1, len); ni = 0; delete lab; next }
        # a block of "//## File" lines precedes an instruction: its location, each inlined
        # at the next; every line of this source file in the chain names a function
        /\/\/## File/ {
            if (!inblk) { chain = ""; inblk = 1 }
            rest = $0
            while (match(rest, /File "[^"]*", line [0-9]+/)) {
                loc = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
                f1 = loc; sub(/^File "/, "", f1); sub(/".*/, "", f1)
                ln = loc; sub(/.*line /, "", ln)
                if (f1 ~ ("/" src "$") || f1 == src) chain = chain " " fn[ln + 0] ":" ln
            }
            next
        }
        /^\.L_x_[0-9]+:/ { l = $0; sub(/:.*/, "", l); lab[l] = ni + 1; next }
        /\/\*[0-9a-f]+\*\// {
            inblk = 0
            ni++; ins[ni] = $0; ichain[ni] = chain
            if ($0 ~ /BRA/ && match($0, /\.L_x_[0-9]+/)) {
                t = substr($0, RSTART, RLENGTH)
                if ((t in lab) && lab[t] <= ni) { nl++; ls[nl] = lab[t]; le[nl] = ni; lf[nl] = fname }
            }
        }
        function flush(   i, j, inner, g, s, k, w, nw, parts, wl) {
            for (i = 1; i <= nl; i++) {
                inner = 1
                for (j = 1; j <= nl; j++) if (j != i && ls[j] >= ls[i] && le[j] <= le[i] && (ls[j] != ls[i] || le[j] != le[i])) inner = 0
                if (!inner) continue
                g = s = 0; delete where
                for (k = ls[i]; k <= le[i]; k++) {
                    if (ins[k] ~ /LDG\.E[A-Z.]*\.128/) {
                        g++
                        nw = split(ichain[k], parts, " ")
                        for (w = 1; w <= nw; w++) where[parts[w]] = 1
                    }
                    if (ins[k] ~ /LDS[A-Z.]*\.128/) s++
                }
                if (!g) continue
                wl = ""; for (k in where) wl = wl (wl == "" ? "" : ",") k
                printf "%s %s %d %d %d %s\n", file, lf[i], le[i] - ls[i] + 1, g, s, wl
            }
            nl = 0
        }
        END { flush() }' "$OUT/$b.sass" >>"$OUT/sass-loops.txt"
    done
    echo
    echo "cuda-lint: innermost sm_$SASS_ARCH loops with 16-byte global loads (per iteration):"
    printf '%-16s %-22s %6s %8s %8s  %s\n' file kernel instrs LDG.128 LDS.128 "source (function:line of each 16-byte load)"
    sort -u "$OUT/sass-loops.txt" | awk '{ printf "%-16s %-22s %6d %8d %8d  %s\n", $1, $2, $3, $4, $5, $6 }'
    echo
    # The hot loops' figures: most 16-byte loads per iteration of any loop whose loads come
    # from that function, per kernel.
    for pair in k_attention:att_scores k_attention:att_values k_gemv:k_gemv k_gemm_bi:dot_rows k_qkv_fused:dot_rows; do
        k=${pair%%:*} fnn=${pair##*:}
        v=$(awk -v k="$k" -v f="$fnn" '$2 == k && index($6, f ":") { if ($4 > m) m = $4 } END { print m + 0 }' "$OUT/sass-loops.txt")
        echo "hot_loop $k $fnn ldg128_per_iter=$v"
    done | tee "$OUT/hot-loops.txt"
fi
if [ "$nbad" -gt 0 ]; then
    echo "cuda-lint: $nbad kernel(s) FAIL (spills, launch resources or static shared memory: see above)"
    exit 1
fi
echo "cuda-lint: no spills; every kernel fits its launch size and the static shared memory limit"
