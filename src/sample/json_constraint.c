/*
 * json_constraint.c — a JSON-Schema-driven acceptor and the sampling mask
 * built on it (json_constraint.h).
 *
 * Why a character-level pushdown acceptor rather than a grammar compiled to
 * a token automaton: token texts are arbitrary byte strings that cross
 * every JSON boundary ('",' or '":{"'), so the only exact test of a token is
 * to feed its bytes to the acceptor; a state of a few small frames copies
 * cheaply, so testing every token of the vocabulary costs a few hundred
 * thousand byte steps per generated token, small beside a decode step.
 *
 * Schema subset (everything else is refused by name): type (one of string,
 * number, integer, boolean, null, object, array), properties, required,
 * additionalProperties (true or false: only listed properties are ever
 * generated, which satisfies both), items, enum and const (scalars), and
 * the annotations title, description, $schema, $id, $comment, default,
 * examples.  An object without properties takes any keys with any values;
 * a schema without type or enum is any JSON value.
 *
 * Generated documents are compact: no whitespace anywhere, so a model can
 * never pad forever.  Numbers are at most 24 bytes, nesting at most
 * KS_JSON_MAX_DEPTH.  Keys of an object with properties are the listed
 * names, each at most once, in the order the model picks; '}' is allowed
 * once every required one is there.
 *
 * The budget: the constraint keeps "the shortest completion of the text so
 * far fits in the tokens left", testing a candidate's completion length
 * only when the budget is close (it cannot matter earlier).  Since a
 * vocabulary has single-byte tokens for the ASCII that completions are made
 * of, a token that writes the completion's next byte always qualifies, so
 * the document is always complete when max_tokens runs out.
 */
#include "sample/json_constraint.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { JC_MAX_NODES = 1024, JC_MAX_PROPS = 64, JC_MAX_ENUM = 64, JC_MAX_NUM = 24 };

typedef enum { JK_ANY, JK_STRING, JK_NUMBER, JK_INTEGER, JK_BOOL, JK_NULL, JK_OBJECT, JK_ARRAY, JK_ENUM } jc_kind;

typedef struct {
    uint8_t kind;
    uint8_t n_props, n_enum;
    bool free_keys;      /* object without properties: any key, any value */
    uint16_t items;      /* array: item node */
    uint32_t first;      /* object: first property in s->props; enum: first text in s->enums */
    uint64_t required;   /* object: bit i = property i is required */
} jc_node;

typedef struct {
    char *text; /* object key: the name as a JSON string, quotes included; enum: compact JSON */
    size_t len;
    uint16_t node; /* object key: the value's schema */
} jc_text;

struct ks_json_schema {
    jc_node nodes[JC_MAX_NODES];
    int n_nodes;
    jc_text *texts; /* [cap] property keys and enum values */
    size_t n_texts, cap_texts;
    uint16_t any; /* a JK_ANY node */
    uint16_t any_obj; /* a free-key object node (values of a free object are any) */
    size_t min_len;
};

/* ------------------------------------------------------------ compile -- */

typedef struct {
    ks_json_schema *s;
    char *where;
    size_t where_cap;
    ks_status st;
    char path[256];
} jc_build;

static void jc_fail(jc_build *b, ks_status st, const char *fmt, ...) {
    if (b->st != KS_OK) return;
    b->st = st;
    va_list ap;
    va_start(ap, fmt);
    char msg[256];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (b->where_cap) snprintf(b->where, b->where_cap, "%s at %s", msg, b->path[0] ? b->path : "/");
}

static int jc_node_new(jc_build *b, jc_kind k) {
    if (b->s->n_nodes >= JC_MAX_NODES) {
        jc_fail(b, KS_ERR_UNSUPPORTED, "more than %d schema nodes", JC_MAX_NODES);
        return -1;
    }
    int i = b->s->n_nodes++;
    memset(&b->s->nodes[i], 0, sizeof b->s->nodes[i]);
    b->s->nodes[i].kind = (uint8_t)k;
    return i;
}

static int jc_text_add(jc_build *b, char *text, uint16_t node) {
    ks_json_schema *s = b->s;
    if (!text) {
        jc_fail(b, KS_ERR_NOMEM, "out of memory");
        return -1;
    }
    if (s->n_texts == s->cap_texts) {
        size_t cap = s->cap_texts ? s->cap_texts * 2 : 32;
        jc_text *t = ks_realloc(s->texts, cap * sizeof *t);
        if (!t) {
            cJSON_free(text);
            jc_fail(b, KS_ERR_NOMEM, "out of memory");
            return -1;
        }
        s->texts = t;
        s->cap_texts = cap;
    }
    s->texts[s->n_texts] = (jc_text){text, strlen(text), node};
    return (int)s->n_texts++;
}

static int jc_compile(jc_build *b, const cJSON *j, int depth);

static void jc_path_push(jc_build *b, size_t *mark, const char *seg, const char *name) {
    *mark = strlen(b->path);
    snprintf(b->path + *mark, sizeof b->path - *mark, "/%s%s%s", seg, name ? "/" : "", name ? name : "");
}

static int jc_compile(jc_build *b, const cJSON *j, int depth) {
    if (b->st != KS_OK) return -1;
    if (depth > KS_JSON_MAX_DEPTH - 2) {
        jc_fail(b, KS_ERR_UNSUPPORTED, "nesting deeper than %d", KS_JSON_MAX_DEPTH - 2);
        return -1;
    }
    if (cJSON_IsTrue(j)) return b->s->any;
    if (!cJSON_IsObject(j)) {
        jc_fail(b, KS_ERR_INVALID_ARG, "a schema must be an object");
        return -1;
    }
    static const char *const known[] = {"type", "properties", "required", "additionalProperties", "items", "enum",
                                        "const", "title", "description", "$schema", "$id", "$comment", "default",
                                        "examples"};
    for (const cJSON *k = j->child; k; k = k->next) {
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof *known; i++) ok |= strcmp(k->string, known[i]) == 0;
        if (!ok) {
            jc_fail(b, KS_ERR_UNSUPPORTED, "unsupported keyword '%.64s'", k->string);
            return -1;
        }
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(j, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(j, "const");
    if (en || cn) {
        if (en && cn) {
            jc_fail(b, KS_ERR_UNSUPPORTED, "both enum and const");
            return -1;
        }
        if (en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) < 1 || cJSON_GetArraySize(en) > JC_MAX_ENUM)) {
            jc_fail(b, KS_ERR_INVALID_ARG, "enum must be an array of 1 to %d values", JC_MAX_ENUM);
            return -1;
        }
        int id = jc_node_new(b, JK_ENUM);
        if (id < 0) return -1;
        b->s->nodes[id].first = (uint32_t)b->s->n_texts;
        const cJSON *v = en ? en->child : cn;
        for (; v && b->st == KS_OK; v = en ? v->next : NULL) {
            if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
                jc_fail(b, KS_ERR_UNSUPPORTED, "enum/const of an array or object");
                return -1;
            }
            /* the value must also satisfy "type" when both are given */
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
            if (cJSON_IsString(ty)) {
                const char *t = ty->valuestring;
                bool fits = (!strcmp(t, "string") && cJSON_IsString(v)) || (!strcmp(t, "number") && cJSON_IsNumber(v)) ||
                            (!strcmp(t, "integer") && cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble)) ||
                            (!strcmp(t, "boolean") && cJSON_IsBool(v)) || (!strcmp(t, "null") && cJSON_IsNull(v));
                if (!fits) continue; /* a value the type excludes can never validate */
            }
            if (jc_text_add(b, cJSON_PrintUnformatted(v), 0) < 0) return -1;
            b->s->nodes[id].n_enum++;
        }
        if (b->s->nodes[id].n_enum == 0) {
            jc_fail(b, KS_ERR_INVALID_ARG, "no enum/const value has the schema's type");
            return -1;
        }
        return id;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!ty) {
        if (cJSON_GetObjectItemCaseSensitive(j, "properties")) ty = NULL; /* properties imply an object below */
        else return b->s->any;
    } else if (!cJSON_IsString(ty)) {
        jc_fail(b, KS_ERR_UNSUPPORTED, "'type' other than one string");
        return -1;
    }
    const char *t = ty ? ty->valuestring : "object";
    static const struct {
        const char *name;
        jc_kind k;
    } types[] = {{"string", JK_STRING}, {"number", JK_NUMBER}, {"integer", JK_INTEGER}, {"boolean", JK_BOOL},
                 {"null", JK_NULL},     {"object", JK_OBJECT}, {"array", JK_ARRAY}};
    int kind = -1;
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (!strcmp(t, types[i].name)) kind = (int)types[i].k;
    if (kind < 0) {
        jc_fail(b, KS_ERR_INVALID_ARG, "unknown type '%.32s'", t);
        return -1;
    }
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(j, "properties"),
                *req = cJSON_GetObjectItemCaseSensitive(j, "required"),
                *ap = cJSON_GetObjectItemCaseSensitive(j, "additionalProperties"),
                *items = cJSON_GetObjectItemCaseSensitive(j, "items");
    if (kind != JK_OBJECT && (props || req || ap)) {
        jc_fail(b, KS_ERR_INVALID_ARG, "properties/required/additionalProperties on a %s", t);
        return -1;
    }
    if (kind != JK_ARRAY && items) {
        jc_fail(b, KS_ERR_INVALID_ARG, "items on a %s", t);
        return -1;
    }
    if (ap && !cJSON_IsBool(ap)) {
        jc_fail(b, KS_ERR_UNSUPPORTED, "additionalProperties other than true or false");
        return -1;
    }
    int id = jc_node_new(b, (jc_kind)kind);
    if (id < 0) return -1;
    if (kind == JK_ARRAY) {
        int it = b->s->any;
        if (items) {
            size_t mark;
            jc_path_push(b, &mark, "items", NULL);
            it = jc_compile(b, items, depth + 1);
            b->path[mark] = '\0';
            if (it < 0) return -1;
        }
        b->s->nodes[id].items = (uint16_t)it;
    }
    if (kind == JK_OBJECT) {
        if (props && !cJSON_IsObject(props)) {
            jc_fail(b, KS_ERR_INVALID_ARG, "properties must be an object");
            return -1;
        }
        int np = props ? cJSON_GetArraySize(props) : 0;
        if (np > JC_MAX_PROPS) {
            jc_fail(b, KS_ERR_UNSUPPORTED, "more than %d properties", JC_MAX_PROPS);
            return -1;
        }
        /* the property texts are contiguous: compile the values first */
        int vals[JC_MAX_PROPS];
        int i = 0;
        for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
            size_t mark;
            jc_path_push(b, &mark, "properties", p->string);
            vals[i] = jc_compile(b, p, depth + 1);
            b->path[mark] = '\0';
            if (vals[i] < 0) return -1;
        }
        b->s->nodes[id].free_keys = np == 0;
        b->s->nodes[id].first = (uint32_t)b->s->n_texts;
        i = 0;
        for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
            cJSON *name = cJSON_CreateString(p->string);
            char *txt = name ? cJSON_PrintUnformatted(name) : NULL;
            cJSON_Delete(name);
            if (jc_text_add(b, txt, (uint16_t)vals[i]) < 0) return -1;
        }
        b->s->nodes[id].n_props = (uint8_t)np;
        if (req) {
            if (!cJSON_IsArray(req)) {
                jc_fail(b, KS_ERR_INVALID_ARG, "required must be an array of names");
                return -1;
            }
            for (const cJSON *r = req->child; r; r = r->next) {
                int found = -1;
                i = 0;
                for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++)
                    if (cJSON_IsString(r) && !strcmp(p->string, r->valuestring)) found = i;
                if (found < 0) {
                    /* a required name without a schema: only free objects could write it */
                    jc_fail(b, KS_ERR_UNSUPPORTED, "required '%.64s' is not in properties",
                            cJSON_IsString(r) ? r->valuestring : "?");
                    return -1;
                }
                b->s->nodes[id].required |= 1ull << found;
            }
        }
    }
    return id;
}

/* ------------------------------------------------------------ acceptor -- */

enum { F_VALUE, F_OBJ, F_ARR, F_STR, F_ENUM, F_NUM, F_LIT };

static const char *const jc_lits[] = {"true", "false", "null"};

static bool jc_push(ks_json_state *st, ks_json_frame f) {
    if (st->n >= KS_JSON_MAX_DEPTH) return false;
    st->f[st->n++] = f;
    return true;
}

static const jc_text *jc_cands(const ks_json_schema *s, const ks_json_frame *f, int *n) {
    const jc_node *nd = &s->nodes[f->node];
    *n = f->key ? nd->n_props : nd->n_enum;
    return &s->texts[nd->first];
}

/* A value ended (its frame was popped): tell the container.  idx: the key
 * an enum-key frame matched. */
static void jc_value_done(const ks_json_schema *s, ks_json_state *st, bool was_key, int idx) {
    (void)s;
    if (st->n == 0) {
        st->done = true;
        return;
    }
    ks_json_frame *p = &st->f[st->n - 1];
    if (p->t == F_OBJ && was_key) {
        p->phase = 1; /* expect ':' */
        p->cur = (uint16_t)(idx < 0 ? 0xFFFF : idx);
        if (idx >= 0) p->mask |= 1ull << idx;
    }
    /* F_OBJ after a value is already in phase 2, F_ARR in phase 1 */
}

/* Whether a number in this phase could end here. */
static bool jc_num_terminal(uint8_t ph) { return ph == 2 || ph == 3 || ph == 5 || ph == 8; }

/* An enum frame could end here: an alive candidate is matched whole. */
static int jc_enum_whole(const ks_json_schema *s, const ks_json_frame *f) {
    int n;
    const jc_text *c = jc_cands(s, f, &n);
    for (int i = 0; i < n; i++)
        if ((f->mask >> i & 1) && c[i].len == f->pos) return i;
    return -1;
}

static bool jc_feed1(const ks_json_schema *s, ks_json_state *st, unsigned char c) {
    for (;;) {
        if (st->n == 0) return false; /* complete: nothing may follow */
        ks_json_frame *f = &st->f[st->n - 1];
        const jc_node *nd = &s->nodes[f->node];
        switch (f->t) {
        case F_VALUE: {
            jc_kind k = (jc_kind)nd->kind;
            bool any = k == JK_ANY;
            if (k == JK_ENUM) {
                *f = (ks_json_frame){.t = F_ENUM, .node = f->node, .mask = nd->n_enum >= 64 ? ~0ull : (1ull << nd->n_enum) - 1};
                continue;
            }
            if (c == '"' && (k == JK_STRING || any)) {
                *f = (ks_json_frame){.t = F_STR, .node = f->node};
                return true;
            }
            if ((c == '-' || (c >= '0' && c <= '9')) && (k == JK_NUMBER || k == JK_INTEGER || any)) {
                *f = (ks_json_frame){.t = F_NUM, .node = f->node};
                continue;
            }
            if (((c == 't' || c == 'f') && (k == JK_BOOL || any)) || (c == 'n' && (k == JK_NULL || any))) {
                *f = (ks_json_frame){.t = F_LIT, .node = f->node, .cur = (uint16_t)(c == 't' ? 0 : c == 'f' ? 1 : 2)};
                continue;
            }
            if (c == '{' && (k == JK_OBJECT || any)) {
                *f = (ks_json_frame){.t = F_OBJ, .node = any ? s->any_obj : f->node};
                return true;
            }
            if (c == '[' && (k == JK_ARRAY || any)) {
                /* the any node's items are any, so an any-array needs no node of its own */
                *f = (ks_json_frame){.t = F_ARR, .node = any ? s->any : f->node};
                return true;
            }
            return false;
        }
        case F_STR:
            if (f->need) {
                if (c < f->lo || c > f->hi) return false;
                f->need--;
                f->lo = 0x80;
                f->hi = 0xBF;
                return true;
            }
            if (f->phase == 1) { /* after a backslash */
                if (c == 'u') {
                    f->phase = 2;
                    f->pos = 0;
                    return true;
                }
                if (!strchr("\"\\/bfnrt", c) || c == 0) return false;
                f->phase = 0;
                return true;
            }
            if (f->phase == 2) { /* \uXXXX, no surrogate halves: strict parsers reject lone ones */
                if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
                if (f->pos == 0) f->lo = (c == 'd' || c == 'D');
                else if (f->pos == 1 && f->lo && !(c >= '0' && c <= '7')) return false;
                if (++f->pos == 4) f->phase = 0;
                return true;
            }
            if (c == '"') {
                bool key = f->key;
                st->n--;
                jc_value_done(s, st, key, -1);
                return true;
            }
            if (c == '\\') {
                f->phase = 1;
                return true;
            }
            if (c < 0x20) return false;
            if (c >= 0x80) { /* UTF-8: a lead byte and the range of its first continuation */
                if (c >= 0xC2 && c <= 0xDF) f->need = 1, f->lo = 0x80, f->hi = 0xBF;
                else if (c == 0xE0) f->need = 2, f->lo = 0xA0, f->hi = 0xBF;
                else if (c == 0xED) f->need = 2, f->lo = 0x80, f->hi = 0x9F;
                else if (c >= 0xE1 && c <= 0xEF) f->need = 2, f->lo = 0x80, f->hi = 0xBF;
                else if (c == 0xF0) f->need = 3, f->lo = 0x90, f->hi = 0xBF;
                else if (c >= 0xF1 && c <= 0xF3) f->need = 3, f->lo = 0x80, f->hi = 0xBF;
                else if (c == 0xF4) f->need = 3, f->lo = 0x80, f->hi = 0x8F;
                else return false;
            }
            return true;
        case F_ENUM: {
            int n;
            const jc_text *cd = jc_cands(s, f, &n);
            uint64_t next = 0;
            for (int i = 0; i < n; i++)
                if ((f->mask >> i & 1) && cd[i].len > f->pos && (unsigned char)cd[i].text[f->pos] == c) next |= 1ull << i;
            if (next) {
                f->mask = next;
                f->pos++;
                /* a single candidate matched whole: done (strings are prefix-free) */
                int w = jc_enum_whole(s, f);
                if (w >= 0 && (next & (next - 1)) == 0) {
                    bool key = f->key;
                    st->n--;
                    jc_value_done(s, st, key, key ? w : -1);
                }
                return true;
            }
            int w = jc_enum_whole(s, f);
            if (w < 0) return false;
            bool key = f->key;
            st->n--;
            jc_value_done(s, st, key, key ? w : -1);
            continue; /* c belongs to the container */
        }
        case F_NUM: {
            bool integer = nd->kind == JK_INTEGER;
            uint8_t ph = f->phase, np = 0xFF;
            bool digit = c >= '0' && c <= '9';
            switch (ph) {
            case 0: np = c == '-' ? 1 : c == '0' ? 2 : digit ? 3 : 0xFF; break;
            case 1: np = c == '0' ? 2 : digit ? 3 : 0xFF; break;
            case 2:
            case 3:
                if (digit && ph == 3) np = 3;
                else if (c == '.' && !integer) np = 4;
                else if ((c == 'e' || c == 'E') && !integer) np = 6;
                break;
            case 4: np = digit ? 5 : 0xFF; break;
            case 5: np = digit ? 5 : (c == 'e' || c == 'E') ? 6 : 0xFF; break;
            case 6: np = (c == '+' || c == '-') ? 7 : digit ? 8 : 0xFF; break;
            case 7: np = digit ? 8 : 0xFF; break;
            case 8: np = digit && f->need < 3 ? 8 : 0xFF; break; /* at most 3 exponent digits: no overflow to inf */
            }
            if (np == 8) f->need++;
            if (np != 0xFF && f->pos < JC_MAX_NUM) {
                f->phase = np;
                f->pos++;
                return true;
            }
            if (!jc_num_terminal(ph)) return false;
            st->n--;
            jc_value_done(s, st, false, -1);
            continue;
        }
        case F_LIT: {
            const char *l = jc_lits[f->cur];
            if ((unsigned char)l[f->pos] != c) return false;
            if (l[++f->pos] == '\0') {
                st->n--;
                jc_value_done(s, st, false, -1);
            }
            return true;
        }
        case F_OBJ: {
            uint64_t all = nd->n_props >= 64 ? ~0ull : (1ull << nd->n_props) - 1;
            bool req_ok = (f->mask & nd->required) == nd->required;
            if (f->phase == 0 || f->phase == 3) { /* a key, or '}' right after '{' */
                if (c == '}' && f->phase == 0 && req_ok) {
                    st->n--;
                    jc_value_done(s, st, false, -1);
                    return true;
                }
                if (c != '"') return false;
                if (nd->free_keys) return jc_push(st, (ks_json_frame){.t = F_STR, .key = 1, .node = f->node});
                if ((f->mask & all) == all) return false;
                if (!jc_push(st, (ks_json_frame){.t = F_ENUM, .key = 1, .node = f->node, .mask = all & ~f->mask}))
                    return false;
                continue; /* the quote is the key's first byte */
            }
            if (f->phase == 1) {
                if (c != ':') return false;
                f->phase = 2;
                uint16_t vn = nd->free_keys || f->cur == 0xFFFF ? s->any : s->texts[nd->first + f->cur].node;
                return jc_push(st, (ks_json_frame){.t = F_VALUE, .node = vn});
            }
            /* phase 2: after a value */
            if (c == ',' && (nd->free_keys || (f->mask & all) != all)) {
                f->phase = 3;
                return true;
            }
            if (c == '}' && req_ok) {
                st->n--;
                jc_value_done(s, st, false, -1);
                return true;
            }
            return false;
        }
        case F_ARR: {
            uint16_t it = nd->items;
            if (c == ']') {
                st->n--;
                jc_value_done(s, st, false, -1);
                return true;
            }
            if (f->phase == 1) {
                if (c != ',') return false;
                return jc_push(st, (ks_json_frame){.t = F_VALUE, .node = it});
            }
            f->phase = 1;
            if (!jc_push(st, (ks_json_frame){.t = F_VALUE, .node = it})) return false;
            continue;
        }
        default: return false;
        }
    }
}

void ks_json_state_init(const ks_json_schema *s, ks_json_state *st) {
    st->n = 1;
    st->done = false;
    st->f[0] = (ks_json_frame){.t = F_VALUE, .node = 0};
    (void)s;
}

bool ks_json_state_feed(const ks_json_schema *s, ks_json_state *st, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!jc_feed1(s, st, (unsigned char)p[i])) return false;
    return true;
}

bool ks_json_state_complete(const ks_json_schema *s, const ks_json_state *st) {
    if (st->n == 0) return st->done;
    if (st->n != 1) return false;
    const ks_json_frame *f = &st->f[0];
    return (f->t == F_NUM && jc_num_terminal(f->phase)) || (f->t == F_ENUM && jc_enum_whole(s, f) >= 0);
}

/* The first byte of the shortest value of node. */
static unsigned char jc_min_first(const ks_json_schema *s, uint16_t node) {
    const jc_node *nd = &s->nodes[node];
    switch (nd->kind) {
    case JK_STRING: return '"';
    case JK_NUMBER:
    case JK_INTEGER: return '0';
    case JK_BOOL: return 'f';
    case JK_OBJECT: return '{';
    case JK_ARRAY: return '[';
    case JK_ENUM: {
        size_t best = 0;
        for (size_t i = 1; i < nd->n_enum; i++)
            if (s->texts[nd->first + i].len < s->texts[nd->first + best].len) best = i;
        return (unsigned char)s->texts[nd->first + best].text[0];
    }
    default: return 'n'; /* null: the shortest of anything */
    }
}

/* The next byte of the shortest completion; 0 when st is complete. */
static unsigned char jc_min_next(const ks_json_schema *s, const ks_json_state *st0) {
    ks_json_state st = *st0;
    for (;;) {
        if (st.n == 0) return 0;
        ks_json_frame *f = &st.f[st.n - 1];
        const jc_node *nd = &s->nodes[f->node];
        switch (f->t) {
        case F_VALUE: return jc_min_first(s, f->node);
        case F_STR:
            if (f->need) return f->lo;
            if (f->phase == 1) return 'n';
            if (f->phase == 2) return '0';
            return '"';
        case F_ENUM: {
            int n;
            const jc_text *cd = jc_cands(s, f, &n);
            int best = -1;
            uint64_t prefer = f->key ? f->mask & nd->required : 0; /* a key: a missing required one first */
            if (!prefer) prefer = f->mask;
            for (int i = 0; i < n; i++)
                if ((prefer >> i & 1) && (best < 0 || cd[i].len < cd[best].len)) best = i;
            if (best >= 0 && cd[best].len > f->pos) return (unsigned char)cd[best].text[f->pos];
            int w = jc_enum_whole(s, f);
            if (w < 0) return 0; /* cannot happen: an enum frame always has a live candidate */
            bool key = f->key;
            st.n--;
            jc_value_done(s, &st, key, key ? w : -1);
            if (st.n == 0) return 0;
            continue;
        }
        case F_NUM:
            if (!jc_num_terminal(f->phase)) return '0';
            st.n--;
            jc_value_done(s, &st, false, -1);
            if (st.n == 0) return 0;
            continue;
        case F_LIT: return (unsigned char)jc_lits[f->cur][f->pos];
        case F_OBJ: {
            bool missing = (f->mask & nd->required) != nd->required;
            if (f->phase == 0) return missing ? '"' : '}';
            if (f->phase == 3) return '"';
            if (f->phase == 1) return ':';
            return missing ? ',' : '}';
        }
        case F_ARR: return ']';
        default: return 0;
        }
    }
}

size_t ks_json_state_finish(const ks_json_schema *s, const ks_json_state *st0, char *buf, size_t cap) {
    ks_json_state st = *st0;
    size_t n = 0;
    for (;;) {
        unsigned char c = jc_min_next(s, &st);
        if (!c) break;
        if (!jc_feed1(s, &st, c)) break; /* cannot happen: every chosen byte is valid */
        if (n + 1 < cap) buf[n] = (char)c;
        n++;
        if (n > 1 << 20) break;
    }
    if (cap) buf[n < cap ? n : cap - 1] = '\0';
    return n;
}

size_t ks_json_schema_min_len(const ks_json_schema *s) { return s->min_len; }

ks_status ks_json_schema_compile(const char *schema, size_t len, ks_json_schema **out, char *where, size_t where_cap) {
    if (!out) return KS_FAIL(KS_ERR_INVALID_ARG, "json schema: NULL argument");
    if (where_cap) where[0] = '\0';
    ks_json_schema *s = ks_calloc(1, sizeof *s);
    if (!s) return KS_FAIL(KS_ERR_NOMEM, "json schema");
    jc_build b = {.s = s, .where = where, .where_cap = where_cap, .st = KS_OK};
    /* node 0 is the root, compiled into place below; then any, any_obj */
    s->n_nodes = 3;
    s->any = 1;
    s->any_obj = 2;
    s->nodes[1] = (jc_node){.kind = JK_ANY, .items = 1};
    s->nodes[2] = (jc_node){.kind = JK_OBJECT, .free_keys = true, .items = 1};
    int root;
    if (!schema) {
        root = 2;
    } else {
        cJSON *j = cJSON_ParseWithLength(schema, len);
        if (!j) {
            jc_fail(&b, KS_ERR_INVALID_ARG, "not valid JSON");
            root = -1;
        } else {
            root = jc_compile(&b, j, 0);
            cJSON_Delete(j);
        }
    }
    if (b.st == KS_OK && root < 0) b.st = KS_ERR_INVALID_ARG;
    if (b.st != KS_OK) {
        ks_status st = b.st;
        ks_json_schema_destroy(s);
        return KS_FAIL(st, "json schema: %s", where_cap ? where : "invalid");
    }
    s->nodes[0] = s->nodes[root];
    ks_json_state st;
    ks_json_state_init(s, &st);
    s->min_len = ks_json_state_finish(s, &st, NULL, 0);
    *out = s;
    return KS_OK;
}

void ks_json_schema_destroy(ks_json_schema *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_texts; i++) cJSON_free(s->texts[i].text);
    ks_free(s->texts);
    ks_free(s);
}

/* ------------------------------------------------------------ tokens -- */

struct ks_json_constraint {
    const ks_json_schema *s;
    ks_json_state st;
    int32_t n_vocab;
    char *blob;    /* [off[n_vocab]] every token's text */
    uint32_t *off; /* [n_vocab + 1] */
    bool *banned;  /* [n_vocab] tokens with no text: never written */
    bool *eog;     /* [n_vocab] end-of-generation tokens: only once the document could end */
    ks_json_schema *own; /* the schema when the constraint compiled it */
};

ks_status ks_json_constraint_create(const ks_model *m, const ks_json_schema *s, ks_json_constraint **out) {
    if (!m || !s || !out) return KS_FAIL(KS_ERR_INVALID_ARG, "json constraint: NULL argument");
    int32_t V = ks_model_n_vocab(m);
    ks_json_constraint *c = ks_calloc(1, sizeof *c);
    if (!c) return KS_FAIL(KS_ERR_NOMEM, "json constraint");
    c->s = s;
    c->n_vocab = V;
    ks_json_state_init(s, &c->st);
    c->off = ks_malloc(sizeof *c->off * ((size_t)V + 1));
    c->banned = ks_calloc((size_t)V, sizeof *c->banned);
    c->eog = ks_calloc((size_t)V, sizeof *c->eog);
    size_t cap = (size_t)V * 8 + 64, n = 0;
    c->blob = ks_malloc(cap);
    if (!c->off || !c->banned || !c->eog || !c->blob) {
        ks_json_constraint_destroy(c);
        return KS_FAIL(KS_ERR_NOMEM, "json constraint over %d tokens", V);
    }
    for (int32_t i = 0; i < V; i++) {
        char piece[256];
        size_t np = 0;
        if (ks_token_to_piece(m, i, piece, sizeof piece, &np) != KS_OK) np = 0;
        if (n + np > cap) {
            size_t nc = (n + np) * 2;
            char *b = ks_realloc(c->blob, nc);
            if (!b) {
                ks_json_constraint_destroy(c);
                return KS_FAIL(KS_ERR_NOMEM, "json constraint over %d tokens", V);
            }
            c->blob = b;
            cap = nc;
        }
        c->off[i] = (uint32_t)n;
        memcpy(c->blob + n, piece, np);
        n += np;
        c->eog[i] = ks_token_is_eog(m, i);
        c->banned[i] = np == 0 && !c->eog[i];
    }
    c->off[V] = (uint32_t)n;
    *out = c;
    return KS_OK;
}

ks_status ks_json_constraint_create_text(const ks_model *m, const char *schema_text, ks_json_constraint **out) {
    ks_json_schema *s = NULL;
    char where[256];
    bool any = !schema_text || !schema_text[0];
    KS_TRY(ks_json_schema_compile(any ? NULL : schema_text, any ? 0 : strlen(schema_text), &s, where, sizeof where));
    ks_status st = ks_json_constraint_create(m, s, out);
    if (st != KS_OK) {
        ks_json_schema_destroy(s);
        return st;
    }
    (*out)->own = s;
    return KS_OK;
}

void ks_json_constraint_destroy(ks_json_constraint *c) {
    if (!c) return;
    ks_json_schema_destroy(c->own);
    ks_free(c->blob);
    ks_free(c->off);
    ks_free(c->banned);
    ks_free(c->eog);
    ks_free(c);
}

int32_t ks_json_constraint_mask(ks_json_constraint *c, float *logits, int32_t tokens_left) {
    size_t fin = ks_json_state_finish(c->s, &c->st, NULL, 0);
    /* far from the end no single token can break the budget: a token adds
     * at most its length plus the depth's closers to the completion */
    bool tight = (int64_t)tokens_left <= (int64_t)fin + 2 * KS_JSON_MAX_DEPTH + 256;
    /* end-of-generation only where the text is a whole document that could
     * also go on (a top-level number); a closed one ends without a draw */
    bool complete = ks_json_state_complete(c->s, &c->st);
    int32_t allowed = 0;
    ks_json_state tmp;
    for (int32_t i = 0; i < c->n_vocab; i++) {
        if (logits[i] == -INFINITY) continue;
        bool ok = c->eog[i] ? complete : !c->banned[i];
        if (ok && !c->eog[i]) {
            size_t frames = (size_t)c->st.n;
            tmp.n = c->st.n;
            tmp.done = c->st.done;
            memcpy(tmp.f, c->st.f, frames * sizeof tmp.f[0]);
            ok = ks_json_state_feed(c->s, &tmp, c->blob + c->off[i], c->off[i + 1] - c->off[i]);
            if (ok && tight) ok = (int64_t)ks_json_state_finish(c->s, &tmp, NULL, 0) <= (int64_t)tokens_left - 1;
        }
        if (ok) allowed++;
        else logits[i] = -INFINITY;
    }
    return allowed;
}

bool ks_json_constraint_accept(ks_json_constraint *c, int32_t token) {
    if (token < 0 || token >= c->n_vocab || c->banned[token] || c->eog[token]) return false;
    ks_json_state tmp = c->st;
    if (!ks_json_state_feed(c->s, &tmp, c->blob + c->off[token], c->off[token + 1] - c->off[token])) return false;
    c->st = tmp;
    return true;
}

bool ks_json_constraint_done(const ks_json_constraint *c) {
    /* complete and closed: nothing can follow (a bare top-level number
     * could still grow, so it runs until the budget or a non-digit) */
    return c->st.n == 0 && c->st.done;
}
