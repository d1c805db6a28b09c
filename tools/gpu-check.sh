#!/usr/bin/env bash
# The first GPU run: ONE command on the GPU machine, from the repo root:
#   bash tools/gpu-check.sh --limit SECONDS      (with gpu-bundle/, made by `make gpu-bundle`)
# SECONDS is the time the run is given; the stages end before it, leaving a margin (a tenth,
# at least 20 s) for the recap. Every stage appends its key=value lines to $OUT/recap.txt
# the moment it ends, so a run stopped at any point leaves the preflight and every finished
# stage there (and the output's last lines repeat the whole recap at the end). Stages, in the
# order of what they tell (each with its own limit; a stage left without time is
# "skipped (time)", which is not a failure):
#   preflight the driver's and the runtime's CUDA versions, the device and its memory, the
#             cuBLAS library found: within seconds, before anything else; a driver older
#             than the runtime the binaries carry is one line and exit 3
#   device    the binaries (gpu-bundle/ if they start here, else `make cuda CUDA_ARCHS=90`)
#             and the device-to-device copy bandwidth
#   pass1     the Llama-3.1-8B-shaped one-row pass at a 512-token context (the headline figure)
#   gemv      the own one-row bf16 GEMV (cuk_gemv) beside cuBLAS on the 8B decode matrices
#   qkv       8B pass times for 1 and 65 rows with the q|k|v projection in the fused kernel
#             and on cuBLAS (rootspec-cuda-bench, ROOTSPEC_CUDA_FUSED_QKV), and the one-row
#             pass with o, gate|up, down and the head on the own GEMV/GEMM and on cuBLAS
#             (ROOTSPEC_CUDA_GEMV)
#   seqs      the paged multi-sequence path: one decode row of each of 8 sequences (512-token
#             contexts of their own) in one pass against one pass per sequence, default and
#             --batch-invariant (rootspec-cuda-bench --seqs): ms, ratio, largest logits
#             difference, and with --batch-invariant whether the bits are the same
#   suites    the CUDA Check suites, one at a time (kernels vs CPU references, forward
#             parity, golden fixtures, graph replay == eager, batch-invariant mode); a line
#             per suite as it ends
#   memcheck  compute-sanitizer memcheck over the kernel suite (the bundle's own copy)
#   bench     rootspec-cuda-bench: 8B and 1B shapes, n = 1, 9, 60, 65, graph vs eager
#   pipeline  tools/pipeline-timing.sh: the 8B target with a 1B-shaped drafter in two
#             processes on GPU 0 (under MPS when the machine has it), 32 new tokens, AR /
#             draft / pearl / rootdraw; then rootdraw with an EAGLE-3 head shaped like the
#             published 8B one
#   batch_invariant  the 8B shape timed with --batch-invariant kernels (n = 1, 9, 65)
#   racecheck, synccheck  compute-sanitizer over the kernel suite, if time is left
# docs/CUDA.md says what each recap key means. A sanitizer that cannot start is
# "skipped (...)", not a failure. Default-mode T=0 identity differences are reported with
# AR's logit margin where the ids split, not judged.
# Exit status: 0 when no stage FAILed, 1 otherwise, 2 when no binaries could be had or on
# bad usage, 3 when the driver is too old for the binaries.
#   --limit S        the run's time limit in seconds (required, except with --emu: 3600)
#   --emu            dry run without a GPU: the emulator build (make cuda-emu), tiny
#                    models, stage limits x10 (the recap has the same keys)
#   --default-model  a second, optional run (the default model travels in two parts,
#                    tools/gpu-carry.sh): checks the parts first and goes if they are not
#                    all here; then CUDA vs CPU on that model and the host CPU's kernels
# Settings: GPU_CHECK_OUT (logs; default $OUT, else gpu-check-out/), GPU_CHECK_BIN (a
# binaries folder), GPU_CHECK_SCALE (stage limits factor), GPU_CHECK_SUITES.
set -u
cd "$(dirname "$0")/.."
MODE=full
EMU=0
LIMIT=""
while [ $# -gt 0 ]; do
    case "$1" in
      --default-model) MODE=default-model ;;
      --emu) EMU=1 ;;
      --limit) LIMIT=${2:-}; shift ;;
      --limit=*) LIMIT=${1#--limit=} ;;
      -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
      *) echo "gpu-check: unknown option '$1' (--limit S, --emu, --default-model, --help)" >&2; exit 2 ;;
    esac
    shift
done
[ -z "$LIMIT" ] && [ "$EMU" = 1 ] && LIMIT=3600
case "$LIMIT" in
  ''|*[!0-9]*) echo "gpu-check: --limit SECONDS (the run's time limit, a whole number) is required; got '${LIMIT}'" >&2; exit 2 ;;
esac
[ "$LIMIT" -ge 60 ] || { echo "gpu-check: --limit $LIMIT: at least 60 seconds" >&2; exit 2; }
OUTDIR=${GPU_CHECK_OUT:-${OUT:-gpu-check-out}}
mkdir -p "$OUTDIR"
RECAP=$OUTDIR/recap.txt
: >"$RECAP"
T0=$(date +%s)
# The stages' deadline: the run's limit less a margin for the recap and the teardown.
MARGIN=$(( LIMIT / 10 > 20 ? LIMIT / 10 : 20 ))
DEADLINE=$(( LIMIT - MARGIN ))
say() { echo "gpu-check [$(( $(date +%s) - T0 ))s]: $*"; }
# kv KEY VALUE: one recap line, printed and appended to $OUT/recap.txt at once.
kv() { echo "$1=$2"; echo "$1=$2" >>"$RECAP"; }
if [ "$EMU" = 1 ]; then
    : "${GPU_CHECK_BIN:=build/cuda-emu}" "${GPU_CHECK_SCALE:=10}"
    export CUEMU_QUIET=1 OPENBLAS_NUM_THREADS=1
    MODEL_ARGS="--model random:tiny --copy-mib 8 --ctx 64 --iters 2"
    GEMV_ARGS="--gemv-div 16 --iters 2"
    PASS1_ARGS=$MODEL_ARGS QKV_ARGS=$MODEL_ARGS BI_ARGS=$MODEL_ARGS BENCH_ARGS=$MODEL_ARGS
    SEQS_ARGS="--model random:tiny --ctx 64 --iters 2 --seqs 4"
    PIPE_T=random:tiny,seed=9 PIPE_D=random:tiny,seed=9,layers=1 PIPE_E3=random:eagle3-tiny
else
    PASS1_ARGS="--only target --iters 10 --ctx 512 --copy-mib 1024" GEMV_ARGS="--iters 20"
    QKV_ARGS="--only target --iters 10 --ctx 512" BI_ARGS="--only target --iters 5 --ctx 512"
    BENCH_ARGS="--iters 20 --ctx 512"
    SEQS_ARGS="--only target --iters 5 --ctx 512 --seqs 8"
    PIPE_T=random:llama3-8b,seed=1 PIPE_D=random:llama3-1b,seed=2 PIPE_E3=random:eagle3-llama3-8b
fi
SCALE=${GPU_CHECK_SCALE:-1}
declare -A ST # stage -> ok | FAIL (...) | skipped (...) | timeout
PIPE_DIR=/nonexistent # the pipeline's round logs, once it has run
STAGES="preflight device pass1 gemv qkv seqs suites memcheck bench pipeline batch_invariant racecheck synccheck"
STAGE=preflight # the stage running now
# limit CAP: CAP * SCALE seconds, or what is left before the deadline if less; fails
# (skip the stage) with under 15 s left.
limit() {
    local left=$(( DEADLINE - ($(date +%s) - T0) )) cap=$(( $1 * SCALE ))
    [ "$left" -lt 15 ] && return 1
    echo $(( left < cap ? left : cap ))
}
# status RC: a stage's status from its exit status.
status() { case "$1" in 0) echo ok ;; 124|137) echo timeout ;; *) echo "FAIL (exit $1)" ;; esac; }
# stage_end NAME STATUS: the stage's line in the recap; the next stage starts.
stage_end() { ST[$1]=$2; kv "stage_$1" "$2"; }

# tmo SECS CMD...: CMD under timeout (TERM, KILL 10 s later; timeout puts it in a process
# group of its own), waited for in the background so that a signal to this script is
# handled at once: the trap below kills that group, notes where the run stopped, exits.
CHILD=""
tmo() {
    local rc
    timeout -k 10 "$@" &
    CHILD=$!
    wait "$CHILD"
    rc=$?
    CHILD=""
    return $rc
}
stopped() {
    [ -n "$CHILD" ] && kill -TERM -- -"$CHILD" 2>/dev/null
    kv stopped "signal during stage $STAGE after $(( $(date +%s) - T0 ))s"
    exit 1
}
trap stopped TERM INT HUP

# ---- preflight: versions, device, memory, cuBLAS, within seconds ----
say "preflight (the run's limit ${LIMIT}s, stages until ${DEADLINE}s; recap lines in $RECAP)"
if command -v nvidia-smi >/dev/null; then
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode \
        --format=csv,noheader >"$OUTDIR/gpu.txt" 2>&1 || echo "nvidia-smi failed: $(head -1 "$OUTDIR/gpu.txt")" >"$OUTDIR/gpu.txt"
    timeout 20 nvidia-smi >"$OUTDIR/nvidia-smi.txt" 2>&1
else
    echo "nvidia-smi not available" >"$OUTDIR/gpu.txt"
fi
kv gpu "$(head -1 "$OUTDIR/gpu.txt" | tr ' ' '_')"
DRV_CUDA=$(grep -o 'CUDA Version: *[0-9.]*' "$OUTDIR/nvidia-smi.txt" 2>/dev/null | grep -o '[0-9.]*$')
kv driver_cuda_smi "${DRV_CUDA:-n/a}"
# What the bundle was built with (make gpu-bundle writes it).
BUNDLE_RT=$(sed -n 's/^cuda_runtime=//p' gpu-bundle/BUILD.txt 2>/dev/null)
kv bundle "$( [ -r gpu-bundle/BUILD.txt ] && tr '\n' ' ' <gpu-bundle/BUILD.txt | sed 's/ $//; s/ /,/g' || echo none)"
if [ -n "$DRV_CUDA" ] && [ -n "$BUNDLE_RT" ] && [ "${DRV_CUDA%%.*}" -lt "${BUNDLE_RT%%.*}" ]; then
    say "FAIL: the driver supports CUDA $DRV_CUDA, older than the CUDA $BUNDLE_RT runtime the binaries carry: a driver of CUDA ${BUNDLE_RT%%.*} or newer is needed; nothing can run"
    stage_end preflight "FAIL (driver CUDA $DRV_CUDA < runtime $BUNDLE_RT)"
    kv result FAIL
    exit 3
fi
# The exclusive compute mode admits one process: the pipeline's two would fail.
grep -qi exclusive "$OUTDIR/gpu.txt" && say "WARNING: compute mode is exclusive: the pipeline will fail"

# --default-model: the model's parts must all be here before anything else is tried.
if [ "$MODE" = default-model ] && ! bash tools/gpu-carry.sh join; then
    say "no default model: carry gpu-carry/model.part1, model.part2 and model.sha256 (tools/gpu-carry.sh)"
    exit 2
fi
# libcublas (and, for a -lcudart build, libcudart) come from the machine: find a copy the
# loader does not already see (CUDA toolkit folders, pip's nvidia-* wheels).
add_cuda_libs() {
    local bin=$1 missing lib dir py
    missing=$(ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}')
    [ -z "$missing" ] && return 0
    say "libraries not found for $bin: $(echo $missing | tr '\n' ' '); searching"
    py=$(python3 -c 'import site
print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
    for lib in $missing; do
        dir=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu \
              /opt /usr/local/lib/python3* /usr/lib/python3* $py -name "$lib" 2>/dev/null | head -1)
        if [ -n "$dir" ]; then
            export LD_LIBRARY_PATH="$(dirname "$dir")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            say "  $lib -> $(dirname "$dir")"
        else
            say "  $lib: not found anywhere"
        fi
    done
    ! ldd "$bin" 2>/dev/null | grep -q "not found"
}

# gpu-bundle/'s files travel xz-compressed (make gpu-bundle).
unpack_xz() {
    local f n=0
    for f in gpu-bundle/*.xz gpu-bundle/lib/*.xz gpu-bundle/sanitizer/*.xz; do
        [ -e "$f" ] || continue
        [ -e "${f%.xz}" ] && continue
        if command -v xz >/dev/null; then xz -dk "$f"
        else python3 -c 'import lzma,sys; open(sys.argv[1][:-3],"wb").write(lzma.open(sys.argv[1]).read())' "$f"
        fi || return 1
        case $f in gpu-bundle/rootspec-*|*/compute-sanitizer.xz) chmod +x "${f%.xz}" ;; esac
        n=$((n + 1))
    done
    [ "$n" -eq 0 ] || say "unpacked $n files of gpu-bundle/ (xz)"
}
# The bundle is usable when its libraries resolve and a binary starts (usage exit 2, not
# the loader's 127).
bundle_ok() {
    unpack_xz || return 1
    [ -x gpu-bundle/rootspec-cuda-tests ] && [ -x gpu-bundle/rootspec-cuda-bench ] || return 1
    add_cuda_libs gpu-bundle/rootspec-cuda-tests || return 1
    gpu-bundle/rootspec-cuda-bench --usage >/dev/null 2>&1
    [ $? -eq 2 ]
}


BIN=""
if [ -n "${GPU_CHECK_BIN:-}" ]; then
    BIN=$GPU_CHECK_BIN
    say "PATH TAKEN: GPU_CHECK_BIN=$BIN"
elif bundle_ok; then
    BIN=gpu-bundle
    say "PATH TAKEN: prebuilt gpu-bundle/ ($(du -sh gpu-bundle | cut -f1))"
else
    say "PATH TAKEN: gpu-bundle/ missing or not runnable here; building: make cuda CUDA_ARCHS=90"
    if tmo "$(( DEADLINE / 2 ))" make -j"$(nproc)" cuda CUDA_ARCHS=90 >"$OUTDIR/build.log" 2>&1; then
        BIN=build/cuda
        add_cuda_libs $BIN/rootspec-cuda-tests || true
    else
        tail -15 "$OUTDIR/build.log"
        say "FAIL: make cuda failed (log: $OUTDIR/build.log): carry gpu-bundle (make gpu-bundle)"
        stage_end preflight "FAIL (no binaries)"
        kv result FAIL
        exit 2
    fi
fi
kv binaries "$BIN"
kv cublas_lib "$(ldd "$BIN/rootspec-cuda-bench" 2>/dev/null | awk '/libcublas\.so/ { print $3 == "not" ? "NOT_FOUND" : $3; exit }' | grep . || echo static-or-emulated)"
tmo 30 "$BIN/rootspec-cuda-bench" --preflight >"$OUTDIR/preflight.log" 2>&1
rc=$?
grep -E '^[a-z_]+=' "$OUTDIR/preflight.log" | grep -v '^preflight=' | while IFS='=' read -r k v; do kv "$k" "$v"; done
pf=$(sed -n 's/^preflight=//p' "$OUTDIR/preflight.log")
if [ "$rc" -eq 3 ]; then
    say "FAIL: $pf"
    stage_end preflight "$pf"
    kv result FAIL
    exit 3
fi
stage_end preflight "${pf:-$(status $rc)}"
cp "$RECAP" "$OUTDIR/preflight.txt"
no_gpu=0
case "$pf" in ok) ;; *) no_gpu=1 ;; esac
if [ "$no_gpu" = 1 ] && [ "$EMU" = 0 ] && [ -z "${GPU_CHECK_BIN:-}" ]; then
    say "no usable device: nothing else can run"
    kv result FAIL
    exit 1
fi
STAGE=device

# ---- what each stage adds to the recap when it ends ----
# bench_field FILE N FIELD: FIELD of the first BENCH line of n=N in FILE (its first model)
bench_field() {
    grep -m1 -E "^BENCH .* n=$2 " "$1" 2>/dev/null | grep -o " $3=[^ ]*" | cut -d= -f2
}
# bench_kv KEY FILE N FIELD: one recap line from a bench log.
bench_kv() { local v; v=$(bench_field "$2" "$3" "$4"); kv "$1" "${v:-n/a}"; }
recap_qkv() {
    local n f c fast="" sep=""
    f=$(bench_field "$OUTDIR/qkv-fused.log" 1 graph_nout1_ms)
    c=$(bench_field "$OUTDIR/onerow-cublas.log" 1 graph_nout1_ms)
    kv onerow_ms_n1 "own:${f:-n/a},cublas:${c:-n/a}"
    for n in 1 65; do
        f=$(bench_field "$OUTDIR/qkv-fused.log" $n graph_nout1_ms)
        c=$(bench_field "$OUTDIR/qkv-cublas.log" $n graph_nout1_ms)
        kv "qkv_ms_n$n" "fused:${f:-n/a},cublas:${c:-n/a}"
        if [ -n "$f" ] && [ -n "$c" ]; then
            fast="$fast${sep}n$n:$(awk -v f="$f" -v c="$c" 'BEGIN { print f <= c ? "fused" : "cublas" }')"
            sep=","
        fi
    done
    kv qkv_faster "${fast:-n/a}"
}
recap_bench() {
    local n f path="" sep=""
    for n in 1 9 65; do
        f=$(bench_field "$OUTDIR/cuda-bench.log" $n qkv)
        path="$path${sep}n$n:${f:-n/a}"; sep=","
    done
    kv qkv_path "$path"
    bench_kv launches_per_layer_graph_n65 "$OUTDIR/cuda-bench.log" 65 graph_kernels_layer
    for n in 1 9 65; do
        bench_kv "pass_ms_n${n}_bench" "$OUTDIR/cuda-bench.log" $n graph_nout1_ms
        bench_kv "share_n${n}_bench" "$OUTDIR/cuda-bench.log" $n share
    done
}
# seqs: one SEQS line per mode (rootspec-cuda-bench --seqs)
recap_seqs() {
    local l n
    l=$(grep -m1 "^SEQS .* bi=0 " "$OUTDIR/seqs.log" 2>/dev/null)
    n=$(echo "$l" | grep -o ' seqs=[0-9]*' | cut -d= -f2)
    kv "seqs_ms_n${n:-N}" "batch:$(echo "$l" | grep -o 'batch_ms=[^ ]*' | cut -d= -f2),solo:$(echo "$l" | grep -o 'solo_ms=[^ ]*' | cut -d= -f2)"
    kv "seqs_speedup_n${n:-N}" "$(echo "$l" | grep -o 'speedup=[^ ]*' | cut -d= -f2)"
    kv seqs_max_abs_diff "$(echo "$l" | grep -o 'max_abs_diff=[^ ]*' | cut -d= -f2)"
    l=$(grep -m1 "^SEQS .* bi=1 " "$OUTDIR/seqs-bi.log" 2>/dev/null)
    kv seqs_bi "$(echo "$l" | grep -o 'bitwise=[^ ]*' | cut -d= -f2) (max |d| $(echo "$l" | grep -o 'max_abs_diff=[^ ]*' | cut -d= -f2), batch $(echo "$l" | grep -o 'batch_ms=[^ ]*' | cut -d= -f2) ms, solo $(echo "$l" | grep -o 'solo_ms=[^ ]*' | cut -d= -f2) ms)"
}
recap_bi() {
    local n
    bench_kv launches_per_layer_graph_bi "$OUTDIR/cuda-bench-bi.log" 1 graph_kernels_layer
    for n in 1 9 65; do bench_kv "pass_ms_bi_n$n" "$OUTDIR/cuda-bench-bi.log" $n graph_nout1_ms; done
}
recap_pipeline() {
    local f dh dr d2h
    sed -n 's/^identity_/identity_/p' "$OUTDIR/pipeline.log" 2>/dev/null | while IFS='=' read -r k v; do kv "$k" "$v"; done
    sed -n 's/^identity_/identity_eagle3_/p' "$OUTDIR/pipeline-eagle3.log" 2>/dev/null | while IFS='=' read -r k v; do kv "$k" "$v"; done
    # whole logits rows the targets copied to the host, each round's share summed over the
    # round logs (must be 0: the decode reads rows through row queries)
    d2h=$(cat "$PIPE_DIR"/rounds-*.jsonl "$PIPE_DIR"/eagle3/rounds-*.jsonl 2>/dev/null |
          grep -o '"d2h_full_rows":[0-9]*' | cut -d: -f2 | awk '{ s += $1; n++ } END { print n ? s : "n/a" }')
    kv d2h_full_rows "$d2h"
    dh=$(cat "$PIPE_DIR"/rounds-*.jsonl 2>/dev/null | grep -o '"draft_host_ns":[0-9]*' | cut -d: -f2 |
         awk '{ s += $1; n++ } END { if (n) printf "%.3f", s / n / 1e6 }')
    kv drafter_host_ms_per_round "${dh:-n/a}"
    dr=$(cat "$PIPE_DIR"/rounds-*.jsonl 2>/dev/null | grep -o '"draft_rows":[1-9][0-9]*' | cut -d: -f2 |
         awk '{ s += $1; n++ } END { if (n) printf "%.1f", s / n }')
    kv drafter_rows_per_round "${dr:-n/a}"
}
# The whole recap again at the end (the output's tail is what a caller may see), with the
# result: ok unless a stage FAILed.
recap() {
    local s bad=0
    for s in $STAGES; do
        [ -n "${ST[$s]+x}" ] || kv "stage_$s" "not run"
        case "${ST[$s]:-}" in FAIL*) bad=1 ;; esac
    done
    kv result "$([ "$bad" = 0 ] && echo ok || echo FAIL)"
    echo
    say "RECAP (done in $(( $(date +%s) - T0 ))s of ${LIMIT}s; binaries: $BIN; also in $RECAP)"
    cat "$RECAP"
    return $bad
}
# ---- --default-model: CUDA vs CPU on the default model, then the host CPU's kernels ----
# The GPU machine's own CPU (16 cores, maybe AVX-512 / AMX, which the development machine
# lacks): the avx512 and amx families' greedy ids (rootdraw: tree passes) against avx2's
# (AR), and rootspec-micro's figures. Reported, never a failure.
host_cpu_stage() {
    local m=models/SmolLM2-135M-Instruct.Q4_1.gguf fam dec
    say "host CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p'); flags:" \
        "$(grep -o -w -E 'avx512f|avx512_vnni|avx512_bf16|amx_tile|amx_int8|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    for fam in avx2 avx512 amx; do
        dec=rootdraw; [ "$fam" = avx2 ] && dec=ar
        ROOTSPEC_CPU_KERNELS=$fam timeout 60 "$BIN/rootspec-target" --model "$m" --chat \
            --prompt "Name three primary colours." --max-new 32 --output-ids --decoder "$dec" \
            >"$OUTDIR/cpu-ids-$fam.txt" 2>"$OUTDIR/cpu-ids-$fam.err"
        say "cpu family $fam: exit $?; $(tail -1 "$OUTDIR/cpu-ids-$fam.err")"
    done
    for fam in avx512 amx; do
        if [ -s "$OUTDIR/cpu-ids-$fam.txt" ] && cmp -s "$OUTDIR/cpu-ids-avx2.txt" "$OUTDIR/cpu-ids-$fam.txt"; then
            kv "cpu_${fam}_ids" same
        else
            kv "cpu_${fam}_ids" "DIFFER (or $fam not runnable here: see above)"
        fi
    done
    ROOTSPEC_CPU_KERNELS=amx timeout 60 "$BIN/rootspec-micro" --model "$m" --threads 1 \
        --draft-rounds 0 --iters 3 --ar-tokens 8 2>&1 | grep -E '^(micro|kernels|pass_)' | head -8
    timeout 120 "$BIN/rootspec-micro" --model "$m" --threads 1,2,8 --draft-rounds 0 --iters 5 \
        --ar-tokens 32 2>&1 | tee "$OUTDIR/cpu-micro.log" | tail -30
}
default_model_stage() {
    local rc
    say "default model: the CUDA-vs-CPU parity test on it"
    CK_RUN_SUITE=cuda_forward CK_RUN_CASE=default_model tmo 200 \
        "$BIN/rootspec-cuda-tests" >"$OUTDIR/cuda-default-model.log" 2>&1
    rc=$?
    tail -5 "$OUTDIR/cuda-default-model.log"
    host_cpu_stage
    kv default_model_parity "$(status $rc)"
    return $(( rc != 0 ))
}


# ---- device: the runtime's view of the GPU (a bench run that times no model) ----
tmo 60 "$BIN/rootspec-cuda-bench" --only none --copy-mib 256 --iters 1 >"$OUTDIR/device.log" 2>&1
rc=$?
grep -hE "^device|copy bandwidth|^SKIP" "$OUTDIR/device.log"
kv copy_gbs "$(grep -o 'bandwidth: [0-9]*' "$OUTDIR/device.log" | grep -o '[0-9]*$' || echo n/a)"
if grep -q "^SKIP: no CUDA device" "$OUTDIR/device.log"; then
    stage_end device "FAIL (no usable device: $(grep -m1 -o '(.*)' "$OUTDIR/device.log" | cut -c1-100))"
else
    stage_end device "$(status $rc)"
fi

# A "no CUDA device" skip on the GPU machine means nothing was checked.
no_device() { [ "$EMU" = 0 ] && [ -z "${GPU_CHECK_BIN:-}" ] && grep -q "^SKIP: no CUDA device" "$1"; }

# run_bench LOG CAP ARGS...: one rootspec-cuda-bench run; its status word in RB. (Not run
# inside $(...): a subshell would keep the stop trap from reaching the bench.)
RB=""
run_bench() {
    local log=$1 cap=$2 lim rc
    shift 2
    if ! lim=$(limit "$cap"); then RB="skipped (time)"; return; fi
    tmo "$lim" "$BIN/rootspec-cuda-bench" "$@" >"$log" 2>&1
    rc=$?
    if no_device "$log"; then RB="FAIL (no usable device)"; return; fi
    RB=$(status $rc)
}

if [ "$MODE" = default-model ]; then
    STAGE=default_model
    default_model_stage
    exit $?
fi

# ---- pass1: the 8B one-row pass at a 512-token context, first of all figures ----
STAGE=pass1
say "pass1: rootspec-cuda-bench $PASS1_ARGS --ns 1"
run_bench "$OUTDIR/pass1.log" 60 $PASS1_ARGS --ns 1; s=$RB
grep -hE "^BENCH|copy bandwidth" "$OUTDIR/pass1.log"
bench_kv pass_ms_n1 "$OUTDIR/pass1.log" 1 graph_nout1_ms
bench_kv share_n1 "$OUTDIR/pass1.log" 1 share
bench_kv launches_per_layer "$OUTDIR/pass1.log" 1 launches_layer
bench_kv launches_per_layer_graph "$OUTDIR/pass1.log" 1 graph_kernels_layer
stage_end pass1 "$s"

# ---- gemv: the own one-row GEMV beside cuBLAS on the 8B decode matrices ----
STAGE=gemv
say "gemv: rootspec-cuda-bench --gemv $GEMV_ARGS"
run_bench "$OUTDIR/gemv.log" 30 --gemv $GEMV_ARGS; s=$RB
grep -h "^GEMV" "$OUTDIR/gemv.log"
for sh in o gate_up down lm_head; do
    l=$(grep -m1 "^GEMV shape=$sh " "$OUTDIR/gemv.log")
    o=$(echo "$l" | grep -o 'own_us=[^ ]*' | cut -d= -f2) c=$(echo "$l" | grep -o 'cublas_us=[^ ]*' | cut -d= -f2)
    kv "gemv_us_$sh" "own:${o:-n/a},cublas:${c:-n/a}"
done
stage_end gemv "$s"

# ---- qkv: the fused q|k|v kernel against cuBLAS on the 8B shape, 1 and 65 rows ----
STAGE=qkv
say "qkv: rootspec-cuda-bench $QKV_ARGS --ns 1,65, q|k|v fused, then on cuBLAS"
ROOTSPEC_CUDA_FUSED_QKV=all run_bench "$OUTDIR/qkv-fused.log" 60 $QKV_ARGS --ns 1,65; s1=$RB
ROOTSPEC_CUDA_FUSED_QKV=0 run_bench "$OUTDIR/qkv-cublas.log" 60 $QKV_ARGS --ns 1,65; s2=$RB
ROOTSPEC_CUDA_GEMV=0 run_bench "$OUTDIR/onerow-cublas.log" 45 $QKV_ARGS --ns 1; s3=$RB
grep -hE "^BENCH" "$OUTDIR/qkv-fused.log" "$OUTDIR/qkv-cublas.log" "$OUTDIR/onerow-cublas.log"
recap_qkv
if [ "$s1" != ok ]; then stage_end qkv "$s1"
elif [ "$s2" != ok ]; then stage_end qkv "$s2"
else stage_end qkv "$s3"
fi

# ---- seqs: rows of several sequences in one pass against a pass per sequence ----
STAGE=seqs
say "seqs: rootspec-cuda-bench $SEQS_ARGS, then --batch-invariant"
run_bench "$OUTDIR/seqs.log" 45 $SEQS_ARGS; s1=$RB
run_bench "$OUTDIR/seqs-bi.log" 45 $SEQS_ARGS --batch-invariant; s2=$RB
grep -h "^SEQS" "$OUTDIR/seqs.log" "$OUTDIR/seqs-bi.log"
recap_seqs
if [ "$s1" != ok ]; then stage_end seqs "$s1"
elif [ "$s2" != ok ]; then stage_end seqs "$s2"
elif grep -q "^SEQS .*bitwise=differs" "$OUTDIR/seqs-bi.log"; then stage_end seqs "FAIL (batch-invariant rows differ from alone)"
else stage_end seqs ok
fi

# ---- suites: one at a time, each with its own limit: the runner cannot fork (a CUDA
# context does not survive fork()), so Check's timeouts do not apply ----
STAGE=suites
: >"$OUTDIR/cuda-tests.log"
failed="" skipped=""
SUITE_END=$(( $(date +%s) + 150 * SCALE ))
for f in tests/cuda/test_cuda_*.c; do
    suite=$(basename "$f" .c); suite=${suite#test_}
    case " ${GPU_CHECK_SUITES:-$suite} " in *" $suite "*) ;; *) continue ;; esac
    if [ "$(date +%s)" -ge "$SUITE_END" ] || ! lim=$(limit 60); then
        skipped="$skipped $suite"
        kv "suite_$suite" "skipped (time)"
        continue
    fi
    say "suite $suite (limit ${lim}s)"
    CK_RUN_SUITE=$suite tmo "$lim" "$BIN/rootspec-cuda-tests" >"$OUTDIR/suite-$suite.log" 2>&1
    rc=$?
    cat "$OUTDIR/suite-$suite.log" >>"$OUTDIR/cuda-tests.log"
    sum=$(grep -m1 -o '[0-9]*%: Checks: [0-9]*, Failures: [0-9]*, Errors: [0-9]*' "$OUTDIR/suite-$suite.log")
    if no_device "$OUTDIR/suite-$suite.log"; then kv "suite_$suite" "FAIL (no usable device)"
    elif [ "$rc" -eq 0 ]; then kv "suite_$suite" "ok (${sum:-no summary})"
    else kv "suite_$suite" "$(status $rc) (${sum:-no summary})"
    fi
    # the first failing check of the suite, where it says which row and by how much
    grep -m3 -E "^[^ ]*:[0-9]+:[EF]:|MISMATCH" "$OUTDIR/suite-$suite.log" | cut -c1-300 |
        while read -r line; do kv "suite_${suite}_first_failure" "$line"; done
    [ "$rc" -ne 0 ] && failed="$failed $suite"
    [ "$suite" = cuda_batchinv ] && kv batch_invariant "$( [ "$rc" -eq 0 ] && echo ok || echo FAIL)"
    [ "$suite" = cuda_seqs ] && kv multi_seq "$( [ "$rc" -eq 0 ] && echo ok || echo FAIL)"
done
if no_device "$OUTDIR/cuda-tests.log"; then stage_end suites "FAIL (no usable device)"
elif [ -n "$failed" ]; then stage_end suites "FAIL (${failed# })"
elif [ -n "$skipped" ]; then stage_end suites "ok; skipped (time):$skipped"
else stage_end suites ok
fi

# ---- compute-sanitizer over the kernel suite: the bundle's own copy (make gpu-bundle
# carries it from its wheel), else the machine's ----
SAN=""
for c in gpu-bundle/sanitizer/compute-sanitizer "$(command -v compute-sanitizer)" \
         $(ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null); do
    [ -n "$c" ] && [ -x "$c" ] && { SAN=$c; break; }
done
# sanitize TOOL CAP: the stage's line (stage_end). A run that never reached the suite (the
# tool cannot start here: no ERROR SUMMARY line) is skipped, not failed.
sanitize() {
    local tool=$1 log="$OUTDIR/sanitizer-$1.log" lim rc
    if [ "$EMU" = 1 ] || [ -n "${GPU_CHECK_BIN:-}" ]; then stage_end "$tool" "skipped (not a GPU run)"; return; fi
    [ -z "$SAN" ] && { stage_end "$tool" "skipped (no compute-sanitizer)"; return; }
    lim=$(limit "$2") || { stage_end "$tool" "skipped (time)"; return; }
    CK_RUN_SUITE=cuda_kernels tmo "$lim" "$SAN" --tool "$tool" --error-exitcode 9 \
        "$BIN/rootspec-cuda-tests" >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then stage_end "$tool" ok
    elif [ "$rc" -eq 124 ]; then stage_end "$tool" timeout
    elif ! grep -q "ERROR SUMMARY" "$log"; then
        stage_end "$tool" "skipped (could not start: $(grep -m1 -iE 'error|unable|fail' "$log" | cut -c1-80))"
    else
        stage_end "$tool" "FAIL (exit $rc, $(grep -m1 -o 'ERROR SUMMARY: [0-9]* error[s]*' "$log"))"
    fi
}
STAGE=memcheck
say "memcheck: ${SAN:-no compute-sanitizer} --tool memcheck, kernel suite"
kv sanitizer "${SAN:-none}${SAN:+ ($("$SAN" --version 2>&1 | tail -1 | tr -s ' ' _))}"
sanitize memcheck 60
case "${ST[memcheck]}" in FAIL*) tail -20 "$OUTDIR/sanitizer-memcheck.log" ;; esac

# ---- bench: both shapes, every n, graph vs eager ----
STAGE=bench
say "bench: rootspec-cuda-bench $BENCH_ARGS"
run_bench "$OUTDIR/cuda-bench.log" 90 $BENCH_ARGS; s=$RB
grep -hE "^BENCH|graph replays" "$OUTDIR/cuda-bench.log"
recap_bench
stage_end bench "$s"

# ---- pipeline: the 8B target and a small drafter, both on GPU 0 ----
# Two processes share the GPU by time slices unless MPS runs: start its daemon for the stage
# when the machine has it (and none runs), stop it after.
STAGE=pipeline
mps_start() {
    MPS_DIR=""
    [ "$EMU" = 1 ] && { kv pipeline_mps "off (emulator)"; return; }
    command -v nvidia-cuda-mps-control >/dev/null || { kv pipeline_mps "off (no nvidia-cuda-mps-control)"; return; }
    MPS_DIR=$(mktemp -d /tmp/rootspec-mps.XXXXXX)
    export CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPS_DIR/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if timeout 10 nvidia-cuda-mps-control -d >"$OUTDIR/mps.log" 2>&1; then
        kv pipeline_mps on
    else
        kv pipeline_mps "off (daemon did not start: $(head -c 80 "$OUTDIR/mps.log"))"
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        MPS_DIR=""
    fi
}
mps_stop() {
    [ -n "${MPS_DIR:-}" ] || return 0
    echo quit | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
PIPE_DIR=$(mktemp -d /tmp/rootspec-pipeline.XXXXXX)
say "pipeline: tools/pipeline-timing.sh, target $PIPE_T, drafter $PIPE_D, 32 new tokens"
if lim=$(limit 100); then
    mps_start
    PIPE_BIN=$BIN PIPE_BACKEND=cuda PIPE_OUT="$PIPE_DIR" PIPE_TARGET=$PIPE_T PIPE_DRAFT=$PIPE_D \
    PIPE_MAX_NEW=32 PIPE_IDENTITY=report PIPE_RUN_LIMIT=$(( lim / 4 > 20 ? lim / 4 : 20 )) \
        tmo "$lim" bash tools/pipeline-timing.sh >"$OUTDIR/pipeline.log" 2>&1
    sp=$(status $?)
    if lim=$(limit 45); then
        say "pipeline: rootdraw with the EAGLE-3 head $PIPE_E3 as the drafter"
        PIPE_BIN=$BIN PIPE_BACKEND=cuda PIPE_OUT="$PIPE_DIR/eagle3" PIPE_TARGET=$PIPE_T \
        PIPE_DRAFT=$PIPE_E3 PIPE_DECODERS=rootdraw PIPE_MAX_NEW=32 PIPE_IDENTITY=report \
        PIPE_RUN_LIMIT=$(( lim / 2 > 20 ? lim / 2 : 20 )) \
            tmo "$lim" bash tools/pipeline-timing.sh >"$OUTDIR/pipeline-eagle3.log" 2>&1
        rc=$?
        [ "$rc" -ne 0 ] && sp="$sp; EAGLE-3 head: $(status $rc)"
    else
        sp="$sp; EAGLE-3 head: skipped (time)"
    fi
    mps_stop
else
    sp="skipped (time)"
fi
grep -hE "IDENTITY|: exit [1-9]|  ERR |^  (decoder|ar|draft|pearl|rootdraw) " "$OUTDIR"/pipeline*.log 2>/dev/null | head -40
tar -czf "$OUTDIR/pipeline-logs.tar.gz" -C "$PIPE_DIR" . 2>/dev/null || true
recap_pipeline
stage_end pipeline "$sp"

# ---- batch-invariant mode (its suite ran with the others) ----
STAGE=batch_invariant
say "batch_invariant: rootspec-cuda-bench $BI_ARGS --ns 1,9,65 --batch-invariant"
run_bench "$OUTDIR/cuda-bench-bi.log" 45 $BI_ARGS --ns 1,9,65 --batch-invariant; s=$RB
grep -hE "^BENCH" "$OUTDIR/cuda-bench-bi.log"
recap_bi
stage_end batch_invariant "$s"

say "racecheck, synccheck: compute-sanitizer, kernel suite, if time is left"
STAGE=racecheck
sanitize racecheck 45
STAGE=synccheck
sanitize synccheck 45

STAGE=recap
recap
