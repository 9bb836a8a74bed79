/*
 * registry.c — the list of policies, and the one parser of policy strings.
 *
 * The registry is a static table: adding a policy is one file in
 * src/select/ and one line here (docs/DESIGN.md, "Adding a policy").  A
 * program or test linking ks_select may also register one at run time
 * (ks_policy_register), which is how tests/test_example_policy.c runs the
 * worked example without touching this table.
 * It is the only list of policies: the CLI (--policy, `kvsieve policies`),
 * the server, the public selection API (select_api.c), the tests and the
 * docs test read it, with the data each interface carries (summary,
 * arg_names, its sub-interfaces: select, prefill, hidden, prefix).
 *
 * Parsing.  A policy choice is written in two strings wherever users write
 * it: the name, "NAME" or "EVICTOR+SELECTOR", and the arguments,
 * "k=v,k=v".  ks_policy_spec_parse reads both once, into a ks_policy_spec
 * (kvsieve.h) whose chain holds registry indices and whose arguments are
 * known to be taken by some part of the chain; below the entrances (the
 * CLI, the server's `kvsieve` object, ks_context_params, ks_policy_config,
 * the selection API) only that value travels, and what a policy needs is
 * asked of it (ks_policy_spec_needs_dlm, _chunkable, ...), never of its
 * name.  Every reader of "k=v" in the code base goes through args_next
 * below: the policies' typed lookups (ks_args_int and kin), the check of the
 * keys, the CLI's scoping of --policy-arg NAME.k=v.
 */
#define _GNU_SOURCE
#include "policies/registry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

extern const ks_policy_i ks_policy_dense;
extern const ks_policy_i ks_policy_streaming;
extern const ks_policy_i ks_policy_h2o;
extern const ks_policy_i ks_policy_snapkv;
extern const ks_policy_i ks_policy_quest;
extern const ks_policy_i ks_policy_specontext;
extern const ks_policy_i ks_policy_dapq;
extern const ks_policy_i ks_policy_freekv;
extern const ks_policy_i ks_policy_chess;
extern const ks_policy_i ks_policy_lrqk;
extern const ks_policy_i ks_policy_topp;

/* The policies built in, then those registered at run time (ks_policy_register). */
enum { REGISTRY_CAP = 32 };
static const ks_policy_i *registry[REGISTRY_CAP + 1] = {
    &ks_policy_dense,
    &ks_policy_streaming,
    &ks_policy_h2o,
    &ks_policy_snapkv,
    &ks_policy_quest,
    &ks_policy_specontext,
    &ks_policy_dapq,
    &ks_policy_freekv,
    &ks_policy_chess,
    &ks_policy_lrqk,
    &ks_policy_topp,
    NULL,
};

const ks_policy_i *const *ks_policy_list(void) { return registry; }

ks_status ks_policy_register(const ks_policy_i *vt) {
    if (!vt || !vt->name || !*vt->name || !vt->summary || !vt->prefix_why || !vt->create || !vt->destroy)
        return KS_FAIL(KS_ERR_INVALID_ARG, "a policy needs a name, a summary, prefix_why, create and destroy");
    if (strchr(vt->name, '+') || strchr(vt->name, ','))
        return KS_FAIL(KS_ERR_INVALID_ARG, "policy name '%s': '+' and ',' separate names", vt->name);
    if ((vt->select && !vt->select->select_layer) || (vt->prefill && !vt->prefill->on_prefill) ||
        (vt->hidden && (!vt->hidden->hidden_layers || !vt->hidden->on_hidden)) || (vt->refine && !vt->refine->refine))
        return KS_FAIL(KS_ERR_INVALID_ARG, "policy '%s': a sub-interface lacks its required hook", vt->name);
    if (vt->refine && (vt->select || vt->prefill || vt->hidden))
        return KS_FAIL(KS_ERR_INVALID_ARG, "policy '%s': a refining stage has no select, prefill or hidden part", vt->name);
    int32_t n = ks_policy_count();
    if (ks_policy_find(vt->name)) return KS_FAIL(KS_ERR_INVALID_ARG, "policy '%s' is registered already", vt->name);
    if (n == REGISTRY_CAP) return KS_FAIL(KS_ERR_NOMEM, "the registry holds %d policies at most", REGISTRY_CAP);
    registry[n] = vt;
    registry[n + 1] = NULL;
    return KS_OK;
}

int32_t ks_policy_count(void) {
    int32_t n = 0;
    while (registry[n]) n++;
    return n;
}

const char *ks_policy_name_at(int32_t i, const char **summary) {
    KS_ASSERT(i >= 0 && i < ks_policy_count());
    if (summary) *summary = registry[i]->summary;
    return registry[i]->name;
}

static int32_t index_of(const char *name, size_t n) {
    for (int32_t i = 0; registry[i]; i++)
        if (strlen(registry[i]->name) == n && !strncmp(registry[i]->name, name, n)) return i;
    return -1;
}

const ks_policy_i *ks_policy_find(const char *name) {
    int32_t i = name ? index_of(name, strlen(name)) : -1;
    return i < 0 ? NULL : registry[i];
}

const ks_policy_i *ks_policy_spec_part(const ks_policy_spec *spec, int32_t i) {
    KS_ASSERT(i >= 0 && i < spec->n_parts);
    return registry[spec->part[i]];
}

/* ------------------------------------------------------------- args -- */
/* One item of "k=v,k=v": *p advanced past it; false at the end.  The key
 * is [key, key + kn), the value [*v, *v + vn) (v NULL: the item has no '='). */
typedef struct args_item {
    const char *key, *v;
    size_t kn, vn, n; /* n: the whole item */
} args_item;

static bool args_next(const char **p, args_item *it) {
    if (!*p || !**p) return false;
    const char *s = *p, *end = strchr(s, ',');
    it->n = end ? (size_t)(end - s) : strlen(s);
    const char *eq = memchr(s, '=', it->n);
    it->key = s;
    it->kn = eq ? (size_t)(eq - s) : it->n;
    it->v = eq ? eq + 1 : NULL;
    it->vn = eq ? it->n - it->kn - 1 : 0;
    *p = s + it->n + (end != NULL);
    return true;
}

static bool args_find(const char *args, const char *key, const char **v, size_t *vn) {
    args_item it;
    size_t kl = strlen(key);
    for (const char *p = args; args_next(&p, &it);)
        if (it.v && it.kn == kl && !strncmp(it.key, key, kl)) {
            *v = it.v;
            *vn = it.vn;
            return true;
        }
    return false;
}

bool ks_policy_args_has(const char *args, const char *key) {
    const char *v;
    size_t vn;
    return args_find(args, key, &v, &vn);
}

bool ks_policy_args_valid(const char *args) {
    args_item it;
    for (const char *p = args; args_next(&p, &it);)
        if (!it.v || it.kn == 0) return false;
    return !args || !*args || args[strlen(args) - 1] != ','; /* no empty last item */
}

/* key's value as a number in [lo, hi] (integer: digits only), def when
 * absent. */
static ks_status args_number(const char *args, const char *key, bool integer, double def, double lo, double hi,
                             double *out) {
    const char *v;
    size_t vn;
    if (!args_find(args, key, &v, &vn)) {
        *out = def;
        return KS_OK;
    }
    const char *what = integer ? "an integer" : "a number";
    if (vn == 0 || vn >= 64) return KS_FAIL(KS_ERR_INVALID_ARG, "policy argument %s needs %s", key, what);
    char buf[64], *end;
    memcpy(buf, v, vn);
    buf[vn] = 0;
    errno = 0;
    double x = integer ? (double)strtoll(buf, &end, 10) : strtod(buf, &end);
    if (*end || errno || !(x >= lo && x <= hi)) {
        if (integer)
            return KS_FAIL(KS_ERR_INVALID_ARG, "policy argument %s=%s: expected an integer in [%lld, %lld]", key, buf,
                           (long long)lo, (long long)hi);
        return KS_FAIL(KS_ERR_INVALID_ARG, "policy argument %s=%s: expected a number in [%g, %g]", key, buf, lo, hi);
    }
    *out = x;
    return KS_OK;
}

ks_status ks_args_int(const char *args, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out) {
    double x; /* the bounds policies use are far below 2^53: exact as doubles */
    KS_TRY(args_number(args, key, true, (double)def, (double)lo, (double)hi, &x));
    *out = (int64_t)x;
    return KS_OK;
}

ks_status ks_args_float(const char *args, const char *key, double def, double lo, double hi, double *out) {
    return args_number(args, key, false, def, lo, hi, out);
}

ks_status ks_args_str(const char *args, const char *key, const char *def, char *out, size_t cap) {
    const char *v;
    size_t vn;
    if (!args_find(args, key, &v, &vn)) {
        snprintf(out, cap, "%s", def ? def : "");
        return KS_OK;
    }
    if (vn >= cap) return KS_FAIL(KS_ERR_INVALID_ARG, "policy argument %s is too long", key);
    memcpy(out, v, vn);
    out[vn] = 0;
    return KS_OK;
}

static bool part_takes(const ks_policy_i *vt, const char *key, size_t kn) {
    for (int j = 0; vt->arg_names && vt->arg_names[j]; j++)
        if (strlen(vt->arg_names[j]) == kn && !strncmp(vt->arg_names[j], key, kn)) return true;
    return false;
}

static bool chain_takes(const ks_policy_spec *s, const char *key, size_t kn) {
    for (int32_t i = 0; i < s->n_parts; i++)
        if (part_takes(registry[s->part[i]], key, kn)) return true;
    return false;
}

/* ------------------------------------------------------------- spec -- */
ks_policy_spec ks_policy_spec_default(void) {
    ks_policy_spec s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "dense");
    s.n_parts = 1;
    s.part[0] = index_of("dense", 5);
    s.sink = 4;
    s.window = 64;
    s.dense_layers = -1;
    return s;
}

/* The chain of "a", "a+b" or either followed by a refining stage ("+topp")
 * into s->name, n_parts, part (whether the first part can lead a
 * composition is ks_policy_spec_parse's check). */
static ks_status parse_chain(const char *policy, ks_policy_spec *s) {
    if (!policy || !*policy) policy = "dense";
    if (strlen(policy) >= sizeof s->name) return KS_FAIL(KS_ERR_INVALID_ARG, "policy '%s' is too long", policy);
    snprintf(s->name, sizeof s->name, "%s", policy);
    s->n_parts = 0;
    for (const char *p = policy;;) {
        const char *e = strchr(p, '+');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int32_t k = index_of(p, n);
        if (k < 0) {
            char names[512] = "";
            for (int i = 0; registry[i]; i++) {
                strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
                strncat(names, registry[i]->name, sizeof names - strlen(names) - 1);
            }
            return KS_FAIL(n ? KS_ERR_NOT_FOUND : KS_ERR_INVALID_ARG, "unknown policy '%.*s' (known: %s)", (int)n, p,
                           names);
        }
        bool refines = ks_policy_i_refines(registry[k]);
        if (s->n_parts > 0 && ks_policy_i_refines(registry[s->part[s->n_parts - 1]]))
            return KS_FAIL(KS_ERR_INVALID_ARG, "policy '%s': a refining stage (%s) comes last", policy,
                           registry[s->part[s->n_parts - 1]]->name);
        if (s->n_parts == KS_POLICY_MAX_PARTS || (!refines && s->n_parts == KS_POLICY_MAX_PARTS - 1))
            return KS_FAIL(KS_ERR_INVALID_ARG,
                           "policy '%s': at most an evictor and a selector can be composed (and a refining stage after)",
                           policy);
        s->part[s->n_parts++] = k;
        if (!e) break;
        p = e + 1;
    }
    return KS_OK;
}

ks_status ks_policy_spec_parse(const char *policy, const char *args, int32_t budget, int32_t sink, int32_t window,
                               int32_t dense_layers, ks_policy_spec *out) {
    ks_policy_spec s;
    memset(&s, 0, sizeof s);
    KS_TRY(parse_chain(policy, &s));
    int32_t n_base = s.n_parts - ks_policy_i_refines(registry[s.part[s.n_parts - 1]]); /* before a refining stage */
    if (n_base == 2 && !registry[s.part[0]]->prefill)
        return KS_FAIL(KS_ERR_INVALID_ARG, "policy '%s': the first of a composition must evict at prefill (e.g. snapkv)",
                       s.name);
    if (budget < 0 || sink < 0 || window < 0) return KS_FAIL(KS_ERR_INVALID_ARG, "budget, sink and window must be >= 0");
    s.budget = budget;
    s.sink = sink;
    s.window = window;
    s.dense_layers = dense_layers;
    if (!args) args = "";
    if (strlen(args) >= sizeof s.args) return KS_FAIL(KS_ERR_INVALID_ARG, "policy arguments too long");
    args_item it;
    for (const char *p = args; args_next(&p, &it);) {
        if (!it.v) return KS_FAIL(KS_ERR_INVALID_ARG, "policy argument '%.*s' is not key=value", (int)it.n, it.key);
        if (!chain_takes(&s, it.key, it.kn))
            return KS_FAIL(KS_ERR_INVALID_ARG, "policy %s has no argument '%.*s'", s.name, (int)it.kn, it.key);
    }
    snprintf(s.args, sizeof s.args, "%s", args);
    *out = s;
    return KS_OK;
}

bool ks_policy_spec_equal(const ks_policy_spec *a, const ks_policy_spec *b) {
    return !strcmp(a->name, b->name) && !strcmp(a->args, b->args) && a->budget == b->budget && a->sink == b->sink &&
           a->window == b->window && a->dense_layers == b->dense_layers;
}

bool ks_policy_spec_has_part(const ks_policy_spec *spec, const char *name) {
    for (int32_t i = 0; i < spec->n_parts; i++)
        if (!strcmp(registry[spec->part[i]]->name, name)) return true;
    return false;
}

bool ks_policy_spec_needs_dlm(const ks_policy_spec *spec) {
    for (int32_t i = 0; i < spec->n_parts; i++)
        if (ks_policy_i_needs_dlm(registry[spec->part[i]])) return true;
    return false;
}

bool ks_policy_spec_chunkable(const ks_policy_spec *spec) {
    /* no part has a prefill hook: the state after a prompt does not depend on
     * how it was split into ks_prefill calls */
    for (int32_t i = 0; i < spec->n_parts; i++)
        if (registry[spec->part[i]]->prefill) return false;
    return true;
}

/* ---------------------------------------------- string entrances -- */
/* The public questions about a policy named by a string parse its chain
 * with the parser above (unknown names answer false / 0). */
bool ks_policy_accepts_arg(const char *policy, const char *key) {
    ks_policy_spec s;
    return parse_chain(policy, &s) == KS_OK && chain_takes(&s, key, strlen(key));
}

bool ks_policy_prefill_chunkable(const char *policy) {
    ks_policy_spec s;
    return policy && *policy && parse_chain(policy, &s) == KS_OK && ks_policy_spec_chunkable(&s);
}

int32_t ks_policy_prefill_room(const char *policy, const char *args) {
    /* only the evictor's prefill hooks run before decoding, but every part
     * with pseudo tokens is counted: the larger answer is the safe one */
    ks_policy_spec s;
    if (!policy || !*policy || parse_chain(policy, &s) != KS_OK) return 0;
    int32_t room = 0;
    for (int32_t i = 0; i < s.n_parts; i++) {
        const ks_policy_prefill_i *pf = registry[s.part[i]]->prefill;
        if (pf && pf->pseudo_tokens && pf->prefill_room) {
            int32_t r = pf->prefill_room(args);
            if (r > room) room = r;
        }
    }
    return room;
}

ks_status ks_policy_args_scope(const char *policy, const char *args, bool all, char *out, size_t cap) {
    ks_policy_spec s;
    bool known = parse_chain(policy, &s) == KS_OK;
    args_item it;
    for (const char *p = args; args_next(&p, &it);) {
        const char *use = NULL;
        size_t n = 0;
        const char *dot = memchr(it.key, '.', it.kn);
        if (dot) { /* NAME.k=v: only for a chain with the part NAME */
            for (int32_t i = 0; known && i < s.n_parts && !use; i++) {
                const char *nm = registry[s.part[i]]->name;
                if (strlen(nm) == (size_t)(dot - it.key) && !strncmp(nm, it.key, (size_t)(dot - it.key))) {
                    use = dot + 1;
                    n = it.n - (size_t)(dot + 1 - it.key);
                }
            }
        } else if (all || (known && it.v && chain_takes(&s, it.key, it.kn))) {
            use = it.key;
            n = it.n;
        }
        if (!use) continue;
        size_t used = strlen(out);
        if (used + n + 2 > cap) return KS_FAIL(KS_ERR_INVALID_ARG, "policy arguments too long");
        snprintf(out + used, cap - used, "%s%.*s", used ? "," : "", (int)n, use);
    }
    return KS_OK;
}

void ks_policy_spec_add_draft(const ks_policy_spec *in, const char *model_path, ks_policy_spec *out) {
    if (out != in) *out = *in;
    if (!model_path || !ks_policy_spec_needs_dlm(in) || ks_policy_args_has(in->args, "dlm")) return;
    size_t n = strlen(model_path);
    if (n > 5 && !strcmp(model_path + n - 5, ".gguf")) n -= 5;
    char dir[1024], cfg[1100];
    snprintf(dir, sizeof dir, "%.*s-dlm", (int)n, model_path);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    struct stat sb;
    size_t used = strlen(out->args);
    if (stat(cfg, &sb) == 0 && used + strlen(dir) + 6 < sizeof out->args) /* dlm is a key every such part takes */
        snprintf(out->args + used, sizeof out->args - used, "%sdlm=%s", used ? "," : "", dir);
}
