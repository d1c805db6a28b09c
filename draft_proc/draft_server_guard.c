/* Server guards (see server_guard.h). The connection bound works with libzmq's socket
 * monitor: ACCEPTED and DISCONNECTED events (their value is the connection's fd) keep a
 * table of live connections; over the cap, the connection idle longest (never the current
 * session's) is shut down, and libzmq closes it as if the peer had left. */
#include "draft_server_guard.h"
#include "proto/proto.h"
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zmq.h>

#define GUARD_MAX_CONNS 1024        /* ~47 KB of libzmq state each: 48 MB at most */
#define GUARD_HANDSHAKE_MS 5000     /* a peer that has not finished ZMTP by then is dropped */
#define GUARD_REPLACED_RING 16      /* sessions a takeover replaced, newest last */
#define GUARD_LOG_GAP_NS 1000000000ull
/* A new connection is spared this long: a real target sends its HELLO within
 * milliseconds, so a flood of reconnecting idle peers cannot push it out first. */
#define GUARD_GRACE_NS 100000000ull

/* libzmq 4.3's ipc listener accepts only EAGAIN, EINTR, ECONNABORTED, EPROTO and ENFILE
 * from accept(): EMFILE trips an assertion (ipc_listener.cpp) that aborts the drafter when
 * idle peers use up its descriptors. This definition precedes libc's for libzmq and
 * reports EMFILE as ENFILE, which libzmq handles by retrying once a descriptor is free
 * (the monitor below frees them). */
int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    long r = syscall(SYS_accept4, fd, addr, len, flags);
    if (r < 0 && errno == EMFILE) errno = ENFILE;
    return (int)r;
}

struct DraftServerGuard {
    void *sock, *mon;          /* the ROUTER, and our end of its monitor */
    char mon_ep[64];
    pthread_t thread;
    int thread_on;
    atomic_int stop;
    int n_fds;                 /* table size: the RLIMIT_NOFILE soft limit, capped */
    _Atomic uint64_t *last;    // (n_fds) last accept or frame time, 0: not a live connection
    uint64_t *born;            // (n_fds) accept time
    atomic_int session_fd;
    int live, cap;
    long evicted, evicted_logged;
    uint64_t evict_log_ns;
    char path[4096];           /* ipc socket file, "" for tcp:// */
    int bound;
    dev_t dev;
    ino_t ino;
    uint64_t replaced[GUARD_REPLACED_RING];
    int n_replaced;
    long takeovers, takeovers_logged;
    uint64_t takeover_log_ns;
};

static const char *kind_of(mode_t m) {
    return S_ISREG(m)    ? "a regular file"
           : S_ISDIR(m)  ? "a directory"
           : S_ISLNK(m)  ? "a symbolic link"
           : S_ISFIFO(m) ? "a FIFO"
                         : "something else";
}

/* libzmq's ipc bind unlinks whatever is at the path: a stale socket file may go, anything
 * else is someone's file. (A live drafter's socket is refused in server.c.) */
static int ipc_path_check(const char *ep, const char *path, RsErr *e) {
    struct stat st;
    if (!strcmp(path, "*") || lstat(path, &st) != 0 || S_ISSOCK(st.st_mode)) return RS_OK;
    return rs_err(e, RS_EINVAL,
                  "cannot bind '%s': '%s' exists and is %s, not a socket (remove it or choose "
                  "another path)",
                  ep, path, kind_of(st.st_mode));
}

/* Idle descriptors are what a flood consumes: use all the process may have. */
static int raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur > (1u << 20) ? 1 << 20 : (int)rl.rlim_cur;
}

/* Shuts down the live connection idle longest, other than the session's and those younger
 * than the grace period; 0 if there is none (yet: the monitor tries again every 100 ms,
 * and until then libzmq's accept waits, see accept4 above). */
static int evict_one(DraftServerGuard *g) {
    int victim = -1, sess = atomic_load(&g->session_fd);
    uint64_t oldest = UINT64_MAX, now = rs_now_ns();
    for (int fd = 0; fd < g->n_fds; fd++) {
        uint64_t t = atomic_load_explicit(&g->last[fd], memory_order_relaxed);
        if (t && fd != sess && t < oldest && now - g->born[fd] >= GUARD_GRACE_NS)
            oldest = t, victim = fd;
    }
    if (victim < 0) return 0;
    atomic_store(&g->last[victim], 0); /* not live for us from now on */
    g->live--;
    g->evicted++;
    shutdown(victim, SHUT_RDWR);
    return 1;
}

static void on_event(DraftServerGuard *g, uint16_t ev, int fd) {
    if (fd < 0 || fd >= g->n_fds) return;
    if (ev == ZMQ_EVENT_ACCEPTED) {
        if (!atomic_load(&g->last[fd])) g->live++;
        g->born[fd] = rs_now_ns();
        atomic_store(&g->last[fd], g->born[fd]);
    } else if (atomic_exchange(&g->last[fd], 0)) {
        g->live--;
    }
}

static void enforce_cap(DraftServerGuard *g) {
    while (g->live > g->cap && evict_one(g)) {}
    uint64_t now = rs_now_ns();
    if (g->evicted > g->evicted_logged && now - g->evict_log_ns >= 5 * GUARD_LOG_GAP_NS) {
        fprintf(stderr,
                "rootspec-draft: %ld idle connection(s) closed: more than %d peers connected "
                "(%ld in all so far)\n",
                g->evicted - g->evicted_logged, g->cap, g->evicted);
        g->evicted_logged = g->evicted;
        g->evict_log_ns = now;
    }
}

static void *monitor_main(void *arg) {
    DraftServerGuard *g = arg;
    while (!atomic_load(&g->stop)) {
        zmq_pollitem_t it = {.socket = g->mon, .events = ZMQ_POLLIN};
        int ready = zmq_poll(&it, 1, 100);
        enforce_cap(g);
        if (ready <= 0) continue;
        zmq_msg_t a, b;
        zmq_msg_init(&a);
        zmq_msg_init(&b);
        if (zmq_msg_recv(&a, g->mon, 0) >= 0 && zmq_msg_more(&a) &&
            zmq_msg_recv(&b, g->mon, 0) >= 0 && zmq_msg_size(&a) >= 6) {
            const uint8_t *d = zmq_msg_data(&a);
            uint16_t ev;
            uint32_t val;
            memcpy(&ev, d, 2);
            memcpy(&val, d + 2, 4);
            on_event(g, ev, (int)val);
        }
        zmq_msg_close(&a);
        zmq_msg_close(&b);
    }
    return NULL;
}

int draft_server_guard_create(void *ctx, void *sock, const char *endpoint, DraftServerGuard **out,
                        RsErr *e) {
    *out = NULL;
    int ipc = !strncmp(endpoint, "ipc://", 6);
    int rc = ipc ? ipc_path_check(endpoint, endpoint + 6, e) : RS_OK;
    if (rc) return rc;
    DraftServerGuard *g = rs_xcalloc(1, sizeof *g);
    if (ipc) snprintf(g->path, sizeof g->path, "%s", endpoint + 6);
    g->sock = sock;
    g->n_fds = raise_nofile();
    int reserve = g->n_fds / 2; /* libraries, models, the busy moments before an eviction */
    g->cap = g->n_fds - reserve < GUARD_MAX_CONNS ? g->n_fds - reserve : GUARD_MAX_CONNS;
    if (g->cap < 4) g->cap = 4;
    g->last = rs_xcalloc((size_t)g->n_fds, sizeof *g->last);
    g->born = rs_xcalloc((size_t)g->n_fds, sizeof *g->born);
    atomic_init(&g->session_fd, -1);
    int hs = GUARD_HANDSHAKE_MS;
    zmq_setsockopt(sock, ZMQ_HANDSHAKE_IVL, &hs, sizeof hs);
    snprintf(g->mon_ep, sizeof g->mon_ep, "inproc://rootspec-guard-%p", (void *)g);
    g->mon = zmq_socket(ctx, ZMQ_PAIR);
    if (zmq_socket_monitor(sock, g->mon_ep, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0 ||
        !g->mon || zmq_connect(g->mon, g->mon_ep) != 0) {
        rc = rs_err(e, RS_EIO, "cannot monitor the drafter's socket: %s",
                    zmq_strerror(zmq_errno()));
        draft_server_guard_destroy(&g);
        return rc;
    }
    g->thread_on = pthread_create(&g->thread, NULL, monitor_main, g) == 0;
    *out = g;
    return RS_OK;
}

void draft_server_guard_bound(DraftServerGuard *g) {
    struct stat st;
    if (!g || !g->path[0] || lstat(g->path, &st) != 0 || !S_ISSOCK(st.st_mode)) return;
    g->bound = 1;
    g->dev = st.st_dev;
    g->ino = st.st_ino;
}

void draft_server_guard_seen(DraftServerGuard *g, int fd) {
    if (g && fd >= 0 && fd < g->n_fds && atomic_load_explicit(&g->last[fd], memory_order_relaxed))
        atomic_store_explicit(&g->last[fd], rs_now_ns(), memory_order_relaxed);
}

void draft_server_guard_hello(DraftServerGuard *g, int fd, int replaced, uint64_t old_session) {
    if (!g) return;
    atomic_store(&g->session_fd, fd);
    if (!replaced) return;
    if (g->n_replaced == GUARD_REPLACED_RING) {
        memmove(g->replaced, g->replaced + 1, sizeof g->replaced - sizeof g->replaced[0]);
        g->n_replaced--;
    }
    g->replaced[g->n_replaced++] = old_session;
    g->takeovers++;
    uint64_t now = rs_now_ns();
    if (now - g->takeover_log_ns < GUARD_LOG_GAP_NS && g->takeover_log_ns) return;
    long quiet = g->takeovers - g->takeovers_logged - 1;
    fprintf(stderr, "rootspec-draft: new target session replaces the old one");
    if (quiet > 0) fprintf(stderr, " (and %ld more takeovers since the last report)", quiet);
    fprintf(stderr, "\n");
    g->takeovers_logged = g->takeovers;
    g->takeover_log_ns = now;
}

const char *draft_server_guard_no_session(const DraftServerGuard *g, uint64_t session) {
    for (int i = 0; g && i < g->n_replaced; i++)
        if (g->replaced[i] == session)
            return PROTO_TAKEN_OVER " (its HELLO replaced this session): send HELLO to start again";
    return "no session: send HELLO first (or another target took over)";
}

void draft_server_guard_destroy(DraftServerGuard **gp) {
    if (!gp || !*gp) return;
    DraftServerGuard *g = *gp;
    if (g->thread_on) {
        atomic_store(&g->stop, 1);
        pthread_join(g->thread, NULL);
    }
    zmq_socket_monitor(g->sock, NULL, 0);
    if (g->mon) zmq_close(g->mon);
    if (g->takeovers > g->takeovers_logged)
        fprintf(stderr, "rootspec-draft: %ld more session takeovers (%ld in all)\n",
                g->takeovers - g->takeovers_logged, g->takeovers);
    struct stat st;
    if (g->bound && lstat(g->path, &st) == 0 && st.st_dev == g->dev && st.st_ino == g->ino)
        unlink(g->path); /* still the file we bound: a clean exit leaves nothing behind */
    free(g->last);
    free(g->born);
    free(g);
    *gp = NULL;
}
