/*
 * moe.c — the mixture-of-experts FFN (moe.h): route, group by expert, one
 * product per active expert.
 *
 * Why grouped.  A prefill chunk of n rows with k experts each touches up to
 * n_expert experts, each chosen by about n k / n_expert rows.  Running each
 * row through its own experts would be n k matrix-vector products, each
 * streaming a whole expert; grouping the rows of an expert and running one
 * product over them reads each active expert once per chunk and lets the
 * GEMM kernels reuse every weight byte across those rows.  A decode step is
 * the same code with one row (or one per sequence): only the k chosen
 * experts are read, so the bytes a step streams, and the weight_bytes_read
 * the benchmarks divide by, are the active parameters', not the model's.
 *
 * Products are ks_matmul_weight_ex on expert views (any weight type, the
 * pool's threads split each expert's output rows).  Gate and up share one
 * quantization of the gathered rows (x_ready).  The gather, the SwiGLU and
 * the weighted sum are per-row arithmetic over every (row, expert) pair of
 * the call at once (pairs in expert order, so each expert's rows are one
 * contiguous slice its products read and write in place); they run on the
 * pool when large (a prefill), split by pairs (gather, SwiGLU) or by output
 * rows (the sum, so each row's sum is one worker's, in its fixed order).
 *
 * Order of sums.  Each row's output is accumulated over its experts in
 * ascending expert index, whatever the batch holds, and each row of a
 * product is computed by the same kernel arithmetic for any row count: a
 * row's output therefore does not depend on its batch-mates, so decode
 * agrees with prefill, and the per-row reference in tests/test_moe.c is
 * matched bit for bit.
 *
 * gpt-oss (model/arch_gptoss.c) adds biases to the router and to each
 * expert's three products, weighs the selected experts by the softmax of
 * their own logits (ks_moe_route_topk_softmax), and gates with its clamped
 * SwiGLU: g = min(gate, 7), u = clamp(up, -7, 7), out = g sigmoid(1.702 g)
 * (u + 1) (llama.cpp's ggml_swiglu_oai with alpha 1.702 and limit 7, the
 * constants of the HF GptOssExperts).
 */
#include "infer/moe.h"

#include "matmul/matmul.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define FAST_PAIRS 64 /* (row, expert) pairs the decode path takes at most (moe_experts_fast) */

void ks_moe_buf_destroy(ks_moe_buf *b) {
    if (!b) return;
    ks_free_aligned(b->logits);
    ks_free(b->sel);
    ks_free(b->w);
    ks_free(b->start);
    ks_free(b->by_expert);
    ks_free(b->by_w);
    ks_free(b->row_pair);
    ks_free(b->row_fill);
    ks_free_aligned(b->xg);
    ks_free_aligned(b->gate);
    ks_free_aligned(b->up);
    ks_free_aligned(b->yg);
    ks_free_aligned(b->out);
    ks_free_aligned(b->xq);
    ks_free(b);
}

ks_status ks_moe_buf_create(const ks_hparams *hp, int32_t max_rows, ks_moe_buf **out) {
    if (hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert || max_rows <= 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "moe: %d experts, %d used, %d rows", hp->n_expert, hp->n_expert_used,
                       max_rows);
    ks_moe_buf *b = ks_calloc(1, sizeof *b);
    if (!b) return KS_FAIL(KS_ERR_NOMEM, "moe buffers");
    const size_t R = (size_t)max_rows, E = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used;
    const size_t D = (size_t)hp->n_embd;
    /* gate / up hold every (row, expert) pair's n_ff_exp values, or the shared experts' wider rows */
    const size_t SH = (size_t)(hp->n_expert_shared > 1 ? hp->n_expert_shared : 1);
    const size_t F = (size_t)hp->n_ff_exp * (K > SH ? K : SH);
    b->max_rows = max_rows;
    b->n_expert = hp->n_expert;
    b->n_used = hp->n_expert_used;
    b->n_embd = hp->n_embd;
    b->n_ff = hp->n_ff_exp;
    b->logits = ks_malloc_aligned(sizeof(float) * R * E);
    b->sel = ks_malloc(sizeof(int32_t) * R * K);
    b->w = ks_malloc(sizeof(float) * R * K);
    b->start = ks_malloc(sizeof(int32_t) * (E + 1));
    b->by_expert = ks_malloc(sizeof(int32_t) * R * K);
    b->by_w = ks_malloc(sizeof(float) * R * K);
    b->row_pair = ks_malloc(sizeof(int32_t) * R * K);
    b->row_fill = ks_malloc(sizeof(int32_t) * R);
    b->xg = ks_malloc_aligned(sizeof(float) * R * K * D);
    b->gate = ks_malloc_aligned(sizeof(float) * R * F);
    b->up = ks_malloc_aligned(sizeof(float) * R * F);
    b->yg = ks_malloc_aligned(sizeof(float) * R * K * D);
    b->out = ks_malloc_aligned(sizeof(float) * R * D);
    /* the decode path's quantized inputs, one slot a pair: an 8-bit format
     * takes about a byte an element plus its scales (at most 1.14 bytes, Q8_K) */
    b->xq_pairs = (int32_t)(R * K < FAST_PAIRS ? R * K : FAST_PAIRS);
    b->xq_slot = (2 * (D > (size_t)hp->n_ff_exp ? D : (size_t)hp->n_ff_exp) + 1024 + 63) & ~(size_t)63;
    b->xq = ks_malloc_aligned(b->xq_slot * (size_t)b->xq_pairs);
    if (!b->logits || !b->sel || !b->w || !b->start || !b->by_expert || !b->by_w || !b->row_pair || !b->row_fill || !b->xg || !b->gate || !b->up ||
        !b->yg || !b->out || !b->xq) {
        ks_moe_buf_destroy(b);
        return KS_FAIL(KS_ERR_NOMEM, "moe buffers of %zu rows, %zu experts", R, E);
    }
    /* touched now, so first use inside a step faults nothing in (as the context's activations) */
    memset(b->xg, 0, sizeof(float) * R * K * D);
    memset(b->gate, 0, sizeof(float) * R * F);
    memset(b->up, 0, sizeof(float) * R * F);
    memset(b->yg, 0, sizeof(float) * R * K * D);
    memset(b->out, 0, sizeof(float) * R * D);
    *out = b;
    return KS_OK;
}


size_t ks_moe_matmul_scratch_bytes(const ks_model *m, int64_t rows) {
    size_t need = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const ks_moe_layer *L = m->layers[il].moe;
        if (!L) continue;
        const ks_weight *ws[] = {&L->router, &L->gate[0], &L->up[0], &L->down[0], &L->sh_gate, &L->sh_up, &L->sh_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            if (!ws[i]->data) continue; /* no shared experts */
            size_t s = ks_matmul_scratch_bytes(ws[i]->type, ws[i]->cols, rows);
            if (s > need) need = s;
        }
    }
    return need;
}

size_t ks_moe_worker_scratch_bytes(const ks_model *m) {
    size_t need = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const ks_moe_layer *L = m->layers[il].moe;
        if (!L) continue;
        size_t s = ks_matmul_worker_scratch_bytes(&L->router);
        if (s > need) need = s;
        const ks_weight *sh[] = {&L->sh_gate, &L->sh_up, &L->sh_down};
        for (size_t i = 0; i < 3; i++)
            if (sh[i]->data && (s = ks_matmul_worker_scratch_bytes(sh[i])) > need) need = s;
        for (int e = 0; e < m->hp.n_expert; e++) {
            const ks_weight *ws[] = {&L->gate[e], &L->up[e], &L->down[e]};
            for (size_t i = 0; i < 3; i++) {
                s = ks_matmul_worker_scratch_bytes(ws[i]);
                if (s > need) need = s;
            }
        }
    }
    return need;
}

/* the k largest logits into sel, best first, by insertion into a list
 * (strict > keeps the lower index ahead on a tie) */
static void moe_top_k(const float *logits, int n_expert, int k, int32_t *sel) {
    int n = 0;
    for (int e = 0; e < n_expert; e++) {
        if (n == k && !(logits[e] > logits[sel[k - 1]])) continue;
        int i = n < k ? n++ : k - 1;
        while (i > 0 && logits[e] > logits[sel[i - 1]]) {
            sel[i] = sel[i - 1];
            i--;
        }
        sel[i] = e;
    }
}

void ks_moe_route(const float *logits, int n_expert, int k, bool norm, int32_t *sel, float *w) {
    float mx = logits[0];
    for (int e = 1; e < n_expert; e++)
        if (logits[e] > mx) mx = logits[e];
    /* the k largest logits are the k largest probabilities */
    moe_top_k(logits, n_expert, k, sel);
    float z = 0;
    for (int e = 0; e < n_expert; e++) z += expf(logits[e] - mx);
    float sum = 0;
    for (int i = 0; i < k; i++) {
        w[i] = expf(logits[sel[i]] - mx) / z;
        sum += w[i];
    }
    if (norm) {
        if (sum < 6.103515625e-5f) sum = 6.103515625e-5f; /* llama.cpp's clamp: f16's smallest normal */
        for (int i = 0; i < k; i++) w[i] /= sum;
    }
}

void ks_moe_route_topk_softmax(const float *logits, int n_expert, int k, int32_t *sel, float *w) {
    moe_top_k(logits, n_expert, k, sel);
    const float mx = logits[sel[0]]; /* the best first */
    float z = 0;
    for (int i = 0; i < k; i++) z += w[i] = expf(logits[sel[i]] - mx);
    for (int i = 0; i < k; i++) w[i] /= z;
}

/* ------------------------------------------------------------- SwiGLU -- */
typedef struct {
    float *gate;
    const float *up;
    int64_t n; /* elements */
    bool oai;  /* gpt-oss's clamped form */
} swiglu_job;

#define OAI_ALPHA 1.702f
#define OAI_LIMIT 7.0f

static void swiglu_range(float *g, const float *u, int64_t i0, int64_t i1, bool oai) {
    if (oai) {
        for (int64_t i = i0; i < i1; i++) {
            float x = fminf(g[i], OAI_LIMIT), y = fminf(fmaxf(u[i], -OAI_LIMIT), OAI_LIMIT);
            g[i] = x / (1.0f + expf(OAI_ALPHA * -x)) * (y + 1.0f);
        }
        return;
    }
    for (int64_t i = i0; i < i1; i++) {
        float x = g[i];
        g[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

static void swiglu_worker(void *arg, int ith, int nth) {
    const swiglu_job *j = arg;
    int64_t i0, i1;
    ks_pool_share(j->n, ith, nth, &i0, &i1);
    swiglu_range(j->gate, j->up, i0, i1, j->oai);
}

/* rows[m][width] += bias[width], one bias for every row */
static void add_bias_rows(float *rows, int m, int64_t width, const float *bias) {
    for (int i = 0; i < m; i++) {
        float *r = rows + (size_t)i * (size_t)width;
        for (int64_t d = 0; d < width; d++) r[d] += bias[d];
    }
}

#define SWIGLU_PARALLEL_MIN (1 << 15) /* elements: below, the caller alone (a dispatch costs microseconds) */

static void matmul_count(ks_pool *pool, const ks_weight *w, const float *X, int n, float *Y, void *scratch, bool x_ready,
                         ks_moe_counters *cnt) {
    double t0 = ks_time_sec();
    ks_matmul_weight_ex(pool, w, X, n, Y, scratch, x_ready);
    if (!cnt) return;
    cnt->matmul_seconds += ks_time_sec() - t0;
    cnt->macs += (uint64_t)w->rows * (uint64_t)w->cols * (uint64_t)n;
    cnt->weight_bytes += ks_weight_bytes(w);
}

/* ------------------------------------------------ gather / scatter -- */
typedef struct {
    const ks_moe_buf *b;
    const float *xn;
    int n, K;
} moe_copy_job;

/* xg[i] = xn[by_expert[i]] for the pairs i of this worker's share */
static void gather_worker(void *arg, int ith, int nth) {
    const moe_copy_job *j = arg;
    const size_t D = (size_t)j->b->n_embd;
    int64_t i0, i1;
    ks_pool_share((int64_t)j->n * j->K, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; i++)
        memcpy(j->b->xg + (size_t)i * D, j->xn + (size_t)j->b->by_expert[i] * D, sizeof(float) * D);
}

/* out[r] = sum over r's experts, ascending index, of w yg[pair], for the
 * rows of this worker's share: each row is one worker's, so the order of its
 * sum is the per-row loop's whatever the thread count */
static void scatter_worker(void *arg, int ith, int nth) {
    const moe_copy_job *j = arg;
    const ks_moe_buf *b = j->b;
    const size_t D = (size_t)b->n_embd;
    int64_t r0, r1;
    ks_pool_share(j->n, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        float *o = b->out + (size_t)r * D;
        memset(o, 0, sizeof(float) * D);
        for (int k = 0; k < j->K; k++) {
            const int32_t i = b->row_pair[(size_t)r * j->K + k];
            const float *y = b->yg + (size_t)i * D;
            const float wi = b->by_w[i];
            for (size_t d = 0; d < D; d++) o[d] += wi * y[d];
        }
    }
}

#define COPY_PARALLEL_MIN (1 << 16) /* floats copied: below, the caller alone */

static size_t fast_slot_bytes(const ks_weight *w) { return (ks_matmul_scratch_bytes(w->type, w->cols, 1) + 63) & ~(size_t)63; }

/* ------------------------------------------- decode: one pool run each -- */
/* A decode step of one token (or a batch whose rows chose distinct experts)
 * gives every active expert one row.  Run as above, that is three products
 * per expert, each its own parallel-for of a few hundred rows: 8 experts x 3
 * = 24 dispatches and barriers a layer (qwen3-30b-a3b), each costing a wake-up
 * and a wait for the slower thread.  Here the gate and up rows of all active
 * experts are one list split between the threads in one run, and the down
 * rows another: two runs a layer.  Every output row is the same one-row
 * kernel over the same quantized input as in the per-expert products (the
 * split only decides which thread computes it), so the result is the same
 * bits (tests/test_moe.c). */
typedef struct {
    const ks_moe_layer *L;
    const ks_moe_buf *b;
    const int32_t *act; /* [n_act] the active experts, ascending; expert act[a] has pair start[act[a]] */
    int n_act;
    int64_t F, D;
    bool down;          /* false: gate and up (2F rows an expert); true: down (D rows) */
    uint8_t *scratch;   /* pair p's quantized input at p * slot (the buffer's xq) */
    size_t slot;
    atomic_llong next;  /* the next unclaimed unit */
} fast_job;

#define FAST_UNIT 16 /* rows: the products' own split alignment (matmul.c) */
#define FAST_CLAIM 8 /* units a thread claims at a time */

/* The threads claim FAST_CLAIM units at a time from a shared cursor instead
 * of splitting the list in halves up front: on a host whose cores other jobs
 * share, a thread descheduled mid-run no longer leaves its half for the other
 * to wait on; the faster thread takes what is left.  Which thread computes a
 * row does not change its bits. */
static void fast_worker(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    fast_job *j = arg;
    const ks_moe_buf *b = j->b;
    const int64_t per = j->down ? j->D : 2 * j->F; /* rows an expert */
    const int64_t units_per = (per + FAST_UNIT - 1) / FAST_UNIT, total = units_per * j->n_act;
    for (int64_t u0; (u0 = atomic_fetch_add(&j->next, FAST_CLAIM)) < total;) {
        const int64_t u1 = u0 + FAST_CLAIM < total ? u0 + FAST_CLAIM : total;
        for (int64_t u = u0; u < u1;) {
            const int a = (int)(u / units_per);
            const int e = j->act[a];
            const int32_t p = b->start[e];                     /* the expert's one pair */
            int64_t r0 = (u % units_per) * FAST_UNIT;
            int64_t uend = (int64_t)(a + 1) * units_per < u1 ? (int64_t)(a + 1) * units_per : u1;
            int64_t r1 = (uend - (int64_t)a * units_per) * FAST_UNIT;
            if (r1 > per) r1 = per;
            u = uend;
            /* the rows [r0, r1) of this expert's list: gate rows [0, F), up rows [F, 2F), or down rows */
            while (r0 < r1) {
                const ks_weight *w;
                const float *x;
                float *y;
                int64_t base, end;
                if (j->down) {
                    w = &j->L->down[e], x = b->gate + (size_t)p * j->F, y = b->yg + (size_t)p * j->D, base = 0, end = per;
                } else if (r0 < j->F) {
                    w = &j->L->gate[e], x = b->xg + (size_t)p * j->D, y = b->gate + (size_t)p * j->F, base = 0, end = j->F;
                } else {
                    w = &j->L->up[e], x = b->xg + (size_t)p * j->D, y = b->up + (size_t)p * j->F, base = j->F, end = per;
                }
                const int64_t s1 = r1 < end ? r1 : end;
                /* fast_ok checked that every cut here falls on w's row alignment */
                KS_ASSERT((r0 - base) % ks_matmul_row_align(w) == 0 && (s1 - base) % ks_matmul_row_align(w) == 0);
                const size_t rb = ks_dtype_row_bytes(w->type, w->cols);
                ks_weight view = *w;
                view.data = (const uint8_t *)w->data + (size_t)(r0 - base) * rb;
                view.rows = s1 - r0;
                ks_matmul_weight_ex(NULL, &view, x, 1, y + (r0 - base), j->scratch + (size_t)p * j->slot, true);
                r0 = s1;
            }
        }
    }
}

/* Whether a product of the path above can cut w's rows where it does: at
 * multiples of FAST_UNIT and at w's end (a row range of the file layout or of
 * the eight-row groups is a matrix; of a panel layout it is not). */
static bool fast_cuts(const ks_weight *w) {
    const int64_t a = ks_matmul_row_align(w);
    return a > 0 && FAST_UNIT % a == 0 && w->rows % a == 0;
}

/* Whether the active experts of this call can take the path above: one row
 * each, layouts the path can cut (fast_cuts), gate and up alike (type,
 * layout: one quantization of their input serves both), no biases (gpt-oss
 * adds them per product; it keeps the general path), few enough pairs for
 * the scratch. */
static bool fast_ok(const ks_moe_layer *L, const ks_moe_buf *b, int n, int K, const int32_t *act, int n_act) {
    if (n * K > b->xq_pairs || n_act != n * K || L->gate_b || L->up_b || L->down_b) return false;
    for (int a = 0; a < n_act; a++) {
        const int e = act[a];
        const ks_weight *g = &L->gate[e], *u = &L->up[e], *d = &L->down[e];
        if (b->start[e + 1] - b->start[e] != 1 || !fast_cuts(g) || !fast_cuts(u) || !fast_cuts(d) ||
            g->layout != u->layout || g->type != u->type || g->cols != u->cols || fast_slot_bytes(g) > b->xq_slot ||
            fast_slot_bytes(d) > b->xq_slot)
            return false;
    }
    return true;
}

static void moe_experts_fast(ks_pool *pool, const ks_moe_layer *L, ks_moe_buf *b, const int32_t *act, int n_act,
                             int64_t F, int64_t D, bool oai, ks_moe_counters *cnt) {
    double t0 = ks_time_sec();
    fast_job j = {L, b, act, n_act, F, D, false, b->xq, b->xq_slot, 0};
    atomic_init(&j.next, 0);
    for (int a = 0; a < n_act; a++) { /* expert act[a]'s one pair */
        const int32_t p = b->start[act[a]];
        ks_matmul_quantize_x(&L->gate[act[a]], b->xg + (size_t)p * D, 0, j.scratch + (size_t)p * j.slot);
    }
    if (pool) ks_pool_run(pool, fast_worker, &j);
    else fast_worker(&j, 0, 1);
    swiglu_range(b->gate, b->up, 0, (int64_t)n_act * F, oai);
    j.down = true;
    atomic_store(&j.next, 0);
    for (int a = 0; a < n_act; a++) {
        const int32_t p = b->start[act[a]];
        ks_matmul_quantize_x(&L->down[act[a]], b->gate + (size_t)p * F, 0, j.scratch + (size_t)p * j.slot);
    }
    if (pool) ks_pool_run(pool, fast_worker, &j);
    else fast_worker(&j, 0, 1);
    if (!cnt) return;
    cnt->fast_calls++;
    cnt->matmul_seconds += ks_time_sec() - t0;
    for (int a = 0; a < n_act; a++) {
        const int e = act[a];
        const ks_weight *ws[3] = {&L->gate[e], &L->up[e], &L->down[e]};
        for (int i = 0; i < 3; i++) {
            cnt->macs += (uint64_t)ws[i]->rows * (uint64_t)ws[i]->cols;
            cnt->weight_bytes += ks_weight_bytes(ws[i]);
        }
        cnt->expert_runs++;
    }
}

void ks_moe_ffn(ks_pool *pool, const ks_hparams *hp, const ks_moe_layer *L, int n, const float *xn, ks_moe_buf *b,
                void *mm_scratch, ks_moe_counters *cnt) {
    const int E = hp->n_expert, K = hp->n_expert_used, F = hp->n_ff_exp;
    const size_t D = (size_t)hp->n_embd;
    KS_ASSERT(n > 0 && n <= b->max_rows && E == b->n_expert && K == b->n_used && F == b->n_ff);
    /* route */
    matmul_count(pool, &L->router, xn, n, b->logits, mm_scratch, false, cnt);
    if (L->router_b) add_bias_rows(b->logits, n, E, L->router_b);
    for (int r = 0; r < n; r++)
        if (hp->expert_softmax_topk)
            ks_moe_route_topk_softmax(b->logits + (size_t)r * E, E, K, b->sel + (size_t)r * K, b->w + (size_t)r * K);
        else
            ks_moe_route(b->logits + (size_t)r * E, E, K, hp->expert_norm, b->sel + (size_t)r * K,
                         b->w + (size_t)r * K);
    if (hp->expert_weights_scale != 0 && hp->expert_weights_scale != 1) /* deepseek2's routed_scaling_factor */
        for (int i = 0; i < n * K; i++) b->w[i] *= hp->expert_weights_scale;
    /* group: a counting sort of the (row, expert) pairs by expert, rows
     * ascending within an expert (each row picks an expert at most once) */
    int32_t *start = b->start;
    memset(start, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int i = 0; i < n * K; i++) start[b->sel[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    for (int r = 0; r < n; r++)
        for (int i = 0; i < K; i++) {
            int e = b->sel[(size_t)r * K + i];
            int at = start[e]++;
            b->by_expert[at] = r;
            b->by_w[at] = b->w[(size_t)r * K + i];
        }
    for (int e = E; e > 0; e--) start[e] = start[e - 1]; /* the fill advanced each start to the next's */
    start[0] = 0;
    /* each row's pairs in ascending expert order (the pairs are sorted by expert) */
    int32_t *fill = b->row_fill;
    memset(fill, 0, sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n * K; i++) {
        const int r = b->by_expert[i];
        b->row_pair[(size_t)r * K + fill[r]++] = i;
    }
    /* gather every pair's input row at once: expert e's rows are xg[start[e], start[e+1]) */
    moe_copy_job cj = {b, xn, n, K};
    const bool par = pool && (int64_t)n * K * (int64_t)D >= COPY_PARALLEL_MIN;
    if (par) ks_pool_run(pool, gather_worker, &cj);
    else gather_worker(&cj, 0, 1);
    /* a step that gives each active expert one row: two parallel runs for all of them */
    int32_t act[FAST_PAIRS];
    int n_act = 0;
    if (n * K <= b->xq_pairs)
        for (int e = 0; e < E; e++)
            if (start[e + 1] > start[e]) act[n_act++] = e;
    if (n * K <= b->xq_pairs && fast_ok(L, b, n, K, act, n_act)) {
        moe_experts_fast(pool, L, b, act, n_act, F, (int64_t)D, hp->ffn_swiglu_oai, cnt);
        goto sum;
    }
    /* gate and up of every active expert over its rows, in place in the pair order */
    for (int e = 0; e < E; e++) {
        const int m = start[e + 1] - start[e];
        if (!m) continue;
        const float *xg = b->xg + (size_t)start[e] * D;
        float *g = b->gate + (size_t)start[e] * F, *u = b->up + (size_t)start[e] * F;
        const ks_weight *wg = &L->gate[e], *wu = &L->up[e];
        matmul_count(pool, wg, xg, m, g, mm_scratch, false, cnt);
        bool same = wg->type == wu->type && wg->cols == wu->cols && wg->layout == wu->layout;
        matmul_count(pool, wu, xg, m, u, mm_scratch, same, cnt);
        if (L->gate_b) add_bias_rows(g, m, F, L->gate_b + (size_t)e * F);
        if (L->up_b) add_bias_rows(u, m, F, L->up_b + (size_t)e * F);
    }
    /* one SwiGLU over all pairs (elementwise: the same values as per expert) */
    swiglu_job j = {b->gate, b->up, (int64_t)n * K * F, hp->ffn_swiglu_oai};
    if (pool && j.n >= SWIGLU_PARALLEL_MIN) ks_pool_run(pool, swiglu_worker, &j);
    else swiglu_range(j.gate, j.up, 0, j.n, j.oai);
    for (int e = 0; e < E; e++) {
        const int m = start[e + 1] - start[e];
        if (!m) continue;
        float *y = b->yg + (size_t)start[e] * D;
        matmul_count(pool, &L->down[e], b->gate + (size_t)start[e] * F, m, y, mm_scratch, false, cnt);
        if (L->down_b) add_bias_rows(y, m, (int64_t)D, L->down_b + (size_t)e * D);
        if (cnt) cnt->expert_runs++;
    }
sum:
    /* the weighted sum per row */
    if (par) ks_pool_run(pool, scatter_worker, &cj);
    else scatter_worker(&cj, 0, 1);
    if (L->sh_gate.data) { /* shared experts: every row, added after the routed sum as llama.cpp's graph does */
        const ks_weight *wg = &L->sh_gate, *wu = &L->sh_up;
        matmul_count(pool, wg, xn, n, b->gate, mm_scratch, false, cnt);
        bool same = wg->type == wu->type && wg->cols == wu->cols && wg->layout == wu->layout;
        matmul_count(pool, wu, xn, n, b->up, mm_scratch, same, cnt);
        swiglu_job sj = {b->gate, b->up, (int64_t)n * wg->rows, false};
        if (pool && sj.n >= SWIGLU_PARALLEL_MIN) ks_pool_run(pool, swiglu_worker, &sj);
        else swiglu_range(sj.gate, sj.up, 0, sj.n, false);
        matmul_count(pool, &L->sh_down, b->gate, n, b->yg, mm_scratch, false, cnt);
        for (size_t i = 0; i < (size_t)n * D; i++) b->out[i] += b->yg[i];
    }
}
