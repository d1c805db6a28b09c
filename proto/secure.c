/* CURVE keys and a minimal ZAP handler (RFC 27) so that only the key directory's client
 * may talk to a drafter over tcp://. */
#include "secure.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

/* libzmq takes the port modulo 65536 ("tcp://host:99999" binds 34463), so check it here. */
static int check_tcp_port(const char *ep, RsErr *e) {
    const char *colon = strrchr(ep + 6, ':');
    if (!colon) return rs_err(e, RS_EINVAL, "endpoint '%s' has no port (tcp://HOST:PORT)", ep);
    const char *p = colon + 1;
    if (!strcmp(p, "*")) return RS_OK; /* bind: any free port */
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (!*p || *p == '-' || *p == '+' || *end || errno || v < 1 || v > 65535)
        return rs_err(e, RS_EINVAL, "endpoint '%s': port '%s' is not a number in 1..65535", ep, p);
    return RS_OK;
}

int secure_check_endpoint(const char *ep, int insecure, const char *curve_dir, RsErr *e) {
    if (!ep || !*ep) return rs_err(e, RS_EINVAL, "empty endpoint");
    if (!strncmp(ep, "ipc://", 6)) {
        if (!ep[6]) return rs_err(e, RS_EINVAL, "endpoint '%s' has no socket path (ipc:///PATH)", ep);
        return RS_OK;
    }
    if (!strncmp(ep, "inproc://", 9)) /* the drafter and the target are two processes */
        return rs_err(e, RS_EINVAL,
                      "endpoint '%s': inproc:// reaches only the same process; use ipc:///PATH "
                      "(one machine) or tcp://HOST:PORT", ep);
    if (!strncmp(ep, "tcp://", 6)) {
        int rc = check_tcp_port(ep, e);
        if (rc) return rc;
        if (curve_dir || insecure) return RS_OK;
        return rs_err(e, RS_EINVAL,
                      "endpoint '%s' is plain tcp://: give --curve-dir DIR (keys from "
                      "`rootspec-draft --gen-keys DIR`) or --insecure",
                      ep);
    }
    return rs_err(e, RS_EINVAL, "endpoint '%s': unknown transport (ipc://, tcp://)", ep);
}

/* O_EXCL|O_NOFOLLOW: never through a symlink planted at the path (dangling or not), never
 * over an existing file; a secret key is 0600 from its first byte, not chmod-ed later. */
static int write_key(const char *dir, const char *name, const char *z85, RsErr *e) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int secret = strstr(name, ".key") != NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, secret ? 0600 : 0644);
    if (fd < 0) return rs_err(e, RS_EIO, "cannot create key file '%s': %s", path, strerror(errno));
    char line[64];
    int n = snprintf(line, sizeof line, "%s\n", z85);
    int ok = write(fd, line, (size_t)n) == n;
    if (close(fd) != 0) ok = 0;
    if (!ok) return rs_err(e, RS_EIO, "cannot write key file '%s': %s", path, strerror(errno));
    return RS_OK;
}

/* A secret key others can read is no secret: said on stderr (not refused, so a deployment
 * that copied keys with a loose umask keeps working while it is told to fix them). */
static void warn_loose_secret(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        fprintf(stderr,
                "rootspec: warning: secret key file '%s' is readable by group or others (mode "
                "%04o): chmod 600 it\n",
                path, (unsigned)(st.st_mode & 07777));
}

static int read_key(const char *dir, const char *name, char z85[41], RsErr *e) {
    char path[1024], *buf = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = rs_read_file(path, &buf, NULL, e);
    if (rc) return rc;
    if (strstr(name, ".key")) warn_loose_secret(path);
    size_t n = strcspn(buf, "\r\n");
    if (n != 40) {
        free(buf);
        return rs_err(e, RS_EFORMAT, "key file '%s' must hold one 40-character Z85 key", path);
    }
    memcpy(z85, buf, 40);
    z85[40] = 0;
    free(buf);
    uint8_t raw[32];
    if (!zmq_z85_decode(raw, z85)) return rs_err(e, RS_EFORMAT, "key file '%s' is not Z85", path);
    return RS_OK;
}

int secure_gen_keys(const char *dir, RsErr *e) {
    char pub[41], sec[41];
    mkdir(dir, 0700);
    /* Replacing a deployed pair would lock out every host that holds the old keys. */
    const char *names[] = {"server.key", "server.pub", "client.key", "client.pub"};
    for (int i = 0; i < 4; i++) {
        char path[1024];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (lstat(path, &st) == 0) /* a symlink too, even a dangling one */
            return rs_err(e, RS_EINVAL, "'%s' exists already: remove the old keys or choose another DIR",
                          path);
    }
    if (zmq_curve_keypair(pub, sec) != 0)
        return rs_err(e, RS_EUNSUPPORTED, "libzmq built without CURVE: %s", zmq_strerror(zmq_errno()));
    int rc = write_key(dir, "server.pub", pub, e);
    if (!rc) rc = write_key(dir, "server.key", sec, e);
    if (rc) return rc;
    zmq_curve_keypair(pub, sec);
    rc = write_key(dir, "client.pub", pub, e);
    if (!rc) rc = write_key(dir, "client.key", sec, e);
    return rc;
}

static pthread_t zap_thread;
static int zap_running;
static void *zap_sock;
static uint8_t zap_client_key[32];

/* Answers ZAP requests: 200 for CURVE with the known client key, 400 otherwise. */
static void *zap_main(void *arg) {
    (void)arg;
    for (;;) {
        char frames[8][256];
        size_t sizes[8];
        int nf = 0, more = 1;
        while (more && nf < 8) {
            int r = zmq_recv(zap_sock, frames[nf], sizeof frames[nf], 0);
            if (r < 0) { /* context shut down: close our socket so zmq_ctx_term returns */
                zmq_close(zap_sock);
                return NULL;
            }
            sizes[nf] = (size_t)r < sizeof frames[nf] ? (size_t)r : sizeof frames[nf];
            nf++;
            int m = 0;
            size_t ml = sizeof m;
            zmq_getsockopt(zap_sock, ZMQ_RCVMORE, &m, &ml);
            more = m;
        }
        while (more) { /* drain oversize requests */
            char junk[256];
            if (zmq_recv(zap_sock, junk, sizeof junk, 0) < 0) {
                zmq_close(zap_sock);
                return NULL;
            }
            int m = 0;
            size_t ml = sizeof m;
            zmq_getsockopt(zap_sock, ZMQ_RCVMORE, &m, &ml);
            more = m;
        }
        /* version, request id, domain, address, identity, mechanism, credentials... */
        int ok = nf >= 7 && sizes[5] == 5 && !memcmp(frames[5], "CURVE", 5) && sizes[6] == 32 &&
                 !memcmp(frames[6], zap_client_key, 32);
        const char *status = ok ? "200" : "400", *text = ok ? "OK" : "unknown client key";
        zmq_send(zap_sock, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(zap_sock, frames[1], nf > 1 ? sizes[1] : 0, ZMQ_SNDMORE);
        zmq_send(zap_sock, status, 3, ZMQ_SNDMORE);
        zmq_send(zap_sock, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(zap_sock, "", 0, ZMQ_SNDMORE);
        zmq_send(zap_sock, "", 0, 0);
    }
}

int secure_server_setup(void *ctx, void *sock, const char *dir, RsErr *e) {
    char sec[41], cpub[41];
    int rc = read_key(dir, "server.key", sec, e);
    if (!rc) rc = read_key(dir, "client.pub", cpub, e);
    if (rc) return rc;
    zmq_z85_decode(zap_client_key, cpub);
    if (!zap_running) {
        zap_sock = zmq_socket(ctx, ZMQ_REP);
        if (!zap_sock || zmq_bind(zap_sock, "inproc://zeromq.zap.01") != 0)
            return rs_err(e, RS_EIO, "cannot start the ZAP handler: %s", zmq_strerror(zmq_errno()));
        pthread_create(&zap_thread, NULL, zap_main, NULL);
        zap_running = 1;
    }
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, 41) != 0)
        return rs_err(e, RS_EUNSUPPORTED, "CURVE set-up failed: %s", zmq_strerror(zmq_errno()));
    return RS_OK;
}

void secure_server_shutdown(void) {
    if (!zap_running) return;
    pthread_join(zap_thread, NULL); /* returns once zmq_ctx_shutdown woke the handler */
    zap_running = 0;
}

int secure_client_setup(void *sock, const char *dir, RsErr *e) {
    char spub[41], cpub[41], csec[41];
    int rc = read_key(dir, "server.pub", spub, e);
    if (!rc) rc = read_key(dir, "client.pub", cpub, e);
    if (!rc) rc = read_key(dir, "client.key", csec, e);
    if (rc) return rc;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, spub, 41) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, cpub, 41) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, csec, 41) != 0)
        return rs_err(e, RS_EUNSUPPORTED, "CURVE set-up failed: %s", zmq_strerror(zmq_errno()));
    return RS_OK;
}
