/*
 * eval_tasks.c — seeded synthetic long-context tasks, sized in model tokens.
 *
 * Why synthetic: a budgeted attention policy fails in one specific way — it
 * drops the few KV entries that carry the answer — and synthetic tasks put
 * that evidence at a known token position (the "depth") inside a haystack of
 * a known length, so failures can be mapped over depth x length.  The
 * families follow RULER (passkey, multi-key and multi-value needles,
 * variable tracking); the fifth, longgen, targets what prompt-only tasks
 * miss: KV written by *decoding*.  The model writes a numbered list, a long
 * stretch of text follows, and it is asked to repeat one item; the score is
 * consistency with its own earlier output, so even a model that writes
 * nonsense can be scored, and a policy that evicts generated tokens cannot
 * hide.
 *
 * Sizing: every length is counted with the model's own tokenizer, because a
 * budget is a number of KV entries.  The filler is a deterministic stream of
 * English-like sentences from a small word list (varied enough that no
 * n-gram repeats as a tell-tale pattern, plain enough to tokenize the same
 * everywhere); the generator binary-searches the number of filler words so
 * the whole sequence — prompt plus every decode budget — lands in
 * [target - tol, target] (tol in eval.h) and never above it, since the
 * context has exactly target slots.  Short targets (toy models) shed
 * distractors and then the intro rather than failing outright.
 *
 * Placement: needles go in at sentence boundaries nearest to depth x filler
 * words; the evidence token span is measured by tokenizing the text up to
 * the needle's edges.  Both BPE families here attach a space to the word
 * after it, so cutting the text just before a space gives the same tokens as
 * the prefix of the whole.
 */
#include "core/core.h"
#include "eval/eval.h"
#include "eval/eval_internal.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ----------------------------------------------------------- buffer -- */

void ks_eval_sbuf_putn(ks_eval_sbuf *b, const char *s, size_t n) {
    if (b->refused) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > cap) cap *= 2;
        char *p = ks_realloc(b->s, cap);
        if (!p) {
            b->refused = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

void ks_eval_sbuf_puts(ks_eval_sbuf *b, const char *s) { ks_eval_sbuf_putn(b, s, strlen(s)); }

void ks_eval_sbuf_printf(ks_eval_sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    KS_ASSERT(n >= 0);
    if ((size_t)n < sizeof tmp) {
        ks_eval_sbuf_putn(b, tmp, (size_t)n);
        return;
    }
    char *big = ks_malloc((size_t)n + 1);
    if (!big) {
        b->refused = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    ks_eval_sbuf_putn(b, big, (size_t)n);
    ks_free(big);
}

char *ks_eval_sbuf_take(ks_eval_sbuf *b) {
    if (!b->s) ks_eval_sbuf_putn(b, "", 0);
    char *s = b->refused ? NULL : b->s;
    if (b->refused) ks_free(b->s);
    *b = (ks_eval_sbuf){0};
    return s;
}

/* ------------------------------------------------------------ names -- */

static const char *const g_task_names[KS_EVAL_TASK_COUNT] = {"passkey", "multikey", "multivalue",
                                                             "vartrack", "longgen"};

const char *ks_eval_task_name(ks_eval_task task) {
    return (unsigned)task < KS_EVAL_TASK_COUNT ? g_task_names[task] : "?";
}

ks_status ks_eval_task_parse(const char *name, ks_eval_task *out) {
    for (int i = 0; i < KS_EVAL_TASK_COUNT; i++)
        if (!strcmp(name, g_task_names[i])) {
            *out = (ks_eval_task)i;
            return KS_OK;
        }
    return KS_FAIL(KS_ERR_NOT_FOUND, "unknown eval task '%s'", name);
}

/* ----------------------------------------------------------- filler -- */

static const char *const g_det[] = {"the", "a", "one", "every", "that", "this", "some"};
static const char *const g_adj[] = {"quiet", "green", "old", "bright", "small", "warm", "cold",
                                    "tall", "busy", "gentle", "brown", "soft", "early", "late",
                                    "happy", "calm", "wide", "dark", "clever", "little"};
static const char *const g_noun[] = {"river", "garden", "farmer", "window", "teacher", "road",
                                     "bird", "village", "boat", "tree", "market", "child",
                                     "house", "hill", "letter", "lamp", "friend", "baker",
                                     "cloud", "field", "dog", "bridge", "song", "kitchen"};
static const char *const g_verb[] = {"walks", "waits", "sings", "looks", "rests", "turns", "moves",
                                     "stays", "plays", "shines", "works", "sleeps", "runs",
                                     "listens", "grows", "stops"};
static const char *const g_prep[] = {"near", "under", "over", "behind", "beside", "past",
                                     "along", "across", "around", "by"};
static const char *const g_adv[] = {"slowly", "today", "again", "quietly", "often", "still",
                                    "softly", "later", "always", "there"};
#define KS_EVAL_NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Sentence shapes as category strings: D det, A adj, N noun, V verb,
 * P prep, R adverb, & "and". */
static const char *const g_shapes[] = {"DANVPDN", "DNVR", "DANVPDAN", "DNVPDN", "DANVR",
                                       "DN&DNVPDAN", "RDANV", "DNVRPDN"};

typedef struct eval_filler {
    int32_t n;
    const char **word; /* [n] */
    bool *start;       /* [n] first word of a sentence */
} eval_filler;

static const char *eval_pick(ks_rng *r, const char *const *list, int n) {
    return list[ks_rng_next(r) % (uint64_t)n];
}

/* At least `n_min` words, ending on a sentence boundary. */
static ks_status eval_filler_make(ks_rng *r, int32_t n_min, eval_filler *f) {
    int32_t cap = n_min + 16;
    f->word = ks_malloc(sizeof(char *) * (size_t)cap);
    f->start = ks_malloc(sizeof(bool) * (size_t)cap);
    f->n = 0;
    if (!f->word || !f->start) return KS_FAIL(KS_ERR_NOMEM, "filler of %d words", n_min);
    while (f->n < n_min) {
        const char *shape = g_shapes[ks_rng_next(r) % (uint64_t)KS_EVAL_NELEM(g_shapes)];
        for (const char *c = shape; *c; c++) {
            const char *w = "and";
            switch (*c) {
            case 'D': w = eval_pick(r, g_det, KS_EVAL_NELEM(g_det)); break;
            case 'A': w = eval_pick(r, g_adj, KS_EVAL_NELEM(g_adj)); break;
            case 'N': w = eval_pick(r, g_noun, KS_EVAL_NELEM(g_noun)); break;
            case 'V': w = eval_pick(r, g_verb, KS_EVAL_NELEM(g_verb)); break;
            case 'P': w = eval_pick(r, g_prep, KS_EVAL_NELEM(g_prep)); break;
            case 'R': w = eval_pick(r, g_adv, KS_EVAL_NELEM(g_adv)); break;
            default: break;
            }
            f->word[f->n] = w;
            f->start[f->n] = c == shape;
            f->n++;
        }
    }
    return KS_OK;
}

static void eval_filler_free(eval_filler *f) {
    ks_free(f->word);
    ks_free(f->start);
}

/* Renders words [a, b): capitalised sentence starts, periods at ends (and at
 * b even if it cuts a sentence, so every insertion follows a full stop). */
static void eval_filler_render(const eval_filler *f, int32_t a, int32_t b, ks_eval_sbuf *out) {
    for (int32_t i = a; i < b; i++) {
        if (out->n && out->s[out->n - 1] != '\n') ks_eval_sbuf_putn(out, " ", 1);
        const char *w = f->word[i];
        if (f->start[i] || i == a) {
            char c = (char)toupper((unsigned char)w[0]);
            ks_eval_sbuf_putn(out, &c, 1);
            ks_eval_sbuf_puts(out, w + 1);
        } else {
            ks_eval_sbuf_puts(out, w);
        }
        if (i + 1 == b || f->start[i + 1]) ks_eval_sbuf_putn(out, ".", 1);
    }
}

/* Sentence start nearest to word index pos within [0, w] (w itself counts). */
static int32_t eval_snap(const eval_filler *f, double pos, int32_t w) {
    int32_t p = (int32_t)lround(pos);
    if (p <= 0) return 0;
    if (p >= w) return w;
    for (int32_t d = 0; d <= w; d++) {
        if (p - d >= 0 && (p - d == 0 || f->start[p - d])) return p - d;
        if (p + d <= w && (p + d == w || f->start[p + d])) return p + d;
    }
    return p;
}

/* -------------------------------------------------------- tokenizing -- */

static ks_status eval_count(const ks_model *m, const char *text, size_t len, bool bos, int32_t *out) {
    size_t n = 0;
    ks_status st = ks_tokenize(m, text, len, bos, false, NULL, 0, &n);
    if (st != KS_OK && st != KS_ERR_INVALID_ARG) return st;
    *out = (int32_t)n;
    return KS_OK;
}

/* The SPM tokenizer puts a space before the first piece of every call; a
 * continuation must not get one, so it is tokenized behind an anchor word
 * whose tokens are then dropped (checked, with a plain fallback). */
ks_status ks_eval_tokenize_cont(const ks_model *model, const char *text, int32_t *ids, size_t cap,
                                size_t *n_out) {
    static const char anchor[] = "Z";
    int32_t a_ids[8];
    size_t na = 0, nt = 0, len = strlen(text);
    KS_TRY(ks_tokenize(model, anchor, 1, false, false, a_ids, 8, &na));
    char *joined = ks_malloc(len + 2);
    if (!joined) return KS_FAIL(KS_ERR_NOMEM, "continuation of %zu bytes", len);
    joined[0] = anchor[0];
    memcpy(joined + 1, text, len + 1);
    ks_status st = ks_tokenize(model, joined, len + 1, false, false, NULL, 0, &nt);
    int32_t *tmp = ks_malloc(sizeof(int32_t) * (nt + 1));
    if (!tmp) {
        ks_free(joined);
        return KS_FAIL(KS_ERR_NOMEM, "continuation of %zu tokens", nt);
    }
    if (st == KS_OK || st == KS_ERR_INVALID_ARG) st = ks_tokenize(model, joined, len + 1, false, false, tmp, nt + 1, &nt);
    ks_free(joined);
    bool anchored = st == KS_OK && nt >= na && memcmp(tmp, a_ids, na * sizeof(int32_t)) == 0;
    if (anchored) {
        size_t n = nt - na;
        if (ids && n <= cap) memcpy(ids, tmp + na, n * sizeof(int32_t));
        ks_free(tmp);
        if (n > cap) {
            *n_out = n;
            return ids ? KS_FAIL(KS_ERR_INVALID_ARG, "continuation needs %zu ids, cap %zu", n, cap)
                       : KS_ERR_INVALID_ARG;
        }
        *n_out = n;
        return KS_OK;
    }
    ks_free(tmp);
    return ks_tokenize(model, text, len, false, false, ids, cap, n_out);
}

static ks_status eval_count_cont(const ks_model *m, const char *text, int32_t *out) {
    size_t n = 0;
    ks_status st = ks_eval_tokenize_cont(m, text, NULL, 0, &n);
    if (st != KS_OK && st != KS_ERR_INVALID_ARG) return st;
    *out = (int32_t)n;
    return KS_OK;
}

/* ------------------------------------------------------------ specs -- */

/* A needle inserted into the filler at fraction `frac` of its words. */
typedef struct eval_insert {
    double frac;
    char text[192];
    bool evidence;
} eval_insert;

#define KS_EVAL_MAX_INSERTS 12
#define KS_EVAL_MAX_ITEMS 8

/* Everything that does not depend on the filler size. */
typedef struct eval_spec {
    char intro[256];
    char question[256];
    int32_t n_ins;
    eval_insert ins[KS_EVAL_MAX_INSERTS];
    int32_t answer_budget;  /* GEN tokens for the final answer */
    /* longgen */
    int32_t n_items;
    int32_t item_budget;
    char instruction[192];
} eval_spec;

static int32_t eval_number(ks_rng *r, const int32_t *avoid, int n_avoid) {
    for (;;) {
        int32_t v = 10000 + (int32_t)(ks_rng_next(r) % 90000);
        bool dup = false;
        for (int i = 0; i < n_avoid; i++) dup |= avoid[i] == v;
        if (!dup) return v;
    }
}

static void eval_varname(ks_rng *r, char *buf) {
    for (int i = 0; i < 5; i++) buf[i] = (char)('A' + ks_rng_next(r) % 26);
    buf[5] = '\0';
}

static void eval_answer(ks_eval_instance *inst, const char *s) {
    KS_ASSERT(inst->n_answers < KS_EVAL_MAX_ANSWERS);
    snprintf(inst->answers[inst->n_answers++], KS_EVAL_ANSWER_CAP, "%s", s);
}

/* Builds the filler-independent parts at complexity `level` (0 = smallest).
 * Returns false when the level does not exist. */
static bool eval_spec_make(ks_eval_task task, uint64_t seed, int level, double depth, eval_spec *sp,
                           ks_eval_instance *inst) {
    memset(sp, 0, sizeof *sp);
    inst->n_answers = 0;
    inst->longgen_item = 0;
    ks_rng r = {seed * 0x9E3779B97F4A7C15ull ^ (uint64_t)(task + 1) * 0xD1B54A32D192ED03ull};
    bool intro = level > 0;
    /* distractor positions avoid the evidence: spread over the other half */
    double other = depth < 0.5 ? 0.75 : 0.25;
    switch (task) {
    case KS_EVAL_PASSKEY: {
        if (level > 1) return false;
        int32_t key = eval_number(&r, NULL, 0);
        if (intro) snprintf(sp->intro, sizeof sp->intro, "A pass key is hidden in the text below. Remember it.\n");
        snprintf(sp->ins[0].text, sizeof sp->ins[0].text, "The pass key is %d. Remember it. %d is the pass key.", key, key);
        sp->ins[0].frac = depth;
        sp->ins[0].evidence = true;
        sp->n_ins = 1;
        snprintf(sp->question, sizeof sp->question, "\nWhat is the pass key? The pass key is");
        sp->answer_budget = 8;
        char a[16];
        snprintf(a, sizeof a, "%d", key);
        eval_answer(inst, a);
        inst->n_needles = 1;
        return true;
    }
    case KS_EVAL_MULTIKEY: {
        static const int nn[] = {1, 1, 3, 4}; /* needles incl. the asked one, by level */
        if (level > 3) return false;
        int n = nn[level];
        int32_t vals[KS_EVAL_MAX_INSERTS];
        char keys[KS_EVAL_MAX_INSERTS][48];
        for (int i = 0; i < n; i++) {
            vals[i] = eval_number(&r, vals, i);
            for (;;) {
                snprintf(keys[i], sizeof keys[i], "%s-%s", eval_pick(&r, g_adj, KS_EVAL_NELEM(g_adj)),
                         eval_pick(&r, g_noun, KS_EVAL_NELEM(g_noun)));
                bool dup = false;
                for (int j = 0; j < i; j++) dup |= !strcmp(keys[i], keys[j]);
                if (!dup) break;
            }
            eval_insert *in = &sp->ins[sp->n_ins++];
            snprintf(in->text, sizeof in->text, "The magic number for %.40s is %d.", keys[i], vals[i]);
            in->evidence = i == 0;
            in->frac = i == 0 ? depth : (n > 2 ? (double)(i - 1) / (n - 2) : other);
        }
        if (intro) snprintf(sp->intro, sizeof sp->intro, "Some magic numbers are hidden in the text below. Remember them.\n");
        snprintf(sp->question, sizeof sp->question, "\nWhat is the magic number for %s? The magic number for %s is",
                 keys[0], keys[0]);
        sp->answer_budget = 8;
        char a[16];
        snprintf(a, sizeof a, "%d", vals[0]);
        eval_answer(inst, a);
        inst->n_needles = n;
        return true;
    }
    case KS_EVAL_MULTIVALUE: {
        if (level > 3) return false;
        int n = level <= 1 ? 2 : level + 1; /* values: 2, 2, 3, 4 */
        char key[48]; /* the smallest form (toy contexts) uses a one-word key and terse text */
        if (level == 0) snprintf(key, sizeof key, "%s", eval_pick(&r, g_noun, KS_EVAL_NELEM(g_noun)));
        else snprintf(key, sizeof key, "%s-%s", eval_pick(&r, g_adj, KS_EVAL_NELEM(g_adj)),
                      eval_pick(&r, g_noun, KS_EVAL_NELEM(g_noun)));
        int32_t vals[KS_EVAL_MAX_ANSWERS];
        eval_insert *in = &sp->ins[sp->n_ins++];
        in->frac = depth;
        in->evidence = true;
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            vals[i] = eval_number(&r, vals, i);
            off += (size_t)snprintf(in->text + off, sizeof in->text - off,
                                    level == 0 ? "%s%s: %d." : "%sOne magic number for %s is %d.", i ? " " : "",
                                    key, vals[i]);
            char a[16];
            snprintf(a, sizeof a, "%d", vals[i]);
            eval_answer(inst, a);
        }
        if (intro) snprintf(sp->intro, sizeof sp->intro, "Some magic numbers are hidden in the text below. Remember them.\n");
        snprintf(sp->question, sizeof sp->question,
                 level == 0 ? "\nAll numbers for %s:" : "\nWhat are all the magic numbers for %s? They are:", key);
        sp->answer_budget = 6 * n + 2;
        inst->n_needles = n;
        return true;
    }
    case KS_EVAL_VARTRACK: {
        if (level > 3) return false;
        int hops = level <= 1 ? 2 : level + 1; /* names in the chain: 2, 2, 3, 4 */
        bool distract = level >= 2;
        int32_t value = eval_number(&r, NULL, 0);
        char names[KS_EVAL_MAX_ANSWERS][8];
        for (int i = 0; i < hops + 2; i++) {
            for (;;) {
                eval_varname(&r, names[i]);
                bool dup = false;
                for (int j = 0; j < i; j++) dup |= !strcmp(names[i], names[j]);
                if (!dup) break;
            }
        }
        eval_insert *in = &sp->ins[sp->n_ins++];
        in->frac = depth;
        in->evidence = true;
        size_t off = (size_t)snprintf(in->text, sizeof in->text, "VAR %s = %d.", names[0], value);
        eval_answer(inst, names[0]);
        for (int i = 1; i < hops; i++) {
            off += (size_t)snprintf(in->text + off, sizeof in->text - off, " VAR %s = VAR %s.", names[i], names[i - 1]);
            eval_answer(inst, names[i]);
        }
        if (distract) {
            int32_t other_value = eval_number(&r, &value, 1);
            eval_insert *d = &sp->ins[sp->n_ins++];
            d->frac = other;
            snprintf(d->text, sizeof d->text, "VAR %s = %d. VAR %s = VAR %s.", names[hops], other_value,
                     names[hops + 1], names[hops]);
        }
        if (intro) snprintf(sp->intro, sizeof sp->intro, "Track the variables assigned in the text below.\n");
        if (level == 0)
            snprintf(sp->question, sizeof sp->question, "\nWhich variables equal %d? They are:", value);
        else
            snprintf(sp->question, sizeof sp->question,
                     "\nWhich variables are equal to %d? Answer: the variables equal to %d are:", value, value);
        sp->answer_budget = 6 * hops + 2;
        inst->n_needles = hops;
        return true;
    }
    case KS_EVAL_LONGGEN: {
        static const int items[] = {2, 2, 3, 4, 6, 8};
        if (level > 5) return false;
        sp->n_items = items[level];
        inst->longgen_item = 1 + (int32_t)(ks_rng_next(&r) % (uint64_t)sp->n_items);
        if (intro) snprintf(sp->intro, sizeof sp->intro, "Read the text and follow the instructions in it.\n");
        sp->item_budget = level == 0 ? 6 : 7;
        if (level == 0)
            snprintf(sp->instruction, sizeof sp->instruction, "Write %d random numbers.\n1.", sp->n_items);
        else
            snprintf(sp->instruction, sizeof sp->instruction,
                     "Write a list of %d random five-digit numbers, one per line, numbered 1 to %d.\n1.",
                     sp->n_items, sp->n_items);
        snprintf(sp->question, sizeof sp->question,
                 level == 0 ? "\nRepeat item %d.\n%d." : "\nRepeat item %d of your list exactly.\n%d.",
                 inst->longgen_item, inst->longgen_item);
        sp->answer_budget = sp->item_budget;
        inst->n_needles = sp->n_items;
        eval_answer(inst, "");
        return true;
    }
    default: return false;
    }
}

/* ------------------------------------------------------------ build -- */

static int eval_cmp_insert(const void *a, const void *b) {
    const int32_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

static void eval_segs_free(ks_eval_instance *inst) {
    for (int32_t i = 0; i < inst->n_segs; i++) ks_free(inst->segs[i].text);
    ks_free(inst->segs);
    ks_free(inst->prompt);
    inst->segs = NULL;
    inst->prompt = NULL;
    inst->n_segs = 0;
}

static void eval_seg_text(ks_eval_instance *inst, char *text) {
    inst->segs[inst->n_segs++] = (ks_eval_seg){KS_EVAL_SEG_TEXT, text, 0, false};
}

static void eval_seg_gen(ks_eval_instance *inst, int32_t max_tokens, bool stop_newline) {
    inst->segs[inst->n_segs++] = (ks_eval_seg){KS_EVAL_SEG_GEN, NULL, max_tokens, stop_newline};
}

/* Builds the script for w filler words and measures it.  Needle char edges
 * are recorded so the evidence span can be tokenized. */
static ks_status eval_build(const ks_model *m, const eval_spec *sp, const eval_filler *f, int32_t w,
                            bool spans, ks_eval_instance *inst) {
    eval_segs_free(inst);
    int32_t max_segs = 4 + 3 * KS_EVAL_MAX_ITEMS;
    inst->segs = ks_calloc((size_t)max_segs, sizeof(ks_eval_seg));
    if (!inst->segs) return KS_FAIL(KS_ERR_NOMEM, "script of %d segments", max_segs);
    ks_eval_sbuf b = {0};
    ks_eval_sbuf_puts(&b, sp->intro);
    size_t hay_begin = b.n, ev_begin = 0, ev_end = 0;
    if (inst->task != KS_EVAL_LONGGEN) {
        int32_t order[KS_EVAL_MAX_INSERTS][2]; /* [n_ins][word position, insert index] */
        for (int32_t i = 0; i < sp->n_ins; i++) {
            order[i][0] = eval_snap(f, sp->ins[i].frac * w, w);
            order[i][1] = i;
        }
        qsort(order, (size_t)sp->n_ins, sizeof order[0], eval_cmp_insert);
        int32_t at = 0;
        for (int32_t k = 0; k < sp->n_ins; k++) {
            const eval_insert *in = &sp->ins[order[k][1]];
            eval_filler_render(f, at, order[k][0], &b);
            at = order[k][0];
            if (b.n && b.s[b.n - 1] != '\n') ks_eval_sbuf_putn(&b, " ", 1);
            if (in->evidence) ev_begin = b.n > 0 && b.s[b.n - 1] == ' ' ? b.n - 1 : b.n;
            ks_eval_sbuf_puts(&b, in->text);
            if (in->evidence) ev_end = b.n;
        }
        eval_filler_render(f, at, w, &b);
        size_t hay_end = b.n;
        ks_eval_sbuf_puts(&b, sp->question);
        inst->prompt = b.refused ? NULL : ks_strdup(b.s);
        eval_seg_text(inst, ks_eval_sbuf_take(&b));
        if (!inst->prompt || !inst->segs[inst->n_segs - 1].text) return KS_FAIL(KS_ERR_NOMEM, "eval prompt");
        eval_seg_gen(inst, sp->answer_budget, false);
        int32_t hb = 0, he = 0, eb = 0, ee = 0;
        if (spans) { /* four more tokenizations: only for the final size */
            KS_TRY(eval_count(m, inst->prompt, hay_begin, true, &hb));
            KS_TRY(eval_count(m, inst->prompt, hay_end, true, &he));
            KS_TRY(eval_count(m, inst->prompt, ev_begin, true, &eb));
            KS_TRY(eval_count(m, inst->prompt, ev_end, true, &ee));
        }
        KS_TRY(eval_count(m, inst->prompt, strlen(inst->prompt), true, &inst->n_prompt));
        inst->haystack_begin = hb;
        inst->haystack_end = he;
        inst->evidence_begin = eb;
        inst->evidence_end = ee;
        inst->n_total = inst->n_prompt + sp->answer_budget;
    } else {
        /* [intro, filler before, instruction "1."] [GEN item] ["\n2."] ...
         * ["\n" filler after, question] [GEN answer] */
        int32_t split = eval_snap(f, inst->depth * w, w);
        eval_filler_render(f, 0, split, &b);
        size_t ev_char = b.n;
        if (b.n && b.s[b.n - 1] != '\n') ks_eval_sbuf_putn(&b, " ", 1);
        ks_eval_sbuf_puts(&b, sp->instruction);
        if (b.refused) {
            ks_free(b.s);
            return KS_FAIL(KS_ERR_NOMEM, "eval prompt");
        }
        ks_eval_sbuf all = {0};
        /* a failure below (a refused allocation while counting) frees the two buffers */
#define EVAL_TRY(expr)                         \
    do {                                       \
        ks_status eval_try_st_ = (expr);       \
        if (eval_try_st_ != KS_OK) {           \
            ks_free(b.s);                      \
            ks_free(all.s);                    \
            return eval_try_st_;               \
        }                                      \
    } while (0)
        ks_eval_sbuf_puts(&all, b.s);
        int32_t n = 0, hb = 0;
        if (all.refused) {
            ks_free(b.s);
            ks_free(all.s);
            return KS_FAIL(KS_ERR_NOMEM, "eval prompt");
        }
        EVAL_TRY(eval_count(m, b.s, hay_begin, true, &hb));
        EVAL_TRY(eval_count(m, b.s, b.n, true, &n));
        int32_t before = 0;
        EVAL_TRY(eval_count(m, b.s, ev_char, true, &before));
        eval_seg_text(inst, ks_eval_sbuf_take(&b));
        inst->haystack_begin = hb;
        inst->evidence_begin = before;
        int32_t gen = 0;
        for (int32_t i = 1; i <= sp->n_items; i++) {
            if (i > 1) {
                char label[16];
                snprintf(label, sizeof label, "\n%d.", (int)i);
                int32_t nl = 0;
                EVAL_TRY(eval_count_cont(m, label, &nl));
                n += nl;
                ks_eval_sbuf_puts(&all, label);
                char *copy = ks_strdup(label);
                if (!copy) {
                    ks_free(all.s);
                    return KS_FAIL(KS_ERR_NOMEM, "eval label");
                }
                eval_seg_text(inst, copy);
            }
            ks_eval_sbuf_puts(&all, " <item>");
            eval_seg_gen(inst, sp->item_budget, true);
            gen += sp->item_budget;
        }
        inst->evidence_end = n + gen;
        ks_eval_sbuf_puts(&b, "\n");
        eval_filler_render(f, split, w, &b);
        size_t tail_filler = b.n;
        ks_eval_sbuf_puts(&b, sp->question);
        int32_t nb = 0, nf = 0;
        if (b.refused || all.refused) {
            ks_free(b.s);
            ks_free(all.s);
            return KS_FAIL(KS_ERR_NOMEM, "eval prompt");
        }
        EVAL_TRY(eval_count_cont(m, b.s, &nb));
        char save = b.s[tail_filler];
        b.s[tail_filler] = '\0';
        EVAL_TRY(eval_count_cont(m, b.s, &nf));
        b.s[tail_filler] = save;
        ks_eval_sbuf_puts(&all, b.s);
        eval_seg_text(inst, ks_eval_sbuf_take(&b));
        eval_seg_gen(inst, sp->answer_budget, true);
        inst->n_prompt = n + nb;
        inst->haystack_end = n + gen + nf;
        inst->n_total = inst->n_prompt + gen + sp->answer_budget;
#undef EVAL_TRY
        inst->prompt = ks_eval_sbuf_take(&all);
        if (!inst->prompt || !inst->segs[inst->n_segs - 2].text) return KS_FAIL(KS_ERR_NOMEM, "eval prompt");
    }
    int32_t ev = inst->evidence_end - inst->evidence_begin;
    int32_t room = inst->haystack_end - inst->haystack_begin - ev;
    inst->depth_actual = room > 0 ? (double)(inst->evidence_begin - inst->haystack_begin) / room : 0.0;
    return KS_OK;
}

static int32_t eval_tolerance(int32_t target) {
    int32_t t = (int32_t)floor(target * KS_EVAL_LEN_TOL);
    return t > KS_EVAL_LEN_SLACK ? t : KS_EVAL_LEN_SLACK;
}

ks_status ks_eval_generate(ks_eval_task task, uint64_t seed, int32_t target_tokens, double depth,
                           const ks_model *model, ks_eval_instance *out) {
    if ((unsigned)task >= KS_EVAL_TASK_COUNT) return KS_FAIL(KS_ERR_INVALID_ARG, "bad eval task %d", (int)task);
    if (!model) return KS_FAIL(KS_ERR_INVALID_ARG, "no model for token counting");
    if (!(depth >= 0.0 && depth <= 1.0)) return KS_FAIL(KS_ERR_INVALID_ARG, "depth %g outside [0, 1]", depth);
    if (target_tokens < 16) return KS_FAIL(KS_ERR_INVALID_ARG, "target length %d too short", target_tokens);
    ks_eval_instance inst = {0};
    inst.task = task;
    inst.seed = seed;
    inst.target_tokens = target_tokens;
    inst.depth = depth;
    eval_spec sp;
    eval_filler f = {0};
    ks_status st = KS_OK;
    /* largest complexity level whose empty-haystack form fits */
    int level = 0;
    while (eval_spec_make(task, seed, level + 1, depth, &sp, &inst)) level++;
    for (;; level--) {
        if (level < 0) {
            st = KS_FAIL(KS_ERR_INVALID_ARG, "%s: target %d tokens is too short for the smallest instance",
                         ks_eval_task_name(task), target_tokens);
            goto fail;
        }
        eval_spec_make(task, seed, level, depth, &sp, &inst);
        eval_filler_free(&f);
        if ((st = eval_filler_make(&(ks_rng){seed ^ 0xF111E5ull}, 0, &f)) != KS_OK) goto fail;
        if ((st = eval_build(model, &sp, &f, 0, false, &inst)) != KS_OK) goto fail;
        if (inst.n_total <= target_tokens) break;
    }
    /* every filler word costs >= 1 token, so target words always suffice */
    eval_filler_free(&f);
    ks_rng fr = {seed ^ 0xF111E5ull};
    if ((st = eval_filler_make(&fr, target_tokens, &f)) != KS_OK) goto fail;
    int32_t lo = 0, hi = f.n; /* total(lo) <= target; find the largest such w */
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if ((st = eval_build(model, &sp, &f, mid, false, &inst)) != KS_OK) goto fail;
        if (inst.n_total <= target_tokens) lo = mid;
        else hi = mid - 1;
    }
    /* the count is only nearly monotone in w (needles snap to sentence
     * starts), so look a little past the search's answer */
    int32_t best_w = lo, best_n = -1;
    for (int32_t w = lo; w <= lo + 4 && w <= f.n; w++) {
        if ((st = eval_build(model, &sp, &f, w, false, &inst)) != KS_OK) goto fail;
        if (inst.n_total <= target_tokens && inst.n_total > best_n) {
            best_n = inst.n_total;
            best_w = w;
        }
    }
    if ((st = eval_build(model, &sp, &f, best_w, true, &inst)) != KS_OK) goto fail;
    KS_ASSERT(inst.n_total <= target_tokens);
    if (inst.n_total < target_tokens - eval_tolerance(target_tokens)) {
        st = KS_FAIL(KS_ERR_INVALID_ARG, "%s: could not size to %d tokens (got %d)", ks_eval_task_name(task),
                     target_tokens, inst.n_total);
        goto fail;
    }
    eval_filler_free(&f);
    *out = inst;
    return KS_OK;
fail:
    eval_filler_free(&f);
    eval_segs_free(&inst);
    return st;
}

void ks_eval_instance_free(ks_eval_instance *inst) {
    if (!inst) return;
    eval_segs_free(inst);
}
