/*
 * jinja.c — a small Jinja2 interpreter for chat templates: lexer, parser to
 * an AST, and a tree-walking evaluator over a small value type.
 *
 * Why an interpreter at all: a GGUF carries the exact template its model was
 * trained with, and the built-in families (tokenizer_chat.c) only
 * approximate the common ones; executing the template is the only way to get
 * byte-for-byte what Hugging Face's apply_chat_template produces for Qwen3's
 * thinking tags, DeepSeek's separators, Mistral's system placement and so on.
 *
 * The reference is jinja2 configured as transformers configures it
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
 * tojson = json.dumps(ensure_ascii=False)).  Supported:
 *   statements  if/elif/else, for (tuple targets, `if` filter, else,
 *               loop.index/index0/first/last/length/revindex/previtem/
 *               nextitem), set (name, ns.attr, block set), macro (with
 *               defaults and keyword arguments), break/continue,
 *               generation (transformers' marker: rendered as its body)
 *   expressions literals, lists, dicts, tuples, attribute/item access,
 *               slices with steps, calls, filters, tests, `~ + - * / // %
 *               **`, comparisons, in / not in, and/or/not, `a if c else b`
 *   filters     trim, tojson, length/count, upper, lower, default/d, items,
 *               first, last, join, list, string, int, float, abs,
 *               capitalize, title, replace, safe, indent, reverse,
 *               selectattr/rejectattr, select/reject, map(attribute=|filter),
 *               dictsort
 *   tests       defined, undefined, none, string, mapping, iterable,
 *               sequence, number, integer, float, boolean, true, false,
 *               even, odd, divisibleby, eq/equalto/ne/lt/le/gt/ge, in, sameas
 *   methods     str: strip/lstrip/rstrip/split/startswith/endswith/upper/
 *               lower/replace/title/capitalize/find/count/join/format
 *               ({} {0} {name} only);
 *               dict: get/items/keys/values
 *   globals     range, namespace, dict, raise_exception, strftime_now
 * Semantics follow Python's where templates can tell: an undefined value
 * prints as nothing and is false but is an error to index or call, a loop
 * body is a fresh scope each iteration (so `set` inside it does not leak:
 * what namespace() exists for), string length and slices count code points.
 * Known differences, none of which the published templates we test touch:
 * upper/lower/title and whitespace stripping know ASCII only, comparisons
 * do not chain, and strftime_now is not defined (templates then use their
 * fixed fallback date).
 *
 * Memory: the AST lives in the template's arena, every value of a render in
 * that render's arena, freed at once at the end; values are never mutated
 * except namespaces, so sharing is free.  The input is untrusted, so parsing
 * bounds nesting depth and rendering bounds steps, macro depth, arena size
 * and output size; every violation is a status naming the template line.
 */
#define _POSIX_C_SOURCE 200809L /* gmtime_r: strftime_now must not share gmtime's static buffer across threads */
#include "tokenizer/jinja.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <ctype.h>
#include <string.h>
#include <time.h>

enum {
    JJ_MAX_DEPTH = 200,            /* parser nesting (expressions and blocks) */
    JJ_MAX_CALL_DEPTH = 64,        /* macro calls in flight */
    JJ_MAX_STEPS = 20000000,       /* evaluated nodes per render */
    JJ_MAX_OUT = 32 << 20,         /* rendered bytes */
};
#define JJ_MAX_ARENA ((size_t)128 << 20) /* a render's values: a limit, not the machine's memory */

/* -------------------------------------------------------------- arena -- */

typedef struct jj_blk {
    struct jj_blk *next;
    size_t used, cap;
    max_align_t data[];
} jj_blk;

typedef struct {
    jj_blk *head;
    size_t total;
    bool refused;
    bool capped; /* refused for JJ_MAX_ARENA, not by the allocator */
} jj_arena;

static void *jj_alloc(jj_arena *a, size_t n) {
    if (a->refused) return NULL;
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap > JJ_MAX_ARENA) {
            a->refused = a->capped = true;
            return NULL;
        }
        jj_blk *b = ks_malloc(sizeof *b + cap);
        if (!b) {
            a->refused = true;
            return NULL;
        }
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
        a->total += cap;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void jj_arena_free(jj_arena *a) {
    for (jj_blk *b = a->head, *nx; b; b = nx) {
        nx = b->next;
        ks_free(b);
    }
    a->head = NULL;
}

static char *jj_strndup(jj_arena *a, const char *s, size_t n) {
    char *p = jj_alloc(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ------------------------------------------------------------- values -- */

typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_MACRO, JV_FUNC } jv_type;

typedef struct jj_list jj_list;
typedef struct jj_dict jj_dict;
typedef struct jn jn;

typedef struct jv {
    jv_type t;
    size_t n; /* JV_STR: bytes */
    union {
        bool b;
        int64_t i;
        double f;
        const char *s;
        jj_list *l;
        jj_dict *d;
        const jn *m; /* JV_MACRO: the macro statement */
        int fn;      /* JV_FUNC: a global function */
    } u;
} jv;

struct jj_list {
    jv *a; /* [cap] */
    size_t n, cap;
};
struct jj_dict {
    jv *k, *v; /* [cap] keys (strings) and values, insertion order */
    size_t n, cap;
    bool ns; /* a namespace(): the one mutable object templates have */
};

enum { JF_RANGE, JF_NAMESPACE, JF_DICT, JF_RAISE, JF_STRFTIME };

static const jv JV_U = {.t = JV_UNDEF};
static jv jv_none(void) { return (jv){.t = JV_NONE}; }
static jv jv_bool(bool b) { return (jv){.t = JV_BOOL, .u.b = b}; }
static jv jv_int(int64_t i) { return (jv){.t = JV_INT, .u.i = i}; }
static jv jv_float(double f) { return (jv){.t = JV_FLOAT, .u.f = f}; }
static jv jv_str(const char *s, size_t n) { return (jv){.t = JV_STR, .n = n, .u.s = s}; }

/* --------------------------------------------------------------- lexer -- */

typedef enum { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF } jt_type;

typedef struct {
    jt_type t;
    int line;
    const char *s; /* T_TEXT/T_NAME/T_OP: into the source; T_STR: unescaped, arena */
    size_t n;
    int64_t i;
    double f;
} jtok;

typedef struct {
    jj_arena *A;
    jtok *tok; /* [cap] */
    size_t n, cap, pos;
    int depth;
    char err[200];
    int err_line;
    bool failed;
} jparse;

static void jp_fail(jparse *p, int line, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = true;
    p->err_line = line;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
}

static jtok *jl_push(jparse *p, jt_type t, int line, const char *s, size_t n) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        jtok *nt = jj_alloc(p->A, cap * sizeof *nt);
        if (!nt) {
            jp_fail(p, line, "out of memory");
            return NULL;
        }
        if (p->n) memcpy(nt, p->tok, p->n * sizeof *nt);
        p->tok = nt;
        p->cap = cap;
    }
    jtok *k = &p->tok[p->n++];
    *k = (jtok){.t = t, .line = line, .s = s, .n = n};
    return k;
}

static bool jl_is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static int jl_count_lines(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

/* Append UTF-8 of code point cp to d (room for 4 bytes assumed). */
static size_t jj_utf8_put(char *d, uint32_t cp) {
    if (cp < 0x80) {
        d[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | (cp >> 6));
        d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12));
        d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18));
    d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int jl_hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal starting at s[*i] (the quote): Python escapes, as jinja2
 * decodes them with unicode-escape. */
static void jl_string(jparse *p, const char *s, size_t len, size_t *i, int *line) {
    char q = s[*i];
    size_t j = *i + 1, start = j;
    while (j < len && s[j] != q) {
        if (s[j] == '\\' && j + 1 < len) j++;
        j++;
    }
    if (j >= len) {
        jp_fail(p, *line, "unterminated string literal");
        return;
    }
    char *d = jj_alloc(p->A, (j - start) + 1);
    if (!d) {
        jp_fail(p, *line, "out of memory");
        return;
    }
    size_t n = 0;
    for (size_t k = start; k < j; k++) {
        char c = s[k];
        if (c != '\\') {
            d[n++] = c;
            continue;
        }
        char e = s[++k];
        switch (e) {
        case 'n': d[n++] = '\n'; break;
        case 't': d[n++] = '\t'; break;
        case 'r': d[n++] = '\r'; break;
        case '0': d[n++] = '\0'; break;
        case 'b': d[n++] = '\b'; break;
        case 'f': d[n++] = '\f'; break;
        case 'v': d[n++] = '\v'; break;
        case 'a': d[n++] = '\a'; break;
        case '\\': d[n++] = '\\'; break;
        case '\'': d[n++] = '\''; break;
        case '"': d[n++] = '"'; break;
        case '\n': break; /* line continuation */
        case 'x':
        case 'u':
        case 'U': {
            int w = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int h = 0; h < w; h++) {
                int v = k + 1 + (size_t)h < j ? jl_hex(s[k + 1 + h]) : -1;
                if (v < 0) {
                    jp_fail(p, *line, "bad \\%c escape in a string literal", e);
                    return;
                }
                cp = cp * 16 + (uint32_t)v;
            }
            if (cp > 0x10FFFF) {
                jp_fail(p, *line, "escape beyond U+10FFFF in a string literal");
                return;
            }
            k += (size_t)w;
            /* \xNN is one code point too (unicode-escape), so it is UTF-8 encoded */
            if ((size_t)(j - start) - n < 4) { /* cannot happen: an escape is longer than its UTF-8 */
                jp_fail(p, *line, "bad escape");
                return;
            }
            n += jj_utf8_put(d + n, cp);
            break;
        }
        default: /* unknown escapes stay as written, as in Python */
            d[n++] = '\\';
            d[n++] = e;
        }
    }
    d[n] = '\0';
    *line += jl_count_lines(s + *i, j + 1 - *i);
    jtok *k = jl_push(p, T_STR, *line, d, n);
    (void)k;
    *i = j + 1;
}

/* Tokens of one tag's body, from s[*i] up to and including its closer
 * ("}}" for kind '{', "%}" for '%').  Returns the index after the closer,
 * with *strip_after set when the closer was "-}}"/"-%}". */
static size_t jl_tag(jparse *p, const char *s, size_t len, size_t i, char kind, int *line, bool *strip_after) {
    int braces = 0;
    for (;;) {
        if (p->failed) return len;
        while (i < len && jl_is_ws(s[i])) {
            if (s[i] == '\n') (*line)++;
            i++;
        }
        if (i >= len) {
            jp_fail(p, *line, "unclosed %s tag", kind == '{' ? "{{" : "{%");
            return len;
        }
        char close = kind == '{' ? '}' : '%';
        if (braces == 0) {
            if (s[i] == '-' && i + 2 < len + 0 && s[i + 1] == close && s[i + 2] == '}') {
                *strip_after = true;
                jl_push(p, kind == '{' ? T_VAR_END : T_BLOCK_END, *line, s + i, 3);
                return i + 3;
            }
            if (s[i] == close && i + 1 < len && s[i + 1] == '}') {
                *strip_after = false;
                jl_push(p, kind == '{' ? T_VAR_END : T_BLOCK_END, *line, s + i, 2);
                return i + 2;
            }
        }
        char c = s[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t j = i;
            while (j < len && ((s[j] >= 'a' && s[j] <= 'z') || (s[j] >= 'A' && s[j] <= 'Z') || s[j] == '_' ||
                               (s[j] >= '0' && s[j] <= '9')))
                j++;
            jl_push(p, T_NAME, *line, s + i, j - i);
            i = j;
        } else if (c >= '0' && c <= '9') {
            size_t j = i;
            bool fl = false;
            while (j < len && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_')) j++;
            if (j + 1 < len && s[j] == '.' && s[j + 1] >= '0' && s[j + 1] <= '9') {
                fl = true;
                j++;
                while (j < len && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_')) j++;
            }
            if (j < len && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < len && (s[k] == '+' || s[k] == '-')) k++;
                if (k < len && s[k] >= '0' && s[k] <= '9') {
                    fl = true;
                    j = k;
                    while (j < len && s[j] >= '0' && s[j] <= '9') j++;
                }
            }
            char buf[64];
            size_t m = 0;
            for (size_t k = i; k < j && m + 1 < sizeof buf; k++)
                if (s[k] != '_') buf[m++] = s[k];
            buf[m] = '\0';
            jtok *t = jl_push(p, fl ? T_FLOAT : T_INT, *line, s + i, j - i);
            if (t) {
                if (fl) t->f = strtod(buf, NULL);
                else {
                    errno = 0;
                    long long v = strtoll(buf, NULL, 10);
                    if (errno) jp_fail(p, *line, "integer literal out of range");
                    t->i = v;
                }
            }
            i = j;
        } else if (c == '\'' || c == '"') {
            jl_string(p, s, len, &i, line);
        } else {
            static const char *two[] = {"//", "**", "==", "!=", "<=", ">="};
            size_t w = 0;
            for (size_t k = 0; k < sizeof two / sizeof *two; k++)
                if (i + 1 < len && s[i] == two[k][0] && s[i + 1] == two[k][1]) w = 2;
            if (!w && strchr("()[]{}.,:|~+-*/%<>=", c) && c != '\0') w = 1;
            if (!w) {
                jp_fail(p, *line, "unexpected character '%c' in a tag", c);
                return len;
            }
            if (c == '{') braces++;
            if (c == '}') braces--;
            jl_push(p, T_OP, *line, s + i, w);
            i += w;
        }
    }
}

static void jl_lex(jparse *p, const char *s, size_t len) {
    /* keep_trailing_newline=False: one final newline is not output */
    if (len && s[len - 1] == '\n') len--;
    size_t i = 0;
    int line = 1;
    bool line_start = true;
    while (i < len && !p->failed) {
        size_t j = i;
        while (j + 1 < len && !(s[j] == '{' && (s[j + 1] == '{' || s[j + 1] == '%' || s[j + 1] == '#'))) j++;
        if (j + 1 >= len) {
            jl_push(p, T_TEXT, line, s + i, len - i);
            break;
        }
        char kind = s[j + 1];
        size_t k = j + 2, tlen = j - i;
        if (k < len && s[k] == '-') {
            while (tlen && jl_is_ws(s[i + tlen - 1])) tlen--;
            k++;
        } else if (k < len && s[k] == '+' && kind != '{') {
            k++;
        } else if (kind != '{') { /* lstrip_blocks */
            size_t lp = tlen;
            while (lp && s[i + lp - 1] != '\n') lp--;
            bool blank = true;
            for (size_t q = lp; q < tlen; q++)
                if (s[i + q] != ' ' && s[i + q] != '\t') blank = false;
            if ((lp > 0 || line_start) && blank) tlen = lp;
        }
        if (tlen) jl_push(p, T_TEXT, line, s + i, tlen);
        line += jl_count_lines(s + i, j - i);
        bool strip_after = false;
        if (kind == '#') {
            size_t e = k;
            while (e + 1 < len && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= len) {
                jp_fail(p, line, "unclosed comment");
                return;
            }
            strip_after = e > k && s[e - 1] == '-';
            line += jl_count_lines(s + j, e - j);
            i = e + 2;
        } else {
            jl_push(p, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, line, s + j, k - j);
            i = jl_tag(p, s, len, k, kind, &line, &strip_after);
        }
        size_t i0 = i;
        if (strip_after) {
            while (i < len && jl_is_ws(s[i])) i++;
        } else if (kind != '{' && i < len && s[i] == '\n') { /* trim_blocks */
            i++;
        }
        line += jl_count_lines(s + i0, i - i0);
        line_start = i > i0 ? s[i - 1] == '\n' : false;
    }
    jl_push(p, T_EOF, line, s + len, 0);
}

/* -------------------------------------------------------------- parser -- */

typedef enum {
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_PARAM,
    /* expressions */
    N_LIT, N_NAME, N_LIST, N_DICT, N_PAIR, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_KWARG, N_FILTER, N_TEST, N_BIN,
    N_NOT, N_NEG, N_POS, N_COND, N_AND, N_OR, N_CONCAT
} jn_kind;

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN } jn_op;

struct jn {
    jn_kind k;
    int line;
    int op;    /* N_BIN: jn_op; N_TEST: negated */
    const char *s; /* N_TEXT, N_NAME, N_ATTR, N_FILTER, N_TEST, N_MACRO, N_KWARG, N_PARAM */
    size_t n;
    jv val;  /* N_LIT */
    jn *a, *b, *c, *d;
    jn *els;  /* N_FOR: the {% else %} body */
    jn *next; /* the next statement of a body, the next element of a list */
};

static jn *jp_node(jparse *p, jn_kind k, int line) {
    jn *n = jj_alloc(p->A, sizeof *n);
    if (!n) {
        jp_fail(p, line, "out of memory");
        return NULL;
    }
    memset(n, 0, sizeof *n);
    n->k = k;
    n->line = line;
    return n;
}

static jtok *jp_peek(jparse *p) { return &p->tok[p->pos]; }
static jtok *jp_peek2(jparse *p) { return &p->tok[p->pos + 1 < p->n ? p->pos + 1 : p->pos]; }
static jtok *jp_next(jparse *p) {
    jtok *t = &p->tok[p->pos];
    if (t->t != T_EOF) p->pos++;
    return t;
}
static bool jt_is(const jtok *t, jt_type ty, const char *s) {
    return t->t == ty && (!s || (t->n == strlen(s) && memcmp(t->s, s, t->n) == 0));
}
static bool jp_skip(jparse *p, jt_type ty, const char *s) {
    if (!jt_is(jp_peek(p), ty, s)) return false;
    jp_next(p);
    return true;
}
static void jp_expect(jparse *p, jt_type ty, const char *s, const char *what) {
    if (!jp_skip(p, ty, s)) {
        jtok *t = jp_peek(p);
        jp_fail(p, t->line, "expected %s, found '%.*s'", what, (int)(t->n > 40 ? 40 : t->n), t->t == T_EOF ? "end of template" : t->s);
    }
}

static jn *jp_expr(jparse *p);
static jn *jp_or(jparse *p);
static jn *jp_unary(jparse *p, bool with_filter);
static jn *jp_primary(jparse *p);
static jn *jp_postfix(jparse *p, jn *n);

/* Call arguments after '(' up to ')': positional exprs and N_KWARG. */
static jn *jp_args(jparse *p) {
    jn *head = NULL, **tail = &head;
    while (!p->failed && !jt_is(jp_peek(p), T_OP, ")")) {
        jn *a;
        if (jp_peek(p)->t == T_NAME && jt_is(jp_peek2(p), T_OP, "=")) {
            jtok *nm = jp_next(p);
            jp_next(p);
            a = jp_node(p, N_KWARG, nm->line);
            if (!a) return NULL;
            a->s = nm->s;
            a->n = nm->n;
            a->a = jp_expr(p);
        } else {
            a = jp_expr(p);
        }
        if (!a) return NULL;
        *tail = a;
        tail = &a->next;
        if (!jp_skip(p, T_OP, ",")) break;
    }
    jp_expect(p, T_OP, ")", "')'");
    return head;
}

static bool jp_enter(jparse *p) {
    if (++p->depth > JJ_MAX_DEPTH) {
        jp_fail(p, jp_peek(p)->line, "nesting deeper than %d", JJ_MAX_DEPTH);
        return false;
    }
    return true;
}

static jn *jp_filter_expr(jparse *p, jn *n) {
    while (n && !p->failed) {
        jtok *t = jp_peek(p);
        if (jt_is(t, T_OP, "|")) {
            jp_next(p);
            jtok *nm = jp_next(p);
            if (nm->t != T_NAME) {
                jp_fail(p, nm->line, "expected a filter name after '|'");
                return NULL;
            }
            jn *f = jp_node(p, N_FILTER, nm->line);
            if (!f) return NULL;
            f->s = nm->s;
            f->n = nm->n;
            f->a = n;
            if (jp_skip(p, T_OP, "(")) f->b = jp_args(p);
            n = f;
        } else if (jt_is(t, T_NAME, "is")) {
            jp_next(p);
            jn *f = jp_node(p, N_TEST, t->line);
            if (!f) return NULL;
            if (jp_skip(p, T_NAME, "not")) f->op = 1;
            jtok *nm = jp_next(p);
            if (nm->t != T_NAME) {
                jp_fail(p, nm->line, "expected a test name after 'is'");
                return NULL;
            }
            f->s = nm->s;
            f->n = nm->n;
            f->a = n;
            jtok *q = jp_peek(p);
            if (jt_is(q, T_OP, "(")) {
                jp_next(p);
                f->b = jp_args(p);
            } else if ((q->t == T_NAME && !jt_is(q, T_NAME, "else") && !jt_is(q, T_NAME, "or") &&
                        !jt_is(q, T_NAME, "and") && !jt_is(q, T_NAME, "if") && !jt_is(q, T_NAME, "in") &&
                        !jt_is(q, T_NAME, "is") && !jt_is(q, T_NAME, "not")) ||
                       q->t == T_STR || q->t == T_INT || q->t == T_FLOAT) {
                f->b = jp_postfix(p, jp_primary(p));
            }
            n = f;
        } else {
            break;
        }
    }
    return n;
}

static jn *jp_postfix(jparse *p, jn *n) {
    while (n && !p->failed) {
        jtok *t = jp_peek(p);
        if (jt_is(t, T_OP, ".")) {
            jp_next(p);
            jtok *nm = jp_next(p);
            jn *a;
            if (nm->t == T_NAME) {
                a = jp_node(p, N_ATTR, nm->line);
                if (!a) return NULL;
                a->s = nm->s;
                a->n = nm->n;
            } else if (nm->t == T_INT) { /* x.0 is x[0] */
                a = jp_node(p, N_ITEM, nm->line);
                if (!a) return NULL;
                a->b = jp_node(p, N_LIT, nm->line);
                if (!a->b) return NULL;
                a->b->val = jv_int(nm->i);
            } else {
                jp_fail(p, nm->line, "expected an attribute name after '.'");
                return NULL;
            }
            a->a = n;
            n = a;
        } else if (jt_is(t, T_OP, "[")) {
            jp_next(p);
            jn *lo = NULL, *hi = NULL, *st = NULL;
            bool slice = false;
            if (!jt_is(jp_peek(p), T_OP, ":")) lo = jp_expr(p);
            if (jp_skip(p, T_OP, ":")) {
                slice = true;
                if (!jt_is(jp_peek(p), T_OP, "]") && !jt_is(jp_peek(p), T_OP, ":")) hi = jp_expr(p);
                if (jp_skip(p, T_OP, ":") && !jt_is(jp_peek(p), T_OP, "]")) st = jp_expr(p);
            }
            jp_expect(p, T_OP, "]", "']'");
            jn *a = jp_node(p, slice ? N_SLICE : N_ITEM, t->line);
            if (!a) return NULL;
            a->a = n;
            a->b = lo;
            a->c = hi;
            a->d = st;
            n = a;
        } else if (jt_is(t, T_OP, "(")) {
            jp_next(p);
            jn *c = jp_node(p, N_CALL, t->line);
            if (!c) return NULL;
            c->a = n;
            c->b = jp_args(p);
            n = c;
        } else {
            break;
        }
    }
    return n;
}

static jn *jp_primary(jparse *p) {
    if (p->failed || !jp_enter(p)) return NULL;
    jtok *t = jp_next(p);
    jn *n = NULL;
    switch (t->t) {
    case T_NAME:
        n = jp_node(p, N_LIT, t->line);
        if (!n) break;
        if (jt_is(t, T_NAME, "true") || jt_is(t, T_NAME, "True")) n->val = jv_bool(true);
        else if (jt_is(t, T_NAME, "false") || jt_is(t, T_NAME, "False")) n->val = jv_bool(false);
        else if (jt_is(t, T_NAME, "none") || jt_is(t, T_NAME, "None")) n->val = jv_none();
        else {
            n->k = N_NAME;
            n->s = t->s;
            n->n = t->n;
        }
        break;
    case T_STR: {
        /* adjacent literals concatenate */
        size_t total = t->n;
        size_t q = p->pos;
        while (p->tok[q].t == T_STR) total += p->tok[q++].n;
        char *d = jj_alloc(p->A, total + 1);
        n = jp_node(p, N_LIT, t->line);
        if (!d || !n) {
            jp_fail(p, t->line, "out of memory");
            break;
        }
        memcpy(d, t->s, t->n);
        size_t m = t->n;
        while (jp_peek(p)->t == T_STR) {
            jtok *u = jp_next(p);
            memcpy(d + m, u->s, u->n);
            m += u->n;
        }
        d[m] = '\0';
        n->val = jv_str(d, m);
        break;
    }
    case T_INT:
    case T_FLOAT:
        n = jp_node(p, N_LIT, t->line);
        if (n) n->val = t->t == T_INT ? jv_int(t->i) : jv_float(t->f);
        break;
    case T_OP:
        if (jt_is(t, T_OP, "(")) {
            if (jp_skip(p, T_OP, ")")) {
                n = jp_node(p, N_LIST, t->line);
                break;
            }
            jn *e = jp_expr(p);
            if (jp_skip(p, T_OP, ",")) { /* a tuple: a list to us */
                n = jp_node(p, N_LIST, t->line);
                if (!n) break;
                n->a = e;
                jn **tail = &e->next;
                while (!p->failed && !jt_is(jp_peek(p), T_OP, ")")) {
                    jn *x = jp_expr(p);
                    if (!x) break;
                    *tail = x;
                    tail = &x->next;
                    if (!jp_skip(p, T_OP, ",")) break;
                }
            } else {
                n = e;
            }
            jp_expect(p, T_OP, ")", "')'");
        } else if (jt_is(t, T_OP, "[")) {
            n = jp_node(p, N_LIST, t->line);
            if (!n) break;
            jn **tail = &n->a;
            while (!p->failed && !jt_is(jp_peek(p), T_OP, "]")) {
                jn *x = jp_expr(p);
                if (!x) break;
                *tail = x;
                tail = &x->next;
                if (!jp_skip(p, T_OP, ",")) break;
            }
            jp_expect(p, T_OP, "]", "']'");
        } else if (jt_is(t, T_OP, "{")) {
            n = jp_node(p, N_DICT, t->line);
            if (!n) break;
            jn **tail = &n->a;
            while (!p->failed && !jt_is(jp_peek(p), T_OP, "}")) {
                jn *pr = jp_node(p, N_PAIR, jp_peek(p)->line);
                if (!pr) break;
                pr->a = jp_expr(p);
                jp_expect(p, T_OP, ":", "':'");
                pr->b = jp_expr(p);
                *tail = pr;
                tail = &pr->next;
                if (!jp_skip(p, T_OP, ",")) break;
            }
            jp_expect(p, T_OP, "}", "'}'");
        } else {
            jp_fail(p, t->line, "unexpected '%.*s'", (int)t->n, t->s);
        }
        break;
    default:
        jp_fail(p, t->line, "expected an expression");
    }
    p->depth--;
    return p->failed ? NULL : n;
}

static jn *jp_bin(jparse *p, int op, int line, jn *a, jn *b) {
    jn *n = jp_node(p, N_BIN, line);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jn *jp_unary(jparse *p, bool with_filter) {
    if (p->failed || !jp_enter(p)) return NULL;
    jtok *t = jp_peek(p);
    jn *n;
    if (jt_is(t, T_OP, "-") || jt_is(t, T_OP, "+")) {
        jp_next(p);
        n = jp_node(p, t->s[0] == '-' ? N_NEG : N_POS, t->line);
        if (n) n->a = jp_unary(p, false);
    } else {
        n = jp_postfix(p, jp_primary(p));
    }
    if (with_filter) n = jp_filter_expr(p, n);
    p->depth--;
    return p->failed ? NULL : n;
}

static jn *jp_pow(jparse *p) {
    jn *l = jp_unary(p, true);
    while (!p->failed && jt_is(jp_peek(p), T_OP, "**")) {
        int line = jp_next(p)->line;
        l = jp_bin(p, OP_POW, line, l, jp_unary(p, true));
    }
    return l;
}

static jn *jp_math2(jparse *p) {
    jn *l = jp_pow(p);
    for (;;) {
        jtok *t = jp_peek(p);
        int op = jt_is(t, T_OP, "*") ? OP_MUL : jt_is(t, T_OP, "/") ? OP_DIV : jt_is(t, T_OP, "//") ? OP_FDIV
                 : jt_is(t, T_OP, "%") ? OP_MOD : -1;
        if (op < 0 || p->failed) return l;
        jp_next(p);
        l = jp_bin(p, op, t->line, l, jp_pow(p));
    }
}

static jn *jp_concat(jparse *p) {
    jn *l = jp_math2(p);
    if (!jt_is(jp_peek(p), T_OP, "~")) return l;
    jn *c = jp_node(p, N_CONCAT, jp_peek(p)->line);
    if (!c) return NULL;
    c->a = l;
    jn **tail = l ? &l->next : &c->a;
    while (!p->failed && jp_skip(p, T_OP, "~")) {
        jn *x = jp_math2(p);
        if (!x) return NULL;
        *tail = x;
        tail = &x->next;
    }
    return c;
}

static jn *jp_math1(jparse *p) {
    jn *l = jp_concat(p);
    for (;;) {
        jtok *t = jp_peek(p);
        int op = jt_is(t, T_OP, "+") ? OP_ADD : jt_is(t, T_OP, "-") ? OP_SUB : -1;
        if (op < 0 || p->failed) return l;
        jp_next(p);
        l = jp_bin(p, op, t->line, l, jp_concat(p));
    }
}

static jn *jp_compare(jparse *p) {
    jn *l = jp_math1(p);
    for (;;) {
        jtok *t = jp_peek(p);
        int op = -1;
        if (jt_is(t, T_OP, "==")) op = OP_EQ;
        else if (jt_is(t, T_OP, "!=")) op = OP_NE;
        else if (jt_is(t, T_OP, "<")) op = OP_LT;
        else if (jt_is(t, T_OP, "<=")) op = OP_LE;
        else if (jt_is(t, T_OP, ">")) op = OP_GT;
        else if (jt_is(t, T_OP, ">=")) op = OP_GE;
        else if (jt_is(t, T_NAME, "in")) op = OP_IN;
        else if (jt_is(t, T_NAME, "not") && jt_is(jp_peek2(p), T_NAME, "in")) op = OP_NOTIN;
        if (op < 0 || p->failed) return l;
        jp_next(p);
        if (op == OP_NOTIN) jp_next(p);
        l = jp_bin(p, op, t->line, l, jp_math1(p));
    }
}

static jn *jp_not(jparse *p) {
    if (p->failed || !jp_enter(p)) return NULL;
    jn *n;
    jtok *t = jp_peek(p);
    if (jt_is(t, T_NAME, "not")) {
        jp_next(p);
        n = jp_node(p, N_NOT, t->line);
        if (n) n->a = jp_not(p);
    } else {
        n = jp_compare(p);
    }
    p->depth--;
    return p->failed ? NULL : n;
}

static jn *jp_and(jparse *p) {
    jn *l = jp_not(p);
    while (!p->failed && jt_is(jp_peek(p), T_NAME, "and")) {
        jn *n = jp_node(p, N_AND, jp_next(p)->line);
        if (!n) return NULL;
        n->a = l;
        n->b = jp_not(p);
        l = n;
    }
    return l;
}

static jn *jp_or(jparse *p) {
    jn *l = jp_and(p);
    while (!p->failed && jt_is(jp_peek(p), T_NAME, "or")) {
        jn *n = jp_node(p, N_OR, jp_next(p)->line);
        if (!n) return NULL;
        n->a = l;
        n->b = jp_and(p);
        l = n;
    }
    return l;
}

static jn *jp_expr(jparse *p) {
    if (p->failed || !jp_enter(p)) return NULL;
    jn *l = jp_or(p);
    while (!p->failed && jt_is(jp_peek(p), T_NAME, "if")) {
        jn *n = jp_node(p, N_COND, jp_next(p)->line);
        if (!n) break;
        n->a = l;
        n->b = jp_or(p);
        if (jp_skip(p, T_NAME, "else")) n->c = jp_expr(p);
        l = n;
    }
    p->depth--;
    return p->failed ? NULL : l;
}

/* Statements up to a {% NAME %} with NAME in ends (not consumed; *end gets
 * its index) or the end of the template (only when ends is empty). */
static jn *jp_body(jparse *p, const char *const *ends, int n_ends, int *end);

static void jp_block_end(jparse *p) { jp_expect(p, T_BLOCK_END, NULL, "'%}'"); }

/* Consume "{% NAME" of an end/else keyword found by jp_body. */
static void jp_keyword(jparse *p) {
    jp_next(p); /* T_BLOCK_BEGIN */
    jp_next(p); /* the name */
}

static jn *jp_target(jparse *p) {
    jtok *t = jp_next(p);
    if (t->t != T_NAME) {
        jp_fail(p, t->line, "expected a variable name");
        return NULL;
    }
    jn *n = jp_node(p, N_NAME, t->line);
    if (!n) return NULL;
    n->s = t->s;
    n->n = t->n;
    return n;
}

static jn *jp_stmt_if(jparse *p, int line) {
    static const char *const ends[] = {"elif", "else", "endif"};
    jn *n = jp_node(p, N_IF, line);
    if (!n) return NULL;
    n->a = jp_expr(p);
    jp_block_end(p);
    int e = -1;
    n->b = jp_body(p, ends, 3, &e);
    if (p->failed) return NULL;
    jp_keyword(p);
    if (e == 0) {
        n->c = jp_stmt_if(p, jp_peek(p)->line); /* elif: a nested if that consumes the endif */
        return n;
    }
    if (e == 1) {
        jp_block_end(p);
        n->c = jp_body(p, ends + 2, 1, &e);
        if (p->failed) return NULL;
        jp_keyword(p);
    }
    jp_block_end(p);
    return n;
}

static jn *jp_stmt(jparse *p) {
    jtok *b = jp_next(p); /* T_BLOCK_BEGIN */
    jtok *kw = jp_next(p);
    if (kw->t != T_NAME) {
        jp_fail(p, b->line, "expected a statement name after '{%%'");
        return NULL;
    }
    int line = kw->line;
    if (jt_is(kw, T_NAME, "if")) return jp_stmt_if(p, line);
    if (jt_is(kw, T_NAME, "for")) {
        static const char *const ends[] = {"else", "endfor"};
        jn *n = jp_node(p, N_FOR, line);
        if (!n) return NULL;
        n->a = jp_target(p);
        if (jp_skip(p, T_OP, ",")) {
            jn *l = jp_node(p, N_LIST, line);
            if (!l) return NULL;
            l->a = n->a;
            jn **tail = &n->a->next;
            do {
                jn *x = jp_target(p);
                if (!x) return NULL;
                *tail = x;
                tail = &x->next;
            } while (jp_skip(p, T_OP, ","));
            n->a = l;
        }
        jp_expect(p, T_NAME, "in", "'in'");
        n->b = jp_or(p);
        if (jp_skip(p, T_NAME, "if")) n->d = jp_or(p);
        if (jt_is(jp_peek(p), T_NAME, "recursive")) {
            jp_fail(p, line, "recursive loops are not supported");
            return NULL;
        }
        jp_block_end(p);
        int e = -1;
        n->c = jp_body(p, ends, 2, &e);
        if (p->failed) return NULL;
        jp_keyword(p);
        if (e == 0) {
            jp_block_end(p);
            jn *els = jp_body(p, ends + 1, 1, &e);
            if (p->failed) return NULL;
            jp_keyword(p);
            n->els = els;
        }
        jp_block_end(p);
        return n;
    }
    if (jt_is(kw, T_NAME, "set")) {
        jn *tg = jp_target(p);
        if (!tg) return NULL;
        if (jp_skip(p, T_OP, ".")) {
            jtok *at = jp_next(p);
            if (at->t != T_NAME) {
                jp_fail(p, at->line, "expected an attribute name in set");
                return NULL;
            }
            jn *a = jp_node(p, N_ATTR, at->line);
            if (!a) return NULL;
            a->a = tg;
            a->s = at->s;
            a->n = at->n;
            tg = a;
        }
        if (jt_is(jp_peek(p), T_OP, ",")) {
            jp_fail(p, line, "tuple assignment in set is not supported");
            return NULL;
        }
        if (jp_skip(p, T_OP, "=")) {
            jn *n = jp_node(p, N_SET, line);
            if (!n) return NULL;
            n->a = tg;
            n->b = jp_expr(p);
            jp_block_end(p);
            return n;
        }
        static const char *const ends[] = {"endset"};
        jp_block_end(p);
        jn *n = jp_node(p, N_SETBLOCK, line);
        if (!n) return NULL;
        n->a = tg;
        int e;
        n->b = jp_body(p, ends, 1, &e);
        if (p->failed) return NULL;
        jp_keyword(p);
        jp_block_end(p);
        return n;
    }
    if (jt_is(kw, T_NAME, "macro")) {
        static const char *const ends[] = {"endmacro"};
        jtok *nm = jp_next(p);
        if (nm->t != T_NAME) {
            jp_fail(p, line, "expected a macro name");
            return NULL;
        }
        jn *n = jp_node(p, N_MACRO, line);
        if (!n) return NULL;
        n->s = nm->s;
        n->n = nm->n;
        jp_expect(p, T_OP, "(", "'('");
        jn **tail = &n->a;
        while (!p->failed && !jt_is(jp_peek(p), T_OP, ")")) {
            jtok *pn = jp_next(p);
            if (pn->t != T_NAME) {
                jp_fail(p, pn->line, "expected a parameter name");
                return NULL;
            }
            jn *pr = jp_node(p, N_PARAM, pn->line);
            if (!pr) return NULL;
            pr->s = pn->s;
            pr->n = pn->n;
            if (jp_skip(p, T_OP, "=")) pr->a = jp_expr(p);
            *tail = pr;
            tail = &pr->next;
            if (!jp_skip(p, T_OP, ",")) break;
        }
        jp_expect(p, T_OP, ")", "')'");
        jp_block_end(p);
        int e;
        n->b = jp_body(p, ends, 1, &e);
        if (p->failed) return NULL;
        jp_keyword(p);
        jp_block_end(p);
        return n;
    }
    if (jt_is(kw, T_NAME, "break") || jt_is(kw, T_NAME, "continue")) {
        jn *n = jp_node(p, kw->s[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        jp_block_end(p);
        return n;
    }
    if (jt_is(kw, T_NAME, "generation")) {
        /* transformers' assistant-mask marker: no output of its own */
        static const char *const ends[] = {"endgeneration"};
        jp_block_end(p);
        int e;
        jn *body = jp_body(p, ends, 1, &e);
        if (p->failed) return NULL;
        jp_keyword(p);
        jp_block_end(p);
        jn *n = jp_node(p, N_IF, line); /* if true: body */
        if (!n) return NULL;
        n->a = jp_node(p, N_LIT, line);
        if (!n->a) return NULL;
        n->a->val = jv_bool(true);
        n->b = body;
        return n;
    }
    jp_fail(p, line, "unsupported statement '%.*s'", (int)(kw->n > 40 ? 40 : kw->n), kw->s);
    return NULL;
}

static jn *jp_body(jparse *p, const char *const *ends, int n_ends, int *end) {
    if (!jp_enter(p)) return NULL;
    jn *head = NULL, **tail = &head;
    while (!p->failed) {
        jtok *t = jp_peek(p);
        jn *n = NULL;
        if (t->t == T_EOF) {
            if (n_ends) jp_fail(p, t->line, "missing {%% %s %%}", ends[n_ends - 1]);
            break;
        }
        if (t->t == T_TEXT) {
            jp_next(p);
            n = jp_node(p, N_TEXT, t->line);
            if (n) {
                n->s = t->s;
                n->n = t->n;
            }
        } else if (t->t == T_VAR_BEGIN) {
            jp_next(p);
            n = jp_node(p, N_OUT, t->line);
            if (n) n->a = jp_expr(p);
            jp_expect(p, T_VAR_END, NULL, "'}}'");
        } else if (t->t == T_BLOCK_BEGIN) {
            jtok *kw = jp_peek2(p);
            bool stop = false;
            for (int i = 0; i < n_ends; i++)
                if (jt_is(kw, T_NAME, ends[i])) {
                    *end = i;
                    stop = true;
                }
            if (stop) break;
            static const char *const stray[] = {"elif", "else", "endif", "endfor", "endset", "endmacro",
                                                "endgeneration"};
            for (size_t i = 0; i < sizeof stray / sizeof *stray; i++)
                if (jt_is(kw, T_NAME, stray[i])) {
                    jp_fail(p, kw->line, "unexpected {%% %s %%}", stray[i]);
                    break;
                }
            if (p->failed) break;
            n = jp_stmt(p);
        } else {
            jp_fail(p, t->line, "unexpected token");
        }
        if (!n) break;
        *tail = n;
        tail = &n->next;
    }
    p->depth--;
    return p->failed ? NULL : head;
}

struct ks_jinja {
    jj_arena A;
    jn *root;
};

ks_status ks_jinja_parse(const char *src, size_t len, ks_jinja **out) {
    if (!out || (!src && len)) return KS_FAIL(KS_ERR_INVALID_ARG, "jinja: NULL argument");
    ks_jinja *t = ks_calloc(1, sizeof *t);
    if (!t) return KS_FAIL(KS_ERR_NOMEM, "jinja: template");
    jparse p = {.A = &t->A};
    /* the source is copied: tokens and nodes point into it */
    char *copy = jj_strndup(&t->A, src ? src : "", len);
    if (!copy) {
        ks_jinja_destroy(t);
        return KS_FAIL(KS_ERR_NOMEM, "jinja: template of %zu bytes", len);
    }
    jl_lex(&p, copy, len);
    if (!p.failed) t->root = jp_body(&p, NULL, 0, NULL);
    if (p.failed) {
        bool nomem = t->A.refused;
        ks_jinja_destroy(t);
        if (nomem) return KS_FAIL(KS_ERR_NOMEM, "jinja: parsing a template of %zu bytes", len);
        return KS_FAIL(KS_ERR_FORMAT, "template line %d: %s", p.err_line, p.err);
    }
    *out = t;
    return KS_OK;
}

void ks_jinja_destroy(ks_jinja *t) {
    if (!t) return;
    jj_arena_free(&t->A);
    ks_free(t);
}

/* ----------------------------------------------------------- evaluator -- */

typedef struct {
    jj_arena A;
    jj_dict **frames; /* [JJ_MAX_FRAMES] scope stack, innermost last */
    int n_frames;
    int call_depth;
    long steps;
    char *out; /* [out_cap] */
    size_t out_n, out_cap;
    bool failed, raised, nomem;
    int64_t now; /* strftime_now's clock, Unix seconds (UTC) */
    int depth;   /* jv_repr's nesting */
    int brk; /* 1: break, 2: continue pending */
    char err[300];
} jr;

enum { JJ_MAX_FRAMES = 1024 };

static void jr_fail(jr *r, int line, const char *fmt, ...) {
    if (r->failed) return;
    r->failed = true;
    int k = snprintf(r->err, sizeof r->err, "template line %d: ", line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + k, sizeof r->err - (size_t)k, fmt, ap);
    va_end(ap);
}

static void *jr_alloc(jr *r, size_t n) {
    void *p = jj_alloc(&r->A, n);
    if (!p && !r->failed) {
        r->failed = true;
        r->nomem = !r->A.capped;
        snprintf(r->err, sizeof r->err, r->A.capped ? "the template needs more than %zu bytes of values"
                                                    : "out of memory (values of %zu bytes)",
                 r->A.capped ? JJ_MAX_ARENA : r->A.total);
    }
    return p;
}

/* A growable string built in the arena. */
typedef struct {
    jr *r;
    char *p;
    size_t n, cap;
} jsb;

static void jsb_put(jsb *b, const char *s, size_t n) {
    if (b->r->failed) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *q = jr_alloc(b->r, cap);
        if (!q) return;
        if (b->n) memcpy(q, b->p, b->n);
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
static void jsb_puts(jsb *b, const char *s) { jsb_put(b, s, strlen(s)); }
static jv jsb_val(jsb *b) {
    if (!b->p) return jv_str("", 0);
    return jv_str(b->p, b->n);
}

static jj_list *jl_new(jr *r, size_t cap) {
    jj_list *l = jr_alloc(r, sizeof *l);
    if (!l) return NULL;
    l->n = 0;
    l->cap = cap ? cap : 4;
    l->a = jr_alloc(r, l->cap * sizeof *l->a);
    return l->a ? l : NULL;
}
static void jl_add(jr *r, jj_list *l, jv v) {
    if (!l) return;
    if (l->n == l->cap) {
        jv *a = jr_alloc(r, l->cap * 2 * sizeof *a);
        if (!a) return;
        memcpy(a, l->a, l->n * sizeof *a);
        l->a = a;
        l->cap *= 2;
    }
    l->a[l->n++] = v;
}
static jv jv_list(jj_list *l) { return l ? (jv){.t = JV_LIST, .u.l = l} : JV_U; }

static jj_dict *jd_new(jr *r) {
    jj_dict *d = jr_alloc(r, sizeof *d);
    if (!d) return NULL;
    memset(d, 0, sizeof *d);
    return d;
}
static bool jv_streq(jv a, const char *s, size_t n) { return a.t == JV_STR && a.n == n && memcmp(a.u.s, s, n) == 0; }
static jv *jd_find(const jj_dict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_streq(d->k[i], k, n)) return &d->v[i];
    return NULL;
}
static jv *jd_find_v(const jj_dict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == key.t && (key.t == JV_STR ? jv_streq(d->k[i], key.u.s, key.n) : d->k[i].u.i == key.u.i))
            return &d->v[i];
    return NULL;
}
static void jd_set(jr *r, jj_dict *d, jv key, jv v) {
    if (!d) return;
    jv *e = jd_find_v(d, key);
    if (e) {
        *e = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jv *k = jr_alloc(r, cap * sizeof *k), *vv = jr_alloc(r, cap * sizeof *vv);
        if (!k || !vv) return;
        if (d->n) {
            memcpy(k, d->k, d->n * sizeof *k);
            memcpy(vv, d->v, d->n * sizeof *vv);
        }
        d->k = k;
        d->v = vv;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n++] = v;
}
static void jd_setc(jr *r, jj_dict *d, const char *key, jv v) { jd_set(r, d, jv_str(key, strlen(key)), v); }

static bool jv_truthy(jv v) {
    switch (v.t) {
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.n > 0;
    case JV_LIST: return v.u.l->n > 0;
    case JV_DICT: return v.u.d->n > 0;
    case JV_MACRO:
    case JV_FUNC: return true;
    default: return false;
    }
}

static const char *jv_type_name(jv v) {
    static const char *const names[] = {"undefined", "none", "boolean", "integer", "float", "string",
                                        "list", "dict", "macro", "function"};
    return names[v.t];
}

static bool jv_num(jv v, double *f) {
    if (v.t == JV_INT || v.t == JV_BOOL) {
        *f = v.t == JV_INT ? (double)v.u.i : v.u.b;
        return true;
    }
    if (v.t == JV_FLOAT) {
        *f = v.u.f;
        return true;
    }
    return false;
}

/* Values a template builds can nest without bound ({% set x = [x] %} in a
 * loop), so every recursion over a value carries its depth. */
enum { JJ_MAX_VALUE_DEPTH = 256 };

static bool jv_eq_d(jv a, jv b, int depth);
static bool jv_eq(jv a, jv b) { return jv_eq_d(a, b, 0); }

static bool jv_eq_d(jv a, jv b, int depth) {
    double x, y;
    if (depth > JJ_MAX_VALUE_DEPTH) return false; /* too deep to compare: unequal, never a stack overflow */
    if (jv_num(a, &x) && jv_num(b, &y)) {
        if ((a.t == JV_INT || a.t == JV_BOOL) && (b.t == JV_INT || b.t == JV_BOOL))
            return (a.t == JV_INT ? a.u.i : a.u.b) == (b.t == JV_INT ? b.u.i : b.u.b);
        return x == y;
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a.n == b.n && memcmp(a.u.s, b.u.s, a.n) == 0;
    case JV_LIST:
        if (a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_eq_d(a.u.l->a[i], b.u.l->a[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = jd_find_v(b.u.d, a.u.d->k[i]);
            if (!o || !jv_eq_d(a.u.d->v[i], *o, depth + 1)) return false;
        }
        return true;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

/* Python's repr(float): the shortest digits that read back, exponent form
 * outside [1e-4, 1e16). */
static void jj_fmt_float(double f, char *buf, size_t cap) {
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = [-]d.ddde[+-]XX */
    char digits[32];
    size_t nd = 0;
    const char *q = e;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    char *o = buf;
    size_t room = cap;
    int k;
    if (exp < -4 || exp >= 16) {
        k = snprintf(o, room, "%s%c", neg ? "-" : "", digits[0]);
        o += k, room -= (size_t)k;
        if (nd > 1) {
            k = snprintf(o, room, ".%s", digits + 1);
            o += k, room -= (size_t)k;
        }
        snprintf(o, room, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        return;
    }
    k = snprintf(o, room, "%s", neg ? "-" : "");
    o += k, room -= (size_t)k;
    if (exp < 0) {
        k = snprintf(o, room, "0.");
        o += k, room -= (size_t)k;
        for (int z = 0; z < -exp - 1; z++) *o++ = '0', room--;
        snprintf(o, room, "%s", digits);
        return;
    }
    for (int i = 0; i <= exp; i++) *o++ = i < (int)nd ? digits[i] : '0', room--;
    *o++ = '.', room--;
    if ((int)nd > exp + 1) snprintf(o, room, "%s", digits + exp + 1);
    else snprintf(o, room, "0");
}

static void jv_repr(jr *r, jsb *b, jv v);

/* str(v) as Python prints it. */
static void jv_str_into(jr *r, jsb *b, jv v) {
    char num[64];
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jsb_puts(b, "None"); return;
    case JV_BOOL: jsb_puts(b, v.u.b ? "True" : "False"); return;
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v.u.i); jsb_puts(b, num); return;
    case JV_FLOAT: jj_fmt_float(v.u.f, num, sizeof num); jsb_puts(b, num); return;
    case JV_STR: jsb_put(b, v.u.s, v.n); return;
    default: jv_repr(r, b, v);
    }
}

static void jv_repr(jr *r, jsb *b, jv v) {
    if ((v.t == JV_LIST || v.t == JV_DICT) && r->depth >= JJ_MAX_VALUE_DEPTH) {
        jr_fail(r, 0, "a value nested deeper than %d cannot be printed", JJ_MAX_VALUE_DEPTH);
        return;
    }
    if (v.t == JV_STR) {
        bool sq = memchr(v.u.s, '\'', v.n) != NULL, dq = memchr(v.u.s, '"', v.n) != NULL;
        char q = sq && !dq ? '"' : '\'';
        jsb_put(b, &q, 1);
        for (size_t i = 0; i < v.n; i++) {
            unsigned char c = (unsigned char)v.u.s[i];
            char esc[8];
            if (c == (unsigned char)q || c == '\\') {
                esc[0] = '\\', esc[1] = (char)c;
                jsb_put(b, esc, 2);
            } else if (c == '\n') jsb_puts(b, "\\n");
            else if (c == '\r') jsb_puts(b, "\\r");
            else if (c == '\t') jsb_puts(b, "\\t");
            else if (c < 0x20 || c == 0x7f) {
                snprintf(esc, sizeof esc, "\\x%02x", c);
                jsb_puts(b, esc);
            } else jsb_put(b, (const char *)&c, 1);
        }
        jsb_put(b, &q, 1);
    } else if (v.t == JV_LIST) {
        jsb_puts(b, "[");
        r->depth++;
        for (size_t i = 0; i < v.u.l->n && !r->failed; i++) {
            if (i) jsb_puts(b, ", ");
            jv_repr(r, b, v.u.l->a[i]);
        }
        r->depth--;
        jsb_puts(b, "]");
    } else if (v.t == JV_DICT) {
        if (v.u.d->ns) jsb_puts(b, "<Namespace ");
        jsb_puts(b, "{");
        r->depth++;
        for (size_t i = 0; i < v.u.d->n && !r->failed; i++) {
            if (i) jsb_puts(b, ", ");
            jv_repr(r, b, v.u.d->k[i]);
            jsb_puts(b, ": ");
            jv_repr(r, b, v.u.d->v[i]);
        }
        r->depth--;
        jsb_puts(b, "}");
        if (v.u.d->ns) jsb_puts(b, ">");
    } else if (v.t == JV_MACRO || v.t == JV_FUNC) {
        jsb_puts(b, "<function>");
    } else if (v.t == JV_UNDEF) {
        jsb_puts(b, "Undefined");
    } else {
        jv_str_into(r, b, v);
    }
}

/* json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: none). */
static bool jv_json(jr *r, jsb *b, jv v, int indent, int level, int line) {
    char num[64];
    switch (v.t) {
    case JV_NONE: jsb_puts(b, "null"); return true;
    case JV_BOOL: jsb_puts(b, v.u.b ? "true" : "false"); return true;
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v.u.i); jsb_puts(b, num); return true;
    case JV_FLOAT:
        if (isnan(v.u.f)) jsb_puts(b, "NaN");
        else if (isinf(v.u.f)) jsb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            jj_fmt_float(v.u.f, num, sizeof num);
            jsb_puts(b, num);
        }
        return true;
    case JV_STR:
        jsb_puts(b, "\"");
        for (size_t i = 0; i < v.n; i++) {
            unsigned char c = (unsigned char)v.u.s[i];
            if (c == '"') jsb_puts(b, "\\\"");
            else if (c == '\\') jsb_puts(b, "\\\\");
            else if (c == '\n') jsb_puts(b, "\\n");
            else if (c == '\r') jsb_puts(b, "\\r");
            else if (c == '\t') jsb_puts(b, "\\t");
            else if (c == '\b') jsb_puts(b, "\\b");
            else if (c == '\f') jsb_puts(b, "\\f");
            else if (c < 0x20) {
                snprintf(num, sizeof num, "\\u%04x", c);
                jsb_puts(b, num);
            } else jsb_put(b, (const char *)&c, 1);
        }
        jsb_puts(b, "\"");
        return true;
    case JV_LIST:
    case JV_DICT: {
        if (level > JJ_MAX_VALUE_DEPTH) {
            jr_fail(r, line, "tojson: a value nested deeper than %d", JJ_MAX_VALUE_DEPTH);
            return false;
        }
        bool is_l = v.t == JV_LIST;
        size_t n = is_l ? v.u.l->n : v.u.d->n;
        jsb_puts(b, is_l ? "[" : "{");
        if (n == 0) {
            jsb_puts(b, is_l ? "]" : "}");
            return true;
        }
        for (size_t i = 0; i < n; i++) {
            if (i) jsb_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0) {
                jsb_puts(b, "\n");
                for (int s = 0; s < indent * (level + 1); s++) jsb_puts(b, " ");
            }
            if (!is_l) { /* json.dumps writes an integer key as a string */
                jv k = v.u.d->k[i];
                if (k.t != JV_STR) {
                    snprintf(num, sizeof num, "\"%lld\"", (long long)k.u.i);
                    jsb_puts(b, num);
                } else {
                    jv_json(r, b, k, indent, level + 1, line);
                }
                jsb_puts(b, ": ");
            }
            if (!jv_json(r, b, is_l ? v.u.l->a[i] : v.u.d->v[i], indent, level + 1, line)) return false;
        }
        if (indent >= 0) {
            jsb_puts(b, "\n");
            for (int s = 0; s < indent * level; s++) jsb_puts(b, " ");
        }
        jsb_puts(b, is_l ? "]" : "}");
        return true;
    }
    default:
        jr_fail(r, line, "tojson: a %s is not JSON serializable", jv_type_name(v));
        return false;
    }
}

static jv jv_tostr(jr *r, jv v) {
    if (v.t == JV_STR) return v;
    jsb b = {.r = r};
    jv_str_into(r, &b, v);
    return jsb_val(&b);
}

/* ---- code points: Python strings index characters, not bytes ---- */

static size_t jj_u8len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

static size_t jj_ncp(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; c++) {
        size_t w = jj_u8len((unsigned char)s[i]);
        i += w > n - i ? n - i : w;
    }
    return c;
}

/* Byte offsets of every code point of s (plus the end): [ncp + 1]. */
static size_t *jj_cp_offsets(jr *r, const char *s, size_t n, size_t *ncp) {
    size_t c = jj_ncp(s, n);
    size_t *o = jr_alloc(r, (c + 1) * sizeof *o);
    if (!o) return NULL;
    size_t i = 0, k = 0;
    while (i < n) {
        o[k++] = i;
        size_t w = jj_u8len((unsigned char)s[i]);
        i += w > n - i ? n - i : w;
    }
    o[k] = n;
    *ncp = c;
    return o;
}

/* ---- scopes ---- */

static jv jr_lookup(jr *r, const char *s, size_t n) {
    for (int i = r->n_frames - 1; i >= 0; i--) {
        jv *v = jd_find(r->frames[i], s, n);
        if (v) return *v;
    }
    static const struct {
        const char *name;
        int fn;
    } globals[] = {{"range", JF_RANGE}, {"namespace", JF_NAMESPACE}, {"dict", JF_DICT}, {"raise_exception", JF_RAISE},
                   {"strftime_now", JF_STRFTIME}};
    for (size_t i = 0; i < sizeof globals / sizeof *globals; i++)
        if (strlen(globals[i].name) == n && memcmp(globals[i].name, s, n) == 0)
            return (jv){.t = JV_FUNC, .u.fn = globals[i].fn};
    return JV_U;
}

static bool jr_push(jr *r, int line) {
    if (r->n_frames >= JJ_MAX_FRAMES) {
        jr_fail(r, line, "scopes nested deeper than %d", JJ_MAX_FRAMES);
        return false;
    }
    jj_dict *d = jd_new(r);
    if (!d) return false;
    r->frames[r->n_frames++] = d;
    return true;
}

static jv ev(jr *r, const jn *n);
static void ex_body(jr *r, const jn *n);

static bool jr_step(jr *r, int line) {
    if (r->failed) return false;
    if (++r->steps > JJ_MAX_STEPS) {
        jr_fail(r, line, "more than %d evaluation steps", JJ_MAX_STEPS);
        return false;
    }
    return true;
}

/* ---- arguments ---- */

typedef struct {
    jv pos[8];
    int n_pos;
    const char *kw_name[8];
    size_t kw_len[8];
    jv kw[8];
    int n_kw;
} jargs;

static bool ev_args(jr *r, const jn *a, jargs *out, int line) {
    memset(out, 0, sizeof *out);
    for (; a; a = a->next) {
        if (a->k == N_KWARG) {
            if (out->n_kw == 8) {
                jr_fail(r, line, "more than 8 keyword arguments");
                return false;
            }
            out->kw_name[out->n_kw] = a->s;
            out->kw_len[out->n_kw] = a->n;
            out->kw[out->n_kw++] = ev(r, a->a);
        } else {
            if (out->n_pos == 8) {
                jr_fail(r, line, "more than 8 arguments");
                return false;
            }
            out->pos[out->n_pos++] = ev(r, a);
        }
        if (r->failed) return false;
    }
    return true;
}

/* Argument i, or the keyword name, or def. */
static jv arg(const jargs *a, int i, const char *name, jv def) {
    if (i >= 0 && i < a->n_pos) return a->pos[i];
    for (int k = 0; k < a->n_kw; k++)
        if (name && strlen(name) == a->kw_len[k] && memcmp(name, a->kw_name[k], a->kw_len[k]) == 0) return a->kw[k];
    return def;
}

static bool need_str(jr *r, jv v, int line, const char *what) {
    if (v.t == JV_STR) return true;
    jr_fail(r, line, "%s expects a string, got %s", what, jv_type_name(v));
    return false;
}

/* ---- string helpers ---- */

static bool jj_is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

static jv jj_strip(jv s, jv chars, bool left, bool right) {
    size_t i = 0, n = s.n;
    const char *p = s.u.s;
    bool def = chars.t == JV_UNDEF || chars.t == JV_NONE;
#define JJ_STRIPPABLE(c) (def ? jj_is_space((unsigned char)(c)) : memchr(chars.u.s, (c), chars.n) != NULL)
    if (left)
        while (i < n && JJ_STRIPPABLE(p[i])) i++;
    if (right)
        while (n > i && JJ_STRIPPABLE(p[n - 1])) n--;
#undef JJ_STRIPPABLE
    return jv_str(p + i, n - i);
}

static const char *jj_memmem(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static jv jj_case(jr *r, jv s, int mode) { /* 0 lower, 1 upper, 2 title, 3 capitalize */
    char *d = jr_alloc(r, s.n + 1);
    if (!d) return JV_U;
    bool word_start = true;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.u.s[i];
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        bool up = mode == 1 || ((mode == 2 && word_start) || (mode == 3 && i == 0));
        if (mode == 0 || (mode >= 2 && !up)) d[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
        else d[i] = (c >= 'a' && c <= 'z') ? (char)(c - 32) : c;
        word_start = !alpha;
    }
    d[s.n] = '\0';
    return jv_str(d, s.n);
}

static jv jj_replace(jr *r, jv s, jv a, jv b, int64_t count) {
    jsb o = {.r = r};
    size_t i = 0;
    int64_t done = 0;
    if (a.n == 0) { /* Python inserts between every character */
        size_t ncp;
        size_t *off = jj_cp_offsets(r, s.u.s, s.n, &ncp);
        if (!off) return JV_U;
        for (size_t k = 0; k <= ncp; k++) {
            if (count < 0 || done < count) {
                jsb_put(&o, b.u.s, b.n);
                done++;
            }
            if (k < ncp) jsb_put(&o, s.u.s + off[k], off[k + 1] - off[k]);
        }
        return jsb_val(&o);
    }
    while (i <= s.n) {
        const char *f = (count < 0 || done < count) ? jj_memmem(s.u.s + i, s.n - i, a.u.s, a.n) : NULL;
        if (!f) {
            jsb_put(&o, s.u.s + i, s.n - i);
            break;
        }
        jsb_put(&o, s.u.s + i, (size_t)(f - (s.u.s + i)));
        jsb_put(&o, b.u.s, b.n);
        i = (size_t)(f - s.u.s) + a.n;
        done++;
    }
    return jsb_val(&o);
}

static jv jj_split(jr *r, jv s, jv sep, int64_t maxsplit) {
    jj_list *l = jl_new(r, 4);
    if (!l) return JV_U;
    const char *p = s.u.s;
    size_t n = s.n, i = 0;
    int64_t done = 0;
    if (sep.t == JV_UNDEF || sep.t == JV_NONE) {
        for (;;) {
            while (i < n && jj_is_space((unsigned char)p[i])) i++;
            if (i >= n) break;
            size_t j = i;
            if (maxsplit >= 0 && done >= maxsplit) {
                size_t e = n;
                while (e > i && jj_is_space((unsigned char)p[e - 1])) e--;
                jl_add(r, l, jv_str(p + i, e - i));
                break;
            }
            while (j < n && !jj_is_space((unsigned char)p[j])) j++;
            jl_add(r, l, jv_str(p + i, j - i));
            done++;
            i = j;
        }
        return jv_list(l);
    }
    for (;;) {
        const char *f = (maxsplit < 0 || done < maxsplit) ? jj_memmem(p + i, n - i, sep.u.s, sep.n) : NULL;
        if (!f) {
            jl_add(r, l, jv_str(p + i, n - i));
            break;
        }
        jl_add(r, l, jv_str(p + i, (size_t)(f - (p + i))));
        i = (size_t)(f - p) + sep.n;
        done++;
    }
    return jv_list(l);
}

/* ---- item access ---- */

static jv jv_getitem(jr *r, jv o, jv k, int line) {
    if (o.t == JV_UNDEF) {
        jr_fail(r, line, "cannot index an undefined value");
        return JV_U;
    }
    if (o.t == JV_DICT) {
        if (k.t != JV_STR && k.t != JV_INT) return JV_U;
        jv *v = jd_find_v(o.u.d, k);
        return v ? *v : JV_U;
    }
    if (o.t == JV_LIST || o.t == JV_STR) {
        if (k.t != JV_INT) {
            if (o.t == JV_STR && k.t == JV_STR) return JV_U; /* a string has no items by name */
            if (k.t != JV_BOOL) return JV_U;
        }
        int64_t i = k.t == JV_INT ? k.u.i : k.u.b;
        if (o.t == JV_LIST) {
            int64_t n = (int64_t)o.u.l->n;
            if (i < 0) i += n;
            return i >= 0 && i < n ? o.u.l->a[i] : JV_U;
        }
        size_t ncp;
        size_t *off = jj_cp_offsets(r, o.u.s, o.n, &ncp);
        if (!off) return JV_U;
        if (i < 0) i += (int64_t)ncp;
        if (i < 0 || i >= (int64_t)ncp) return JV_U;
        return jv_str(o.u.s + off[i], off[i + 1] - off[i]);
    }
    return JV_U;
}

/* Attribute: a dict's key (methods are resolved at the call). */
static jv jv_getattr(jr *r, jv o, const char *s, size_t n, int line) {
    if (o.t == JV_UNDEF) {
        jr_fail(r, line, "'%.*s' of an undefined value", (int)n, s);
        return JV_U;
    }
    if (o.t == JV_DICT) {
        jv *v = jd_find(o.u.d, s, n);
        return v ? *v : JV_U;
    }
    return JV_U;
}

static bool jv_idx(jr *r, jv v, int64_t *i, int line, const char *what) {
    if (v.t == JV_INT) *i = v.u.i;
    else if (v.t == JV_BOOL) *i = v.u.b;
    else {
        jr_fail(r, line, "%s must be an integer, got %s", what, jv_type_name(v));
        return false;
    }
    return true;
}

static jv ev_slice(jr *r, const jn *n) {
    jv o = ev(r, n->a);
    jv lo = n->b ? ev(r, n->b) : jv_none(), hi = n->c ? ev(r, n->c) : jv_none(), st = n->d ? ev(r, n->d) : jv_none();
    if (r->failed) return JV_U;
    if (o.t != JV_LIST && o.t != JV_STR) {
        jr_fail(r, n->line, "cannot slice a %s", jv_type_name(o));
        return JV_U;
    }
    size_t ncp = 0, *off = NULL;
    if (o.t == JV_STR) {
        off = jj_cp_offsets(r, o.u.s, o.n, &ncp);
        if (!off) return JV_U;
    }
    int64_t len = o.t == JV_LIST ? (int64_t)o.u.l->n : (int64_t)ncp, step = 1, a, b;
    if (st.t != JV_NONE && !jv_idx(r, st, &step, n->line, "a slice step")) return JV_U;
    if (step == 0) {
        jr_fail(r, n->line, "slice step cannot be zero");
        return JV_U;
    }
    /* Python's PySlice_AdjustIndices */
    if (lo.t == JV_NONE) a = step < 0 ? len - 1 : 0;
    else {
        if (!jv_idx(r, lo, &a, n->line, "a slice index")) return JV_U;
        if (a < 0) a += len;
        if (a < 0) a = step < 0 ? -1 : 0;
        else if (a >= len) a = step < 0 ? len - 1 : len;
    }
    if (hi.t == JV_NONE) b = step < 0 ? -1 : len;
    else {
        if (!jv_idx(r, hi, &b, n->line, "a slice index")) return JV_U;
        if (b < 0) b += len;
        if (b < 0) b = step < 0 ? -1 : 0;
        else if (b >= len) b = step < 0 ? len - 1 : len;
    }
    if (o.t == JV_LIST) {
        jj_list *l = jl_new(r, 4);
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step) jl_add(r, l, o.u.l->a[i]);
        return jv_list(l);
    }
    if (step == 1) return a < b ? jv_str(o.u.s + off[a], off[b] - off[a]) : jv_str("", 0);
    jsb s = {.r = r};
    jsb_put(&s, "", 0);
    for (int64_t i = a; step > 0 ? i < b : i > b; i += step) jsb_put(&s, o.u.s + off[i], off[i + 1] - off[i]);
    return jsb_val(&s);
}

/* ---- tests ---- */

static bool jv_contains(jr *r, jv hay, jv x, int line) {
    if (hay.t == JV_STR) {
        if (x.t != JV_STR) {
            jr_fail(r, line, "'in <string>' requires a string on the left, got %s", jv_type_name(x));
            return false;
        }
        return jj_memmem(hay.u.s, hay.n, x.u.s, x.n) != NULL;
    }
    if (hay.t == JV_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (jv_eq(hay.u.l->a[i], x)) return true;
        return false;
    }
    if (hay.t == JV_DICT) return (x.t == JV_STR || x.t == JV_INT) && jd_find_v(hay.u.d, x) != NULL;
    if (hay.t == JV_UNDEF) return false; /* jinja2's Undefined iterates as empty */
    jr_fail(r, line, "'in' a %s", jv_type_name(hay));
    return false;
}

static int jv_cmp(jr *r, jv a, jv b, int line, bool *ok) {
    double x, y;
    *ok = true;
    if (jv_num(a, &x) && jv_num(b, &y)) return x < y ? -1 : x > y;
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t m = a.n < b.n ? a.n : b.n;
        int c = memcmp(a.u.s, b.u.s, m);
        if (c) return c < 0 ? -1 : 1;
        return a.n < b.n ? -1 : a.n > b.n;
    }
    *ok = false;
    jr_fail(r, line, "cannot order a %s and a %s", jv_type_name(a), jv_type_name(b));
    return 0;
}

static bool jj_name_is(const char *s, size_t n, const char *name) { return strlen(name) == n && memcmp(s, name, n) == 0; }

static bool jv_test(jr *r, jv v, const char *s, size_t n, const jargs *a, int line) {
    jv x = arg(a, 0, NULL, JV_U);
    bool ok;
    if (jj_name_is(s, n, "defined")) return v.t != JV_UNDEF;
    if (jj_name_is(s, n, "undefined")) return v.t == JV_UNDEF;
    if (jj_name_is(s, n, "none")) return v.t == JV_NONE;
    if (jj_name_is(s, n, "string")) return v.t == JV_STR;
    if (jj_name_is(s, n, "mapping")) return v.t == JV_DICT;
    if (jj_name_is(s, n, "iterable")) return v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR;
    if (jj_name_is(s, n, "sequence")) return v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR;
    if (jj_name_is(s, n, "number")) return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    if (jj_name_is(s, n, "integer")) return v.t == JV_INT;
    if (jj_name_is(s, n, "float")) return v.t == JV_FLOAT;
    if (jj_name_is(s, n, "boolean")) return v.t == JV_BOOL;
    if (jj_name_is(s, n, "true")) return v.t == JV_BOOL && v.u.b;
    if (jj_name_is(s, n, "false")) return v.t == JV_BOOL && !v.u.b;
    if (jj_name_is(s, n, "callable")) return v.t == JV_MACRO || v.t == JV_FUNC;
    if (jj_name_is(s, n, "even") || jj_name_is(s, n, "odd") || jj_name_is(s, n, "divisibleby")) {
        int64_t i, d = 2;
        if (!jv_idx(r, v, &i, line, "the tested value")) return false;
        if (s[0] == 'd' && !jv_idx(r, x, &d, line, "divisibleby's argument")) return false;
        if (d == 0) {
            jr_fail(r, line, "divisibleby 0");
            return false;
        }
        bool even = i % d == 0;
        return s[0] == 'o' ? !even : even;
    }
    if (jj_name_is(s, n, "eq") || jj_name_is(s, n, "equalto") || jj_name_is(s, n, "sameas")) return jv_eq(v, x);
    if (jj_name_is(s, n, "ne")) return !jv_eq(v, x);
    if (jj_name_is(s, n, "in")) return jv_contains(r, x, v, line);
    if (jj_name_is(s, n, "lt") || jj_name_is(s, n, "le") || jj_name_is(s, n, "gt") || jj_name_is(s, n, "ge")) {
        int c = jv_cmp(r, v, x, line, &ok);
        if (!ok) return false;
        return s[0] == 'l' ? (s[1] == 't' ? c < 0 : c <= 0) : (s[1] == 't' ? c > 0 : c >= 0);
    }
    jr_fail(r, line, "unknown test '%.*s'", (int)n, s);
    return false;
}

/* ---- filters ---- */

static int64_t jv_length(jr *r, jv v, int line) {
    switch (v.t) {
    case JV_STR: return (int64_t)jj_ncp(v.u.s, v.n);
    case JV_LIST: return (int64_t)v.u.l->n;
    case JV_DICT: return (int64_t)v.u.d->n;
    case JV_UNDEF: return 0;
    default: jr_fail(r, line, "length of a %s", jv_type_name(v)); return 0;
    }
}

/* The items a loop or filter iterates: a list's elements, a dict's keys,
 * a string's characters.  Undefined iterates as empty. */
static jj_list *jv_iter(jr *r, jv v, int line) {
    if (v.t == JV_LIST) return v.u.l;
    jj_list *l = jl_new(r, 4);
    if (!l) return NULL;
    if (v.t == JV_DICT) {
        for (size_t i = 0; i < v.u.d->n; i++) jl_add(r, l, v.u.d->k[i]);
    } else if (v.t == JV_STR) {
        size_t ncp, *off = jj_cp_offsets(r, v.u.s, v.n, &ncp);
        if (!off) return NULL;
        for (size_t i = 0; i < ncp; i++) jl_add(r, l, jv_str(v.u.s + off[i], off[i + 1] - off[i]));
    } else if (v.t != JV_UNDEF && v.t != JV_NONE) {
        jr_fail(r, line, "cannot iterate over a %s", jv_type_name(v));
        return NULL;
    } else if (v.t == JV_NONE) {
        jr_fail(r, line, "cannot iterate over none");
        return NULL;
    }
    return l;
}

static jv jv_items(jr *r, jv v, int line) {
    if (v.t != JV_DICT) {
        if (v.t == JV_UNDEF) return jv_list(jl_new(r, 1));
        jr_fail(r, line, "items of a %s", jv_type_name(v));
        return JV_U;
    }
    jj_list *l = jl_new(r, v.u.d->n + 1);
    for (size_t i = 0; l && i < v.u.d->n; i++) {
        jj_list *pair = jl_new(r, 2);
        jl_add(r, pair, v.u.d->k[i]);
        jl_add(r, pair, v.u.d->v[i]);
        jl_add(r, l, jv_list(pair));
    }
    return jv_list(l);
}

static jv jv_apply_filter(jr *r, jv v, const char *s, size_t n, const jargs *a, int line);

/* select/reject/selectattr/rejectattr: keep items whose test result is want. */
static jv jj_select(jr *r, jv v, const jargs *a, bool by_attr, bool want, int line) {
    if (!jv_truthy(v)) return jv_list(jl_new(r, 1)); /* jinja2: `if value:` first, so none selects nothing */
    jj_list *in = jv_iter(r, v, line);
    jj_list *out = jl_new(r, 4);
    if (!in || !out) return JV_U;
    int base = by_attr ? 1 : 0;
    jv attr = arg(a, 0, NULL, JV_U), test = arg(a, base, NULL, JV_U);
    if (by_attr && !need_str(r, attr, line, "selectattr's attribute")) return JV_U;
    if (test.t != JV_UNDEF && !need_str(r, test, line, "select's test")) return JV_U;
    jargs ta = {0};
    for (int i = base + 1; i < a->n_pos && ta.n_pos < 8; i++) ta.pos[ta.n_pos++] = a->pos[i];
    for (size_t i = 0; i < in->n && !r->failed; i++) {
        jv x = in->a[i];
        if (by_attr) x = x.t == JV_DICT ? jv_getattr(r, x, attr.u.s, attr.n, line) : JV_U;
        bool t = test.t == JV_UNDEF ? jv_truthy(x) : jv_test(r, x, test.u.s, test.n, &ta, line);
        if (t == want) jl_add(r, out, in->a[i]);
    }
    return jv_list(out);
}

static jv jv_apply_filter(jr *r, jv v, const char *s, size_t n, const jargs *a, int line) {
#define IS(name) jj_name_is(s, n, name)
    if (IS("trim")) {
        if (v.t == JV_UNDEF) return jv_str("", 0);
        v = jv_tostr(r, v);
        jv chars = arg(a, 0, "chars", JV_U);
        if (chars.t != JV_UNDEF && chars.t != JV_NONE && !need_str(r, chars, line, "trim's chars")) return JV_U;
        return jj_strip(v, chars, true, true);
    }
    if (IS("tojson")) {
        jv ind = arg(a, 0, "indent", jv_none());
        int64_t indent = -1;
        if (ind.t != JV_NONE && !jv_idx(r, ind, &indent, line, "tojson's indent")) return JV_U;
        if (indent > 64) indent = 64;
        jsb b = {.r = r};
        jsb_put(&b, "", 0);
        if (!jv_json(r, &b, v, (int)indent, 0, line)) return JV_U;
        return jsb_val(&b);
    }
    if (IS("length") || IS("count")) return jv_int(jv_length(r, v, line));
    if (IS("upper") || IS("lower") || IS("title") || IS("capitalize")) {
        v = jv_tostr(r, v);
        return jj_case(r, v, IS("lower") ? 0 : IS("upper") ? 1 : IS("title") ? 2 : 3);
    }
    if (IS("default") || IS("d")) {
        jv def = arg(a, 0, "default_value", jv_str("", 0));
        bool boolean = jv_truthy(arg(a, 1, "boolean", jv_bool(false)));
        if (v.t == JV_UNDEF || (boolean && !jv_truthy(v))) return def;
        return v;
    }
    if (IS("items")) return jv_items(r, v, line);
    if (IS("min") || IS("max")) { /* jinja2's: strings compared case-insensitively (ASCII here), empty -> undefined */
        jj_list *l = jv_iter(r, v, line);
        if (!l || l->n == 0) return JV_U;
        bool want_max = IS("max"), cs = jv_truthy(arg(a, 0, "case_sensitive", jv_bool(false)));
        jv best = l->a[0];
        for (size_t i = 1; i < l->n; i++) {
            jv x = l->a[i];
            bool ok = true;
            int c;
            if (!cs && x.t == JV_STR && best.t == JV_STR) {
                size_t m = x.n < best.n ? x.n : best.n, k = 0;
                c = 0;
                for (; k < m && !c; k++) {
                    int p = tolower((unsigned char)x.u.s[k]), q = tolower((unsigned char)best.u.s[k]);
                    c = p < q ? -1 : p > q;
                }
                if (!c) c = x.n < best.n ? -1 : x.n > best.n;
            } else {
                c = jv_cmp(r, x, best, line, &ok);
            }
            if (!ok) return JV_U;
            if (want_max ? c > 0 : c < 0) best = x;
        }
        return best;
    }
    if (IS("first") || IS("last")) {
        jj_list *l = jv_iter(r, v, line);
        if (!l || l->n == 0) return JV_U;
        return IS("first") ? l->a[0] : l->a[l->n - 1];
    }
    if (IS("join")) {
        jv sep = arg(a, 0, "d", jv_str("", 0)), attr = arg(a, 1, "attribute", JV_U);
        if (!need_str(r, sep, line, "join's separator")) return JV_U;
        jj_list *l = jv_iter(r, v, line);
        if (!l) return JV_U;
        jsb b = {.r = r};
        jsb_put(&b, "", 0);
        for (size_t i = 0; i < l->n; i++) {
            if (i) jsb_put(&b, sep.u.s, sep.n);
            jv x = l->a[i];
            if (attr.t == JV_STR) x = jv_getattr(r, x, attr.u.s, attr.n, line);
            jv_str_into(r, &b, x);
        }
        return jsb_val(&b);
    }
    if (IS("list")) {
        jj_list *l = jv_iter(r, v, line);
        return l ? jv_list(l) : JV_U;
    }
    if (IS("string")) return jv_tostr(r, v);
    if (IS("safe")) return v; /* no autoescaping: nothing to mark */
    if (IS("int")) {
        double f;
        if (v.t == JV_STR) {
            char buf[64];
            size_t m = v.n < 63 ? v.n : 63;
            memcpy(buf, v.u.s, m);
            buf[m] = '\0';
            char *end;
            long long x = strtoll(buf, &end, 10);
            return jv_int(end != buf ? x : 0);
        }
        if (jv_num(v, &f)) return jv_int((int64_t)f);
        return jv_int(0);
    }
    if (IS("float")) {
        double f;
        if (v.t == JV_STR) {
            char buf[64];
            size_t m = v.n < 63 ? v.n : 63;
            memcpy(buf, v.u.s, m);
            buf[m] = '\0';
            return jv_float(strtod(buf, NULL));
        }
        return jv_float(jv_num(v, &f) ? f : 0.0);
    }
    if (IS("abs")) {
        if (v.t == JV_INT) return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == JV_FLOAT) return jv_float(fabs(v.u.f));
        jr_fail(r, line, "abs of a %s", jv_type_name(v));
        return JV_U;
    }
    if (IS("replace")) {
        jv x = arg(a, 0, "old", JV_U), y = arg(a, 1, "new", JV_U), c = arg(a, 2, "count", jv_none());
        v = jv_tostr(r, v);
        if (!need_str(r, x, line, "replace") || !need_str(r, y, line, "replace")) return JV_U;
        int64_t cnt = -1;
        if (c.t != JV_NONE && !jv_idx(r, c, &cnt, line, "replace's count")) return JV_U;
        return jj_replace(r, v, x, y, cnt);
    }
    if (IS("indent")) {
        jv w = arg(a, 0, "width", jv_int(4));
        bool first = jv_truthy(arg(a, 1, "first", jv_bool(false))), blank = jv_truthy(arg(a, 2, "blank", jv_bool(false)));
        v = jv_tostr(r, v);
        jsb pad = {.r = r};
        jsb_put(&pad, "", 0);
        if (w.t == JV_STR) jsb_put(&pad, w.u.s, w.n);
        else {
            int64_t k;
            if (!jv_idx(r, w, &k, line, "indent's width")) return JV_U;
            for (int64_t i = 0; i < k && i < 256; i++) jsb_put(&pad, " ", 1);
        }
        jsb b = {.r = r};
        jsb_put(&b, "", 0);
        size_t i = 0;
        bool first_line = true;
        while (i <= v.n) {
            const char *nl = memchr(v.u.s + i, '\n', v.n - i);
            size_t e = nl ? (size_t)(nl - v.u.s) : v.n;
            bool empty = e == i;
            if ((first_line ? first : true) && (blank || !empty)) jsb_put(&b, pad.p, pad.n);
            jsb_put(&b, v.u.s + i, e - i);
            if (!nl) break;
            jsb_put(&b, "\n", 1);
            i = e + 1;
            first_line = false;
        }
        return jsb_val(&b);
    }
    if (IS("reverse")) {
        if (v.t == JV_STR) {
            jargs none = {0};
            (void)none;
            size_t ncp, *off = jj_cp_offsets(r, v.u.s, v.n, &ncp);
            if (!off) return JV_U;
            jsb b = {.r = r};
            jsb_put(&b, "", 0);
            for (size_t i = ncp; i-- > 0;) jsb_put(&b, v.u.s + off[i], off[i + 1] - off[i]);
            return jsb_val(&b);
        }
        jj_list *l = jv_iter(r, v, line), *o = jl_new(r, 4);
        if (!l || !o) return JV_U;
        for (size_t i = l->n; i-- > 0;) jl_add(r, o, l->a[i]);
        return jv_list(o);
    }
    if (IS("dictsort")) { /* (key, value) pairs by key, strings case-insensitively, as jinja2 sorts by default */
        if (v.t != JV_DICT) {
            jr_fail(r, line, "dictsort of a %s", jv_type_name(v));
            return JV_U;
        }
        jv it = jv_items(r, v, line);
        if (it.t != JV_LIST) return JV_U;
        jj_list *l = it.u.l;
        bool cs = jv_truthy(arg(a, 0, "case_sensitive", jv_bool(false)));
        for (size_t i = 1; i < l->n; i++) { /* insertion sort: stable, and dicts are small */
            jv x = l->a[i];
            size_t j = i;
            while (j > 0) {
                jv ka = l->a[j - 1].u.l->a[0], kb = x.u.l->a[0];
                int c;
                if (ka.t == JV_STR && kb.t == JV_STR) {
                    size_t m = ka.n < kb.n ? ka.n : kb.n, q = 0;
                    c = 0;
                    for (; q < m && !c; q++) {
                        int ca = (unsigned char)ka.u.s[q], cb = (unsigned char)kb.u.s[q];
                        if (!cs) {
                            if (ca >= 'A' && ca <= 'Z') ca += 32;
                            if (cb >= 'A' && cb <= 'Z') cb += 32;
                        }
                        c = (ca > cb) - (ca < cb);
                    }
                    if (!c) c = (ka.n > kb.n) - (ka.n < kb.n);
                } else {
                    bool ok;
                    c = jv_cmp(r, ka, kb, line, &ok);
                    if (!ok) return JV_U;
                }
                if (c <= 0) break;
                l->a[j] = l->a[j - 1];
                j--;
            }
            l->a[j] = x;
        }
        return it;
    }
    if (IS("selectattr") || IS("rejectattr")) return jj_select(r, v, a, true, s[0] == 's', line);
    if (IS("select") || IS("reject")) return jj_select(r, v, a, false, s[0] == 's', line);
    if (IS("map")) {
        jj_list *l = jv_iter(r, v, line), *o = jl_new(r, 4);
        if (!l || !o) return JV_U;
        jv attr = arg(a, -1, "attribute", JV_U);
        if (attr.t == JV_STR) {
            jv def = arg(a, -1, "default", JV_U);
            for (size_t i = 0; i < l->n; i++) {
                jv x = jv_getattr(r, l->a[i], attr.u.s, attr.n, line);
                jl_add(r, o, x.t == JV_UNDEF ? def : x);
            }
            return jv_list(o);
        }
        jv f = arg(a, 0, NULL, JV_U);
        if (!need_str(r, f, line, "map's filter")) return JV_U;
        jargs fa = {0};
        for (int i = 1; i < a->n_pos; i++) fa.pos[fa.n_pos++] = a->pos[i];
        for (size_t i = 0; i < l->n && !r->failed; i++) jl_add(r, o, jv_apply_filter(r, l->a[i], f.u.s, f.n, &fa, line));
        return jv_list(o);
    }
#undef IS
    jr_fail(r, line, "unknown filter '%.*s'", (int)n, s);
    return JV_U;
}

/* ---- calls ---- */

static jv ev_macro_call(jr *r, const jn *m, const jargs *a, int line) {
    if (r->call_depth >= JJ_MAX_CALL_DEPTH) {
        jr_fail(r, line, "macro calls nested deeper than %d", JJ_MAX_CALL_DEPTH);
        return JV_U;
    }
    int saved_frames = r->n_frames;
    if (!jr_push(r, line)) return JV_U;
    jj_dict *f = r->frames[r->n_frames - 1];
    int i = 0;
    for (const jn *p = m->a; p; p = p->next, i++) {
        jv v = JV_U;
        if (i < a->n_pos) v = a->pos[i];
        else {
            for (int k = 0; k < a->n_kw; k++)
                if (a->kw_len[k] == p->n && memcmp(a->kw_name[k], p->s, p->n) == 0) v = a->kw[k];
            if (v.t == JV_UNDEF && p->a) v = ev(r, p->a);
        }
        jd_set(r, f, jv_str(p->s, p->n), v);
    }
    if (i < a->n_pos) {
        jr_fail(r, line, "macro '%.*s' takes %d arguments, got %d", (int)m->n, m->s, i, a->n_pos);
        return JV_U;
    }
    /* the body's output is the call's value */
    char *so = r->out;
    size_t sn = r->out_n, sc = r->out_cap;
    r->out = NULL;
    r->out_n = r->out_cap = 0;
    r->call_depth++;
    ex_body(r, m->b);
    r->call_depth--;
    jv res = r->out ? jv_str(r->out, r->out_n) : jv_str("", 0);
    r->out = so;
    r->out_n = sn;
    r->out_cap = sc;
    r->n_frames = saved_frames;
    r->brk = 0;
    return res;
}

static jv ev_func(jr *r, int fn, const jargs *a, int line) {
    if (fn == JF_RAISE) {
        jv m = jv_tostr(r, arg(a, 0, NULL, jv_str("", 0)));
        if (!r->failed) {
            r->failed = r->raised = true;
            snprintf(r->err, sizeof r->err, "%.*s", (int)(m.n > 280 ? 280 : m.n), m.u.s);
        }
        return JV_U;
    }
    if (fn == JF_STRFTIME) {
        jv f = arg(a, 0, NULL, JV_U);
        if (!need_str(r, f, line, "strftime_now")) return JV_U;
        char fmt[128], buf[256];
        if (f.n >= sizeof fmt) {
            jr_fail(r, line, "strftime_now: format longer than %zu bytes", sizeof fmt - 1);
            return JV_U;
        }
        memcpy(fmt, f.u.s, f.n);
        fmt[f.n] = '\0';
        time_t tt = (time_t)r->now;
        struct tm tm;
        if (!gmtime_r(&tt, &tm)) {
            jr_fail(r, line, "strftime_now: bad clock");
            return JV_U;
        }
        size_t k = strftime(buf, sizeof buf, fmt, &tm);
        char *d = jr_alloc(r, k + 1);
        if (!d) return JV_U;
        memcpy(d, buf, k + 1);
        return jv_str(d, k);
    }
    if (fn == JF_NAMESPACE || fn == JF_DICT) {
        jj_dict *d = jd_new(r);
        if (!d) return JV_U;
        d->ns = fn == JF_NAMESPACE;
        for (int k = 0; k < a->n_kw; k++) jd_set(r, d, jv_str(a->kw_name[k], a->kw_len[k]), a->kw[k]);
        return (jv){.t = JV_DICT, .u.d = d};
    }
    /* range */
    int64_t lo = 0, hi, st = 1;
    if (a->n_pos == 1) {
        if (!jv_idx(r, a->pos[0], &hi, line, "range's argument")) return JV_U;
    } else if (a->n_pos == 2 || a->n_pos == 3) {
        if (!jv_idx(r, a->pos[0], &lo, line, "range's argument") || !jv_idx(r, a->pos[1], &hi, line, "range's argument"))
            return JV_U;
        if (a->n_pos == 3 && !jv_idx(r, a->pos[2], &st, line, "range's step")) return JV_U;
    } else {
        jr_fail(r, line, "range takes 1 to 3 arguments");
        return JV_U;
    }
    if (st == 0) {
        jr_fail(r, line, "range step cannot be zero");
        return JV_U;
    }
    int64_t count = st > 0 ? (hi > lo ? (hi - lo + st - 1) / st : 0) : (lo > hi ? (lo - hi - st - 1) / -st : 0);
    if (count > 1000000) {
        jr_fail(r, line, "range of %lld items", (long long)count);
        return JV_U;
    }
    jj_list *l = jl_new(r, (size_t)count + 1);
    for (int64_t i = 0; i < count; i++) jl_add(r, l, jv_int(lo + i * st));
    return jv_list(l);
}

/* obj.name(args): the methods of strings and dicts. */
static jv ev_method(jr *r, jv o, const char *s, size_t n, const jargs *a, int line) {
#define IS(name) jj_name_is(s, n, name)
    if (o.t == JV_STR) {
        if (IS("strip") || IS("lstrip") || IS("rstrip")) {
            jv chars = arg(a, 0, NULL, jv_none());
            if (chars.t != JV_NONE && !need_str(r, chars, line, "strip's chars")) return JV_U;
            return jj_strip(o, chars, s[0] != 'r', s[0] != 'l');
        }
        if (IS("split")) {
            jv sep = arg(a, 0, "sep", jv_none()), mx = arg(a, 1, "maxsplit", jv_int(-1));
            int64_t m;
            if (sep.t != JV_NONE && !need_str(r, sep, line, "split's separator")) return JV_U;
            if (sep.t == JV_STR && sep.n == 0) {
                jr_fail(r, line, "split: empty separator");
                return JV_U;
            }
            if (!jv_idx(r, mx, &m, line, "split's maxsplit")) return JV_U;
            return jj_split(r, o, sep, m);
        }
        if (IS("startswith") || IS("endswith")) {
            jv x = arg(a, 0, NULL, JV_U);
            jj_list one = {&x, 1, 1}, *cands = x.t == JV_LIST ? x.u.l : &one;
            for (size_t i = 0; i < cands->n; i++) {
                jv c = cands->a[i];
                if (!need_str(r, c, line, s)) return JV_U;
                if (c.n <= o.n && memcmp(o.u.s + (s[0] == 's' ? 0 : o.n - c.n), c.u.s, c.n) == 0) return jv_bool(true);
            }
            return jv_bool(false);
        }
        if (IS("upper") || IS("lower") || IS("title") || IS("capitalize"))
            return jj_case(r, o, IS("lower") ? 0 : IS("upper") ? 1 : IS("title") ? 2 : 3);
        if (IS("replace")) {
            jv x = arg(a, 0, NULL, JV_U), y = arg(a, 1, NULL, JV_U), c = arg(a, 2, NULL, jv_int(-1));
            int64_t cnt;
            if (!need_str(r, x, line, "replace") || !need_str(r, y, line, "replace") ||
                !jv_idx(r, c, &cnt, line, "replace's count"))
                return JV_U;
            return jj_replace(r, o, x, y, cnt);
        }
        if (IS("find") || IS("count")) {
            jv x = arg(a, 0, NULL, JV_U);
            if (!need_str(r, x, line, s)) return JV_U;
            if (IS("find")) {
                const char *f = jj_memmem(o.u.s, o.n, x.u.s, x.n);
                return jv_int(f ? (int64_t)jj_ncp(o.u.s, (size_t)(f - o.u.s)) : -1);
            }
            if (x.n == 0) return jv_int((int64_t)jj_ncp(o.u.s, o.n) + 1);
            int64_t c = 0;
            for (const char *p = o.u.s, *f; (f = jj_memmem(p, o.n - (size_t)(p - o.u.s), x.u.s, x.n)); p = f + x.n) c++;
            return jv_int(c);
        }
        if (IS("format")) { /* {} {0} {name} and {{ }}; no format specs */
            jsb b = {.r = r};
            jsb_put(&b, "", 0);
            int auto_i = 0;
            for (size_t i = 0; i < o.n; i++) {
                char c = o.u.s[i];
                if ((c == '{' || c == '}') && i + 1 < o.n && o.u.s[i + 1] == c) {
                    jsb_put(&b, &c, 1);
                    i++;
                    continue;
                }
                if (c == '}') {
                    jr_fail(r, line, "format: single '}'");
                    return JV_U;
                }
                if (c != '{') {
                    jsb_put(&b, &c, 1);
                    continue;
                }
                const char *e = memchr(o.u.s + i, '}', o.n - i);
                if (!e) {
                    jr_fail(r, line, "format: unclosed '{'");
                    return JV_U;
                }
                const char *f = o.u.s + i + 1;
                size_t fl = (size_t)(e - f);
                jv v;
                if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '.', fl) || memchr(f, '[', fl)) {
                    jr_fail(r, line, "format: field '%.*s' (conversions and specs are not supported)", (int)fl, f);
                    return JV_U;
                }
                if (fl == 0) v = arg(a, auto_i++, NULL, JV_U);
                else if (f[0] >= '0' && f[0] <= '9') v = arg(a, atoi(f), NULL, JV_U);
                else {
                    char name[64];
                    snprintf(name, sizeof name, "%.*s", (int)(fl < 63 ? fl : 63), f);
                    v = arg(a, -1, name, JV_U);
                }
                if (v.t == JV_UNDEF) {
                    jr_fail(r, line, "format: no value for '{%.*s}'", (int)fl, f);
                    return JV_U;
                }
                jv_str_into(r, &b, v);
                i = (size_t)(e - o.u.s);
            }
            return jsb_val(&b);
        }
        if (IS("join")) {
            jj_list *l = jv_iter(r, arg(a, 0, NULL, JV_U), line);
            if (!l) return JV_U;
            jsb b = {.r = r};
            jsb_put(&b, "", 0);
            for (size_t i = 0; i < l->n; i++) {
                if (!need_str(r, l->a[i], line, "join")) return JV_U;
                if (i) jsb_put(&b, o.u.s, o.n);
                jsb_put(&b, l->a[i].u.s, l->a[i].n);
            }
            return jsb_val(&b);
        }
    } else if (o.t == JV_DICT) {
        if (IS("get")) {
            jv k = arg(a, 0, NULL, JV_U);
            jv *v = k.t == JV_STR || k.t == JV_INT ? jd_find_v(o.u.d, k) : NULL;
            return v ? *v : arg(a, 1, NULL, jv_none());
        }
        if (IS("items")) return jv_items(r, o, line);
        if (IS("keys") || IS("values")) {
            jj_list *l = jl_new(r, o.u.d->n + 1);
            for (size_t i = 0; l && i < o.u.d->n; i++) jl_add(r, l, s[0] == 'k' ? o.u.d->k[i] : o.u.d->v[i]);
            return jv_list(l);
        }
    } else if (o.t == JV_UNDEF) {
        jr_fail(r, line, "'%.*s' of an undefined value", (int)n, s);
        return JV_U;
    }
#undef IS
    jr_fail(r, line, "a %s has no method '%.*s'", jv_type_name(o), (int)n, s);
    return JV_U;
}

static jv ev_call(jr *r, const jn *n) {
    jargs a;
    if (n->a->k == N_ATTR) {
        jv o = ev(r, n->a->a);
        if (r->failed) return JV_U;
        /* a dict key holding a macro is called as such; otherwise a method */
        jv f = o.t == JV_DICT ? jv_getattr(r, o, n->a->s, n->a->n, n->line) : JV_U;
        if (f.t != JV_MACRO && f.t != JV_FUNC) {
            if (!ev_args(r, n->b, &a, n->line)) return JV_U;
            return ev_method(r, o, n->a->s, n->a->n, &a, n->line);
        }
    }
    jv f = ev(r, n->a);
    if (r->failed) return JV_U;
    if (!ev_args(r, n->b, &a, n->line)) return JV_U;
    if (f.t == JV_MACRO) return ev_macro_call(r, f.u.m, &a, n->line);
    if (f.t == JV_FUNC) return ev_func(r, f.u.fn, &a, n->line);
    if (n->a->k == N_NAME) jr_fail(r, n->line, "'%.*s' is not callable (it is %s)", (int)n->a->n, n->a->s, jv_type_name(f));
    else jr_fail(r, n->line, "a %s is not callable", jv_type_name(f));
    return JV_U;
}

static jv ev_bin(jr *r, const jn *n) {
    jv a = ev(r, n->a), b = ev(r, n->b);
    if (r->failed) return JV_U;
    double x, y;
    bool ok;
    switch (n->op) {
    case OP_EQ: return jv_bool(jv_eq(a, b));
    case OP_NE: return jv_bool(!jv_eq(a, b));
    case OP_LT: { int c = jv_cmp(r, a, b, n->line, &ok); return jv_bool(ok && c < 0); }
    case OP_LE: { int c = jv_cmp(r, a, b, n->line, &ok); return jv_bool(ok && c <= 0); }
    case OP_GT: { int c = jv_cmp(r, a, b, n->line, &ok); return jv_bool(ok && c > 0); }
    case OP_GE: { int c = jv_cmp(r, a, b, n->line, &ok); return jv_bool(ok && c >= 0); }
    case OP_IN: return jv_bool(jv_contains(r, b, a, n->line));
    case OP_NOTIN: { bool c = jv_contains(r, b, a, n->line); return jv_bool(!c); }
    default: break;
    }
    if (n->op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        jsb s = {.r = r};
        jsb_put(&s, a.u.s, a.n);
        jsb_put(&s, b.u.s, b.n);
        return jsb_val(&s);
    }
    if (n->op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST) {
        jj_list *l = jl_new(r, a.u.l->n + b.u.l->n + 1);
        for (size_t i = 0; l && i < a.u.l->n; i++) jl_add(r, l, a.u.l->a[i]);
        for (size_t i = 0; l && i < b.u.l->n; i++) jl_add(r, l, b.u.l->a[i]);
        return jv_list(l);
    }
    if (n->op == OP_MUL && ((a.t == JV_STR && b.t == JV_INT) || (a.t == JV_INT && b.t == JV_STR))) {
        jv s = a.t == JV_STR ? a : b;
        int64_t k = a.t == JV_INT ? a.u.i : b.u.i;
        if (k > 0 && s.n && (uint64_t)k > (uint64_t)JJ_MAX_OUT / s.n) {
            jr_fail(r, n->line, "string repetition too large");
            return JV_U;
        }
        jsb o = {.r = r};
        jsb_put(&o, "", 0);
        for (int64_t i = 0; i < k; i++) jsb_put(&o, s.u.s, s.n);
        return jsb_val(&o);
    }
    if (!jv_num(a, &x) || !jv_num(b, &y) || a.t == JV_BOOL || b.t == JV_BOOL) {
        if (!(jv_num(a, &x) && jv_num(b, &y))) {
            static const char *const ops[] = {"+", "-", "*", "/", "//", "%", "**"};
            jr_fail(r, n->line, "unsupported operand types for %s: %s and %s", ops[n->op], jv_type_name(a),
                    jv_type_name(b));
            return JV_U;
        }
    }
    bool ints = (a.t == JV_INT || a.t == JV_BOOL) && (b.t == JV_INT || b.t == JV_BOOL);
    int64_t i = a.t == JV_INT ? a.u.i : (int64_t)x, j = b.t == JV_INT ? b.u.i : (int64_t)y;
    switch (n->op) {
    case OP_ADD: return ints ? jv_int((int64_t)((uint64_t)i + (uint64_t)j)) : jv_float(x + y);
    case OP_SUB: return ints ? jv_int((int64_t)((uint64_t)i - (uint64_t)j)) : jv_float(x - y);
    case OP_MUL: return ints ? jv_int((int64_t)((uint64_t)i * (uint64_t)j)) : jv_float(x * y);
    case OP_DIV:
        if (y == 0) {
            jr_fail(r, n->line, "division by zero");
            return JV_U;
        }
        return jv_float(x / y);
    case OP_FDIV:
    case OP_MOD:
        if (y == 0) {
            jr_fail(r, n->line, "division by zero");
            return JV_U;
        }
        if (ints) {
            if (i == INT64_MIN && j == -1) return n->op == OP_MOD ? jv_int(0) : jv_int(INT64_MIN);
            int64_t q = i / j, m = i % j;
            if (m != 0 && ((m < 0) != (j < 0))) {
                q--;
                m += j;
            }
            return jv_int(n->op == OP_FDIV ? q : m);
        }
        if (n->op == OP_FDIV) return jv_float(floor(x / y));
        {
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return jv_float(m);
        }
    default: /* OP_POW */
        if (ints && j >= 0) {
            int64_t res = 1;
            for (int64_t k = 0; k < j && k < 64; k++) res = (int64_t)((uint64_t)res * (uint64_t)i);
            return jv_int(res);
        }
        return jv_float(pow(x, y));
    }
}

static jv ev(jr *r, const jn *n) {
    if (!n || !jr_step(r, n ? n->line : 0)) return JV_U;
    switch (n->k) {
    case N_LIT: return n->val;
    case N_NAME: return jr_lookup(r, n->s, n->n);
    case N_LIST: {
        jj_list *l = jl_new(r, 4);
        for (const jn *e = n->a; e && l; e = e->next) jl_add(r, l, ev(r, e));
        return jv_list(l);
    }
    case N_DICT: {
        jj_dict *d = jd_new(r);
        for (const jn *e = n->a; e && d; e = e->next) {
            jv k = ev(r, e->a), v = ev(r, e->b);
            if (r->failed) return JV_U;
            if (k.t != JV_STR && k.t != JV_INT) {
                jr_fail(r, e->line, "dict keys must be strings or integers here, got %s", jv_type_name(k));
                return JV_U;
            }
            jd_set(r, d, k, v);
        }
        return d ? (jv){.t = JV_DICT, .u.d = d} : JV_U;
    }
    case N_ATTR: {
        jv o = ev(r, n->a);
        if (r->failed) return JV_U;
        return jv_getattr(r, o, n->s, n->n, n->line);
    }
    case N_ITEM: {
        jv o = ev(r, n->a), k = ev(r, n->b);
        if (r->failed) return JV_U;
        return jv_getitem(r, o, k, n->line);
    }
    case N_SLICE: return ev_slice(r, n);
    case N_CALL: return ev_call(r, n);
    case N_FILTER: {
        jv v = ev(r, n->a);
        jargs a;
        if (r->failed || !ev_args(r, n->b, &a, n->line)) return JV_U;
        return jv_apply_filter(r, v, n->s, n->n, &a, n->line);
    }
    case N_TEST: {
        jv v = ev(r, n->a);
        jargs a;
        if (r->failed) return JV_U;
        if (!ev_args(r, n->b, &a, n->line)) return JV_U;
        bool t = jv_test(r, v, n->s, n->n, &a, n->line);
        return jv_bool(n->op ? !t : t);
    }
    case N_BIN: return ev_bin(r, n);
    case N_NOT: return jv_bool(!jv_truthy(ev(r, n->a)));
    case N_NEG:
    case N_POS: {
        jv v = ev(r, n->a);
        if (r->failed) return JV_U;
        if (v.t == JV_INT) return jv_int(n->k == N_NEG ? (int64_t)(0 - (uint64_t)v.u.i) : v.u.i);
        if (v.t == JV_FLOAT) return jv_float(n->k == N_NEG ? -v.u.f : v.u.f);
        jr_fail(r, n->line, "bad operand type for unary %c: %s", n->k == N_NEG ? '-' : '+', jv_type_name(v));
        return JV_U;
    }
    case N_COND: return jv_truthy(ev(r, n->b)) ? ev(r, n->a) : (n->c ? ev(r, n->c) : JV_U);
    case N_AND: {
        jv a = ev(r, n->a);
        return jv_truthy(a) ? ev(r, n->b) : a;
    }
    case N_OR: {
        jv a = ev(r, n->a);
        return jv_truthy(a) ? a : ev(r, n->b);
    }
    case N_CONCAT: {
        jsb b = {.r = r};
        jsb_put(&b, "", 0);
        for (const jn *e = n->a; e && !r->failed; e = e->next) jv_str_into(r, &b, ev(r, e));
        return jsb_val(&b);
    }
    default: jr_fail(r, n->line, "internal: node %d is not an expression", (int)n->k); return JV_U;
    }
}

/* ---- statements ---- */

static void jr_emit(jr *r, const char *s, size_t n, int line) {
    if (r->failed || n == 0) return;
    if (r->out_n + n > JJ_MAX_OUT) {
        jr_fail(r, line, "output exceeds %d bytes", JJ_MAX_OUT);
        return;
    }
    if (r->out_n + n + 1 > r->out_cap) {
        size_t cap = (r->out_n + n + 1) * 2;
        char *p = jr_alloc(r, cap);
        if (!p) return;
        if (r->out_n) memcpy(p, r->out, r->out_n);
        r->out = p;
        r->out_cap = cap;
    }
    memcpy(r->out + r->out_n, s, n);
    r->out_n += n;
    r->out[r->out_n] = '\0';
}

static void ex_set(jr *r, const jn *target, jv v, int line) {
    if (r->failed) return;
    if (target->k == N_NAME) {
        jd_set(r, r->frames[r->n_frames - 1], jv_str(target->s, target->n), v);
        return;
    }
    jv o = ev(r, target->a); /* N_ATTR: ns.attr */
    if (r->failed) return;
    if (o.t != JV_DICT || !o.u.d->ns) {
        jr_fail(r, line, "cannot assign an attribute of a %s (only of a namespace)", o.t == JV_DICT ? "dict" : jv_type_name(o));
        return;
    }
    jd_set(r, o.u.d, jv_str(target->s, target->n), v);
}

static void ex_for(jr *r, const jn *n) {
    jv it = ev(r, n->b);
    if (r->failed) return;
    jj_list *src = jv_iter(r, it, n->line);
    if (!src) return;
    /* the `if` clause filters before loop.* is computed, as in jinja2 */
    jj_list *items = src;
    if (n->d) {
        items = jl_new(r, src->n + 1);
        if (!items) return;
        for (size_t i = 0; i < src->n && !r->failed; i++) {
            if (!jr_push(r, n->line)) return;
            jj_dict *f = r->frames[r->n_frames - 1];
            if (n->a->k == N_NAME) jd_set(r, f, jv_str(n->a->s, n->a->n), src->a[i]);
            else {
                size_t k = 0;
                for (const jn *t = n->a->a; t; t = t->next, k++)
                    jd_set(r, f, jv_str(t->s, t->n), jv_getitem(r, src->a[i], jv_int((int64_t)k), n->line));
            }
            bool keep = jv_truthy(ev(r, n->d));
            r->n_frames--;
            if (keep) jl_add(r, items, src->a[i]);
        }
    }
    size_t len = items->n;
    for (size_t i = 0; i < len && !r->failed; i++) {
        if (!jr_push(r, n->line)) return;
        jj_dict *f = r->frames[r->n_frames - 1];
        jv x = items->a[i];
        if (n->a->k == N_NAME) jd_set(r, f, jv_str(n->a->s, n->a->n), x);
        else {
            if (x.t != JV_LIST) {
                jr_fail(r, n->line, "cannot unpack a %s into loop variables", jv_type_name(x));
                return;
            }
            size_t k = 0;
            for (const jn *t = n->a->a; t; t = t->next, k++) {
                if (k >= x.u.l->n) {
                    jr_fail(r, n->line, "not enough values to unpack");
                    return;
                }
                jd_set(r, f, jv_str(t->s, t->n), x.u.l->a[k]);
            }
            if (k != x.u.l->n) {
                jr_fail(r, n->line, "too many values to unpack");
                return;
            }
        }
        jj_dict *loop = jd_new(r);
        jd_setc(r, loop, "index", jv_int((int64_t)i + 1));
        jd_setc(r, loop, "index0", jv_int((int64_t)i));
        jd_setc(r, loop, "revindex", jv_int((int64_t)(len - i)));
        jd_setc(r, loop, "revindex0", jv_int((int64_t)(len - i - 1)));
        jd_setc(r, loop, "first", jv_bool(i == 0));
        jd_setc(r, loop, "last", jv_bool(i + 1 == len));
        jd_setc(r, loop, "length", jv_int((int64_t)len));
        jd_setc(r, loop, "previtem", i ? items->a[i - 1] : JV_U);
        jd_setc(r, loop, "nextitem", i + 1 < len ? items->a[i + 1] : JV_U);
        if (loop) jd_setc(r, f, "loop", (jv){.t = JV_DICT, .u.d = loop});
        ex_body(r, n->c);
        r->n_frames--;
        int brk = r->brk;
        r->brk = 0;
        if (brk == 1) break;
    }
    if (len == 0 && !r->failed) ex_body(r, n->els); /* {% else %}: nothing was iterated */
}

static void ex_body(jr *r, const jn *n) {
    for (; n && !r->failed && !r->brk; n = n->next) {
        if (!jr_step(r, n->line)) return;
        switch (n->k) {
        case N_TEXT: jr_emit(r, n->s, n->n, n->line); break;
        case N_OUT: {
            jv v = ev(r, n->a);
            if (r->failed) return;
            if (v.t == JV_STR) jr_emit(r, v.u.s, v.n, n->line);
            else {
                jsb b = {.r = r};
                jv_str_into(r, &b, v);
                if (b.p) jr_emit(r, b.p, b.n, n->line);
            }
            break;
        }
        case N_IF: ex_body(r, jv_truthy(ev(r, n->a)) ? n->b : n->c); break;
        case N_FOR: ex_for(r, n); break;
        case N_SET: {
            jv v = ev(r, n->b);
            ex_set(r, n->a, v, n->line);
            break;
        }
        case N_SETBLOCK: {
            char *so = r->out;
            size_t sn = r->out_n, sc = r->out_cap;
            r->out = NULL;
            r->out_n = r->out_cap = 0;
            ex_body(r, n->b);
            jv v = r->out ? jv_str(r->out, r->out_n) : jv_str("", 0);
            r->out = so;
            r->out_n = sn;
            r->out_cap = sc;
            ex_set(r, n->a, v, n->line);
            break;
        }
        case N_MACRO:
            jd_set(r, r->frames[r->n_frames - 1], jv_str(n->s, n->n), (jv){.t = JV_MACRO, .u.m = n});
            break;
        case N_BREAK: r->brk = 1; return;
        case N_CONTINUE: r->brk = 2; return;
        default: jr_fail(r, n->line, "internal: node %d is not a statement", (int)n->k); return;
        }
    }
}

/* ---- JSON variables ---- */

static jv jj_from_json(jr *r, const cJSON *j, int depth) {
    if (depth > 128) {
        jr_fail(r, 0, "variables nested deeper than 128");
        return JV_U;
    }
    if (cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0) return jv_int((int64_t)d);
        return jv_float(d);
    }
    if (cJSON_IsString(j)) {
        size_t n = strlen(j->valuestring);
        char *s = jr_alloc(r, n + 1);
        if (!s) return JV_U;
        memcpy(s, j->valuestring, n + 1);
        return jv_str(s, n);
    }
    if (cJSON_IsArray(j)) {
        jj_list *l = jl_new(r, 4);
        for (const cJSON *c = j->child; c && l; c = c->next) jl_add(r, l, jj_from_json(r, c, depth + 1));
        return jv_list(l);
    }
    if (cJSON_IsObject(j)) {
        jj_dict *d = jd_new(r);
        for (const cJSON *c = j->child; c && d; c = c->next) {
            size_t n = strlen(c->string);
            char *k = jr_alloc(r, n + 1);
            if (!k) return JV_U;
            memcpy(k, c->string, n + 1);
            jd_set(r, d, jv_str(k, n), jj_from_json(r, c, depth + 1));
        }
        return d ? (jv){.t = JV_DICT, .u.d = d} : JV_U;
    }
    return JV_U;
}

ks_status ks_jinja_render(const ks_jinja *t, const char *vars, size_t len, int64_t now, char **out, size_t *n_out) {
    if (!t || !out || !n_out || (!vars && len)) return KS_FAIL(KS_ERR_INVALID_ARG, "jinja: NULL argument");
    cJSON *j = cJSON_ParseWithLength(vars ? vars : "{}", vars ? len : 2);
    if (!j) {
        return KS_FAIL(cJSON_GetErrorPtr() ? KS_ERR_INVALID_ARG : KS_ERR_NOMEM, "jinja: the variables are not valid JSON");
    }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return KS_FAIL(KS_ERR_INVALID_ARG, "jinja: the variables must be a JSON object");
    }
    jr r = {.now = now};
    jj_dict *frames[JJ_MAX_FRAMES];
    r.frames = frames;
    jr_push(&r, 0);
    if (!r.failed) {
        jv g = jj_from_json(&r, j, 0);
        if (!r.failed && g.t == JV_DICT) r.frames[0] = g.u.d;
    }
    cJSON_Delete(j);
    /* a template-level scope above the variables, so `set` never edits them */
    jr_push(&r, 0);
    ex_body(&r, t->root);
    ks_status st = KS_OK;
    if (r.failed) {
        if (r.nomem) st = KS_FAIL(KS_ERR_NOMEM, "jinja: %s", r.err);
        else if (r.raised) st = KS_FAIL(KS_ERR_INVALID_ARG, "the chat template rejected the conversation: %s", r.err);
        else st = KS_FAIL(KS_ERR_FORMAT, "chat template: %s", r.err);
    } else {
        char *o = ks_malloc(r.out_n + 1);
        if (!o) st = KS_FAIL(KS_ERR_NOMEM, "jinja: output of %zu bytes", r.out_n);
        else {
            if (r.out_n) memcpy(o, r.out, r.out_n);
            o[r.out_n] = '\0';
            *out = o;
            *n_out = r.out_n;
        }
    }
    jj_arena_free(&r.A);
    return st;
}
