/*
 * torch_bin.c — the restricted unpickler behind ks_torch_bin_parse; the
 * zip container it reads data.pkl and the storages from is torch_zip.c.
 *
 * The unpickler is a stack machine over a fixed value type (none, bool,
 * int, string, tuple, dict, one of the seven known globals, storage,
 * tensor).  Values live in one arena freed at the end, so the memo and
 * nested tuples share them without reference counts and nothing recurses.
 * Each opcode allocates O(1) values plus what it consumes from the stack,
 * so memory stays proportional to the pickle's length.  Strings point into
 * data.pkl and are copied only into the result's names.  What a torch
 * state dict pickles to, for reference (protocol 2):
 *   GLOBAL collections.OrderedDict, EMPTY_TUPLE, REDUCE  -> the dict
 *   MARK, (BINUNICODE name, GLOBAL torch._utils._rebuild_tensor_v2,
 *          (BINPERSID ('storage', GLOBAL torch.HalfStorage, key, 'cpu', numel),
 *           offset, (sizes), (strides), requires_grad, OrderedDict()) REDUCE)...,
 *   SETITEMS, then BUILD with {'_metadata': OrderedDict of per-module dicts}.
 */
#define _GNU_SOURCE
#include "checkpoint/torch_bin.h"
#include "checkpoint/torch_zip.h"

#include <setjmp.h>
#include <string.h>

/* -------------------------------------------------------------- values -- */

typedef enum {
    PV_NONE, PV_BOOL, PV_INT, PV_STR, PV_TUPLE, PV_DICT, PV_GLOBAL, PV_STORAGE, PV_TENSOR
} pv_kind;

typedef enum {
    G_ODICT, G_REBUILD, G_HALF, G_BF16, G_FLOAT, G_LONG, G_BOOL, G_COUNT_
} pv_global;

static const struct { const char *module, *name; } k_globals[G_COUNT_] = {
    [G_ODICT] = {"collections", "OrderedDict"},
    [G_REBUILD] = {"torch._utils", "_rebuild_tensor_v2"},
    [G_HALF] = {"torch", "HalfStorage"},
    [G_BF16] = {"torch", "BFloat16Storage"},
    [G_FLOAT] = {"torch", "FloatStorage"},
    [G_LONG] = {"torch", "LongStorage"},
    [G_BOOL] = {"torch", "BoolStorage"},
};

typedef struct pv pv;
struct pv {
    pv_kind kind;
    union {
        int64_t i;                                   /* BOOL, INT */
        struct { const char *s; uint32_t n; } str;   /* STR */
        struct { pv **items; uint32_t n; } tup;      /* TUPLE */
        struct { pv **kv; uint32_t n, cap; } dict;   /* DICT: kv[2i], kv[2i+1] */
        pv_global g;                                 /* GLOBAL */
        struct { ks_st_dtype dtype; const uint8_t *data; int64_t numel; } sto; /* STORAGE */
        int64_t tensor;                              /* TENSOR: index into the result */
    } u;
};

/* Bump allocator: values and their arrays, freed at once.  A refused
 * allocation jumps back to run_pickle (oom), which reports KS_ERR_NOMEM:
 * every opcode allocates, and everything allocated is reachable from the vm
 * and freed by its owner, so one exit beats a check after each of them. */
typedef struct arena_block { struct arena_block *next; size_t used, cap; unsigned char mem[]; } arena_block;
typedef struct { arena_block *head; jmp_buf *oom; } arena;

static _Noreturn void arena_refused(arena *a) {
    KS_ASSERT(a->oom); /* allocations happen only inside run_pickle */
    longjmp(*a->oom, 1);
}

static void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > ((size_t)1 << 16) ? n : ((size_t)1 << 16);
        arena_block *b = ks_malloc(sizeof *b + cap);
        if (!b) arena_refused(a);
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = a->head->mem + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(arena *a) {
    while (a->head) {
        arena_block *n = a->head->next;
        ks_free(a->head);
        a->head = n;
    }
}

typedef struct {
    arena ar;
    pv **stack;
    size_t n_stack, cap_stack;
    size_t *marks;
    size_t n_marks, cap_marks;
    pv **memo;
    size_t cap_memo;
    const zip_dir *zip;
    const char *prefix;    /* "ARCHIVE/" */
    size_t prefix_len;
    ks_torch_bin *out;
    int64_t cap_out;
} vm;

static pv *pv_new(vm *m, pv_kind k) {
    pv *v = arena_alloc(&m->ar, sizeof *v);
    memset(v, 0, sizeof *v);
    v->kind = k;
    return v;
}

static void push(vm *m, pv *v) {
    if (m->n_stack == m->cap_stack) {
        size_t cap = m->cap_stack ? m->cap_stack * 2 : 64;
        pv **stack = ks_realloc(m->stack, cap * sizeof *m->stack);
        if (!stack) arena_refused(&m->ar);
        m->stack = stack;
        m->cap_stack = cap;
    }
    m->stack[m->n_stack++] = v;
}

static size_t mark_base(const vm *m) { return m->n_marks ? m->marks[m->n_marks - 1] : 0; }

/* Pops one value; the current mark is a floor. */
static ks_status pop(vm *m, size_t off, pv **out) {
    if (m->n_stack <= mark_base(m))
        return KS_FAIL(KS_ERR_FORMAT, "pickle: stack underflow at byte %zu", off);
    *out = m->stack[--m->n_stack];
    return KS_OK;
}

static ks_status top(vm *m, size_t off, pv **out) {
    if (m->n_stack <= mark_base(m))
        return KS_FAIL(KS_ERR_FORMAT, "pickle: stack underflow at byte %zu", off);
    *out = m->stack[m->n_stack - 1];
    return KS_OK;
}

static const char *kind_name(pv_kind k) {
    static const char *const names[] = {"None", "bool", "int", "str", "tuple", "dict", "global", "storage", "tensor"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

static void dict_set(vm *m, pv *d, pv *k, pv *v) {
    if (d->u.dict.n == d->u.dict.cap) {
        uint32_t cap = d->u.dict.cap ? d->u.dict.cap * 2 : 8;
        pv **kv = arena_alloc(&m->ar, sizeof(pv *) * 2 * cap);
        if (d->u.dict.n) memcpy(kv, d->u.dict.kv, sizeof(pv *) * 2 * d->u.dict.n);
        d->u.dict.kv = kv;
        d->u.dict.cap = cap;
    }
    d->u.dict.kv[2 * d->u.dict.n] = k;
    d->u.dict.kv[2 * d->u.dict.n + 1] = v;
    d->u.dict.n++;
}

static pv *make_tuple(vm *m, pv **items, size_t n) {
    pv *t = pv_new(m, PV_TUPLE);
    t->u.tup.n = (uint32_t)n;
    t->u.tup.items = arena_alloc(&m->ar, sizeof(pv *) * (n ? n : 1));
    if (n) memcpy(t->u.tup.items, items, sizeof(pv *) * n);
    return t;
}

static bool str_is(const pv *v, const char *s) {
    return v->kind == PV_STR && v->u.str.n == strlen(s) && !memcmp(v->u.str.s, s, v->u.str.n);
}

/* ('storage', torch.XStorage, key, location, numel) -> a storage view. */
static ks_status persistent_load(vm *m, pv *pid, size_t off, pv **out) {
    if (pid->kind != PV_TUPLE || pid->u.tup.n != 5 || !str_is(pid->u.tup.items[0], "storage"))
        return KS_FAIL(KS_ERR_UNSUPPORTED, "pickle: persistent id at byte %zu is not torch's ('storage', type, key, location, numel)", off);
    pv **it = pid->u.tup.items;
    if (it[1]->kind != PV_GLOBAL || it[1]->u.g < G_HALF)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "pickle: persistent id at byte %zu names no storage type", off);
    if (it[2]->kind != PV_STR || it[3]->kind != PV_STR || it[4]->kind != PV_INT || it[4]->u.i < 0)
        return KS_FAIL(KS_ERR_FORMAT, "pickle: persistent id at byte %zu has a malformed key, location or size", off);
    static const ks_st_dtype dt[G_COUNT_] = {[G_HALF] = KS_ST_F16, [G_BF16] = KS_ST_BF16, [G_FLOAT] = KS_ST_F32,
                                             [G_LONG] = KS_ST_I64, [G_BOOL] = KS_ST_BOOL};
    ks_st_dtype dtype = dt[it[1]->u.g];
    /* the storage's entry: ARCHIVE/data/KEY */
    char name[512], kb[64];
    size_t kl = it[2]->u.str.n;
    if (kl == 0 || kl > 200 || memchr(it[2]->u.str.s, '/', kl))
        return KS_FAIL(KS_ERR_FORMAT, "pickle: storage key '%s' is not a plain name", printable(it[2]->u.str.s, kl, kb, sizeof kb));
    int w = snprintf(name, sizeof name, "%.*sdata/%.*s", (int)m->prefix_len, m->prefix, (int)kl, it[2]->u.str.s);
    if (w < 0 || (size_t)w >= sizeof name) return KS_FAIL(KS_ERR_FORMAT, "pickle: the archive's directory name is too long");
    size_t nl = (size_t)w;
    const zip_entry *e = ks_zip_find(m->zip, name, nl);
    if (!e)
        return KS_FAIL(KS_ERR_FORMAT, "storage '%s' is not in the archive (no entry %s)", printable(it[2]->u.str.s, kl, kb, sizeof kb),
                       printable(name, nl, kb, sizeof kb));
    uint64_t numel = (uint64_t)it[4]->u.i, es = ks_st_dtype_size(dtype);
    if (numel > e->size / es || numel * es != e->size)
        return KS_FAIL(KS_ERR_FORMAT, "storage '%s' claims %llu elements of %s (%llu bytes) but its entry holds %llu bytes",
                       printable(it[2]->u.str.s, kl, kb, sizeof kb), (unsigned long long)numel, ks_st_dtype_name(dtype),
                       (unsigned long long)(numel <= UINT64_MAX / es ? numel * es : UINT64_MAX), (unsigned long long)e->size);
    pv *s = pv_new(m, PV_STORAGE);
    s->u.sto.dtype = dtype;
    s->u.sto.data = e->data;
    s->u.sto.numel = (int64_t)numel;
    *out = s;
    return KS_OK;
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]) */
static ks_status rebuild_tensor(vm *m, pv *args, size_t off, pv **out) {
    if (args->kind != PV_TUPLE || (args->u.tup.n != 6 && args->u.tup.n != 7))
        return KS_FAIL(KS_ERR_UNSUPPORTED, "pickle: _rebuild_tensor_v2 at byte %zu takes 6 arguments here", off);
    pv **a = args->u.tup.items;
    if (a[0]->kind != PV_STORAGE) return KS_FAIL(KS_ERR_FORMAT, "pickle: tensor at byte %zu has no storage", off);
    if (a[1]->kind != PV_INT || a[2]->kind != PV_TUPLE || a[3]->kind != PV_TUPLE || a[4]->kind != PV_BOOL ||
        a[5]->kind != PV_DICT || (args->u.tup.n == 7 && a[6]->kind != PV_NONE && !(a[6]->kind == PV_DICT && !a[6]->u.dict.n)))
        return KS_FAIL(KS_ERR_FORMAT, "pickle: tensor at byte %zu has malformed offset, size, stride, requires_grad or hooks", off);
    if (a[5]->u.dict.n)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "pickle: tensor at byte %zu carries backward hooks", off);
    const pv *sz = a[2], *st = a[3];
    uint32_t nd = sz->u.tup.n;
    if (nd > KS_ST_MAX_DIMS) return KS_FAIL(KS_ERR_UNSUPPORTED, "pickle: tensor at byte %zu has %u dimensions (at most %d)", off, nd, KS_ST_MAX_DIMS);
    if (st->u.tup.n != nd) return KS_FAIL(KS_ERR_FORMAT, "pickle: tensor at byte %zu has %u sizes but %u strides", off, nd, st->u.tup.n);
    const pv *sto = a[0];
    ks_torch_tensor t = {.dtype = sto->u.sto.dtype, .n_dims = (int)nd};
    uint64_t numel = 1;
    bool zero = false;
    for (uint32_t d = 0; d < nd; d++) {
        if (sz->u.tup.items[d]->kind != PV_INT || st->u.tup.items[d]->kind != PV_INT || sz->u.tup.items[d]->u.i < 0)
            return KS_FAIL(KS_ERR_FORMAT, "pickle: tensor at byte %zu has a size or stride that is not a non-negative int", off);
        uint64_t v = (uint64_t)sz->u.tup.items[d]->u.i;
        t.shape[d] = (int64_t)v;
        if (v == 0) zero = true;
        else if (!zero && numel > (UINT64_MAX / 16) / v)
            return KS_FAIL(KS_ERR_FORMAT, "pickle: tensor at byte %zu: element count overflows", off);
        else if (!zero) numel *= v;
    }
    if (zero) numel = 0;
    if (numel > 0) { /* contiguous: each stride is the product of the later sizes (size-1 dims are free) */
        uint64_t want = 1;
        for (int d = (int)nd - 1; d >= 0; d--) {
            if (t.shape[d] != 1 && (uint64_t)st->u.tup.items[d]->u.i != want)
                return KS_FAIL(KS_ERR_UNSUPPORTED, "pickle: tensor at byte %zu is not contiguous (stride %lld in dim %d, %llu expected); "
                                                   "save tensors with .contiguous()", off, (long long)st->u.tup.items[d]->u.i, d,
                               (unsigned long long)want);
            want *= (uint64_t)t.shape[d];
        }
    }
    int64_t so = a[1]->u.i;
    if (so < 0 || (uint64_t)so > (uint64_t)sto->u.sto.numel || numel > (uint64_t)sto->u.sto.numel - (uint64_t)so)
        return KS_FAIL(KS_ERR_FORMAT, "pickle: tensor at byte %zu reads elements [%lld, +%llu) of a %lld-element storage (out of bounds)",
                       off, (long long)so, (unsigned long long)numel, (long long)sto->u.sto.numel);
    size_t es = ks_st_dtype_size(t.dtype);
    t.n_elem = (int64_t)numel;
    t.nbytes = (size_t)numel * es;
    t.data = sto->u.sto.data + (size_t)so * es;
    ks_torch_bin *o = m->out;
    if (o->n_tensors == m->cap_out) {
        int64_t cap = m->cap_out ? m->cap_out * 2 : 16;
        ks_torch_tensor *ts = ks_realloc(o->tensors, (size_t)cap * sizeof *o->tensors);
        if (!ts) arena_refused(&m->ar);
        o->tensors = ts;
        m->cap_out = cap;
    }
    o->tensors[o->n_tensors] = t;
    pv *v = pv_new(m, PV_TENSOR);
    v->u.tensor = o->n_tensors++;
    *out = v;
    return KS_OK;
}

static ks_status need(size_t at, size_t n, size_t size, size_t op_off) {
    if (n > size || at > size - n)
        return KS_FAIL(KS_ERR_FORMAT, "pickle: opcode at byte %zu runs past the end of data.pkl (truncated?)", op_off);
    return KS_OK;
}

static ks_status memo_put(vm *m, uint64_t idx, size_t size, size_t off) {
    if (idx > size + 16) return KS_FAIL(KS_ERR_FORMAT, "pickle: memo index %llu at byte %zu is out of range", (unsigned long long)idx, off);
    pv *v;
    KS_TRY(top(m, off, &v));
    if (idx >= m->cap_memo) {
        size_t cap = m->cap_memo ? m->cap_memo : 64;
        while (cap <= idx) cap *= 2;
        pv **memo = ks_realloc(m->memo, cap * sizeof *m->memo);
        if (!memo) arena_refused(&m->ar);
        m->memo = memo;
        memset(m->memo + m->cap_memo, 0, (cap - m->cap_memo) * sizeof *m->memo);
        m->cap_memo = cap;
    }
    m->memo[idx] = v;
    return KS_OK;
}

static ks_status memo_get(vm *m, uint64_t idx, size_t off) {
    if (idx >= m->cap_memo || !m->memo[idx])
        return KS_FAIL(KS_ERR_FORMAT, "pickle: memo index %llu at byte %zu was never stored", (unsigned long long)idx, off);
    push(m, m->memo[idx]);
    return KS_OK;
}

/* GLOBAL "module\nname\n": one of the known tags, or refused. */
static ks_status global_op(vm *m, const uint8_t *p, size_t at, size_t size, size_t off, size_t *next) {
    const uint8_t *mod = p + at, *nl1 = memchr(mod, '\n', size - at);
    if (!nl1) return KS_FAIL(KS_ERR_FORMAT, "pickle: GLOBAL at byte %zu is unterminated", off);
    const uint8_t *name = nl1 + 1;
    size_t rest = size - (size_t)(name - p);
    const uint8_t *nl2 = memchr(name, '\n', rest);
    if (!nl2) return KS_FAIL(KS_ERR_FORMAT, "pickle: GLOBAL at byte %zu is unterminated", off);
    size_t ml = (size_t)(nl1 - mod), nml = (size_t)(nl2 - name);
    for (int g = 0; g < G_COUNT_; g++)
        if (ml == strlen(k_globals[g].module) && !memcmp(mod, k_globals[g].module, ml) && nml == strlen(k_globals[g].name) &&
            !memcmp(name, k_globals[g].name, nml)) {
            pv *v = pv_new(m, PV_GLOBAL);
            v->u.g = (pv_global)g;
            push(m, v);
            *next = (size_t)(nl2 + 1 - p);
            return KS_OK;
        }
    char mb[80], nb[80];
    return KS_FAIL(KS_ERR_UNSUPPORTED,
                   "pickle refers to the global '%s.%s' at byte %zu, which torch.save of a state dict never writes: refused "
                   "(kvsieve runs no pickled code; known: collections.OrderedDict, torch._utils._rebuild_tensor_v2, "
                   "torch.{Half,BFloat16,Float,Long,Bool}Storage)",
                   printable((const char *)mod, ml, mb, sizeof mb), printable((const char *)name, nml, nb, sizeof nb), off);
}

static ks_status run_pickle_ops(vm *m, const uint8_t *p, size_t size, pv **result) {
    size_t at = 0;
    if (size < 2 || p[0] != 0x80 || p[1] != 2)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "data.pkl does not start with PROTO 2 (torch.save writes pickle protocol 2)");
    at = 2;
    for (;;) {
        if (at >= size) return KS_FAIL(KS_ERR_FORMAT, "pickle: data.pkl ends without STOP (truncated?)");
        size_t off = at;
        uint8_t op = p[at++];
        pv *v, *a, *b;
        switch (op) {
        case '.': /* STOP */
            KS_TRY(pop(m, off, result));
            if (m->n_stack || m->n_marks) return KS_FAIL(KS_ERR_FORMAT, "pickle: STOP at byte %zu leaves values on the stack", off);
            return KS_OK;
        case '(': /* MARK */
            if (m->n_marks == m->cap_marks) {
                size_t cap = m->cap_marks ? m->cap_marks * 2 : 16;
                size_t *marks = ks_realloc(m->marks, cap * sizeof *m->marks);
                if (!marks) arena_refused(&m->ar);
                m->marks = marks;
                m->cap_marks = cap;
            }
            m->marks[m->n_marks++] = m->n_stack;
            break;
        case '}': push(m, pv_new(m, PV_DICT)); break; /* EMPTY_DICT */
        case ')': push(m, make_tuple(m, NULL, 0)); break; /* EMPTY_TUPLE */
        case 'N': push(m, pv_new(m, PV_NONE)); break;
        case 0x88: case 0x89: /* NEWTRUE / NEWFALSE */
            v = pv_new(m, PV_BOOL);
            v->u.i = op == 0x88;
            push(m, v);
            break;
        case 'K': /* BININT1 */
            KS_TRY(need(at, 1, size, off));
            v = pv_new(m, PV_INT);
            v->u.i = p[at];
            at += 1;
            push(m, v);
            break;
        case 'M': /* BININT2 */
            KS_TRY(need(at, 2, size, off));
            v = pv_new(m, PV_INT);
            v->u.i = rd16(p + at);
            at += 2;
            push(m, v);
            break;
        case 'J': /* BININT (signed 32-bit) */
            KS_TRY(need(at, 4, size, off));
            v = pv_new(m, PV_INT);
            v->u.i = (int32_t)rd32(p + at);
            at += 4;
            push(m, v);
            break;
        case 0x8a: { /* LONG1: n bytes, little-endian two's complement */
            KS_TRY(need(at, 1, size, off));
            size_t n = p[at++];
            KS_TRY(need(at, n, size, off));
            if (n > 8) return KS_FAIL(KS_ERR_UNSUPPORTED, "pickle: integer of %zu bytes at byte %zu", n, off);
            uint64_t u = 0;
            for (size_t i = 0; i < n; i++) u |= (uint64_t)p[at + i] << (8 * i);
            if (n && n < 8 && (p[at + n - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * n); /* sign-extend */
            at += n;
            v = pv_new(m, PV_INT);
            memcpy(&v->u.i, &u, sizeof u);
            push(m, v);
            break;
        }
        case 'X': { /* BINUNICODE */
            KS_TRY(need(at, 4, size, off));
            uint32_t n = rd32(p + at);
            at += 4;
            KS_TRY(need(at, n, size, off));
            v = pv_new(m, PV_STR);
            v->u.str.s = (const char *)p + at;
            v->u.str.n = n;
            at += n;
            push(m, v);
            break;
        }
        case 'q': KS_TRY(need(at, 1, size, off)); KS_TRY(memo_put(m, p[at], size, off)); at += 1; break; /* BINPUT */
        case 'r': KS_TRY(need(at, 4, size, off)); KS_TRY(memo_put(m, rd32(p + at), size, off)); at += 4; break; /* LONG_BINPUT */
        case 'h': KS_TRY(need(at, 1, size, off)); KS_TRY(memo_get(m, p[at], off)); at += 1; break; /* BINGET */
        case 'j': KS_TRY(need(at, 4, size, off)); KS_TRY(memo_get(m, rd32(p + at), off)); at += 4; break; /* LONG_BINGET */
        case 'c': KS_TRY(global_op(m, p, at, size, off, &at)); break; /* GLOBAL */
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            size_t n = (size_t)(op - 0x84);
            if (m->n_stack < mark_base(m) + n) return KS_FAIL(KS_ERR_FORMAT, "pickle: stack underflow at byte %zu", off);
            v = make_tuple(m, m->stack + m->n_stack - n, n);
            m->n_stack -= n;
            push(m, v);
            break;
        }
        case 't': { /* TUPLE: everything above the mark */
            if (!m->n_marks) return KS_FAIL(KS_ERR_FORMAT, "pickle: TUPLE at byte %zu without MARK", off);
            size_t base = m->marks[--m->n_marks];
            v = make_tuple(m, m->stack + base, m->n_stack - base);
            m->n_stack = base;
            push(m, v);
            break;
        }
        case 's': /* SETITEM */
            KS_TRY(pop(m, off, &b));
            KS_TRY(pop(m, off, &a));
            KS_TRY(top(m, off, &v));
            if (v->kind != PV_DICT) return KS_FAIL(KS_ERR_FORMAT, "pickle: SETITEM at byte %zu on a %s", off, kind_name(v->kind));
            dict_set(m, v, a, b);
            break;
        case 'u': { /* SETITEMS */
            if (!m->n_marks) return KS_FAIL(KS_ERR_FORMAT, "pickle: SETITEMS at byte %zu without MARK", off);
            size_t base = m->marks[--m->n_marks];
            if ((m->n_stack - base) % 2 || base == 0 || base <= mark_base(m))
                return KS_FAIL(KS_ERR_FORMAT, "pickle: SETITEMS at byte %zu has no dict or an odd item count", off);
            v = m->stack[base - 1];
            if (v->kind != PV_DICT) return KS_FAIL(KS_ERR_FORMAT, "pickle: SETITEMS at byte %zu on a %s", off, kind_name(v->kind));
            for (size_t i = base; i < m->n_stack; i += 2) dict_set(m, v, m->stack[i], m->stack[i + 1]);
            m->n_stack = base;
            break;
        }
        case 'Q': /* BINPERSID */
            KS_TRY(pop(m, off, &a));
            KS_TRY(persistent_load(m, a, off, &v));
            push(m, v);
            break;
        case 'R': /* REDUCE: only the two known callables */
            KS_TRY(pop(m, off, &a));
            KS_TRY(pop(m, off, &b));
            if (b->kind != PV_GLOBAL || a->kind != PV_TUPLE || (b->u.g != G_ODICT && b->u.g != G_REBUILD))
                return KS_FAIL(KS_ERR_UNSUPPORTED, "pickle: REDUCE at byte %zu calls a %s: refused (only OrderedDict() and "
                                                   "_rebuild_tensor_v2 are built)", off,
                               b->kind == PV_GLOBAL ? k_globals[b->u.g].name : kind_name(b->kind));
            if (b->u.g == G_ODICT) {
                if (a->u.tup.n) return KS_FAIL(KS_ERR_UNSUPPORTED, "pickle: OrderedDict at byte %zu built from arguments", off);
                v = pv_new(m, PV_DICT);
            } else {
                KS_TRY(rebuild_tensor(m, a, off, &v));
            }
            push(m, v);
            break;
        case 'b': /* BUILD: the state dict's _metadata attribute; kept out of the result */
            KS_TRY(pop(m, off, &a));
            KS_TRY(top(m, off, &v));
            if (v->kind != PV_DICT || (a->kind != PV_DICT && a->kind != PV_NONE))
                return KS_FAIL(KS_ERR_UNSUPPORTED, "pickle: BUILD at byte %zu on a %s with a %s", off, kind_name(v->kind), kind_name(a->kind));
            break;
        default:
            return KS_FAIL(KS_ERR_UNSUPPORTED, "pickle: opcode 0x%02x at byte %zu is not one torch.save writes for a state dict "
                                               "(protocol 2): refused", op, off);
        }
    }
}

/* ---------------------------------------------------------------- parse -- */

void ks_torch_bin_free(ks_torch_bin *b) {
    if (!b) return;
    for (int64_t i = 0; i < b->n_tensors; i++) ks_free(b->tensors[i].name);
    ks_free(b->tensors);
    ks_free(b);
}

static ks_status run_pickle(vm *m, const uint8_t *p, size_t size, pv **result) {
    jmp_buf oom;
    if (setjmp(oom)) {
        m->ar.oom = NULL;
        return KS_FAIL(KS_ERR_NOMEM, "pickle: values of a %zu-byte data.pkl", size);
    }
    m->ar.oom = &oom;
    ks_status s = run_pickle_ops(m, p, size, result);
    m->ar.oom = NULL;
    return s;
}

static ks_status parse(const uint8_t *buf, size_t size, zip_dir *z, vm *m, ks_torch_bin *out) {
    KS_TRY(ks_zip_read(buf, size, z));
    /* ARCHIVE/data.pkl: the one top-level directory holding a pickle */
    const zip_entry *pkl = NULL;
    for (int64_t i = 0; i < z->n; i++) {
        const zip_entry *e = &z->e[i];
        const char *slash = memchr(e->name, '/', e->name_len);
        if (!slash) continue;
        size_t pl = (size_t)(slash - e->name) + 1;
        if (e->name_len - pl == 8 && !memcmp(e->name + pl, "data.pkl", 8)) {
            if (pkl) return KS_FAIL(KS_ERR_FORMAT, "zip holds more than one data.pkl: not a single torch.save");
            pkl = e;
            m->prefix = e->name;
            m->prefix_len = pl;
        }
    }
    if (!pkl) return KS_FAIL(KS_ERR_FORMAT, "zip has no ARCHIVE/data.pkl: not a torch.save file");
    char bo[300];
    int bl = snprintf(bo, sizeof bo, "%.*sbyteorder", (int)m->prefix_len, m->prefix);
    const zip_entry *order = bl > 0 && (size_t)bl < sizeof bo ? ks_zip_find(z, bo, (size_t)bl) : NULL;
    if (order && !(order->size == 6 && !memcmp(order->data, "little", 6)))
        return KS_FAIL(KS_ERR_UNSUPPORTED, "the archive's byteorder is not 'little'");
    m->zip = z;
    m->out = out;
    pv *root = NULL;
    KS_TRY(run_pickle(m, pkl->data, (size_t)pkl->size, &root));
    if (root->kind != PV_DICT)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "the pickle holds a %s, not a state dict (name -> tensor)", kind_name(root->kind));
    /* name -> tensor, in the dict's order; names become the result's */
    int64_t n_built = out->n_tensors;
    ks_torch_tensor *built = out->tensors;
    out->tensors = ks_calloc((size_t)root->u.dict.n + 1, sizeof *out->tensors);
    out->n_tensors = 0;
    ks_status s = out->tensors ? KS_OK : KS_FAIL(KS_ERR_NOMEM, "state dict of %u entries", root->u.dict.n);
    for (uint32_t i = 0; i < root->u.dict.n && s == KS_OK; i++) {
        const pv *k = root->u.dict.kv[2 * i], *v = root->u.dict.kv[2 * i + 1];
        char nb[96];
        if (k->kind != PV_STR || !k->u.str.n || memchr(k->u.str.s, 0, k->u.str.n)) {
            s = KS_FAIL(KS_ERR_FORMAT, "state dict entry %u has a %s key, not a name", i, kind_name(k->kind));
        } else if (v->kind != PV_TENSOR || v->u.tensor < 0 || v->u.tensor >= n_built) {
            s = KS_FAIL(KS_ERR_UNSUPPORTED, "state dict entry '%s' is a %s, not a tensor (a nested checkpoint? save model.state_dict())",
                        printable(k->u.str.s, k->u.str.n, nb, sizeof nb), kind_name(v->kind));
        } else {
            ks_torch_tensor t = built[v->u.tensor];
            t.name = ks_malloc((size_t)k->u.str.n + 1);
            if (!t.name) {
                s = KS_FAIL(KS_ERR_NOMEM, "tensor name");
                break;
            }
            memcpy(t.name, k->u.str.s, k->u.str.n);
            t.name[k->u.str.n] = 0;
            out->tensors[out->n_tensors++] = t;
        }
    }
    ks_free(built);
    return s;
}

ks_status ks_torch_bin_parse(const void *buf, size_t size, ks_torch_bin **out) {
    if (!buf && size) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL buffer");
    if (!out) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL output");
    zip_dir z = {0};
    vm m = {0};
    ks_torch_bin *b = ks_calloc(1, sizeof *b);
    if (!b) return KS_FAIL(KS_ERR_NOMEM, "torch.save handle");
    ks_status s = buf ? parse(buf, size, &z, &m, b) : KS_FAIL(KS_ERR_FORMAT, "empty file: not a torch.save archive");
    arena_free(&m.ar);
    ks_free(m.stack);
    ks_free(m.marks);
    ks_free(m.memo);
    ks_free(z.e);
    if (s != KS_OK) {
        /* names are set only on the final list; the intermediate list has none */
        ks_torch_bin_free(b);
        return s;
    }
    *out = b;
    return KS_OK;
}
