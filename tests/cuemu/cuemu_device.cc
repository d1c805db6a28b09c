/* cuemu_device.cc: runs a kernel launch on the CPU. Blocks run one after another; the
 * threads of a block are cooperative fibers on the calling OS thread (a small x86-64
 * context switch, with AddressSanitizer fiber annotations; ucontext elsewhere), switched
 * only at __syncthreads and warp shuffles, so a block of 1024 threads costs a few thousand
 * switches rather than OS threads. The barriers check what the hardware leaves undefined
 * and the code must not rely on: a barrier some live thread never reaches (deadlock), a
 * shuffle naming an exited or absent lane, lanes of one shuffle passing different masks.
 * CUEMU_SCHED=rev runs the threads of a block in reverse order (shared-memory races show
 * up as different results between the two orders). CUEMU_BLOCKS=random runs the blocks of
 * each launch in a random order drawn from CUEMU_SEED (default 1) and the launch's serial
 * number, so code that assumes blocks run or finish in index order (the "last block
 * merges" counters) is exercised with other last blocks, reproducibly. After the first
 * block of each launch, the static shared memory it wrote (bytes no longer holding the
 * block-start poison) is checked against the 48 KiB a block may have statically: per
 * kernel, a lower bound of what it declares (tools/cuda-lint.sh has ptxas's exact figure). */
#include "cuemu.h"
#include "cuemu_internal.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUEMU_ASAN 1
#define CUEMU_STACK (512u << 10)
#else
#define CUEMU_ASAN 0
#define CUEMU_STACK (128u << 10)
#endif

cuemu_lane_t *cuemu_cur_lane;
uint3 cuemu_cur_block;
dim3 cuemu_cur_block_dim, cuemu_cur_grid_dim;

enum { L_READY, L_BAR, L_WARP, L_DONE };

typedef struct lane_s : cuemu_lane_t {
    void *sp;          /* saved stack pointer while switched out */
    int state;
    int lin, warp, lane;
    unsigned shfl_n;   /* shuffles done: parity selects the exchange buffer */
    char *stack_lo;    /* usable stack [stack_lo, stack_lo + CUEMU_STACK) */
    void *fake;        /* ASan fake-stack handle while switched out */
#if !defined(__x86_64__)
    ucontext_t uc;
#endif
} lane_t;

typedef struct {
    int count;         /* lanes arrived at the current warp barrier */
    unsigned mask;     /* mask of the current barrier (all lanes must agree) */
    uint64_t slot[2][32];
} warp_t;

static std::vector<lane_t> s_lanes;
static std::vector<warp_t> s_warps;
static void *s_sched_sp;
static void *s_sched_fake;
static const void *s_sched_lo;
static size_t s_sched_size;
static const std::function<void()> *s_body;
static const char *s_kname;
static int s_live, s_bar_count, s_nthreads;
static lane_t *s_cur;
static unsigned s_block_serial; /* blocks run in the current launch */
#if !defined(__x86_64__)
static ucontext_t s_sched_uc;
#endif

static void vmsg(const char *fmt, va_list ap) {
    fprintf(stderr, "cuemu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    fflush(stderr);
}

void cuemu_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
}

void cuemu_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
    abort();
}

#if defined(__x86_64__)
/* cuemu_ctx_switch(save, to): pushes the callee-saved registers, stores rsp in *save,
 * loads `to` and pops the other context's registers. A fresh stack is laid out so that
 * the final `ret` enters cuemu_fiber_tramp with the lane pointer in rbx. */
extern "C" void cuemu_ctx_switch(void **save, void *to);
extern "C" void cuemu_fiber_tramp(void);
asm(".text\n"
    ".globl cuemu_ctx_switch\n"
    ".type cuemu_ctx_switch,@function\n"
    "cuemu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size cuemu_ctx_switch, .-cuemu_ctx_switch\n"
    ".globl cuemu_fiber_tramp\n"
    ".type cuemu_fiber_tramp,@function\n"
    "cuemu_fiber_tramp:\n"
    "  movq %rbx, %rdi\n"
    "  call cuemu_fiber_main\n"
    "  ud2\n"
    ".size cuemu_fiber_tramp, .-cuemu_fiber_tramp\n");
#endif

extern "C" void cuemu_fiber_main(lane_t *l);

/* ASan must be told which stack is current, or it reports the switch as an overflow. */
static inline void asan_leave(void **fake_save, const void *to_lo, size_t to_size) {
#if CUEMU_ASAN
    __sanitizer_start_switch_fiber(fake_save, to_lo, to_size);
#endif
}
static inline void asan_arrived(void *fake, const void **from_lo, size_t *from_size) {
#if CUEMU_ASAN
    __sanitizer_finish_switch_fiber(fake, from_lo, from_size);
#endif
}

static void run_lane(lane_t *l) {
    s_cur = l;
    cuemu_cur_lane = l;
    asan_leave(&s_sched_fake, l->stack_lo, CUEMU_STACK);
#if defined(__x86_64__)
    cuemu_ctx_switch(&s_sched_sp, l->sp);
#else
    swapcontext(&s_sched_uc, &l->uc);
#endif
    asan_arrived(s_sched_fake, NULL, NULL);
    s_cur = NULL;
}

/* Back to the scheduler; returns when the scheduler runs this lane again. */
static void yield_lane(lane_t *l) {
    asan_leave(l->state == L_DONE ? NULL : &l->fake, s_sched_lo, s_sched_size);
#if defined(__x86_64__)
    cuemu_ctx_switch(&l->sp, s_sched_sp);
#else
    swapcontext(&l->uc, &s_sched_uc);
#endif
    asan_arrived(l->fake, NULL, NULL);
    cuemu_cur_lane = l;
    s_cur = l;
}

extern "C" void cuemu_fiber_main(lane_t *l) {
    asan_arrived(NULL, &s_sched_lo, &s_sched_size);
    (*s_body)();
    l->state = L_DONE;
    yield_lane(l);
    cuemu_fatal("a finished fiber was resumed (kernel %s)", s_kname);
}

#if !defined(__x86_64__)
static void uc_entry(unsigned hi, unsigned lo) {
    cuemu_fiber_main((lane_t *)(((uintptr_t)hi << 32) | lo));
}
#endif

static void lane_stack_init(lane_t *l) {
    if (!l->stack_lo) {
        /* One guard page below each stack: an overflow faults instead of corrupting. */
        size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        char *m = (char *)mmap(NULL, CUEMU_STACK + pg, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) cuemu_fatal("cannot map a fiber stack");
        mprotect(m, pg, PROT_NONE);
        l->stack_lo = m + pg;
    }
#if CUEMU_ASAN
    /* Frames below the fiber's entry returned (and unpoisoned themselves); only the entry
     * frames at the top were abandoned mid-call. Clearing 512 KiB of shadow per thread per
     * block would dominate the run time. */
    __asan_unpoison_memory_region(l->stack_lo + CUEMU_STACK - 16384, 16384);
#endif
    l->fake = NULL;
#if defined(__x86_64__)
    uintptr_t *sp = (uintptr_t *)(l->stack_lo + CUEMU_STACK); /* 16-aligned top */
    *--sp = (uintptr_t)cuemu_fiber_tramp; /* ret target; rsp is 16-aligned after it */
    *--sp = 0;                            /* rbp */
    *--sp = (uintptr_t)l;                 /* rbx: the lane */
    for (int i = 0; i < 4; i++) *--sp = 0; /* r12..r15 */
    l->sp = sp;
#else
    getcontext(&l->uc);
    l->uc.uc_stack.ss_sp = l->stack_lo;
    l->uc.uc_stack.ss_size = CUEMU_STACK;
    l->uc.uc_link = NULL;
    uintptr_t p = (uintptr_t)l;
    makecontext(&l->uc, (void (*)())uc_entry, 2, (unsigned)(p >> 32), (unsigned)p);
#endif
}

static const char *state_name(int st) {
    return st == L_READY ? "ready" : st == L_BAR ? "__syncthreads" : st == L_WARP ? "warp shuffle" : "exited";
}

[[noreturn]] static void deadlock(void) {
    fprintf(stderr, "cuemu: deadlock in kernel %s, block (%u,%u,%u): no thread can run\n", s_kname,
            cuemu_cur_block.x, cuemu_cur_block.y, cuemu_cur_block.z);
    int shown = 0;
    for (int i = 0; i < s_nthreads && shown < 16; i++) {
        lane_t *l = &s_lanes[i];
        if (l->state == L_DONE) continue;
        fprintf(stderr, "cuemu:   thread %d (warp %d lane %d) waits at %s\n", i, l->warp, l->lane,
                state_name(l->state));
        shown++;
    }
    int done = 0;
    for (int i = 0; i < s_nthreads; i++) done += s_lanes[i].state == L_DONE;
    for (size_t w = 0; w < s_warps.size(); w++) {
        if (!s_warps[w].count) continue;
        for (int j = 0; j < 32; j++) {
            int t = (int)w * 32 + j;
            if (s_warps[w].mask >> j & 1u && t < s_nthreads && s_lanes[t].state != L_WARP)
                fprintf(stderr, "cuemu:   warp %zu shuffles with mask 0x%08x but lane %d %s\n", w,
                        s_warps[w].mask, j,
                        s_lanes[t].state == L_DONE ? "has exited" : "waits at __syncthreads");
        }
    }
    cuemu_fatal("%d of %d threads had exited, %d wait at __syncthreads", done, s_nthreads,
                s_bar_count);
}

static int sched_reverse(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("CUEMU_SCHED");
        v = e && !strcmp(e, "rev");
    }
    return v;
}

extern "C" char __start_cuemu_shared[] __attribute__((weak));
extern "C" char __stop_cuemu_shared[] __attribute__((weak));

/* CUEMU_BLOCKS=random: the seed, else 0 (index order). */
static uint64_t blocks_seed(void) {
    static int init;
    static uint64_t seed;
    if (!init) {
        const char *e = getenv("CUEMU_BLOCKS"), *sd = getenv("CUEMU_SEED");
        if (e && !strcmp(e, "random")) seed = sd ? strtoull(sd, NULL, 10) + 1 : 2;
        else if (e && *e && strcmp(e, "index"))
            cuemu_fatal("CUEMU_BLOCKS=%s: expected random or index", e);
        init = 1;
    }
    return seed;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Bytes of the shared-memory section not holding the poison (0xff) run_block writes. */
static size_t shared_written(void) {
    size_t n = 0;
    for (const char *p = __start_cuemu_shared; p < __stop_cuemu_shared; p++) n += (unsigned char)*p != 0xff;
    return n;
}

void cuemu_misaligned(const void *p, unsigned align, const char *what) {
    cuemu_fatal("kernel %s, block (%u,%u,%u): %s at %p is not %u-byte aligned (a GPU faults on "
                "a misaligned vector access)", s_kname ? s_kname : "?", cuemu_cur_block.x,
                cuemu_cur_block.y, cuemu_cur_block.z, what, p, align);
}

static void run_block(void) {
    int n = s_nthreads;
    /* Shared memory is undefined at block start on a GPU; here the statics would carry the
     * previous block's values, so a read-before-write would look right. Poison them (NaN
     * floats, -1 ints) for the first 4096 blocks of every launch (bounded cost). Covers the
     * __shared__ variables of non-template kernels: GCC places template statics in COMDAT
     * sections, ignoring the section attribute. */
    if (__start_cuemu_shared && s_block_serial++ < 4096)
        memset(__start_cuemu_shared, 0xff, (size_t)(__stop_cuemu_shared - __start_cuemu_shared));
    unsigned bx = cuemu_cur_block_dim.x, by = cuemu_cur_block_dim.y;
    for (int i = 0; i < n; i++) {
        lane_t *l = &s_lanes[i];
        l->tid = make_uint3(i % bx, (i / bx) % by, i / (bx * by));
        l->lin = i;
        l->warp = i / 32;
        l->lane = i % 32;
        l->state = L_READY;
        l->shfl_n = 0;
        lane_stack_init(l);
    }
    for (auto &w : s_warps) w.count = 0;
    s_live = n;
    s_bar_count = 0;
    int rev = sched_reverse();
    while (s_live > 0) {
        int ran = 0;
        for (int k = 0; k < n; k++) {
            lane_t *l = &s_lanes[rev ? n - 1 - k : k];
            if (l->state != L_READY) continue;
            run_lane(l);
            ran = 1;
            if (l->state == L_DONE) s_live--;
            /* The barrier opens when every thread that has not exited is waiting. */
            if (s_bar_count > 0 && s_bar_count == s_live) {
                for (int i = 0; i < n; i++)
                    if (s_lanes[i].state == L_BAR) s_lanes[i].state = L_READY;
                s_bar_count = 0;
            }
        }
        if (!ran && s_live > 0) deadlock();
    }
}

void cuemu_run_kernel(const char *name, dim3 grid, dim3 block, const std::function<void()> &body) {
    int n = (int)(block.x * block.y * block.z);
    if ((int)s_lanes.size() < n) {
        /* Grow without moving live lanes: none are live between launches. */
        std::vector<lane_t> nl(n);
        for (size_t i = 0; i < s_lanes.size(); i++) nl[i] = s_lanes[i];
        for (size_t i = s_lanes.size(); i < (size_t)n; i++) nl[i].stack_lo = NULL;
        s_lanes.swap(nl);
    }
    s_warps.resize((n + 31) / 32);
    s_body = &body;
    s_kname = name;
    s_nthreads = n;
    cuemu_cur_block_dim = block;
    cuemu_cur_grid_dim = grid;
    s_block_serial = 0;
    static uint64_t launches;
    uint64_t seed = blocks_seed(), st = seed * 0x100000001b3ull ^ ++launches;
    size_t nblk = (size_t)grid.x * grid.y * grid.z;
    std::vector<uint32_t> order(nblk);
    for (size_t i = 0; i < nblk; i++) order[i] = (uint32_t)i;
    if (seed) /* Fisher-Yates */
        for (size_t i = nblk; i > 1; i--) std::swap(order[i - 1], order[splitmix64(&st) % i]);
    for (size_t i = 0; i < nblk; i++) {
        uint32_t b = order[i];
        cuemu_cur_block = make_uint3(b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y));
        run_block();
        if (i == 0 && __start_cuemu_shared) {
            size_t used = shared_written();
            if (used > 48 * 1024)
                cuemu_fatal("kernel %s wrote %zu bytes of static shared memory in one block "
                            "(a block may have 48 KiB statically)", name, used);
        }
    }
    cuemu_cur_lane = NULL;
    s_body = NULL;
}

void cuemu_syncthreads(void) {
    lane_t *l = s_cur;
    if (!l) cuemu_fatal("__syncthreads outside a kernel");
    l->state = L_BAR;
    s_bar_count++;
    yield_lane(l);
}

uint64_t cuemu_shfl_xor_bits(unsigned mask, uint64_t bits, int lane_mask, int width) {
    lane_t *l = s_cur;
    if (!l) cuemu_fatal("warp shuffle outside a kernel");
    if (width <= 0 || width > 32 || (width & (width - 1)))
        cuemu_fatal("kernel %s: shuffle width %d is not a power of 2 <= 32", s_kname, width);
    if (!(mask >> l->lane & 1u))
        cuemu_fatal("kernel %s: thread %d (lane %d) shuffles with mask 0x%08x that excludes it",
                    s_kname, l->lin, l->lane, mask);
    warp_t *w = &s_warps[l->warp];
    /* The first lane to arrive checks the mask for all (later lanes must pass the same). */
    for (int j = 0; j < 32 && w->count == 0; j++) {
        if (!(mask >> j & 1u)) continue;
        int t = l->warp * 32 + j;
        if (t >= s_nthreads)
            cuemu_fatal("kernel %s: shuffle mask 0x%08x names lane %d, absent from a block of %d "
                        "threads", s_kname, mask, j, s_nthreads);
        if (s_lanes[t].state == L_DONE)
            cuemu_fatal("kernel %s, block (%u,%u,%u): shuffle mask 0x%08x names lane %d (thread %d) "
                        "which has exited", s_kname, cuemu_cur_block.x, cuemu_cur_block.y,
                        cuemu_cur_block.z, mask, j, t);
    }
    if (w->count == 0) w->mask = mask;
    else if (w->mask != mask)
        cuemu_fatal("kernel %s: lanes of warp %d shuffle with different masks 0x%08x / 0x%08x",
                    s_kname, l->warp, w->mask, mask);
    int par = l->shfl_n++ & 1;
    w->slot[par][l->lane] = bits;
    if (++w->count == __builtin_popcount(mask)) {
        w->count = 0;
        for (int j = 0; j < 32; j++)
            if (mask >> j & 1u) {
                lane_t *o = &s_lanes[l->warp * 32 + j];
                if (o->state == L_WARP) o->state = L_READY;
            }
    } else {
        l->state = L_WARP;
        yield_lane(l);
    }
    int src = l->lane ^ lane_mask;
    if ((src & ~(width - 1)) != (l->lane & ~(width - 1))) src = l->lane; /* outside the group */
    if (!(mask >> src & 1u))
        cuemu_fatal("kernel %s: lane %d reads lane %d, outside shuffle mask 0x%08x", s_kname,
                    l->lane, src, mask);
    return w->slot[par][src];
}
