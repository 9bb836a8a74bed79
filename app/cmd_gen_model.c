/*
 * cmd_gen_model.c — `kvsieve gen-model`: write a GGUF with deterministic
 * random weights of a real model shape.
 *
 * Why a CLI around ks_shape_generate: benchmarks and end-to-end tests need
 * 1B-8B files of the true shapes (to measure bandwidth and KV behaviour) and
 * tiny files of every architectural variant, without downloading checkpoints.
 * The tokenizer comes from a real vocabulary GGUF so prompts tokenize as they
 * would for the real model.  All the work is in the library; this file only
 * parses flags strictly (a typo must be a usage error, exit 2, never a silently
 * different model), reports progress on stderr for files large enough to take
 * a while, and prints one summary line on stdout.
 */
#include "commands.h"
#include "gguf/gguf.h"
#include "model/eagle3.h"
#include "model/shapes.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void gen_model_usage(FILE *f) {
    fprintf(f,
            "usage: kvsieve gen-model --shape NAME --type TYPE --vocab-from VOCAB.gguf --out FILE\n"
            "                         [--seed N] [--layers N] [--ctx N] [--threads N] [--dlm-out DIR]\n\n"
            "Writes a GGUF with deterministic pseudo-random weights of a real model shape\n"
            "(same arguments -> byte-identical file).  tokenizer.* keys are copied from\n"
            "VOCAB.gguf and its token count is the vocabulary size.\n\n"
            "  --type     q8_0 | q4_0 | q4_k | q6_k | f16 | bf16 | f32\n"
            "  --layers   override the layer count (small test files)\n"
            "  --ctx      override the training context length\n\n"
            "shapes:\n");
    for (int i = 0; i < ks_shape_count(); i++) {
        const ks_model_shape *s = ks_shape_at(i);
        fprintf(f, "  %-14s %-6s embd %-5d layers %-3d heads %d/%d head_dim %d ff %d%s%s%s%s\n", s->name, s->arch,
                s->n_embd, s->n_layer, s->n_head, s->n_head_kv, s->head_dim, s->n_ff, s->tied_output ? " tied" : "",
                s->qkv_bias ? " qkv-bias" : "", s->qk_norm ? " qk-norm" : "", s->rope_llama3 ? " llama3-rope" : "");
    }
}

static bool gen_model_parse_u64(const char *s, uint64_t max, uint64_t *out) {
    if (!s || !*s || *s == '-') return false;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max) return false;
    *out = v;
    return true;
}

typedef struct {
    double t0, last;
    int last_pct;
} gen_model_progress;

static void gen_model_on_progress(void *user, int64_t tensor, int64_t n_tensors, const char *name,
                                  uint64_t done, uint64_t total) {
    gen_model_progress *pr = user;
    if (total < (64u << 20)) return; /* small files: stay quiet */
    int pct = (int)(100.0 * (double)done / (double)total);
    double now = ks_time_sec();
    if (pct < pr->last_pct + 5 && now - pr->last < 10.0) return; /* every 5% or 10 s */
    pr->last_pct = pct;
    pr->last = now;
    fprintf(stderr, "gen-model: %3d%%  %6.2f / %.2f GiB  [%lld/%lld] %s  (%.0f s)\n", pct,
            (double)done / (1u << 30), (double)total / (1u << 30), (long long)tensor + 1, (long long)n_tensors,
            name, now - pr->t0);
}

int cmd_gen_model(int argc, char **argv) {
    const char *shape_name = NULL, *type_name = NULL, *vocab_path = NULL, *out_path = NULL, *dlm_out = NULL;
    ks_shape_gen_params p = {0};
    p.seed = 42;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            gen_model_usage(stdout);
            return 0;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n = 0;
        if (!strcmp(a, "--shape") && v) shape_name = v;
        else if (!strcmp(a, "--type") && v) type_name = v;
        else if (!strcmp(a, "--vocab-from") && v) vocab_path = v;
        else if (!strcmp(a, "--out") && v) out_path = v;
        else if (!strcmp(a, "--dlm-out") && v) dlm_out = v;
        else if (!strcmp(a, "--seed") && v) {
            if (!gen_model_parse_u64(v, UINT64_MAX, &n)) goto bad_value;
            p.seed = n;
        } else if (!strcmp(a, "--layers") && v) {
            if (!gen_model_parse_u64(v, 4096, &n) || n == 0) goto bad_value;
            p.n_layer = (int32_t)n;
        } else if (!strcmp(a, "--ctx") && v) {
            if (!gen_model_parse_u64(v, INT32_MAX, &n) || n == 0) goto bad_value;
            p.n_ctx = (int32_t)n;
        } else if (!strcmp(a, "--threads") && v) {
            if (!gen_model_parse_u64(v, 1024, &n) || n == 0) goto bad_value;
            p.n_threads = (int32_t)n;
        } else {
            fprintf(stderr, "kvsieve gen-model: unknown option or missing value: '%s'\n", a);
            gen_model_usage(stderr);
            return 2;
        }
        i++;
        continue;
    bad_value:
        fprintf(stderr, "kvsieve gen-model: bad value '%s' for %s\n", v, a);
        return 2;
    }
    if (!shape_name || !type_name || !vocab_path || !out_path) {
        fprintf(stderr, "kvsieve gen-model: --shape, --type, --vocab-from and --out are required\n");
        gen_model_usage(stderr);
        return 2;
    }
    const ks_model_shape *shape = ks_shape_find(shape_name);
    if (!shape) {
        fprintf(stderr, "kvsieve gen-model: unknown shape '%s' (see kvsieve gen-model --help)\n", shape_name);
        return 2;
    }
    if (!ks_dtype_from_name(type_name, &p.type) || !ks_dtype_is_weight_type((uint32_t)p.type)) {
        fprintf(stderr, "kvsieve gen-model: unknown weight type '%s' (q8_0 q4_0 q4_k q6_k f16 bf16 f32)\n",
                type_name);
        return 2;
    }

    ks_gguf *vocab = NULL;
    ks_status st = ks_gguf_open(vocab_path, &vocab);
    if (st != KS_OK) {
        app_report("gen-model", "reading the vocabulary", st);
        return 1;
    }
    gen_model_progress pr = {ks_time_sec(), 0, -100};
    p.vocab = vocab;
    p.progress = gen_model_on_progress;
    p.progress_user = &pr;
    uint64_t bytes = 0;
    st = ks_shape_generate(shape, &p, out_path, &bytes);
    const ks_gguf_kv *tokens = ks_gguf_find_kv(vocab, "tokenizer.ggml.tokens");
    long long n_vocab = tokens ? (long long)tokens->arr_n : 0;
    ks_gguf_close(vocab);
    if (st != KS_OK) {
        app_report("gen-model", "writing the model", st);
        return 1;
    }
    printf("gen-model: wrote %s: %s (%s) %s, %d layers, n_vocab %lld, seed %llu, %.1f MiB in %.1f s\n", out_path,
           shape->name, shape->arch, ks_dtype_name(p.type), p.n_layer > 0 ? p.n_layer : shape->n_layer, n_vocab,
           (unsigned long long)p.seed, (double)bytes / (1u << 20), ks_time_sec() - pr.t0);
    if (dlm_out) {
        st = ks_eagle3_generate_head(shape, p.n_layer, (int32_t)n_vocab, p.n_ctx > 0 ? p.n_ctx : 2048, p.seed + 1, dlm_out);
        if (st != KS_OK) {
            app_report("gen-model", "writing the retrieval head", st);
            return 1;
        }
        printf("gen-model: wrote %s: random EAGLE-3 retrieval head (BF16, shares the target's embedding)\n", dlm_out);
    }
    return 0;
}
