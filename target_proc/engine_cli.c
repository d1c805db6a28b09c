/* Engine and decoder options (engine_cli.h). */
#include "engine_cli.h"
#include "common/cli.h"
#include <string.h>

void engine_cli_usage(FILE *f) {
    fprintf(f,
            "  --model PATH          target model: GGUF file or Hugging Face directory, or a\n"
            "                        random-weight model random:PRESET[,seed=N,layers=N,...]\n"
            "                        (llama3-8b, llama3-1b, smollm2-135m, tiny; no tokenizer:\n"
            "                        prompts and output are token ids)\n"
            "  --decoder NAME        ar | draft | pearl | rootdraw | root   (default ar)\n"
            "  --budget B            tree budget, 1..%d (default 59)\n"
            "  --temp T              0 (greedy) or 1 (sample softmax of raw logits) (default 0)\n"
            "  --seed S              sampling seed (default 1)\n"
            "  --threads N           CPU threads (default 1)\n"
            "  --ctx N               KV cache entries per process (default 2048)\n"
            "  --backend NAME        cpu | cuda (default cpu)\n"
            "  --device N            CUDA device ordinal (default 0)\n"
            "  --batch-invariant     CUDA: a row's logits do not depend on the batch (own GEMMs,\n"
            "                        fixed attention splits; T=0 ids equal AR's; default off)\n"
            "  --draft-model PATH    drafter model sharing the target's tokenizer, or an EAGLE-3\n"
            "                        head directory (the target supplies its embeddings)\n"
            "  --draft-layers SPEC   self-drafter from target layers, e.g. 0-5,24-29 (default %s)\n"
            "  --draft-endpoint EP   use a rootspec-draft process at EP (ipc://, tcp://)\n"
            "  --draft-timeout-ms N  remote drafter reply timeout (default 10000)\n"
            "  --insecure            allow plain tcp:// to the drafter (no CURVE)\n"
            "  --curve-dir DIR       CURVE key files for tcp:// (rootspec-draft --gen-keys DIR;\n"
            "                        docs/DESIGN.md §8)\n",
            TREE_MAX, ENGINE_DEFAULT_DRAFT_LAYERS);
}

static int parse_decoder(const char *v, DecodeOpts *d, RsErr *e) {
    int r = rule_parse(v);
    if (r < 0 || r == RULE_ORACLE)
        return rs_err(e, RS_EINVAL, "--decoder: unknown decoder '%s' (ar, draft, pearl, rootdraw, root)", v);
    d->rule = (Rule)r;
    return RS_OK;
}

/* Options without a value; 1 if a was one. */
static int flag_option(const char *a, EngineOpts *eo) {
    if (!strcmp(a, "--batch-invariant")) backend_set_batch_invariant(1);
    else if (!strcmp(a, "--insecure")) eo->insecure = 1;
    else return 0;
    return 1;
}

int engine_cli_option(int argc, char **argv, int *i, EngineOpts *eo, DecodeOpts *d, RsErr *e) {
    const char *a = argv[*i], *v = NULL;
    if (flag_option(a, eo)) return 1;
    static const char *const valued[] = {"--model", "--decoder", "--budget", "--temp", "--seed",
                                         "--threads", "--ctx", "--backend", "--device",
                                         "--draft-model", "--draft-layers", "--draft-endpoint",
                                         "--draft-timeout-ms", "--curve-dir"};
    size_t k = 0;
    while (k < sizeof valued / sizeof valued[0] && strcmp(a, valued[k])) k++;
    if (k == sizeof valued / sizeof valued[0]) return 0;
    int rc = cli_value(argc, argv, *i, &v, e);
    if (rc) return rc;
    (*i)++;
    if (!strcmp(a, "--model")) eo->model_path = v;
    else if (!strcmp(a, "--decoder")) rc = parse_decoder(v, d, e);
    else if (!strcmp(a, "--budget")) rc = cli_int(a, v, 1, TREE_MAX, &d->budget, e);
    else if (!strcmp(a, "--temp")) rc = cli_int(a, v, 0, 1, &d->temp, e);
    else if (!strcmp(a, "--seed")) rc = cli_u64(a, v, &d->seed, e);
    else if (!strcmp(a, "--threads")) rc = cli_int(a, v, 1, 256, &eo->threads, e);
    else if (!strcmp(a, "--ctx")) rc = cli_int(a, v, 256, 1 << 20, &eo->ctx, e);
    else if (!strcmp(a, "--backend")) eo->backend = v;
    else if (!strcmp(a, "--device")) rc = cli_int(a, v, 0, 64, &eo->device, e);
    else if (!strcmp(a, "--draft-model")) eo->draft_model_path = v;
    else if (!strcmp(a, "--draft-layers")) eo->draft_layers = v;
    else if (!strcmp(a, "--draft-endpoint")) eo->draft_endpoint = v;
    else if (!strcmp(a, "--draft-timeout-ms")) rc = cli_int(a, v, 1, 3600000, &eo->draft_timeout_ms, e);
    else eo->curve_dir = v;
    return rc ? rc : 1;
}

int engine_cli_check(const EngineOpts *eo, RsErr *e) {
    if (eo->draft_model_path && eo->draft_layers)
        return rs_err(e, RS_EINVAL, "give --draft-model or --draft-layers (a self-drafter from "
                                    "the target's layers), not both");
    if (eo->draft_endpoint && (eo->draft_model_path || eo->draft_layers))
        return rs_err(e, RS_EINVAL, "--draft-endpoint uses the model of the rootspec-draft "
                                    "process there; drop --%s",
                      eo->draft_model_path ? "draft-model" : "draft-layers");
    return RS_OK;
}

int engine_cli_open(const char *prog, EngineOpts *eo, DecodeOpts *d, Engine **en) {
    RsErr e = {0};
    eo->drafter_optional = 1; /* as when the drafter fails mid-decode: AR, with a warning */
    int rc = engine_create(eo, d->rule != RULE_AR, en, &e);
    if (rc) {
        fprintf(stderr, "%s: %s\n", prog, e.msg);
        return rc == RS_EPEER ? 2 : cli_exit_status(rc);
    }
    if ((*en)->drafter_missing[0]) {
        fprintf(stderr, "%s: warning: %s; decoding autoregressively instead of with "
                        "--decoder %s\n", prog, (*en)->drafter_missing, rule_name(d->rule));
        d->rule = RULE_AR;
        d->score_all = 0;
    }
    return -1;
}
