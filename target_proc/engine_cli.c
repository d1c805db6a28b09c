/* Engine and decoder options (engine_cli.h). */
#include "engine_cli.h"
#include "common/eagle3.h"
#include <string.h>

void engine_cli_usage(FILE *f) {
    fprintf(f,
            "  --model PATH          target model: GGUF file or Hugging Face directory, or a\n"
            "                        random-weight model random:PRESET[,seed=N,layers=N,...]\n"
            "                        (llama3-8b, llama3-1b, smollm2-135m, tiny; no tokenizer:\n"
            "                        prompts and output are token ids)\n"
            "  --decoder NAME        ar | draft | pearl | rootdraw | root   (default ar)\n"
            "  --budget B|auto       tree budget, 1..%d (default 59); auto: each round picks\n"
            "                        from measured costs and acceptance whether to ask the\n"
            "                        drafter, how deep a pool to grow and how many nodes to\n"
            "                        verify (0: a plain AR step), for the most tokens/s\n"
            "  --pool-shape D,W      the drafter's pools: D levels deep (1..8), W nodes expanded\n"
            "                        a level (1..10; 1: a chain of best nodes with their\n"
            "                        siblings, for a drafter as costly as a full model);\n"
            "                        default 8,10 (710 candidates), or with --budget auto\n"
            "                        the planner's choice (docs/DESIGN.md §2, §5)\n"
            "  --temp T              sampling temperature, 0..1e6; 0: greedy, and so is any\n"
            "                        T below 1e-5 (default 0)\n"
            "  --top-k N             sample among the N likeliest tokens (ties kept; 0: off)\n"
            "  --top-p P             then among the fewest likeliest tokens reaching mass P\n"
            "                        (0 < P < 1; 0 or 1: off)\n"
            "  --min-p P             then drop tokens below P times the likeliest's probability\n"
            "                        (0..1; 0: off). Order: temperature, top-k, top-p, min-p;\n"
            "                        every decoder's output follows this law exactly\n"
            "  --seed S              sampling seed (default 1)\n"
            "  --threads N           CPU threads (default 1)\n"
            "  --ctx N               KV cache entries per process (default 2048)\n"
            "  --backend NAME        cpu | cuda (default cpu)\n"
            "  --device N            CUDA device ordinal (default 0)\n"
            "  --batch-invariant     CUDA: a row's logits do not depend on the batch (own GEMMs,\n"
            "                        fixed attention splits; T=0 ids equal AR's; default off)\n"
            "  --draft-model PATH    drafter model sharing the target's tokenizer, or an EAGLE-3\n"
            "                        head directory (the target supplies its embeddings)\n"
            "  --eagle3-layer-ids input|output  what the head's listed feature-layer ids mean:\n"
            "                        the stream entering layer i (vLLM) or the output of layer i\n"
            "                        (SGLang); default: inferred from the ids\n"
            "  --draft-layers SPEC   self-drafter from target layers, e.g. 0-5,24-29, or half\n"
            "                        (the first half) or short (the first eighth) (default %s)\n"
            "  --drafter KIND        self | model | eagle3 | suffix (default: --draft-model's\n"
            "                        kind, else self). suffix: model-free, proposes what\n"
            "                        followed earlier occurrences of the context's last tokens\n"
            "                        (prompt and output so far, and --draft-corpus)\n"
            "  --draft-corpus FILE   suffix drafter: a text file it also looks in\n"
            "  --draft-endpoint EP   use a rootspec-draft process at EP (ipc://, tcp://)\n"
            "  --draft-timeout-ms N  remote drafter reply timeout (default 10000)\n"
            "  --insecure            allow plain tcp:// to the drafter (no CURVE)\n"
            "  --curve-dir DIR       CURVE key files for tcp:// (rootspec-draft --gen-keys DIR;\n"
            "                        docs/DESIGN.md §8)\n"
            "  --chat-special-tokens special tokens spelled in chat content (<|im_end|>, ...)\n"
            "                        become their ids: for trusted callers only (default: the\n"
            "                        text they spell, so content cannot forge a turn)\n",
            TREE_MAX, DRAFTER_DEFAULT_LAYERS);
}

static int parse_decoder(const char *v, DecodeOpts *opts, RsErr *e) {
    int r = decoder_parse(v);
    if (r < 0 || r == DECODER_ORACLE)
        return rs_err(e, RS_EINVAL, "--decoder: unknown decoder '%s' (ar, draft, pearl, rootdraw, root)", v);
    opts->decoder = (DecoderKind)r;
    return RS_OK;
}

/* One valued option a (known to be engine_cli's) with its value v. */
static int parse_value(const char *a, const char *v, EngineOpts *eo, DecodeOpts *opts, RsErr *e) {
    Sampling *s = &opts->sampling;
    if (!strcmp(a, "--model")) eo->model_path = v;
    else if (!strcmp(a, "--decoder")) return parse_decoder(v, opts, e);
    else if (!strcmp(a, "--budget")) return cli_budget(v, &opts->budget, e);
    else if (!strcmp(a, "--pool-shape")) return cli_pool_shape(v, &opts->pool_depth, &opts->pool_width, e);
    /* ranges: sampling_normalize, the check requests go through too (engine_cli_check) */
    else if (!strcmp(a, "--temp")) return cli_real(a, v, &s->temperature, e);
    else if (!strcmp(a, "--top-k")) return cli_int(a, v, 0, 1 << 30, &s->top_k, e);
    else if (!strcmp(a, "--top-p")) return cli_real(a, v, &s->top_p, e);
    else if (!strcmp(a, "--min-p")) return cli_real(a, v, &s->min_p, e);
    else if (!strcmp(a, "--seed")) return cli_u64(a, v, &opts->seed, e);
    else if (!strcmp(a, "--draft-model")) eo->draft_model_path = v;
    else if (!strcmp(a, "--draft-layers")) eo->draft_layers = v;
    else if (!strcmp(a, "--draft-endpoint")) eo->draft_endpoint = v;
    else if (!strcmp(a, "--drafter")) return drafter_kind_option(v, &eo->drafter_kind, e);
    else if (!strcmp(a, "--draft-corpus")) eo->draft_corpus = v;
    else if (!strcmp(a, "--eagle3-layer-ids")) return eagle3_layer_ids_parse(v, &eo->eagle3_layer_ids, e);
    else return cli_int(a, v, 1, 3600000, &eo->draft_timeout_ms, e);
    return RS_OK;
}

int engine_cli_option(int argc, char **argv, int *i, EngineOpts *eo, DecodeOpts *opts, RsErr *e) {
    static const char *const names[] = {"--model", "--decoder", "--budget", "--pool-shape", "--temp", "--top-k",
                                        "--top-p", "--min-p", "--seed", "--draft-model",
                                        "--draft-layers", "--draft-endpoint", "--drafter",
                                        "--draft-corpus", "--eagle3-layer-ids",
                                        "--draft-timeout-ms"};
    const char *a = argv[*i], *v = NULL;
    if (!strcmp(a, "--chat-special-tokens")) return eo->chat_special_tokens = 1;
    size_t k = 0;
    while (k < sizeof names / sizeof names[0] && strcmp(a, names[k])) k++;
    if (k == sizeof names / sizeof names[0]) return 0;
    int rc = cli_value(argc, argv, *i, &v, e);
    if (rc) return rc;
    (*i)++;
    rc = parse_value(a, v, eo, opts, e);
    return rc ? rc : 1;
}

int engine_cli_runtime(EngineOpts *eo, CliRuntime *rt, RsErr *e) {
    int rc = cli_runtime_env(rt, e);
    if (rc) return rc;
    eo->backend = rt->backend;
    eo->threads = rt->threads;
    eo->ctx = rt->ctx;
    eo->device = rt->device;
    eo->insecure = rt->insecure;
    eo->curve_dir = rt->curve_dir;
    eo->batch_invariant = rt->batch_invariant;
    eo->cpu_kernels = rt->cpu_kernels;
    eo->sw = rt->sw;
    return RS_OK;
}

/* The drafter options that do not go together, or NULL. */
static const char *drafter_conflict(const EngineOpts *eo) {
    DrafterKind k = eo->drafter_kind;
    if (eo->draft_model_path && eo->draft_layers)
        return "give --draft-model or --draft-layers (a self-drafter from the target's layers), not both";
    if (eo->draft_endpoint && eo->draft_model_path)
        return "--draft-endpoint uses the model of the rootspec-draft process there; drop --draft-model";
    if (eo->draft_endpoint && eo->draft_layers)
        return "--draft-endpoint uses the model of the rootspec-draft process there; drop --draft-layers";
    if (eo->draft_corpus && k != DRAFTER_KIND_SUFFIX) return "--draft-corpus is for --drafter suffix";
    if (k == DRAFTER_KIND_SUFFIX && (eo->draft_model_path || eo->draft_layers))
        return "--drafter suffix needs no --draft-model or --draft-layers";
    if (k && eo->draft_endpoint)
        return "--drafter chooses an in-process drafter; --draft-endpoint uses the one of the "
               "rootspec-draft process there";
    if ((k == DRAFTER_KIND_MODEL || k == DRAFTER_KIND_EAGLE3) && !eo->draft_model_path)
        return "--drafter model / eagle3 needs --draft-model PATH";
    return NULL;
}

int engine_cli_check(const EngineOpts *eo, DecodeOpts *opts, RsErr *e) {
    const char *why = drafter_conflict(eo);
    if (why) return rs_err(e, RS_EINVAL, "%s", why);
    return sampling_normalize(&opts->sampling, e);
}

int engine_cli_open(const char *prog, EngineOpts *eo, DecodeOpts *opts, Engine **en) {
    RsErr e = {0};
    eo->drafter_optional = 1; /* as when the drafter fails mid-decode: AR, with a warning */
    int rc = engine_create(eo, opts->decoder != DECODER_AR, en, &e);
    if (rc) {
        fprintf(stderr, "%s: %s\n", prog, e.msg);
        return rc == RS_EPEER ? 2 : cli_exit_status(rc);
    }
    if ((*en)->vocab_note[0]) fprintf(stderr, "%s: note: %s\n", prog, (*en)->vocab_note);
    if ((*en)->drafter_missing[0]) {
        fprintf(stderr, "%s: warning: %s; decoding autoregressively instead of with "
                        "--decoder %s\n", prog, (*en)->drafter_missing, decoder_name(opts->decoder));
        opts->decoder = DECODER_AR;
        opts->score_all = 0;
    }
    return -1;
}
