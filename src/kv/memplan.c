/*
 * memplan.c — the memory model and Algorithms 1 and 2 (see memplan.h).
 * Pure arithmetic on doubles: tests compare it with a hand calculation.
 * Thresholds are not forced to be monotonic: while S < B an offloaded layer
 * costs more fast memory than a resident one, and Algorithm 2 simply takes
 * the smallest k that fits.  Local (sliding-window) layers add a term that
 * stops growing at their window; they are never offloaded.
 */
#include "kv/memplan.h"

#include <math.h>

static double per_token_layer(const ks_memplan_params *p) {
    return (p->k_only ? 1.0 : 2.0) * p->kv_elem_bytes * (double)p->requests * p->n_head_kv * p->head_dim;
}

static int32_t n_global(const ks_memplan_params *p) { return p->n_layer - (p->n_local > 0 ? p->n_local : 0); }

/* entries a local layer holds per head at length S */
static double local_len(const ks_memplan_params *p, double S) { return S < p->window ? S : (double)p->window; }

double ks_memplan_bytes(const ks_memplan_params *p, int32_t l_fast, int64_t S) {
    double e = per_token_layer(p);
    double extra = (p->dlm_cache ? 1.0 : 0.0) + p->alpha;
    double local = p->n_local > 0 ? (double)p->n_local * local_len(p, (double)S) : 0.0;
    return p->overhead * (p->model_bytes + p->dlm_bytes) +
           e * (((double)l_fast + extra) * (double)S + (double)(n_global(p) - l_fast) * p->budget + local);
}

ks_status ks_memplan_thresholds(const ks_memplan_params *p, int64_t *thr) {
    if (p->n_layer < 1 || p->requests < 1 || p->n_head_kv < 1 || p->head_dim < 1 || p->kv_elem_bytes <= 0 ||
        p->mem_cap <= 0 || p->budget < 0 || p->alpha < 0 || p->overhead <= 0 || p->n_local < 0 ||
        p->n_local > p->n_layer || (p->n_local > 0 && p->window < 1))
        return KS_FAIL(KS_ERR_INVALID_ARG, "memory plan: bad parameters");
    double e = per_token_layer(p), extra = (p->dlm_cache ? 1.0 : 0.0) + p->alpha;
    double fixed = p->overhead * (p->model_bytes + p->dlm_bytes);
    int32_t G = n_global(p);
    for (int32_t k = 0; k <= p->n_layer; k++) {
        if (k > G) { /* a local layer is never offloaded */
            thr[k] = -1;
            continue;
        }
        int32_t l_fast = G - k;
        double room = p->mem_cap - fixed - e * (double)k * p->budget;
        double per_s = e * ((double)l_fast + extra);
        double s;
        if (p->n_local > 0) { /* past the window the local layers are a constant; before it, per token */
            double past = room - e * (double)p->n_local * p->window;
            if (room < 0) s = -1;
            else if (past >= 0 && per_s <= 0) s = 9.0e18;
            else if (past >= 0 && floor(past / per_s) >= p->window) s = floor(past / per_s);
            else s = floor(room / (per_s + e * p->n_local));
        } else if (room < 0) s = -1;
        else if (per_s <= 0) s = 9.0e18;
        else s = floor(room / per_s);
        thr[k] = s > 9.0e18 ? (int64_t)9.0e18 : (int64_t)s;
    }
    return KS_OK;
}

int32_t ks_memplan_offloaded_at(const int64_t *thr, int32_t n_layer, int64_t S) {
    for (int32_t k = 0; k <= n_layer; k++)
        if (thr[k] >= 0 && S <= thr[k]) return k;
    return n_layer + 1;
}

double ks_memplan_bytes_state(const ks_memplan_params *p, int32_t l_fast, const ks_memplan_state *s) {
    double e1 = 2.0 * p->kv_elem_bytes * p->n_head_kv * p->head_dim;
    /* local layers: at most window entries of each active sequence */
    double local_tok = (double)s->tokens_fast;
    if (p->n_local > 0 && local_tok > (double)p->window * s->active) local_tok = (double)p->window * s->active;
    return p->overhead * (p->model_bytes + p->dlm_bytes) +
           e1 * ((double)l_fast * (double)s->tokens_fast + (p->dlm_cache ? (double)s->tokens_all : 0.0) +
                 p->alpha * (double)p->requests * (double)s->longest +
                 (double)(n_global(p) - l_fast) * p->budget * (double)s->active +
                 (p->n_local > 0 ? (double)p->n_local * local_tok : 0.0));
}

int32_t ks_memplan_offloaded_for(const ks_memplan_params *p, const ks_memplan_state *s) {
    int32_t G = n_global(p);
    for (int32_t k = 0; k <= G; k++)
        if (ks_memplan_bytes_state(p, G - k, s) <= p->mem_cap) return k;
    return p->n_layer + 1;
}
