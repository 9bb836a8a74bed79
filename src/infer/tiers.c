/*
 * tiers.c — the slow KV tier seen from the context: when layers move there,
 * and getting their pages into fast slots before attention needs them.
 *
 * Adaptive memory management ("SpeContext: Enabling Efficient Long-context
 * Reasoning with Speculative Context Sparsity in LLMs", Section 6, Algorithms
 * 1 and 2): the memory model in kv/memplan.c turns the fast-tier cap into
 * sequence-length thresholds once, and before each prefill or decode the
 * context moves the deepest fast layers to the slow tier as the longest
 * sequence crosses them.  The plan moves layers one way only: a step never
 * waits for a layer coming back.  Across many sequences the decision is
 * taken over the actual state rather than R sequences at the longest length
 * (ks_memplan_offloaded_for: the sum of the unparked sequences' lengths, the
 * longest one, the active ones), which equals Algorithm 1's thresholds when
 * every sequence is equally long.  A parked sequence (ks_seq_park: all its
 * KV moved to the slow tier, the pause of a scheduler under a cap) counts
 * only for the retrieval head's cache, which stays with its policy.
 *
 * Loading (the same paper, Section 5, asynchronous prefetch and Section
 * 5.4, elastic loading): an offloaded layer keeps a fixed buffer of entry
 * slots per (sequence, KV head) in the fast tier (kv.h).  A global selection
 * does not depend on the layer, so right after before_step the selected
 * entries of every slow-tier layer are handed to the store, which keeps the
 * ones already buffered and queues only S_now - S_last on the copy engine,
 * into the slots of the entries that left; layer l's loads then overlap the
 * compute of layers < l, and attention's own fetch only waits for them and
 * adds the entry the step appended.  The buffer holds B + P - 1 entries:
 * B for a token-granular selection such as spec's (the paper's fixed
 * budget), plus the rounding of page-granular policies up to whole pages,
 * so no selection within the budget ever falls back to reading pages
 * synchronously.  At prefill every row of a sequence reads every entry of
 * its heads, so they are loaded once per layer before the parallel section
 * when the buffer holds them (dense offloading: a buffer of every entry).
 */
#include "infer/internal.h"

#include <string.h>

int32_t ks_infer_buffer_entries(const ks_context_params *p, int32_t budget) {
    if (p->kv_slots > 0) return p->kv_slots > INT32_MAX / p->page ? 0 : p->kv_slots * p->page;
    if (budget > 0) return budget > INT32_MAX - p->page ? 0 : budget + p->page - 1;
    return 0;
}

bool ks_infer_plan_holds_one(const ks_memplan_params *p) {
    ks_memplan_state one = {.active = 1};
    return ks_memplan_offloaded_for(p, &one) <= p->n_layer;
}

ks_status ks_infer_plan_init(ks_context *c) {
    const ks_hparams *hp = &c->model->hp;
    const ks_context_params *p = &c->params;
    int32_t budget = c->pols[0].spec.budget; /* the default instance's */
    if (budget <= 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "adaptive memory management needs a budget: offloaded layers keep B entries fast");
    int G = hp->n_head / hp->n_head_kv;
    /* alpha: the per-token scratch each worker allocates (ks_attn_scratch) */
    double per_tok_scratch = (double)p->n_threads *
                             (4.0 * (G > 4 ? G : 4) + 4 + 4 + 4 + 4 + sizeof(ks_kv_seg) + 1.0 / 8 +
                              2.0 * c->kv_row_bytes /* gather buffer */);
    double elem = (double)c->kv_row_bytes / hp->head_dim;
    c->plan = (ks_memplan_params){.model_bytes = (double)c->model->weight_bytes,
                                  .dlm_bytes = (double)ks_policy_weight_bytes(c->policy),
                                  .overhead = p->mem_overhead > 0 ? p->mem_overhead : 1.3,
                                  .n_layer = hp->n_layer,
                                  .n_head_kv = hp->n_head_kv,
                                  .head_dim = hp->head_dim,
                                  .kv_elem_bytes = elem,
                                  .requests = c->n_seq,
                                  .budget = budget,
                                  .dlm_cache = ks_policy_own_kcache(c->policy),
                                  .k_only = hp->kv_lora_rank > 0,
                                  .alpha = per_tok_scratch / ((hp->kv_lora_rank > 0 ? 1.0 : 2.0) * elem * c->n_seq *
                                                              hp->n_head_kv * hp->head_dim),
                                  .mem_cap = p->mem_cap};
    for (int32_t il = 0; il < hp->n_layer; il++) c->plan.n_local += c->model->layers[il].window > 0;
    c->plan.window = hp->n_swa;
    c->plan_thr = ks_malloc(sizeof(int64_t) * (size_t)(hp->n_layer + 1));
    if (!c->plan_thr) return KS_FAIL(KS_ERR_NOMEM, "plan thresholds of %d layers", hp->n_layer);
    KS_TRY(ks_memplan_thresholds(&c->plan, c->plan_thr));
    if (!ks_infer_plan_holds_one(&c->plan))
        return KS_FAIL(KS_ERR_NOMEM, "a fast tier of %.2f GB cannot hold the weights (%.2f GB x %.1f) and one sequence's "
                       "%d budget entries per layer", p->mem_cap / 1e9, c->plan.model_bytes / 1e9, c->plan.overhead,
                       budget);
    KS_LOG(INFO, "memory plan: cap %.2f GB, weights %.2f GB (+%.3f GB policy), alpha %.3f; all layers fast up to S=%lld, "
           "all offloaded up to S=%lld", p->mem_cap / 1e9, c->plan.model_bytes / 1e9, c->plan.dlm_bytes / 1e9,
           c->plan.alpha, (long long)c->plan_thr[0], (long long)c->plan_thr[hp->n_layer - c->plan.n_local]);
    return KS_OK;
}

void ks_context_memplan(const ks_context *c, ks_memplan_info *out) {
    memset(out, 0, sizeof *out);
    if (!c->plan_thr) return;
    out->active = true;
    out->model_bytes = c->plan.model_bytes;
    out->dlm_bytes = c->plan.dlm_bytes;
    out->alpha = c->plan.alpha;
    out->overhead = c->plan.overhead;
    out->mem_cap = c->plan.mem_cap;
    out->n_layer = c->plan.n_layer;
    out->n_local = c->plan.n_local;
    out->window = c->plan.window;
    out->requests = c->plan.requests;
    out->budget = c->plan.budget;
    for (int32_t k = 0; k <= c->plan.n_layer && k < 257; k++) out->thresholds[k] = c->plan_thr[k];
    out->offloaded = c->n_offloaded;
}

/* The model's state now, plus a query's additions. */
static ks_memplan_state plan_state(const ks_context *c, const ks_mem_query *q) {
    ks_memplan_state st = {0};
    if (!q->alone)
        for (int32_t i = 0; i < c->n_seq; i++) {
            st.tokens_all += c->seq_len[i];
            if (ks_kv_seq_parked(c->kv, i)) continue;
            st.tokens_fast += c->seq_len[i];
            st.active += c->seq_len[i] > 0;
            if (c->seq_len[i] > st.longest) st.longest = c->seq_len[i];
        }
    if (!q->alone) { /* a page several sequences map (a shared prefix) is memory once: count its tokens once */
        ks_kv_share_info si;
        ks_kv_share_info_get(c->kv, &si);
        const ks_hparams *hp = &c->model->hp;
        st.tokens_fast -= si.dup_pages * ks_kv_page_size(c->kv) / ((int64_t)hp->n_layer * hp->n_head_kv);
        if (st.tokens_fast < 0) st.tokens_fast = 0;
    }
    st.tokens_fast += q->extra_tokens;
    st.tokens_all += q->extra_tokens;
    st.active += q->extra_seqs;
    if (q->longest > st.longest) st.longest = q->longest;
    return st;
}

ks_status ks_context_mem_fits(const ks_context *c, const ks_mem_query *q, ks_mem_fit *out) {
    if (!c || !q || !out) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL argument");
    if (q->extra_tokens < 0 || q->extra_seqs < 0 || q->longest < 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "negative memory query");
    ks_mem_fit f = {.fits = true};
    ks_memplan_state st = plan_state(c, q);
    f.tokens = st.tokens_fast;
    f.active_seqs = st.active;
    if (c->plan_thr) {
        int32_t L = c->plan.n_layer - c->plan.n_local, k = ks_memplan_offloaded_for(&c->plan, &st); /* global layers */
        f.active = true;
        f.fits = k <= L;
        f.offloaded = k;
        f.bytes = ks_memplan_bytes_state(&c->plan, f.fits ? L - k : 0, &st);
        f.mem_cap = c->plan.mem_cap;
    }
    *out = f;
    return KS_OK;
}

ks_status ks_infer_plan_apply(ks_context *c, int64_t extra_tokens, int32_t extra_seqs, int64_t longest) {
    if (!c->plan_thr) return KS_OK;
    ks_mem_query q = {.extra_tokens = extra_tokens, .extra_seqs = extra_seqs, .longest = longest};
    ks_memplan_state st = plan_state(c, &q);
    /* offloadable: the global layers (local ones hold only their window and stay fast) */
    int32_t L = c->model->hp.n_layer - c->plan.n_local, want = ks_memplan_offloaded_for(&c->plan, &st);
    if (want > L) {
        KS_LOG(WARN, "memory plan: %lld tokens in %d sequences (longest %lld) exceed the fast tier even with every "
               "layer offloaded", (long long)st.tokens_fast, st.active, (long long)st.longest);
        want = L;
    }
    while (c->n_offloaded < want) {
        int32_t layer = c->model->hp.n_layer - 1;
        for (int32_t g = -1; layer >= 0; layer--) /* the (n_offloaded + 1)-th global layer from the end */
            if (c->model->layers[layer].window == 0 && ++g == c->n_offloaded) break;
        if (ks_kv_layer_tier(c->kv, layer) == KS_TIER_FAST) KS_TRY(ks_kv_set_layer_tier(c->kv, layer, KS_TIER_SLOW));
        c->n_offloaded++;
        c->stats.kv_offload_events++;
        KS_LOG(INFO, "memory plan: %lld tokens in %d sequences (longest %lld): layer %d moved to the slow tier "
               "(%d of %d offloaded)", (long long)st.tokens_fast, st.active, (long long)st.longest, layer,
               c->n_offloaded, L);
    }
    return KS_OK;
}

ks_status ks_context_apply_memplan(ks_context *c) { return ks_infer_plan_apply(c, 0, 0, 0); }

/* ------------------------------------------------------- park / unpark -- */
ks_status ks_seq_park(ks_context *c, int32_t seq) {
    if (!c) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL context");
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, c->n_seq);
    return ks_kv_seq_park(c->kv, seq);
}

ks_status ks_seq_unpark(ks_context *c, int32_t seq) {
    if (!c) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL context");
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, c->n_seq);
    if (!ks_kv_seq_parked(c->kv, seq)) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d is not parked", seq);
    /* the plan makes room first: its tokens may push more layers to the slow tier */
    KS_TRY(ks_infer_plan_apply(c, c->seq_len[seq], c->seq_len[seq] > 0, c->seq_len[seq]));
    return ks_kv_seq_unpark(c->kv, seq);
}

bool ks_seq_parked(const ks_context *c, int32_t seq) {
    KS_ASSERT(c && seq >= 0 && seq < c->n_seq);
    return ks_kv_seq_parked(c->kv, seq);
}

ks_status ks_context_offload_layer(ks_context *c, int32_t layer, bool offload) {
    if (!c || layer < 0 || layer >= c->model->hp.n_layer)
        return KS_FAIL(KS_ERR_INVALID_ARG, "layer %d out of range", layer);
    return ks_kv_set_layer_tier(c->kv, layer, offload ? KS_TIER_SLOW : KS_TIER_FAST);
}

ks_status ks_infer_prefetch_global(ks_context *c, int32_t first_layer, int32_t n, const int32_t *seqs,
                                   const int32_t *pos) {
    const ks_hparams *hp = &c->model->hp;
    ks_attn_scratch *s = &c->scr[0];
    for (int il = first_layer; il < hp->n_layer; il++) {
        if (ks_kv_layer_tier(c->kv, il) != KS_TIER_SLOW) continue;
        for (int32_t r = 0; r < n; r++)
            for (int h = 0; h < hp->n_head_kv; h++) {
                /* the step will append one entry: select among ne + 1, load the ne stored */
                int32_t ne = ks_kv_n_entries(c->kv, seqs[r], il, h);
                if (!ks_infer_budget_binds(c, seqs[r], ne + 1)) continue; /* dense: attention loads */
                ks_select_req req = {.row = r, .seq = seqs[r], .layer = il, .head = h, .pos = pos[r], .n_entries = ne + 1};
                ks_selection sel;
                KS_TRY(ks_infer_select(c, s, &req, &sel, false, &c->stats.select_seconds));
                if (sel.all) continue;
                int32_t m = ks_infer_mask_entries(s->mask, ne, s->entries);
                /* larger than the buffer: attention reads it synchronously and counts the fallback */
                if (m <= ks_kv_buffer_entries(c->kv)) KS_TRY(ks_kv_fetch(c->kv, seqs[r], il, h, s->entries, m, true));
            }
    }
    return KS_OK;
}

ks_status ks_infer_load_prefill_slots(ks_context *c, int il, int n, const int32_t *seq) {
    int nkv = c->model->hp.n_head_kv;
    int32_t *ent = c->scr[0].entries;
    for (int r = 0; r < n; r++) {
        if (r > 0 && seq[r] == seq[r - 1]) continue;
        for (int h = 0; h < nkv; h++) {
            int32_t ne = ks_kv_n_entries(c->kv, seq[r], il, h);
            if (ne > ks_kv_buffer_entries(c->kv)) continue; /* attention gathers pages */
            for (int32_t i = 0; i < ne; i++) ent[i] = i;
            KS_TRY(ks_kv_fetch(c->kv, seq[r], il, h, ent, ne, true));
        }
    }
    return ks_kv_wait_layer(c->kv, il);
}
