/* The run directory's policy; see outdir.h. */
#include "bench/outdir.h"
#include "common/textsafe.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int bench_outdir_check(const char *dir, RsErr *e) {
    DIR *d = opendir(dir);
    if (!d) return RS_OK; /* missing: made later; not a directory: the caller says so */
    char first[256] = "";
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        /* A FIFO holds no earlier data to mistake, truncate or overwrite: the round log may
         * stream through one (mkfifo DIR/rounds.jsonl; a reader on it; then the run). */
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (lstat(p, &st) == 0 && S_ISFIFO(st.st_mode)) continue;
        if (!n++) rs_escape_str(first, sizeof first, de->d_name);
    }
    closedir(d);
    if (!n) return RS_OK;
    return rs_err(e, RS_EINVAL,
                  "--out '%s' is not empty (it holds '%s'%s): a new run writes into a new or "
                  "empty directory; continue a run with --resume DIR, or choose another --out",
                  dir, first, n > 1 ? " and more" : "");
}

int bench_path_check(const char *opt, const char *path, RsErr *e) {
    for (const unsigned char *p = (const unsigned char *)path; *p; p++)
        if (*p < 0x20 || *p == 0x7f) {
            char shown[600];
            rs_escape_str(shown, sizeof shown, path);
            return rs_err(e, RS_EINVAL, "%s '%s': the path holds a control character (byte "
                          "0x%02x); rootspec-bench takes none in a run directory's path",
                          opt, shown, *p);
        }
    return RS_OK;
}

/* Why the entry at path is not a file the bench may write (NULL: it may, or it is absent). */
static const char *file_refusal(const struct stat *st, int fifo_ok) {
    if (S_ISLNK(st->st_mode)) return "a symbolic link, which rootspec-bench does not follow";
    if (S_ISFIFO(st->st_mode)) return fifo_ok ? NULL : "a FIFO, not a log to resume or read";
    if (!S_ISREG(st->st_mode)) return "not a regular file";
    if (st->st_nlink > 1) return "a hard link to a file named elsewhere too";
    return NULL;
}

int bench_file_check(const char *path, RsErr *e) {
    struct stat st;
    if (lstat(path, &st) != 0) return RS_OK;
    const char *why = file_refusal(&st, 0);
    return why ? rs_err(e, RS_EINVAL, "'%s' is %s; move it away first", path, why) : RS_OK;
}

int bench_run_files_check(const char *dir, RsErr *e) {
    static const char *const names[] = {
        "run.json",   "run.json.tmp", "rounds.jsonl",       "rounds.jsonl.tmp", "decodes.csv",
        "summary.md", "speeds.png",   "round_breakdown.png"};
    int rc = RS_OK;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !rc; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        rc = bench_file_check(p, e);
    }
    return rc;
}

static int io_fail(int fd, const char *path, RsErr *e) {
    int err = errno;
    close(fd);
    return rs_err(e, RS_EIO, "cannot write '%s': %s", path, strerror(err));
}

int bench_file_open(const char *path, BenchFileMode mode, FILE **out, RsErr *e) {
    *out = NULL;
    static const int flags[] = {O_CREAT | O_EXCL, O_CREAT, O_CREAT | O_APPEND, 0};
    int fd = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC | flags[mode], 0666);
    if (fd < 0 && errno == ELOOP)
        return rs_err(e, RS_EINVAL, "'%s' is a symbolic link, which rootspec-bench does not "
                      "follow; move it away first", path);
    if (fd < 0) return rs_err(e, RS_EIO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) return io_fail(fd, path, e);
    const char *why = file_refusal(&st, mode == BENCH_FILE_TRUNC);
    if (why) {
        close(fd);
        return rs_err(e, RS_EINVAL, "'%s' is %s; move it away first", path, why);
    }
    if (mode == BENCH_FILE_TRUNC && S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0)
        return io_fail(fd, path, e);
    *out = fdopen(fd, mode == BENCH_FILE_APPEND ? "ab" : "wb");
    return *out ? RS_OK : io_fail(fd, path, e);
}
