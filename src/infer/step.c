/*
 * step.c — the public steps of a context: prefill a prompt, decode a batch,
 * fill a sequence with synthetic KV for benchmarks.
 *
 * The steps validate everything a caller passes before any state changes,
 * apply the memory plan for the length the step reaches, and give each
 * sequence's own policy (ks_seq_set_policy) its hooks in order, every
 * instance seeing only its own rows while the forward pass runs over all:
 * on_prefill after a prompt (with the queries it asked for, or those of its
 * pseudo tokens), before_step and the prefetch of a global selection before
 * a decode step, entropy of each output for policies that steer by it.  A failed prefill resets its sequence, so nothing
 * half-appended survives.
 */
#include "infer/internal.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* Entropy and varentropy (nats) of softmax(logits): H = -sum p log p,
 * V = sum p (log p + H)^2 — CHESS's quality signals. */
static void entropy_of(const float *logits, int32_t n, float *H, float *Var) {
    float mx;
    double lz = ks_log_sum_exp(logits, n, &mx), h = 0, m2 = 0;
    for (int32_t i = 0; i < n; i++) {
        double lp = (double)logits[i] - mx - lz, p = exp(lp);
        h -= p * lp;
        m2 += p * lp * lp;
    }
    *H = (float)h;
    *Var = (float)(m2 - h * h > 0 ? m2 - h * h : 0);
}

static ks_status check_tokens(const ks_context *c, const int32_t *tokens, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->model->hp.n_vocab)
            return KS_FAIL(KS_ERR_INVALID_ARG, "token %d at index %d is outside the vocabulary [0, %d)", tokens[i], i,
                           c->model->hp.n_vocab);
    return KS_OK;
}

/* DapQ-style pseudo queries: run the policy's pseudo tokens at the positions
 * that follow the prompt and keep their queries in obs_q.  Their KV stays
 * (the last *n_obs entries of every head of seq) for the policy's on_prefill
 * to score over; drop_pseudo removes it afterwards.  The sequence's position
 * stays where the prompt ended. */
static ks_status prefill_pseudo(ks_context *c, int32_t seq, const int32_t *prompt, int32_t n, int32_t *n_obs) {
    const ks_hparams *hp = &c->model->hp;
    int32_t cap = c->max_rows < 1024 ? c->max_rows : 1024, room = c->n_ctx - c->seq_len[seq];
    if (room < cap) cap = room; /* pseudo tokens only ever use the room after the prompt */
    *n_obs = 0;
    if (cap <= 0) return KS_OK;
    int32_t *pt = ks_malloc(sizeof(int32_t) * (size_t)cap);
    if (!pt) return KS_FAIL(KS_ERR_NOMEM, "%d pseudo tokens", cap);
    int32_t *sq = NULL, *ps = NULL, *obs = NULL;
    int32_t np = ks_policy_pseudo_tokens(ks_infer_policy_of(c, seq), prompt, n, pt, cap);
    ks_status st = KS_OK;
    if (np <= 0) goto done;
    if (np > cap || c->seq_len[seq] + np > c->n_ctx) {
        st = KS_FAIL(KS_ERR_CONTEXT_FULL, "%d pseudo tokens do not fit after the prompt (context %d)", np, c->n_ctx);
        goto done;
    }
    if ((st = check_tokens(c, pt, np)) != KS_OK) goto done;
    sq = ks_malloc(sizeof(int32_t) * (size_t)np);
    ps = ks_malloc(sizeof(int32_t) * (size_t)np);
    obs = ks_malloc(sizeof(int32_t) * (size_t)np);
    if (!sq || !ps || !obs) {
        st = KS_FAIL(KS_ERR_NOMEM, "rows of %d pseudo tokens", np);
        goto done;
    }
    for (int32_t i = 0; i < np; i++) {
        sq[i] = seq;
        ps[i] = c->seq_len[seq] + i;
        obs[i] = i;
    }
    ks_free(c->obs_q);
    c->obs_cap = np;
    c->obs_q = ks_malloc(sizeof(float) * (size_t)hp->n_layer * np * hp->n_head * hp->head_dim);
    if (!c->obs_q) {
        c->obs_cap = 0;
        st = KS_FAIL(KS_ERR_NOMEM, "queries of %d pseudo tokens", np);
        goto done;
    }
    st = ks_infer_forward_rows(c, np, sq, ps, pt, NULL, NULL, obs);
    if (st == KS_OK) *n_obs = np;
done:
    ks_free(pt);
    ks_free(sq);
    ks_free(ps);
    ks_free(obs);
    return st;
}

/* Remove the pseudo tokens' KV: the last np entries of every head of seq
 * (the policy's eviction kept them, and their order). */
static ks_status drop_pseudo(ks_context *c, int32_t seq, int32_t np) {
    const ks_hparams *hp = &c->model->hp;
    ks_status st = KS_OK;
    for (int32_t l = 0; l < hp->n_layer && st == KS_OK; l++)
        for (int32_t h = 0; h < hp->n_head_kv && st == KS_OK; h++) {
            int32_t n = ks_kv_n_entries(c->kv, seq, l, h);
            if (n < np) return KS_FAIL(KS_ERR_INVALID_ARG, "layer %d head %d lost pseudo entries (%d < %d)", l, h, n, np);
            st = ks_kv_truncate(c->kv, seq, l, h, n - np);
        }
    return st;
}

/* A slot that grew on one worker this call is grown on all of them now, so
 * the next step allocates nothing whichever worker takes which head. */
static void reserve_scratch(ks_context *c) {
    uint64_t epoch = ks_scratch_epoch();
    if (epoch == c->scratch_epoch) return;
    ks_pool_reserve_scratch(c->pool);
    c->scratch_epoch = epoch;
}

/* Prefill rows tokens[0, n) after what sequence seq holds.  The prefill
 * hooks see the prompt full[0, n_full), of which these rows are the last n
 * (full == tokens for a plain prefill; the whole prompt after a restored
 * prefix, infer/prefix_context.c), so a prompt split into a restored prefix and
 * computed rows leaves a policy exactly where one prefill of it does: the
 * observation rows must lie among the computed ones.  hooks: this call ends
 * the prompt (pseudo tokens and on_prefill run).  pc, when set, takes the
 * whole blocks of full[0, n_full) after the forward (before the hooks, so
 * an evictor's cut is per request) and, at the prompt's end, the policy's
 * own per-token state after the hooks. */
static ks_status prefill_impl(ks_context *c, int32_t seq, const int32_t *tokens, int32_t n, float *logits,
                              float *all_logits, const int32_t *full, int32_t n_full, bool hooks, ks_prefix_cache *pc) {
    if (!c || !tokens) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL context or tokens");
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, c->n_seq);
    if (n <= 0) return KS_FAIL(KS_ERR_INVALID_ARG, "empty prompt (%d tokens)", n);
    if ((int64_t)c->seq_len[seq] + n > c->n_ctx)
        return KS_FAIL(KS_ERR_CONTEXT_FULL, "%d tokens + %d already in sequence %d exceed the context of %d", n,
                       c->seq_len[seq], seq, c->n_ctx);
    KS_TRY(check_tokens(c, tokens, n));
    if (ks_kv_seq_parked(c->kv, seq))
        return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d is parked: ks_seq_unpark it before prefilling", seq);
    if (c->mm_worker_bytes && !ks_scratch(KS_SCRATCH_KERNEL, c->mm_worker_bytes)) /* this thread runs kernels too */
        return KS_FAIL(KS_ERR_NOMEM, "matmul tiles of %zu bytes", c->mm_worker_bytes);
    KS_TRY(ks_infer_plan_apply(c, n, c->seq_len[seq] == 0, (int64_t)c->seq_len[seq] + n));
    const ks_hparams *hp = &c->model->hp;
    ks_policy *pol = ks_infer_policy_of(c, seq); /* the sequence's own policy */
    int32_t obs_window = ks_infer_pol_of(c, seq)->obs_window;
    double t0 = ks_time_sec();
    int chunk = c->params.n_batch;
    /* a sparse prefill's chunks end on the grid of blocks (attend.c), so that a block's rows
     * are computed together whatever n_batch is; a call that starts off the grid, or chunks
     * too small for a block, split one: the sequence's blocks are not cached from then on */
    bool sparse = c->seq_prefill[seq].on;
    if (sparse && (c->seq_len[seq] % KS_PREFILL_BLOCK || chunk < KS_PREFILL_BLOCK)) c->seq_offgrid[seq] = 1;
    if (sparse && chunk >= KS_PREFILL_BLOCK) chunk = chunk / KS_PREFILL_BLOCK * KS_PREFILL_BLOCK;
    size_t V = (size_t)hp->n_vocab;
    int32_t skip = n_full - n; /* rows of the prompt before these */
    int32_t first_pos = c->seq_len[seq] - skip;
    int32_t n_obs = !hooks ? 0 : obs_window < 0 ? n_full : (obs_window < n_full ? obs_window : n_full);
    if (n_obs > n)
        return KS_FAIL(KS_ERR_INVALID_ARG, "the policy's %d observation rows reach into the %d restored prompt rows",
                       n_obs, skip);
    int32_t *sq = ks_malloc(sizeof(int32_t) * chunk), *ps = ks_malloc(sizeof(int32_t) * chunk);
    int32_t *obs = ks_malloc(sizeof(int32_t) * chunk);
    bool *want = ks_calloc((size_t)chunk, sizeof(bool));
    ks_free(c->obs_q);
    c->obs_q = NULL;
    c->obs_cap = n_obs;
    if (n_obs > 0) c->obs_q = ks_malloc(sizeof(float) * (size_t)hp->n_layer * n_obs * hp->n_head * hp->head_dim);
    float *last = logits ? logits : (ks_policy_wants_entropy(pol) ? ks_malloc(sizeof(float) * V) : NULL);
    ks_status st = KS_OK;
    if (!sq || !ps || !obs || !want || (n_obs > 0 && !c->obs_q) || (!logits && ks_policy_wants_entropy(pol) && !last))
        st = KS_FAIL(KS_ERR_NOMEM, "prefill rows of a %d-token chunk", chunk);
    for (int32_t off = 0, m = 0; off < n && st == KS_OK; off += m) {
        m = n - off < chunk ? n - off : chunk;
        /* a sparse chunk that does not end the call ends on the grid (after an off-grid start) */
        int32_t over = sparse && off + m < n ? (c->seq_len[seq] + m) % KS_PREFILL_BLOCK : 0;
        if (over < m) m -= over;
        bool last_chunk = off + m == n;
        for (int i = 0; i < m; i++) {
            sq[i] = seq;
            ps[i] = c->seq_len[seq] + i;
            want[i] = all_logits != NULL || (last != NULL && last_chunk && i == m - 1);
            obs[i] = off + i >= n - n_obs ? off + i - (n - n_obs) : -1;
        }
        float *dst = all_logits ? all_logits + (size_t)off * V : last;
        st = ks_infer_forward_rows(c, m, sq, ps, tokens + off, want, dst, n_obs > 0 ? obs : NULL);
        if (st == KS_OK) c->seq_len[seq] += m;
        /* the pages of local layers the next chunk no longer sees; kept whole
         * while a prefix cache takes or gave this prompt's blocks */
        if (st == KS_OK && pc) c->swa_hold[seq] = 1;
        if (st == KS_OK) st = ks_infer_swa_trim(c, seq);
    }
    if (st == KS_OK && all_logits && last) memcpy(last, all_logits + (size_t)(n - 1) * V, V * sizeof(float));
    /* every piece's whole blocks are final once computed (pieces are only
     * split for policies without prefill hooks): a long prompt cancelled
     * halfway leaves what it computed */
    /* a sparse prefill's blocks go under a key of their own (the canonical
     * prefill policy in the chain's root: prefix_context.c), which only a
     * prefill of the same setting reads */
    if (st == KS_OK && pc) st = ks_prefix_capture_kv(c, pc, seq, full, n_full);
    int32_t n_pseudo = 0;
    if (st == KS_OK && hooks) st = prefill_pseudo(c, seq, full, n_full, &n_pseudo);
    if (st == KS_OK && hooks && n_pseudo > 0) {
        /* the part that asked for them scores with their KV still in the heads (its
         * softmax has the pseudo keys in scope), then the KV goes, then the other parts */
        ks_prefill_info info = {.seq = seq, .n_prompt = n_full, .prompt = full, .n_obs = n_pseudo, .obs_q = c->obs_q,
                                .pseudo = true, .n_pseudo = n_pseudo, .first_pos = first_pos};
        st = ks_policy_on_prefill_split(pol, &info, true);
        if (st == KS_OK) st = drop_pseudo(c, seq, n_pseudo);
        info.n_pseudo = 0;
        if (st == KS_OK) st = ks_policy_on_prefill_split(pol, &info, false);
    } else if (st == KS_OK && hooks) {
        ks_prefill_info info = {.seq = seq, .n_prompt = n_full, .prompt = full, .n_obs = n_obs, .obs_q = c->obs_q,
                                .first_pos = first_pos};
        st = ks_policy_on_prefill(pol, &info);
    }
    if (st == KS_OK && hooks && pc) st = ks_prefix_capture_state(c, pc, seq, full, n_full);
    if (st == KS_OK && last && ks_policy_wants_entropy(pol))
        entropy_of(last, (int32_t)V, &c->entropy[seq], &c->varentropy[seq]);
    ks_free(c->obs_q);
    c->obs_q = NULL;
    c->obs_cap = 0;
    if (last != logits) ks_free(last);
    ks_free(sq);
    ks_free(ps);
    ks_free(obs);
    ks_free(want);
    if (st != KS_OK) {
        ks_seq_reset(c, seq); /* nothing half-appended survives */
        return st;
    }
    c->stats.tokens_prefilled += (uint64_t)n;
    c->stats.prefill_seconds += ks_time_sec() - t0;
    reserve_scratch(c);
    return KS_OK;
}

ks_status ks_prefill(ks_context *c, int32_t seq, const int32_t *tokens, int32_t n, float *logits,
                     float *all_logits) {
    return prefill_impl(c, seq, tokens, n, logits, all_logits, tokens, n, true, NULL);
}

ks_status ks_prefill_rest(ks_context *c, ks_prefix_cache *pc, int32_t seq, const int32_t *prompt, int32_t n,
                          int32_t upto, float *logits) {
    if (!c || !prompt) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL context or prompt");
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, c->n_seq);
    int32_t have = c->seq_len[seq];
    if (upto > n || upto <= have)
        return KS_FAIL(KS_ERR_INVALID_ARG, "prefill of prompt rows [%d, %d) of %d: nothing or out of range", have, upto, n);
    bool end = upto == n;
    return prefill_impl(c, seq, prompt + have, upto - have, end ? logits : NULL, NULL, prompt, upto, end, pc);
}

/* A restore (prefix_context.c) and the rest of the prompt: here, beside the
 * step it ends with, so that prefix_context.c does not call back into this
 * file, which calls it (capture). */
ks_status ks_prefill_cached(ks_context *c, ks_prefix_cache *pc, int32_t seq, const int32_t *prompt, int32_t n,
                            float *logits, int32_t *n_cached) {
    int32_t hit = 0;
    KS_TRY(ks_prefix_restore(c, pc, seq, prompt, n, &hit));
    KS_TRY(ks_prefill_rest(c, pc, seq, prompt, n, n, logits));
    if (n_cached) *n_cached = hit;
    return KS_OK;
}

/* Each policy instance with rows in the step gets before_step for its own
 * rows (in batch order), then, for a global one, the prefetch of its
 * selection.  One instance serving every row sees exactly the whole step.
 * ent: [2n] entropy then varentropy of each row. */
static ks_status policies_before_step(ks_context *c, int32_t n, const int32_t *seqs, const int32_t *tokens,
                                      const int32_t *ps, const float *ent) {
    int32_t *sq = c->step_i32 + c->max_rows, *tk = sq + c->max_rows, *po = tk + c->max_rows;
    float *en = c->step_f32 + 2 * (size_t)c->max_rows;
    ks_status st = KS_OK;
    for (int32_t k = 0; k < c->n_pols && st == KS_OK; k++) {
        ks_infer_pol *e = &c->pols[k];
        if (!e->pol || !e->users) continue;
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (c->seq_pol[seqs[i]] == k) {
                sq[m] = seqs[i];
                tk[m] = tokens[i];
                po[m] = ps[i];
                en[m] = ent[i];
                en[c->max_rows + m] = ent[n + i];
                m++;
            }
        if (!m) continue;
        ks_step_info step = {.n = m, .seq = sq, .token = tk, .pos = po, .entropy = en, .varentropy = en + c->max_rows};
        double ts = ks_time_sec();
        st = ks_policy_before_step(e->pol, &step);
        /* before_step may use every worker: count thread time like the per-head selections */
        c->stats.select_seconds += (ks_time_sec() - ts) * c->params.n_threads;
        if (st == KS_OK && ks_policy_is_global(e->pol)) {
            st = ks_infer_prefetch_global(c, e->dense_from, m, sq, po);
        }
    }
    return st;
}

ks_status ks_decode(ks_context *c, const int32_t *seqs, const int32_t *tokens, int32_t n, float *logits) {
    if (!c || !seqs || !tokens) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL argument");
    if (n <= 0 || n > c->max_rows) return KS_FAIL(KS_ERR_INVALID_ARG, "batch of %d sequences (1..%d allowed)", n, c->max_rows);
    for (int32_t i = 0; i < n; i++) {
        if (seqs[i] < 0 || seqs[i] >= c->n_seq)
            return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seqs[i], c->n_seq);
        for (int32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d appears twice in one step", seqs[i]);
        if (c->seq_len[seqs[i]] + 1 > c->n_ctx)
            return KS_FAIL(KS_ERR_CONTEXT_FULL, "sequence %d is full (%d tokens)", seqs[i], c->n_ctx);
        if (ks_kv_seq_parked(c->kv, seqs[i]))
            return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d is parked: ks_seq_unpark it before decoding", seqs[i]);
    }
    KS_TRY(check_tokens(c, tokens, n));
    if (c->mm_worker_bytes && !ks_scratch(KS_SCRATCH_KERNEL, c->mm_worker_bytes)) /* this thread runs kernels too */
        return KS_FAIL(KS_ERR_NOMEM, "matmul tiles of %zu bytes", c->mm_worker_bytes);
    if (c->plan_thr) { /* Algorithm 2: the step adds a token to each of the n sequences */
        int64_t S = 0;
        int32_t starting = 0;
        for (int32_t i = 0; i < n; i++) {
            S = c->seq_len[seqs[i]] + 1 > S ? c->seq_len[seqs[i]] + 1 : S;
            starting += c->seq_len[seqs[i]] == 0;
        }
        KS_TRY(ks_infer_plan_apply(c, n, starting, S));
    }
    double t0 = ks_time_sec();
    int32_t *ps = c->step_i32;
    bool *want = c->step_want;
    for (int32_t i = 0; i < n; i++) {
        ps[i] = c->seq_len[seqs[i]];
        want[i] = true;
    }
    float *ent = c->step_f32;
    for (int32_t i = 0; i < n; i++) {
        ent[i] = c->entropy[seqs[i]];
        ent[n + i] = c->varentropy[seqs[i]];
    }
    ks_status st = policies_before_step(c, n, seqs, tokens, ps, ent);
    if (st == KS_OK) {
        c->decoding = true;
        c->step_serial++; /* a new key for the layers' shared plans */
        st = ks_infer_forward_rows(c, n, seqs, ps, tokens, logits ? want : NULL, logits, NULL);
        c->decoding = false;
    }
    if (st == KS_OK)
        for (int32_t i = 0; i < n; i++) {
            c->seq_len[seqs[i]]++;
            if (logits && ks_policy_wants_entropy(ks_infer_policy_of(c, seqs[i])))
                entropy_of(logits + (size_t)i * c->model->hp.n_vocab, c->model->hp.n_vocab, &c->entropy[seqs[i]],
                           &c->varentropy[seqs[i]]);
        }
    if (st != KS_OK) return st;
    c->stats.tokens_decoded += (uint64_t)n;
    c->stats.decode_seconds += ks_time_sec() - t0;
    reserve_scratch(c);
    return KS_OK;
}

typedef struct {
    ks_context *c;
    int32_t seq, n;
    const float *noise; /* [n_noise] */
    size_t n_noise;
    atomic_int failed;
} fill_job;

static void fill_worker(void *arg, int ith, int nth) {
    fill_job *j = arg;
    ks_context *c = j->c;
    const ks_hparams *hp = &c->model->hp;
    int hd = hp->head_dim;
    /* whole layers per worker: appends to one layer must stay serial */
    for (int il = ith; il < hp->n_layer; il += nth)
        /* a local layer holds only its window: the last `window` positions */
        for (int32_t p = c->swa_hold[j->seq] ? 0 : ks_infer_window_lo(c, il, j->n); p < j->n; p++)
            for (int h = 0; h < hp->n_head_kv; h++) {
                size_t u = ((size_t)il * hp->n_head_kv + h) * 2;
                size_t ko = ((size_t)p * 7919 + u * 104729) % (j->n_noise - (size_t)hd);
                size_t vo = ((size_t)p * 7919 + (u + 1) * 104729) % (j->n_noise - (size_t)hd);
                if (ks_kv_append(c->kv, j->seq, il, h, p, j->noise + ko, j->noise + vo) != KS_OK) {
                    atomic_store(&j->failed, 1);
                    return;
                }
            }
}

ks_status ks_seq_fill_synthetic(ks_context *c, int32_t seq, int32_t n, uint64_t seed) {
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range", seq);
    if (n < 0 || n > c->n_ctx) return KS_FAIL(KS_ERR_CONTEXT_FULL, "depth %d exceeds the context of %d", n, c->n_ctx);
    ks_seq_reset(c, seq); /* a parked copy goes too */
    /* values are Gaussian noise: only the bytes matter for bandwidth benchmarks */
    size_t n_noise = 1 << 16;
    float *noise = ks_malloc(sizeof(float) * n_noise);
    if (!noise) return KS_FAIL(KS_ERR_NOMEM, "synthetic KV noise");
    ks_rng rng = {seed};
    for (size_t i = 0; i < n_noise; i++) noise[i] = ks_rng_normal(&rng);
    fill_job j = {.c = c, .seq = seq, .n = n, .noise = noise, .n_noise = n_noise};
    atomic_init(&j.failed, 0);
    ks_pool_run(c->pool, fill_worker, &j);
    ks_free(noise);
    if (atomic_load(&j.failed)) {
        ks_seq_reset(c, seq);
        return KS_FAIL(KS_ERR_IO, "could not fill the KV cache of sequence %d: %s", seq, ks_last_error());
    }
    c->seq_len[seq] = n;
    ks_policy_seq_fill_synthetic(ks_infer_policy_of(c, seq), seq, n, seed);
    return KS_OK;
}
