/*
 * safetensors.c — map safetensors files, validate the JSON header, hand out
 * views.
 *
 * Order of distrust: the 8-byte header length is checked against the file
 * size (and the 100 MB cap) before cJSON sees a byte, and cJSON is given the
 * exact length, so a header without a terminating NUL is never overrun.  Each
 * JSON number is accepted only if it is a non-negative integer below 2^53
 * (doubles represent those exactly, so no value is silently rounded), and the
 * byte extent is computed as shape product * element size with an overflow
 * check at every multiplication.  Extents must land inside the data section,
 * and after all tensors of a file are read they are sorted by begin offset so
 * overlaps are found in O(n log n).  Names (unique across shards) are sorted
 * once, which both detects duplicates and makes find a binary search.
 *
 * cJSON's tree lives only for the duration of the parse: names and metadata
 * are copied out, so the handle holds plain arrays.
 */
#define _GNU_SOURCE
#include "checkpoint/safetensors.h"

#include "core/file.h"
#include "checkpoint/torch_bin.h"
#include "tensor/dtype.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct st_shard {
    ks_file_map file;      /* the file bytes: mapped, read (owned) or borrowed */
    char *path;            /* for messages; NULL for buffers */
} st_shard;

struct ks_safetensors {
    st_shard *shards;      /* [n_shards] */
    int n_shards;
    ks_st_tensor *tensors; /* [n_tensors], sorted by name after open */
    int64_t n_tensors, cap_tensors;
    char **meta_keys;      /* [n_meta] */
    char **meta_vals;      /* [n_meta] */
    int64_t n_meta, cap_meta;
};

static const struct { const char *name; size_t size; } k_dtypes[KS_ST_DTYPE_COUNT_] = {
    [KS_ST_BOOL] = {"BOOL", 1}, [KS_ST_U8] = {"U8", 1}, [KS_ST_I8] = {"I8", 1},
    [KS_ST_F8_E4M3] = {"F8_E4M3", 1}, [KS_ST_F8_E5M2] = {"F8_E5M2", 1},
    [KS_ST_I16] = {"I16", 2}, [KS_ST_U16] = {"U16", 2}, [KS_ST_F16] = {"F16", 2},
    [KS_ST_BF16] = {"BF16", 2}, [KS_ST_I32] = {"I32", 4}, [KS_ST_U32] = {"U32", 4},
    [KS_ST_F32] = {"F32", 4}, [KS_ST_I64] = {"I64", 8}, [KS_ST_U64] = {"U64", 8},
    [KS_ST_F64] = {"F64", 8},
};

const char *ks_st_dtype_name(ks_st_dtype t) { return (unsigned)t < KS_ST_DTYPE_COUNT_ ? k_dtypes[t].name : "?"; }
size_t ks_st_dtype_size(ks_st_dtype t) { return (unsigned)t < KS_ST_DTYPE_COUNT_ ? k_dtypes[t].size : 0; }

bool ks_st_dtype_from_name(const char *name, ks_st_dtype *out) {
    for (int i = 0; i < KS_ST_DTYPE_COUNT_; i++)
        if (!strcmp(name, k_dtypes[i].name)) {
            *out = (ks_st_dtype)i;
            return true;
        }
    return false;
}

const char *ks_st_shape_str(int n_dims, const int64_t *shape, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "[");
    for (int d = 0; d < n_dims && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

/* A bounded, printable copy of an untrusted name for messages. */
static const char *msg_name(const char *s, char *buf, size_t cap) {
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++) buf[i] = (s[i] >= 32 && s[i] < 127) ? s[i] : '?';
    buf[i] = 0;
    return buf;
}

/* ---------------------------------------------------------------- parse -- */

/* JSON number -> integer in [0, 2^53]; false if not exactly such a value. */
static bool json_u53(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

/* Takes t's name (freed here when refused). */
static ks_status push_tensor(ks_safetensors *st, const ks_st_tensor *t) {
    if (!t->name) return KS_FAIL(KS_ERR_NOMEM, "tensor name");
    if (st->n_tensors == st->cap_tensors) {
        int64_t cap = st->cap_tensors ? st->cap_tensors * 2 : 16;
        ks_st_tensor *v = ks_realloc(st->tensors, (size_t)cap * sizeof *st->tensors);
        if (!v) {
            ks_free((void *)t->name);
            return KS_FAIL(KS_ERR_NOMEM, "%lld tensors", (long long)cap);
        }
        st->tensors = v;
        st->cap_tensors = cap;
    }
    st->tensors[st->n_tensors++] = *t;
    return KS_OK;
}

/* Appended as found; finish() sorts them and drops repeated keys (the first
 * occurrence wins), so a header with millions of keys stays O(n log n). */
static ks_status push_meta(ks_safetensors *st, const char *k, const char *v) {
    if (st->n_meta == st->cap_meta) {
        int64_t cap = st->cap_meta ? st->cap_meta * 2 : 8;
        char **keys = ks_realloc(st->meta_keys, (size_t)cap * sizeof(char *));
        if (keys) st->meta_keys = keys;
        char **vals = keys ? ks_realloc(st->meta_vals, (size_t)cap * sizeof(char *)) : NULL;
        if (vals) st->meta_vals = vals;
        if (!keys || !vals) return KS_FAIL(KS_ERR_NOMEM, "%lld metadata entries", (long long)cap);
        st->cap_meta = cap;
    }
    char *kc = ks_strdup(k), *vc = ks_strdup(v);
    if (!kc || !vc) {
        ks_free(kc);
        ks_free(vc);
        return KS_FAIL(KS_ERR_NOMEM, "metadata entry");
    }
    st->meta_keys[st->n_meta] = kc;
    st->meta_vals[st->n_meta] = vc;
    st->n_meta++;
    return KS_OK;
}

typedef struct { uint64_t begin, end; int64_t index; } extent;

static int extent_cmp(const void *a, const void *b) {
    const extent *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static ks_status parse_tensor_info(ks_safetensors *st, int shard, const cJSON *item, uint64_t data_size,
                                   extent *ext) {
    char nb[128];
    const char *name = item->string;
    msg_name(name, nb, sizeof nb);
    if (!name[0]) return KS_FAIL(KS_ERR_FORMAT, "a tensor has an empty name");
    if (!cJSON_IsObject(item)) return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': header entry is not an object", nb);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(jd)) return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': missing or non-string \"dtype\"", nb);
    if (!cJSON_IsArray(js)) return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': missing or non-array \"shape\"", nb);
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': \"data_offsets\" must be an array [begin, end]", nb);
    ks_st_tensor t = {0};
    t.shard = shard;
    if (!ks_st_dtype_from_name(jd->valuestring, &t.dtype)) {
        char db[32];
        return KS_FAIL(KS_ERR_UNSUPPORTED, "tensor '%s': unknown dtype '%s' (known: BOOL U8 I8 F8_E4M3 F8_E5M2 I16 U16 F16 BF16 I32 U32 F32 I64 U64 F64)",
                       nb, msg_name(jd->valuestring, db, sizeof db));
    }
    int nd = cJSON_GetArraySize(js);
    if (nd > KS_ST_MAX_DIMS)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "tensor '%s': %d dimensions (at most %d supported)", nb, nd, KS_ST_MAX_DIMS);
    t.n_dims = nd;
    uint64_t n_elem = 1;
    bool zero = false;
    int d = 0;
    for (const cJSON *e = js->child; e; e = e->next, d++) {
        uint64_t v;
        if (!json_u53(e, &v)) return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': shape[%d] is not a non-negative integer", nb, d);
        t.shape[d] = (int64_t)v;
        if (v == 0) zero = true;
        else if (!zero && n_elem > (UINT64_MAX / 16) / v)
            return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': element count overflows", nb);
        else if (!zero) n_elem *= v;
    }
    if (zero) n_elem = 0;
    uint64_t begin, end;
    if (!json_u53(jo->child, &begin) || !json_u53(jo->child->next, &end))
        return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': data_offsets are not non-negative integers", nb);
    if (end < begin)
        return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] end before they begin", nb,
                       (unsigned long long)begin, (unsigned long long)end);
    uint64_t want = n_elem * ks_st_dtype_size(t.dtype); /* n_elem < 2^64/16: no overflow */
    if (want != end - begin) {
        char sb[160];
        return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] span %llu",
                       nb, ks_st_shape_str(t.n_dims, t.shape, sb, sizeof sb), ks_st_dtype_name(t.dtype),
                       (unsigned long long)want, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)(end - begin));
    }
    if (end > data_size)
        return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] lie outside the %llu-byte data section (truncated file?)",
                       nb, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_size);
    t.n_elem = (int64_t)n_elem;
    t.nbytes = (size_t)(end - begin);
    t.name = ks_strdup(name);
    ext->begin = begin;
    ext->end = end;
    ext->index = st->n_tensors;
    return push_tensor(st, &t);
}

/* Parse one file's bytes; appends its tensors (data pointers set) to st. */
static ks_status parse_shard(ks_safetensors *st, int shard) {
    const st_shard *sh = &st->shards[shard];
    if (sh->file.size < 8)
        return KS_FAIL(KS_ERR_FORMAT, "too small (%zu bytes) for a safetensors file (8-byte header length first)", sh->file.size);
    uint64_t n;
    memcpy(&n, sh->file.data, 8); /* little-endian hosts only (x86-64, aarch64) */
    if (n > sh->file.size - 8)
        return KS_FAIL(KS_ERR_FORMAT, "header length %llu exceeds the %zu bytes after it (truncated or not a safetensors file)",
                       (unsigned long long)n, sh->file.size - 8);
    if (n > KS_ST_MAX_HEADER)
        return KS_FAIL(KS_ERR_FORMAT, "header length %llu exceeds the %llu-byte limit", (unsigned long long)n,
                       (unsigned long long)KS_ST_MAX_HEADER);
    if (n < 2 || sh->file.data[8] != '{')
        return KS_FAIL(KS_ERR_FORMAT, "header is not a JSON object (must start with '{')");
    const char *hdr = (const char *)sh->file.data + 8;
    const char *end_ptr = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)n, &end_ptr, false);
    if (!root || !cJSON_IsObject(root)) {
        size_t at = end_ptr && end_ptr >= hdr ? (size_t)(end_ptr - hdr) : 0;
        if (!root) {
            const char *ep = cJSON_GetErrorPtr();
            if (ep && ep >= hdr && ep <= hdr + n) at = (size_t)(ep - hdr);
        }
        cJSON_Delete(root);
        return KS_FAIL(KS_ERR_FORMAT, "header is not well-formed JSON (error near byte %zu of %llu)", at,
                       (unsigned long long)n);
    }
    /* writers pad the header with spaces to 8-byte alignment: allow only blanks after the object */
    for (const char *p = end_ptr ? end_ptr : hdr + n; p < hdr + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            cJSON_Delete(root);
            return KS_FAIL(KS_ERR_FORMAT, "unexpected bytes after the JSON header object (offset %zu)", (size_t)(p - hdr));
        }
    uint64_t data_off = 8 + n, data_size = sh->file.size - data_off;
    int count = cJSON_GetArraySize(root);
    extent *ext = ks_malloc(sizeof(extent) * ((size_t)count + 1));
    if (!ext) {
        cJSON_Delete(root);
        return KS_FAIL(KS_ERR_NOMEM, "header of %d entries", count);
    }
    int n_ext = 0;
    ks_status s = KS_OK;
    for (const cJSON *it = root->child; it && s == KS_OK; it = it->next) {
        if (!it->string) { s = KS_FAIL(KS_ERR_FORMAT, "header member without a name"); break; }
        if (!strcmp(it->string, "__metadata__")) {
            if (!cJSON_IsObject(it)) { s = KS_FAIL(KS_ERR_FORMAT, "__metadata__ is not an object"); break; }
            for (const cJSON *m = it->child; m; m = m->next) {
                if (!cJSON_IsString(m)) {
                    char kb[96];
                    s = KS_FAIL(KS_ERR_FORMAT, "__metadata__ value of '%s' is not a string", msg_name(m->string ? m->string : "", kb, sizeof kb));
                    break;
                }
                if ((s = push_meta(st, m->string ? m->string : "", m->valuestring)) != KS_OK) break;
            }
            if (s != KS_OK) break;
            continue;
        }
        s = parse_tensor_info(st, shard, it, data_size, &ext[n_ext]);
        if (s == KS_OK) n_ext++;
    }
    cJSON_Delete(root);
    if (s == KS_OK) {
        qsort(ext, (size_t)n_ext, sizeof *ext, extent_cmp);
        uint64_t last_end = 0;
        int64_t last = -1;
        for (int i = 0; i < n_ext && s == KS_OK; i++) {
            if (ext[i].begin == ext[i].end) continue; /* empty tensors occupy nothing */
            if (last >= 0 && ext[i].begin < last_end) {
                char a[96], b[96];
                s = KS_FAIL(KS_ERR_FORMAT, "tensors '%s' and '%s' overlap in the data section ([.., %llu) and [%llu, ..))",
                            msg_name(st->tensors[last].name, a, sizeof a), msg_name(st->tensors[ext[i].index].name, b, sizeof b),
                            (unsigned long long)last_end, (unsigned long long)ext[i].begin);
            }
            last_end = ext[i].end;
            last = ext[i].index;
        }
        for (int i = 0; i < n_ext; i++) st->tensors[ext[i].index].data = sh->file.data + data_off + ext[i].begin;
    }
    ks_free(ext);
    return s;
}

static int tensor_name_cmp(const void *a, const void *b) {
    return strcmp(((const ks_st_tensor *)a)->name, ((const ks_st_tensor *)b)->name);
}

typedef struct { const char *key, *val; int64_t order; } meta_entry;

static int meta_cmp(const void *a, const void *b) {
    const meta_entry *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->order > y->order) - (x->order < y->order);
}

/* Sort metadata by key, keeping the first occurrence of each key. */
static ks_status finish_metadata(ks_safetensors *st) {
    if (st->n_meta < 2) return KS_OK;
    meta_entry *e = ks_malloc(sizeof *e * (size_t)st->n_meta);
    if (!e) return KS_FAIL(KS_ERR_NOMEM, "sorting %lld metadata entries", (long long)st->n_meta);
    for (int64_t i = 0; i < st->n_meta; i++) e[i] = (meta_entry){st->meta_keys[i], st->meta_vals[i], i};
    qsort(e, (size_t)st->n_meta, sizeof *e, meta_cmp);
    int64_t n = 0;
    for (int64_t i = 0; i < st->n_meta; i++) {
        if (n > 0 && !strcmp(st->meta_keys[n - 1], e[i].key)) {
            ks_free((void *)e[i].key);
            ks_free((void *)e[i].val);
            continue;
        }
        st->meta_keys[n] = (char *)e[i].key;
        st->meta_vals[n] = (char *)e[i].val;
        n++;
    }
    st->n_meta = n;
    ks_free(e);
    return KS_OK;
}

/* Sort by name and reject duplicates (cJSON keeps both members of a repeated key). */
static ks_status finish(ks_safetensors *st) {
    KS_TRY(finish_metadata(st));
    if (st->n_tensors > 1) qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, tensor_name_cmp);
    for (int64_t i = 1; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i - 1].name, st->tensors[i].name)) {
            char nb[128];
            const ks_st_tensor *a = &st->tensors[i - 1], *b = &st->tensors[i];
            if (a->shard != b->shard && st->shards[a->shard].path && st->shards[b->shard].path)
                return KS_FAIL(KS_ERR_FORMAT, "duplicate tensor name '%s' (in '%s' and '%s')", msg_name(a->name, nb, sizeof nb),
                               st->shards[a->shard].path, st->shards[b->shard].path);
            return KS_FAIL(KS_ERR_FORMAT, "duplicate tensor name '%s'", msg_name(a->name, nb, sizeof nb));
        }
    return KS_OK;
}

void ks_safetensors_close(ks_safetensors *st) {
    if (!st) return;
    for (int64_t i = 0; i < st->n_tensors; i++) ks_free((void *)st->tensors[i].name);
    ks_free(st->tensors);
    for (int64_t i = 0; i < st->n_meta; i++) {
        ks_free(st->meta_keys[i]);
        ks_free(st->meta_vals[i]);
    }
    ks_free(st->meta_keys);
    ks_free(st->meta_vals);
    for (int i = 0; i < st->n_shards; i++) {
        st_shard *sh = &st->shards[i];
        ks_file_map_close(&sh->file);
        ks_free(sh->path);
    }
    ks_free(st->shards);
    ks_free(st);
}

ks_status ks_safetensors_open_buffer(const void *buf, size_t size, ks_safetensors **out) {
    if (!buf && size) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL buffer");
    ks_safetensors *st = ks_calloc(1, sizeof *st);
    if (st) st->shards = ks_calloc(1, sizeof(st_shard));
    if (!st || !st->shards) {
        ks_safetensors_close(st);
        return KS_FAIL(KS_ERR_NOMEM, "safetensors handle");
    }
    st->n_shards = 1;
    st->shards[0].file = (ks_file_map){.data = buf, .size = size};
    ks_status s = parse_shard(st, 0);
    if (s == KS_OK) s = finish(st);
    if (s != KS_OK) {
        ks_safetensors_close(st);
        return s;
    }
    *out = st;
    return KS_OK;
}

/* ------------------------------------------------------------------ files -- */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = ks_malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* PyTorch's pickled state dicts (pytorch_model.bin, *.pt, *.pth): the
 * restricted reader of torch_bin.c hands out views into the shard's bytes,
 * which become this handle's tensors like a safetensors file's.  No
 * overlap check here: tensors of one torch storage may share bytes (tied
 * weights), and every view was checked to lie inside its storage. */
static bool is_torch_name(const char *path) {
    return ends_with(path, ".bin") || ends_with(path, ".pt") || ends_with(path, ".pth");
}

static ks_status parse_torch_shard(ks_safetensors *st, int shard) {
    const st_shard *sh = &st->shards[shard];
    ks_torch_bin *tb = NULL;
    KS_TRY(ks_torch_bin_parse(sh->file.data, sh->file.size, &tb));
    for (int64_t i = 0; i < tb->n_tensors; i++) {
        ks_torch_tensor *src = &tb->tensors[i];
        ks_st_tensor t = {.name = src->name, .dtype = src->dtype, .n_dims = src->n_dims, .n_elem = src->n_elem,
                          .data = src->data, .nbytes = src->nbytes, .shard = shard};
        memcpy(t.shape, src->shape, sizeof t.shape);
        src->name = NULL; /* owned by the handle now */
        ks_status s = push_tensor(st, &t);
        if (s != KS_OK) {
            ks_torch_bin_free(tb);
            return s;
        }
    }
    ks_torch_bin_free(tb);
    return KS_OK;
}

/* Adds one file as a new shard and parses it; the message names the file. */
static ks_status add_shard(ks_safetensors *st, const char *path, bool use_mmap) {
    st_shard *shards = ks_realloc(st->shards, sizeof(st_shard) * (size_t)(st->n_shards + 1));
    if (!shards) return KS_FAIL(KS_ERR_NOMEM, "shard %d ('%s')", st->n_shards, path);
    st->shards = shards;
    st_shard *sh = &st->shards[st->n_shards];
    memset(sh, 0, sizeof *sh);
    if (!(sh->path = ks_strdup(path))) return KS_FAIL(KS_ERR_NOMEM, "shard path '%s'", path);
    ks_status fs = ks_file_map_open(path, use_mmap, &sh->file);
    if (fs != KS_OK) {
        ks_free(sh->path);
        return fs;
    }
    st->n_shards++;
    ks_status s = is_torch_name(path) ? parse_torch_shard(st, st->n_shards - 1) : parse_shard(st, st->n_shards - 1);
    if (s != KS_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ks_last_error());
        return KS_FAIL(s, "'%s': %s", path, msg);
    }
    return KS_OK;
}

#define KS_ST_MAX_INDEX ((size_t)64 << 20)

static int cstr_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* A shard file name from an index must stay inside the checkpoint directory. */
static bool safe_shard_name(const char *s) {
    if (!s[0] || strchr(s, '/') || strchr(s, '\\') || !strcmp(s, ".") || !strcmp(s, "..")) return false;
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 32) return false;
    return true;
}

static ks_status open_index(ks_safetensors *st, const char *index_path, bool use_mmap) {
    ks_file_map tmp;
    KS_TRY(ks_file_map_open(index_path, false, &tmp));
    if (tmp.size > KS_ST_MAX_INDEX) {
        size_t size = tmp.size;
        ks_file_map_close(&tmp);
        return KS_FAIL(KS_ERR_FORMAT, "'%s': index of %zu bytes exceeds the %zu-byte limit", index_path, size, KS_ST_MAX_INDEX);
    }
    cJSON *root = cJSON_ParseWithLength((const char *)tmp.data, tmp.size);
    ks_file_map_close(&tmp);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return KS_FAIL(KS_ERR_FORMAT, "'%s': not a JSON object", index_path);
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        cJSON_Delete(root);
        return KS_FAIL(KS_ERR_FORMAT, "'%s': missing or empty \"weight_map\" object", index_path);
    }
    char *dir = ks_strdup(index_path);
    const char **names = dir ? ks_malloc(sizeof(char *) * (size_t)(cJSON_GetArraySize(wm) + 1)) : NULL;
    if (!names) {
        ks_free(dir);
        cJSON_Delete(root);
        return KS_FAIL(KS_ERR_NOMEM, "'%s': shard list", index_path);
    }
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else strcpy(dir, ".");
    /* distinct shard names, sorted (O(n log n) however long the map) */
    int n_names = 0;
    ks_status s = KS_OK;
    for (const cJSON *e = wm->child; e && s == KS_OK; e = e->next) {
        char nb[128];
        if (!cJSON_IsString(e) || !safe_shard_name(e->valuestring)) {
            s = KS_FAIL(KS_ERR_FORMAT, "'%s': weight_map entry '%s' does not name a file in the same directory", index_path,
                        msg_name(e->string ? e->string : "", nb, sizeof nb));
            break;
        }
        names[n_names++] = e->valuestring;
    }
    if (s == KS_OK && n_names > 1) {
        qsort(names, (size_t)n_names, sizeof *names, cstr_cmp);
        int u = 1;
        for (int i = 1; i < n_names; i++)
            if (strcmp(names[i], names[u - 1])) names[u++] = names[i];
        n_names = u;
    }
    for (int i = 0; i < n_names && s == KS_OK; i++) {
        char *p = path_join(dir, names[i]);
        s = p ? add_shard(st, p, use_mmap) : KS_FAIL(KS_ERR_NOMEM, "shard path");
        ks_free(p);
    }
    if (s == KS_OK) s = finish(st);
    /* every weight_map entry must be in the shard it names */
    for (const cJSON *e = wm->child; e && s == KS_OK; e = e->next) {
        const ks_st_tensor *t = ks_safetensors_find(st, e->string);
        char nb[128];
        if (!t) {
            s = KS_FAIL(KS_ERR_FORMAT, "'%s': tensor '%s' is in the weight_map but in no shard", index_path,
                        msg_name(e->string, nb, sizeof nb));
        } else {
            char *want = path_join(dir, e->valuestring);
            if (!want)
                s = KS_FAIL(KS_ERR_NOMEM, "shard path");
            else if (strcmp(st->shards[t->shard].path, want))
                s = KS_FAIL(KS_ERR_FORMAT, "'%s': tensor '%s' is mapped to '%s' but found in '%s'", index_path,
                            msg_name(e->string, nb, sizeof nb), e->valuestring, st->shards[t->shard].path);
            ks_free(want);
        }
    }
    ks_free(names);
    ks_free(dir);
    cJSON_Delete(root);
    return s;
}

ks_status ks_safetensors_open(const char *path, bool use_mmap, ks_safetensors **out) {
    if (!path) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL path");
    ks_safetensors *st = ks_calloc(1, sizeof *st);
    if (!st) return KS_FAIL(KS_ERR_NOMEM, "safetensors handle");
    ks_status s;
    if (is_dir(path)) {
        /* safetensors first; then PyTorch's pickled layout as the EAGLE authors publish it */
        char *idx = path_join(path, "model.safetensors.index.json");
        char *one = path_join(path, "model.safetensors");
        char *tidx = path_join(path, "pytorch_model.bin.index.json");
        char *tone = path_join(path, "pytorch_model.bin");
        const bool paths = idx && one && tidx && tone;
        const char *index = !paths ? NULL : is_file(idx) ? idx : !is_file(one) && is_file(tidx) ? tidx : NULL;
        const char *single = !paths || index ? NULL : is_file(one) ? one : is_file(tone) ? tone : NULL;
        if (!paths) s = KS_FAIL(KS_ERR_NOMEM, "paths under '%s'", path);
        else if (index) s = open_index(st, index, use_mmap);
        else if (single) {
            s = add_shard(st, single, use_mmap);
            if (s == KS_OK) s = finish(st);
        } else
            s = KS_FAIL(KS_ERR_IO, "'%s' holds none of model.safetensors, model.safetensors.index.json, pytorch_model.bin, "
                                   "pytorch_model.bin.index.json", path);
        ks_free(idx);
        ks_free(one);
        ks_free(tidx);
        ks_free(tone);
    } else if (ends_with(path, ".index.json")) {
        s = open_index(st, path, use_mmap);
    } else {
        s = add_shard(st, path, use_mmap);
        if (s == KS_OK) s = finish(st);
    }
    if (s != KS_OK) {
        ks_safetensors_close(st);
        return s;
    }
    *out = st;
    return KS_OK;
}

/* -------------------------------------------------------------- queries -- */

int64_t ks_safetensors_count(const ks_safetensors *st) { return st->n_tensors; }

const ks_st_tensor *ks_safetensors_at(const ks_safetensors *st, int64_t i) {
    KS_ASSERT(i >= 0 && i < st->n_tensors);
    return &st->tensors[i];
}

const ks_st_tensor *ks_safetensors_find(const ks_safetensors *st, const char *name) {
    int64_t lo = 0, hi = st->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (!c) return &st->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int ks_safetensors_n_shards(const ks_safetensors *st) { return st->n_shards; }

size_t ks_safetensors_file_bytes(const ks_safetensors *st) {
    size_t n = 0;
    for (int i = 0; i < st->n_shards; i++) n += st->shards[i].file.size;
    return n;
}

int64_t ks_safetensors_n_metadata(const ks_safetensors *st) { return st->n_meta; }

void ks_safetensors_metadata_at(const ks_safetensors *st, int64_t i, const char **key, const char **value) {
    KS_ASSERT(i >= 0 && i < st->n_meta);
    *key = st->meta_keys[i];
    *value = st->meta_vals[i];
}

const char *ks_safetensors_metadata(const ks_safetensors *st, const char *key) {
    int64_t lo = 0, hi = st->n_meta;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->meta_keys[mid], key);
        if (!c) return st->meta_vals[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ----------------------------------------------------------- conversion -- */

void ks_st_convert_f32(ks_st_dtype t, const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    switch (t) {
    case KS_ST_F32: memcpy(dst, p, (size_t)n * 4); break;
    case KS_ST_F16:
        for (int64_t i = 0; i < n; i++) { ks_f16 h; memcpy(&h, p + 2 * i, 2); dst[i] = ks_f16_to_f32(h); }
        break;
    case KS_ST_BF16:
        for (int64_t i = 0; i < n; i++) { ks_bf16 h; memcpy(&h, p + 2 * i, 2); dst[i] = ks_bf16_to_f32(h); }
        break;
    case KS_ST_F64:
        for (int64_t i = 0; i < n; i++) { double d; memcpy(&d, p + 8 * i, 8); dst[i] = (float)d; }
        break;
    default: KS_ASSERT(!"ks_st_convert_f32: not a float dtype");
    }
}

ks_status ks_safetensors_to_f32(const ks_st_tensor *t, int expect_dims, const int64_t *expect_shape, float **out) {
    char nb[128];
    msg_name(t->name, nb, sizeof nb);
    if (expect_shape) {
        bool ok = t->n_dims == expect_dims;
        for (int d = 0; ok && d < expect_dims; d++) ok = t->shape[d] == expect_shape[d];
        if (!ok) {
            char a[160], b[160];
            return KS_FAIL(KS_ERR_FORMAT, "tensor %s has shape %s, expected %s", nb, ks_st_shape_str(t->n_dims, t->shape, a, sizeof a),
                           ks_st_shape_str(expect_dims, expect_shape, b, sizeof b));
        }
    }
    if (t->dtype != KS_ST_F32 && t->dtype != KS_ST_F16 && t->dtype != KS_ST_BF16 && t->dtype != KS_ST_F64)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "tensor %s has dtype %s; only F32, F16, BF16 and F64 convert to f32", nb,
                       ks_st_dtype_name(t->dtype));
    /* n_elem is bounded by the file size (validated extent) */
    float *f = ks_malloc(sizeof(float) * (size_t)(t->n_elem ? t->n_elem : 1));
    if (!f) return KS_FAIL(KS_ERR_NOMEM, "tensor %s as %lld floats", nb, (long long)t->n_elem);
    ks_st_convert_f32(t->dtype, t->data, f, t->n_elem);
    *out = f;
    return KS_OK;
}

ks_status ks_safetensors_load_f32(const ks_safetensors *st, const char *name, int expect_dims,
                                  const int64_t *expect_shape, float **out) {
    const ks_st_tensor *t = ks_safetensors_find(st, name);
    if (!t) return KS_FAIL(KS_ERR_NOT_FOUND, "tensor %s not found", name);
    return ks_safetensors_to_f32(t, expect_dims, expect_shape, out);
}
