#!/usr/bin/env bash
# The first GPU run: ONE command on the GPU machine, from the repo root, within 6 minutes:
#   bash tools/gpu-check.sh            (carrying gpu-bundle/, made here by `make gpu-bundle`)
# Stages, in the order of what they tell (each with its own time limit, all within
# GPU_CHECK_DEADLINE seconds, default 330; a stage left without time is reported as
# "skipped (time)", which is not a failure):
#   device    the GPU (nvidia-smi) and the binaries: gpu-bundle/ if they start here, else
#             `make cuda CUDA_ARCHS=90` (needs the Debian dev libraries; says which it took)
#   qkv       Llama-3.1-8B-shaped pass times for 1 and 65 rows with the q|k|v projection in
#             the fused kernel and on cuBLAS (rootspec-cuda-bench, ROOTSPEC_CUDA_FUSED_QKV)
#   suites    the CUDA Check suites, one at a time (kernels vs CPU references, forward
#             parity, golden fixtures, graph replay == eager, batch-invariant mode)
#   memcheck  compute-sanitizer memcheck over the kernel suite
#   bench     rootspec-cuda-bench: 8B and 1B shapes, n = 1, 9, 60, 65, graph vs eager
#   pipeline  tools/pipeline-timing.sh: two processes on GPU 0, the drafter seeded like the
#             target (deep rounds), 32 new tokens, AR / draft / pearl / rootdraw; then
#             rootdraw with an EAGLE-3 head shaped like the published 8B one
#   batch_invariant  the 8B shape timed with --batch-invariant kernels (n = 1, 9, 65)
#   racecheck, synccheck  compute-sanitizer over the kernel suite, if time is left
# then a recap of key=value lines (README, "CUDA", says what each means). A sanitizer that
# cannot start here is "skipped (...)", not a failure. Default-mode T=0 identity
# differences are reported with AR's logit margin where the ids split, not judged.
# Exit status: 0 when no stage FAILed, 1 otherwise, 2 when no binaries could be had.
#   --emu            dry run on this machine: the emulator build (make cuda-emu), tiny
#                    models, limits x10 (the recap has the same keys)
#   --default-model  a second, optional call (the default model travels in two parts,
#                    tools/gpu-carry.sh): checks the parts first and goes if they are not
#                    all here; then CUDA vs CPU on that model and the host CPU's kernels
# Settings: GPU_CHECK_DEADLINE, GPU_CHECK_OUT (logs; default $OUT, else gpu-check-out/),
# GPU_CHECK_BIN (a binaries folder), GPU_CHECK_SCALE (stage limits factor), GPU_CHECK_SUITES.
set -u
cd "$(dirname "$0")/.."
MODE=full
EMU=0
for a in "$@"; do
    case "$a" in
      --default-model) MODE=default-model ;;
      --emu) EMU=1 ;;
      -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
      *) echo "gpu-check: unknown option '$a' (--emu, --default-model, --help)" >&2; exit 2 ;;
    esac
done
OUTDIR=${GPU_CHECK_OUT:-${OUT:-gpu-check-out}}
mkdir -p "$OUTDIR"
T0=$(date +%s)
say() { echo "gpu-check [$(( $(date +%s) - T0 ))s]: $*"; }
if [ "$EMU" = 1 ]; then
    : "${GPU_CHECK_BIN:=build/cuda-emu}" "${GPU_CHECK_SCALE:=10}" "${GPU_CHECK_DEADLINE:=3600}"
    export CUEMU_QUIET=1 OPENBLAS_NUM_THREADS=1
    MODEL_ARGS="--model random:tiny --copy-mib 8 --ctx 64 --iters 2"
    QKV_ARGS=$MODEL_ARGS BI_ARGS=$MODEL_ARGS BENCH_ARGS=$MODEL_ARGS
    PIPE_T=random:tiny,seed=9 PIPE_E3=random:eagle3-tiny
else
    QKV_ARGS="--only target --iters 10 --ctx 512" BI_ARGS="--only target --iters 5 --ctx 512"
    BENCH_ARGS="--iters 20 --ctx 512"
    PIPE_T=random:llama3-8b,seed=1 PIPE_E3=random:eagle3-llama3-8b
fi
DEADLINE=${GPU_CHECK_DEADLINE:-330}
SCALE=${GPU_CHECK_SCALE:-1}
declare -A ST # stage -> ok | FAIL (...) | skipped (...) | timeout
PIPE_DIR=/nonexistent # the pipeline's round logs, once it has run
STAGES="device qkv suites memcheck bench pipeline batch_invariant racecheck synccheck"
# limit CAP: CAP * SCALE seconds, or what is left before the deadline if less; fails
# (skip the stage) with under 15 s left.
limit() {
    local left=$(( DEADLINE - ($(date +%s) - T0) )) cap=$(( $1 * SCALE ))
    [ "$left" -lt 15 ] && return 1
    echo $(( left < cap ? left : cap ))
}
# status RC: a stage's status from its exit status.
status() { case "$1" in 0) echo ok ;; 124|137) echo timeout ;; *) echo "FAIL (exit $1)" ;; esac; }

nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader \
    >"$OUTDIR/gpu.txt" 2>/dev/null || echo "nvidia-smi not available" >"$OUTDIR/gpu.txt"
say "GPU: $(head -1 "$OUTDIR/gpu.txt")"
# The pipeline runs two processes on GPU 0: an Exclusive_Process GPU admits only one.
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
    for f in gpu-bundle/*.xz gpu-bundle/lib/*.xz; do
        [ -e "$f" ] || continue
        [ -e "${f%.xz}" ] && continue
        if command -v xz >/dev/null; then xz -dk "$f"
        else python3 -c 'import lzma,sys; open(sys.argv[1][:-3],"wb").write(lzma.open(sys.argv[1]).read())' "$f"
        fi || return 1
        case $f in gpu-bundle/rootspec-*) chmod +x "${f%.xz}" ;; esac
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

# ---- recap: the device tool returns only the output's tail, so every figure is here ----
kv() { echo "$1=$2"; }
# bench_field FILE N FIELD: FIELD of the first BENCH line of n=N in FILE (its first model)
bench_field() {
    grep -m1 -E "^BENCH .* n=$2 " "$1" 2>/dev/null | grep -o " $3=[^ ]*" | cut -d= -f2
}
# The suite's own summary line: the first "Checks:" after its name, before the next suite's.
suite_result() {
    awk -v s="$1" '/Running suite\(s\): / { if (f) exit; if ($0 ~ s) f = 1; next }
                   f && /Checks:/ { print; exit }' "$OUTDIR/cuda-tests.log" 2>/dev/null
}
recap_qkv() {
    local n f c path="" fast="" sep=""
    for n in 1 9 65; do
        f=$(bench_field "$OUTDIR/cuda-bench.log" $n qkv)
        path="$path${sep}n$n:${f:-n/a}"; sep=","
    done
    kv qkv_path "$path"
    sep=""
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
recap_pipeline() {
    local f dh dr d2h
    sed -n 's/^identity_/identity_/p' "$OUTDIR/pipeline.log" 2>/dev/null
    sed -n 's/^identity_/identity_eagle3_/p' "$OUTDIR/pipeline-eagle3.log" 2>/dev/null
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
recap() {
    local s n L bad=0
    echo
    say "RECAP (done in $(( $(date +%s) - T0 ))s; binaries: $BIN)"
    kv gpu "$(head -1 "$OUTDIR/gpu.txt" | tr ' ' '_')"
    for s in $STAGES; do
        kv "stage_$s" "${ST[$s]:-not run}"
        case "${ST[$s]:-}" in FAIL*) bad=1 ;; esac
    done
    L=$(bench_field "$OUTDIR/cuda-bench.log" 1 launches_layer)
    kv launches_per_layer "${L:-n/a}"
    L=$(bench_field "$OUTDIR/cuda-bench.log" 1 graph_kernels_layer)
    kv launches_per_layer_graph "${L:-n/a}"
    L=$(bench_field "$OUTDIR/cuda-bench.log" 65 graph_kernels_layer)
    kv launches_per_layer_graph_n65 "${L:-n/a}"
    L=$(bench_field "$OUTDIR/cuda-bench-bi.log" 1 graph_kernels_layer)
    kv launches_per_layer_graph_bi "${L:-n/a}"
    recap_qkv
    for n in 1 9 65; do
        L=$(bench_field "$OUTDIR/cuda-bench.log" $n graph_nout1_ms)
        kv "pass_ms_n$n" "${L:-n/a}"
        L=$(bench_field "$OUTDIR/cuda-bench.log" $n share)
        kv "share_n$n" "${L:-n/a}"
        L=$(bench_field "$OUTDIR/cuda-bench-bi.log" $n graph_nout1_ms)
        kv "pass_ms_bi_n$n" "${L:-n/a}"
    done
    s=$(suite_result cuda_batchinv)
    if grep -q "^SKIP: no CUDA device" "$OUTDIR/cuda-tests.log" 2>/dev/null; then
        kv batch_invariant "not run (no device)"
    else
        case "$s" in "100%: Checks"*) kv batch_invariant ok ;; "") kv batch_invariant "not run" ;;
                     *) kv batch_invariant FAIL ;; esac
    fi
    for s in memcheck racecheck synccheck; do kv "sanitizer_$s" "${ST[$s]:-not run}"; done
    recap_pipeline
    kv result "$([ "$bad" = 0 ] && echo ok || echo FAIL)"
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
    CK_RUN_SUITE=cuda_forward CK_RUN_CASE=default_model timeout 200 \
        "$BIN/rootspec-cuda-tests" >"$OUTDIR/cuda-default-model.log" 2>&1
    rc=$?
    tail -5 "$OUTDIR/cuda-default-model.log"
    host_cpu_stage
    kv default_model_parity "$(status $rc)"
    return $(( rc != 0 ))
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
    if make -j"$(nproc)" cuda CUDA_ARCHS=90 >"$OUTDIR/build.log" 2>&1; then
        BIN=build/cuda
        add_cuda_libs $BIN/rootspec-cuda-tests || true
    else
        tail -15 "$OUTDIR/build.log"
        say "FAIL: make cuda failed (log: $OUTDIR/build.log): carry gpu-bundle (make gpu-bundle)"
        echo "stage_device=FAIL (no binaries)"
        exit 2
    fi
fi

# ---- device: the runtime's view of the GPU (a bench run that times no model) ----
"$BIN/rootspec-cuda-bench" --only none --copy-mib 256 --iters 1 >"$OUTDIR/device.log" 2>&1
rc=$?
grep -hE "^device|copy bandwidth|^SKIP" "$OUTDIR/device.log"
if grep -q "^SKIP: no CUDA device" "$OUTDIR/device.log"; then
    ST[device]="FAIL (no usable device: $(grep -m1 -o '(.*)' "$OUTDIR/device.log" | cut -c1-100))"
    [ "$EMU" = 1 ] || [ -n "${GPU_CHECK_BIN:-}" ] || { recap; exit 1; }
else
    ST[device]=$(status $rc)
fi

# A "no CUDA device" skip on the GPU machine (e.g. a driver older than the runtime linked
# in) means nothing was checked.
no_device() { [ "$EMU" = 0 ] && [ -z "${GPU_CHECK_BIN:-}" ] && grep -q "^SKIP: no CUDA device" "$1"; }

# run_bench STAGE LOG CAP ARGS...: one rootspec-cuda-bench run; returns its status word.
run_bench() {
    local log=$1 cap=$2 lim rc
    shift 2
    if ! lim=$(limit "$cap"); then echo "skipped (time)"; return; fi
    timeout "$lim" "$BIN/rootspec-cuda-bench" "$@" >"$log" 2>&1
    rc=$?
    if no_device "$log"; then echo "FAIL (no usable device)"; return; fi
    status $rc
}

if [ "$MODE" = default-model ]; then
    default_model_stage
    exit $?
fi

# ---- qkv: the fused q|k|v kernel against cuBLAS on the 8B shape, 1 and 65 rows ----
say "qkv: rootspec-cuda-bench $QKV_ARGS --ns 1,65, q|k|v fused, then on cuBLAS"
s1=$(ROOTSPEC_CUDA_FUSED_QKV=all run_bench "$OUTDIR/qkv-fused.log" 60 $QKV_ARGS --ns 1,65)
s2=$(ROOTSPEC_CUDA_FUSED_QKV=0 run_bench "$OUTDIR/qkv-cublas.log" 60 $QKV_ARGS --ns 1,65)
grep -hE "^device|copy bandwidth" "$OUTDIR/qkv-fused.log"
grep -hE "^BENCH" "$OUTDIR/qkv-fused.log" "$OUTDIR/qkv-cublas.log"
if [ "$s1" = ok ]; then ST[qkv]=$s2; else ST[qkv]=$s1; fi

# ---- suites: one at a time, each with its own limit: the runner cannot fork (a CUDA
# context does not survive fork()), so Check's timeouts do not apply ----
: >"$OUTDIR/cuda-tests.log"
failed="" skipped=""
SUITE_END=$(( $(date +%s) + 150 * SCALE ))
for f in tests/cuda/test_cuda_*.c; do
    suite=$(basename "$f" .c); suite=${suite#test_}
    case " ${GPU_CHECK_SUITES:-$suite} " in *" $suite "*) ;; *) continue ;; esac
    if [ "$(date +%s)" -ge "$SUITE_END" ] || ! lim=$(limit 60); then
        skipped="$skipped $suite"
        echo "gpu-check: suite $suite: skipped (time)" >>"$OUTDIR/cuda-tests.log"
        continue
    fi
    say "suite $suite (limit ${lim}s)"
    CK_RUN_SUITE=$suite timeout "$lim" "$BIN/rootspec-cuda-tests" >>"$OUTDIR/cuda-tests.log" 2>&1
    rc=$?
    [ "$rc" -eq 124 ] && echo "gpu-check: suite $suite: TIMEOUT after $lim s" >>"$OUTDIR/cuda-tests.log"
    [ "$rc" -ne 0 ] && failed="$failed $suite"
done
if no_device "$OUTDIR/cuda-tests.log"; then ST[suites]="FAIL (no usable device)"
elif [ -n "$failed" ]; then ST[suites]="FAIL (${failed# })"
elif [ -n "$skipped" ]; then ST[suites]="ok; skipped (time):$skipped"
else ST[suites]=ok
fi
grep -hE "Running suite|Checks:|TIMEOUT|skipped|^[^ ]*:[0-9]+:[EF]:" "$OUTDIR/cuda-tests.log" | head -40

# ---- compute-sanitizer over the kernel suite ----
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
# sanitize TOOL CAP: status word. A run that never reached the suite (the tool cannot start
# here: no ERROR SUMMARY line) is skipped, not failed.
sanitize() {
    local tool=$1 log="$OUTDIR/sanitizer-$1.log" lim rc
    if [ "$EMU" = 1 ] || [ -n "${GPU_CHECK_BIN:-}" ]; then echo "skipped (not a GPU run)"; return; fi
    [ -z "$SAN" ] && { echo "skipped (no compute-sanitizer)"; return; }
    lim=$(limit "$2") || { echo "skipped (time)"; return; }
    CK_RUN_SUITE=cuda_kernels timeout "$lim" "$SAN" --tool "$tool" --error-exitcode 9 \
        "$BIN/rootspec-cuda-tests" >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then echo ok
    elif [ "$rc" -eq 124 ]; then echo timeout
    elif ! grep -q "ERROR SUMMARY" "$log"; then
        echo "skipped (could not start: $(grep -m1 -iE 'error|unable|fail' "$log" | cut -c1-80))"
    else
        echo "FAIL (exit $rc, $(grep -m1 -o 'ERROR SUMMARY: [0-9]* error[s]*' "$log"))"
    fi
}
say "memcheck: compute-sanitizer --tool memcheck, kernel suite"
ST[memcheck]=$(sanitize memcheck 60)
case "${ST[memcheck]}" in FAIL*) tail -20 "$OUTDIR/sanitizer-memcheck.log" ;; esac

# ---- bench: both shapes, every n, graph vs eager ----
say "bench: rootspec-cuda-bench $BENCH_ARGS"
ST[bench]=$(run_bench "$OUTDIR/cuda-bench.log" 90 $BENCH_ARGS)
grep -hE "^device|copy bandwidth|^BENCH|graph replays" "$OUTDIR/cuda-bench.log"

# ---- pipeline: both processes on GPU 0, the drafter seeded like the target ----
PIPE_DIR=$(mktemp -d /tmp/rootspec-pipeline.XXXXXX)
say "pipeline: tools/pipeline-timing.sh, target and drafter $PIPE_T, 32 new tokens"
if lim=$(limit 100); then
    PIPE_BIN=$BIN PIPE_BACKEND=cuda PIPE_OUT="$PIPE_DIR" PIPE_TARGET=$PIPE_T PIPE_DRAFT=$PIPE_T \
    PIPE_MAX_NEW=32 PIPE_IDENTITY=report timeout "$lim" bash tools/pipeline-timing.sh \
        >"$OUTDIR/pipeline.log" 2>&1
    ST[pipeline]=$(status $?)
    if lim=$(limit 45); then
        say "pipeline: rootdraw with the EAGLE-3 head $PIPE_E3 as the drafter"
        PIPE_BIN=$BIN PIPE_BACKEND=cuda PIPE_OUT="$PIPE_DIR/eagle3" PIPE_TARGET=$PIPE_T \
        PIPE_DRAFT=$PIPE_E3 PIPE_DECODERS=rootdraw PIPE_MAX_NEW=32 PIPE_IDENTITY=report \
            timeout "$lim" bash tools/pipeline-timing.sh >"$OUTDIR/pipeline-eagle3.log" 2>&1
        rc=$?
        [ "$rc" -ne 0 ] && ST[pipeline]="${ST[pipeline]}; EAGLE-3 head: $(status $rc)"
    else
        ST[pipeline]="${ST[pipeline]}; EAGLE-3 head: skipped (time)"
    fi
else
    ST[pipeline]="skipped (time)"
fi
grep -hE "IDENTITY|: exit [1-9]|  ERR |^  (decoder|ar|draft|pearl|rootdraw) " "$OUTDIR"/pipeline*.log 2>/dev/null | head -40
tar -czf "$OUTDIR/pipeline-logs.tar.gz" -C "$PIPE_DIR" . 2>/dev/null || true

# ---- batch-invariant mode (its suite ran with the others) ----
say "batch_invariant: rootspec-cuda-bench $BI_ARGS --ns 1,9,65 --batch-invariant"
ST[batch_invariant]=$(run_bench "$OUTDIR/cuda-bench-bi.log" 45 $BI_ARGS --ns 1,9,65 --batch-invariant)
grep -hE "^BENCH" "$OUTDIR/cuda-bench-bi.log"

say "racecheck, synccheck: compute-sanitizer, kernel suite, if time is left"
ST[racecheck]=$(sanitize racecheck 45)
ST[synccheck]=$(sanitize synccheck 45)

recap
