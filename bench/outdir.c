/* --out policy; see outdir.h. */
#include "bench/outdir.h"
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

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
        if (!n++) snprintf(first, sizeof first, "%s", de->d_name);
    }
    closedir(d);
    if (!n) return RS_OK;
    return rs_err(e, RS_EINVAL,
                  "--out '%s' is not empty (it holds '%s'%s): a new run writes into a new or "
                  "empty directory; continue a run with --resume DIR, or choose another --out",
                  dir, first, n > 1 ? " and more" : "");
}
