/*
 * select_loop.c — a minimal engine that keeps its own KV cache and asks
 * kvsieve which entries to attend (include/kvsieve_select.h, nothing else
 * from kvsieve).
 *
 * The engine: one attention layer, 4 query heads over 2 KV heads (GQA),
 * head dim 64, a KV cache in one interleaved buffer [n_ctx][K | V] per KV
 * head (so the key view has a row stride of two rows).  The "prompt" is 768
 * random keys with one planted needle: entry NEEDLE of every KV head is a
 * key along a fixed direction u, and every decode query points along u too,
 * so dense attention puts most of its mass on the needle, far from the
 * sinks and the recent window.  Then 32 decode steps: a new random key is
 * appended, the policy selects, attention runs over the selected entries
 * only and is compared with attention over all of them.
 *
 * Checks (exit 1 if one fails):
 *   - every policy the API serves, with a budget covering the context,
 *     selects every entry: its output equals dense attention bit for bit;
 *   - quest at a 25% budget attends the needle at every step (recall of the
 *     dense attention mass >= 0.85);
 *   - h2o at 25%, seeded by kvs_selector_prefill and fed the attention
 *     weights back, keeps the needle too;
 *   - the other policies served run at 25% (recall printed).
 * Usage: select_loop [-v]
 */
#include "kvsieve_select.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_HEAD = 4, N_KV = 2, G = N_HEAD / N_KV, HD = 64, N_CTX = 1024, N_PROMPT = 768, STEPS = 32, NEEDLE = 300 };

static float kvbuf[N_KV][N_CTX][2][HD]; /* the engine's cache: [head][entry][K, V][dim] */
static float u[HD];                     /* the needle direction */
static uint64_t rng = 42;

static float randn(void) { /* sum of uniforms: good enough for a toy */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        s += (float)((rng >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
    }
    return s * 1.7f;
}

static void fill_entry(int h, int e) {
    for (int d = 0; d < HD; d++) {
        kvbuf[h][e][0][d] = randn();
        kvbuf[h][e][1][d] = randn();
    }
    if (e == NEEDLE)
        for (int d = 0; d < HD; d++) kvbuf[h][e][0][d] = 24.0f * u[d];
}

/* Attention of the group's G queries over entries idx[0..n) of KV head h:
 * out [G][HD]; w[i] = probability of idx[i] summed over the group (for
 * feedback); recall of the dense mass when dense_p is given. */
static void attend(int h, const float *q, const int32_t *idx, int32_t n, float *out, float *w) {
    float *sc = malloc(sizeof(float) * (size_t)n);
    if (w) memset(w, 0, sizeof(float) * (size_t)n);
    for (int g = 0; g < G; g++) {
        float mx = -INFINITY, sum = 0;
        for (int32_t i = 0; i < n; i++) {
            float d = 0;
            for (int k = 0; k < HD; k++) d += q[g * HD + k] * kvbuf[h][idx[i]][0][k];
            sc[i] = d / sqrtf((float)HD);
            mx = sc[i] > mx ? sc[i] : mx;
        }
        for (int32_t i = 0; i < n; i++) sum += (sc[i] = expf(sc[i] - mx));
        for (int k = 0; k < HD; k++) out[g * HD + k] = 0;
        for (int32_t i = 0; i < n; i++) {
            float p = sc[i] / sum;
            if (w) w[i] += p;
            for (int k = 0; k < HD; k++) out[g * HD + k] += p * kvbuf[h][idx[i]][1][k];
        }
    }
    free(sc);
}

typedef struct {
    double recall_sum, recall_min;
    int needle_hits, exact_steps;
} result;

/* One policy, one budget: prompt, optional prefill, STEPS decode steps. */
static int run(const char *policy, int32_t budget, bool verbose, result *res) {
    kvs_selector_params p = kvs_selector_default_params();
    p.n_layer = 1;
    p.n_head = N_HEAD;
    p.n_head_kv = N_KV;
    p.head_dim = HD;
    p.n_ctx = N_CTX;
    p.budget = budget;
    p.dense_layers = 0; /* one layer: quest's default (2 dense) would leave nothing to select */
    p.window = 32;
    kvs_selector *sel = NULL;
    if (kvs_selector_create(policy, &p, &sel) != KVS_OK) {
        fprintf(stderr, "select_loop: %s: %s\n", policy, kvs_last_error());
        return 1;
    }
    rng = 42;
    for (int h = 0; h < N_KV; h++)
        for (int e = 0; e < N_PROMPT; e++) fill_entry(h, e);
    kvs_head_kv kv[N_KV];
    for (int h = 0; h < N_KV; h++)
        kv[h] = (kvs_head_kv){.keys = {.data = &kvbuf[h][0][0][0], .type = KVS_TYPE_F32,
                                       .row_stride = sizeof kvbuf[h][0]},
                              .n_entries = N_PROMPT};
    float q[N_KV][G * HD], o_dense[G * HD], o_sel[G * HD], w[N_CTX];
    int32_t all[N_CTX], idx[N_CTX];
    for (int32_t i = 0; i < N_CTX; i++) all[i] = i;
    /* queries: along u with noise */
    #define MAKE_QUERIES()                                                                                             \
        for (int h = 0; h < N_KV; h++)                                                                                 \
            for (int k = 0; k < G * HD; k++) q[h][k] = 4.0f * u[k % HD] + 0.3f * randn();
    int32_t n_obs = kvs_selector_obs_window(sel) < 0 ? 16 : kvs_selector_obs_window(sel);
    if (n_obs > 0) { /* the prompt's last queries, [n_layer][n_obs][n_head][HD] */
        float *obs = malloc(sizeof(float) * (size_t)n_obs * N_HEAD * HD);
        for (int r = 0; r < n_obs; r++) {
            MAKE_QUERIES();
            memcpy(obs + (size_t)r * N_HEAD * HD, q, sizeof q);
        }
        kvs_status st = kvs_selector_prefill(sel, kv, obs, n_obs);
        free(obs);
        if (st != KVS_OK) {
            fprintf(stderr, "select_loop: %s prefill: %s\n", policy, kvs_last_error());
            kvs_selector_destroy(sel);
            return 1;
        }
    }
    *res = (result){.recall_min = 1.0};
    for (int t = 0; t < STEPS; t++) {
        int32_t pos = N_PROMPT + t;
        kvs_step step = {.pos = pos, .entropy = NAN, .varentropy = NAN};
        if (kvs_selector_begin_step(sel, kv, &step) != KVS_OK) goto fail;
        MAKE_QUERIES();
        for (int h = 0; h < N_KV; h++) {
            fill_entry(h, pos); /* this step's K and V, appended */
            kv[h].n_entries = pos + 1;
            kvs_selection out = {.idx = idx, .cap = N_CTX};
            if (kvs_selector_select(sel, kv, 0, h, &(kvs_view){.data = q[h], .type = KVS_TYPE_F32}, &out) != KVS_OK)
                goto fail;
            attend(h, q[h], all, pos + 1, o_dense, w);
            double in = 0, tot = 0;
            for (int32_t i = 0, j = 0; i <= pos; i++) { /* out.idx is ascending */
                tot += w[i];
                if (j < out.n && out.idx[j] == i) in += w[i], j++;
            }
            double recall = in / tot;
            bool needle = false;
            for (int32_t i = 0; i < out.n; i++) needle |= out.idx[i] == NEEDLE;
            attend(h, q[h], out.idx, out.n, o_sel, w);
            if (kvs_selector_wants_feedback(sel) && kvs_selector_feedback(sel, 0, h, out.idx, w, out.n) != KVS_OK)
                goto fail;
            res->recall_sum += recall;
            res->recall_min = recall < res->recall_min ? recall : res->recall_min;
            res->needle_hits += needle;
            res->exact_steps += memcmp(o_sel, o_dense, sizeof o_dense) == 0;
            if (verbose)
                printf("  %s step %d head %d: %d of %d entries, recall %.4f%s\n", policy, t, h, out.n, pos + 1, recall,
                       needle ? ", needle" : "");
        }
    }
    kvs_selector_destroy(sel);
    return 0;
fail:
    fprintf(stderr, "select_loop: %s: %s\n", policy, kvs_last_error());
    kvs_selector_destroy(sel);
    return 1;
}

int main(int argc, char **argv) {
    bool verbose = argc > 1 && !strcmp(argv[1], "-v");
    for (int d = 0; d < HD; d++) u[d] = (d % 3 == 0 ? 1.0f : -0.5f) / sqrtf(HD / 2.0f);
    int failures = 0, cells = N_KV * STEPS;
    printf("%-10s %8s %12s %12s %8s %8s\n", "policy", "budget", "mean recall", "min recall", "needle", "exact");
    /* 1. a budget covering the context is dense attention, for every policy served */
    for (int32_t i = 0; i < kvs_policy_count(); i++) {
        kvs_policy_info info;
        if (kvs_policy_get(i, &info) != KVS_OK) return 1;
        if (!info.api) {
            kvs_selector *no = NULL;
            kvs_selector_params p = kvs_selector_default_params();
            p.n_layer = 1, p.n_head = N_HEAD, p.n_head_kv = N_KV, p.head_dim = HD, p.n_ctx = N_CTX;
            if (kvs_selector_create(info.name, &p, &no) != KVS_ERR_UNSUPPORTED) {
                fprintf(stderr, "FAIL: %s is not served but create did not say unsupported\n", info.name);
                failures++;
            }
            printf("%-10s %8s  (not served: %s)\n", info.name, "-", info.needs_dlm ? "needs a DLM" : "evicts at prefill");
            continue;
        }
        result r;
        if (run(info.name, N_CTX, verbose, &r)) return 1;
        printf("%-10s %8d %12.4f %12.4f %5d/%d %5d/%d\n", info.name, N_CTX, r.recall_sum / cells, r.recall_min,
               r.needle_hits, cells, r.exact_steps, cells);
        if (r.exact_steps != cells) {
            fprintf(stderr, "FAIL: %s with a full budget differs from dense attention\n", info.name);
            failures++;
        }
    }
    /* 2. a quarter of the context, every policy served; quest and h2o must keep the needle */
    for (int32_t i = 0; i < kvs_policy_count(); i++) {
        kvs_policy_info info;
        if (kvs_policy_get(i, &info) != KVS_OK) return 1;
        if (!info.api || !strcmp(info.name, "dense")) continue;
        result r;
        int32_t budget = N_CTX / 4;
        if (run(info.name, budget, verbose, &r)) return 1;
        printf("%-10s %8d %12.4f %12.4f %5d/%d %5d/%d\n", info.name, budget, r.recall_sum / cells, r.recall_min,
               r.needle_hits, cells, r.exact_steps, cells);
        bool must = !strcmp(info.name, "quest") || !strcmp(info.name, "h2o");
        if (must && (r.needle_hits != cells || r.recall_min < 0.85)) {
            fprintf(stderr, "FAIL: %s at 25%% lost the needle (%d of %d, min recall %.3f)\n", info.name, r.needle_hits,
                    cells, r.recall_min);
            failures++;
        }
    }
    printf(failures ? "FAILED (%d)\n" : "ok\n", failures);
    return failures ? 1 : 0;
}
