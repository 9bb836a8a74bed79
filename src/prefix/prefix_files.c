/*
 * prefix_files.c — the prefix cache's files: the directory tier and the
 * one-file prompt caches.
 *
 * Why on disk at all: a RAM tier is lost with the process and is one
 * process's, while a document's KV is worth keeping across restarts and
 * between replicas serving the same documents.  Every block the cache takes
 * is queued for a writer thread (write-behind: the request never waits on
 * the disk), which publishes it as <key>.kvb atomically (write a temporary
 * file, fsync, rename), so a reader never sees half a file and several
 * replicas may share the directory.  A policy's per-token state of a block
 * goes beside it as <key>-<policy>.kvs the same way.  A RAM miss looks for
 * the file; a file is untrusted input: its header (magic, version, model
 * fingerprint, layout, key, parent), sizes, checksum and key chain are
 * checked before a byte is used (ks_pc_record_parse, prefix_record.c,
 * fuzzed), it must be the block its name says, and a bad file is skipped
 * with a counted warning: the rows are computed instead.
 *
 * A bad file heals.  Skipping a bad file is not enough when the directory
 * outlives the process: every restart and every replica would miss from
 * that block on, forever.  So a file that fails validation is marked bad in
 * this process's index, and the block the request then recomputes is
 * written again under the same name, which replaces the bad file (counted
 * in `healed`).  Replacement is only ever by rename, never by unlink: the
 * recomputed block is byte for byte what a good file of that name holds (a
 * prefill row's KV is a function of the tokens before it alone), so if
 * another replica heals the same file at the same moment, whichever rename
 * lands last leaves a good file, a reader that opened the old one keeps
 * reading the old inode, and no good file another replica just wrote is
 * ever removed.  A state file (.kvs) heals the same way when its policy's
 * state is captured again.  The directory has
 * its own LRU under disk_bytes over the files this process knows (found at
 * start or written since); another replica may remove a file first, so
 * every unlink and open tolerates its absence.
 *
 * A one-file prompt cache (`kvsieve run --prompt-cache`) is the same
 * records one after another; it is read here a record at a time, each
 * block keeping the buffer its record was read into (no second copy of a
 * payload); reading stops at the first record that fails validation, which
 * is what lets a checkpointed prefill append to the file (a torn last
 * record leaves the ones before it).  Writing one is prefix_context.c's
 * (the blocks may be pinned pages of the context's store).
 */
#define _GNU_SOURCE
#include "prefix/prefix_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

/* --------------------------------------------------------- directory -- */
static uint64_t wall_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec;
}

static void file_name(const ks_prefix_cache *pc, const ks_pc_key *k, uint64_t pol, char *out, size_t cap) {
    if (pol)
        snprintf(out, cap, "%s/%016llx%016llx-%016llx.kvs", pc->dir, (unsigned long long)k->a,
                 (unsigned long long)k->b, (unsigned long long)pol);
    else
        snprintf(out, cap, "%s/%016llx%016llx.kvb", pc->dir, (unsigned long long)k->a, (unsigned long long)k->b);
}

static void skip_warn(ks_prefix_cache *pc, const char *what, const char *why) {
    pthread_mutex_lock(&pc->mu);
    pc->st.skipped_corrupt++;
    pthread_mutex_unlock(&pc->mu);
    KS_LOG(WARN, "prefix cache: skipped %s: %s", what, why);
}

static int32_t disk_find_locked(ks_prefix_cache *pc, const ks_pc_key *k, uint64_t pol) {
    for (int32_t i = 0; i < pc->n_disk; i++)
        if (ks_pc_key_eq(&pc->disk[i].key, k) && pc->disk[i].pol == pol) return i;
    return -1;
}

/* A file of the directory is known good here (read back, or written): a
 * write of it would be redundant.  A bad one is to be written again. */
static bool disk_good_locked(ks_prefix_cache *pc, const ks_pc_key *k, uint64_t pol) {
    int32_t i = disk_find_locked(pc, k, pol);
    return i >= 0 && !pc->disk[i].bad;
}

/* Note a file of the directory: found at start (scan), read back, or
 * written by this process (wrote).  A file marked bad that is good now was
 * healed: by this process's write (counted), or by another replica's. */
static void disk_note_locked(ks_prefix_cache *pc, const ks_pc_key *k, uint64_t pol, uint64_t bytes, uint64_t stamp,
                             bool wrote) {
    int32_t i = disk_find_locked(pc, k, pol);
    if (i >= 0) {
        disk_ent *e = &pc->disk[i];
        e->stamp = stamp;
        if (e->bad) {
            pc->st.healed += wrote;
            pc->st.disk_bytes = pc->st.disk_bytes - e->bytes + bytes;
            e->bytes = bytes;
            e->bad = false;
        }
        return;
    }
    if (pc->n_disk == pc->disk_cap) {
        int32_t cap = pc->disk_cap ? 2 * pc->disk_cap : 256;
        disk_ent *disk = ks_realloc(pc->disk, sizeof(disk_ent) * (size_t)cap);
        if (!disk) return; /* the file stays unlisted: the index only ever under-counts */
        pc->disk = disk;
        pc->disk_cap = cap;
    }
    pc->disk[pc->n_disk++] = (disk_ent){*k, pol, bytes, stamp, false};
    pc->st.disk_bytes += bytes;
    pc->st.disk_blocks++;
}

/* A file failed validation: skipped (counted, warned) and marked bad, so
 * the block's next write replaces it.  bytes: its size where known (else 0:
 * the index under-counts until the file is replaced). */
static void refuse(ks_prefix_cache *pc, const char *path, const char *why, const ks_pc_key *k, uint64_t pol,
                   uint64_t bytes) {
    skip_warn(pc, path, why);
    pthread_mutex_lock(&pc->mu);
    int32_t i = disk_find_locked(pc, k, pol);
    if (i < 0) { /* another replica wrote it after this process scanned the directory */
        disk_note_locked(pc, k, pol, bytes, wall_us(), false);
        i = disk_find_locked(pc, k, pol);
    }
    if (i >= 0) pc->disk[i].bad = true; /* refused index room: unlisted, so written again anyway */
    pthread_mutex_unlock(&pc->mu);
}

/* Remove the least recently used files while over the disk cap. */
static void disk_trim_locked(ks_prefix_cache *pc) {
    while (pc->p.disk_bytes && pc->st.disk_bytes > pc->p.disk_bytes && pc->n_disk > 0) {
        int32_t o = 0;
        for (int32_t i = 1; i < pc->n_disk; i++)
            if (pc->disk[i].stamp < pc->disk[o].stamp) o = i;
        char path[4096];
        file_name(pc, &pc->disk[o].key, pc->disk[o].pol, path, sizeof path);
        unlink(path); /* another replica may have removed it already */
        pc->st.disk_bytes -= pc->disk[o].bytes;
        pc->st.disk_blocks--;
        pc->st.disk_evictions++;
        pc->disk[o] = pc->disk[--pc->n_disk];
    }
}

ks_status ks_pc_write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return KS_FAIL(KS_ERR_IO, "write: %s", strerror(errno));
        b += w;
        n -= (size_t)w;
    }
    return KS_OK;
}

/* Publish a file atomically: a temporary name, fsync, rename. */
static ks_status publish(const char *path, const void *const *parts, const size_t *sizes, int n_parts) {
    static _Atomic uint64_t serial;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%llu", path, (int)getpid(), (unsigned long long)atomic_fetch_add(&serial, 1));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return KS_FAIL(KS_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    ks_status st = KS_OK;
    for (int i = 0; i < n_parts && st == KS_OK; i++) st = ks_pc_write_all(fd, parts[i], sizes[i]);
    if (st == KS_OK && fsync(fd) != 0) st = KS_FAIL(KS_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && st == KS_OK) st = KS_FAIL(KS_ERR_IO, "close %s: %s", tmp, strerror(errno));
    if (st == KS_OK && rename(tmp, path) != 0) st = KS_FAIL(KS_ERR_IO, "rename %s: %s", tmp, strerror(errno));
    if (st != KS_OK) unlink(tmp);
    return st;
}

static ks_status write_block(ks_prefix_cache *pc, const pc_block *b, const uint8_t *payload) {
    uint8_t hdr[KS_PC_HEADER_BYTES];
    ks_pc_record_header(hdr, &b->fmt, &pc->model, &b->key, &b->parent, b->tok, payload);
    char path[4096];
    file_name(pc, &b->key, 0, path, sizeof path);
    const void *parts[3] = {hdr, b->tok, payload};
    size_t sizes[3] = {sizeof hdr, sizeof(int32_t) * b->fmt.page, b->kv_bytes};
    return publish(path, parts, sizes, 3);
}

static ks_status write_state(ks_prefix_cache *pc, const pc_block *b, const pc_state *s) {
    uint8_t hdr[KS_PC_STATE_HEADER_BYTES];
    ks_pc_state_header(hdr, &pc->model, &b->key, s->pol, s->data, s->bytes);
    char path[4096];
    file_name(pc, &b->key, s->pol, path, sizeof path);
    const void *parts[2] = {hdr, s->data};
    size_t sizes[2] = {sizeof hdr, s->bytes};
    return publish(path, parts, sizes, 2);
}

static void written_locked(ks_prefix_cache *pc, const pc_block *b, const pc_state *s) {
    pc->st.spills += !s;
    disk_note_locked(pc, &b->key, s ? s->pol : 0,
                     s ? KS_PC_STATE_HEADER_BYTES + s->bytes
                       : KS_PC_HEADER_BYTES + sizeof(int32_t) * b->fmt.page + b->kv_bytes,
                     wall_us(), true);
    disk_trim_locked(pc);
}

void *ks_pc_writer_main(void *arg) {
    ks_prefix_cache *pc = arg;
    pthread_mutex_lock(&pc->mu);
    for (;;) {
        while (!pc->qn && !pc->quit) pthread_cond_wait(&pc->cv, &pc->mu);
        if (!pc->qn) break;
        pc_job job = pc->q[0];
        pc_block *b = job.b;
        memmove(pc->q, pc->q + 1, sizeof(pc_job) * (size_t)--pc->qn);
        pc->writing = true;
        pthread_mutex_unlock(&pc->mu);
        /* a block and its attached states are immutable: no lock needed */
        ks_status st = job.st ? write_state(pc, b, job.st) : write_block(pc, b, job.payload ? job.payload : b->kv);
        if (st != KS_OK) KS_LOG(WARN, "prefix cache: could not write a block: %s", ks_last_error());
        ks_free(job.payload);
        pthread_mutex_lock(&pc->mu);
        if (job.st) b->st_queued = false;
        else b->queued = false;
        if (st == KS_OK) written_locked(pc, b, job.st);
        ks_pc_unref_locked(b);
        pc->writing = false;
        if (!pc->qn) pthread_cond_broadcast(&pc->done_cv);
    }
    pthread_mutex_unlock(&pc->mu);
    return NULL;
}

/* Queue a listed block (s NULL) or one of its states for the directory
 * (caller holds mu).  A pinned block's bytes come as payload (the job owns
 * it: the writer thread never reads the store); a block of bytes passes
 * NULL. */
void ks_pc_enqueue_locked(ks_prefix_cache *pc, pc_block *b, pc_state *s, uint8_t *payload) {
    if (!pc->dir || (s ? b->st_queued : b->queued) || disk_good_locked(pc, &b->key, s ? s->pol : 0) ||
        (!s && !payload && !b->kv)) {
        ks_free(payload);
        return;
    }
    if (!pc->has_writer) { /* synchronous mode */
        ks_status st = s ? write_state(pc, b, s) : write_block(pc, b, payload ? payload : b->kv);
        ks_free(payload);
        if (st == KS_OK) written_locked(pc, b, s);
        else KS_LOG(WARN, "prefix cache: could not write a block: %s", ks_last_error());
        return;
    }
    if (pc->qn == pc->qcap) {
        int32_t cap = pc->qcap ? 2 * pc->qcap : 64;
        pc_job *q = ks_realloc(pc->q, sizeof(pc_job) * (size_t)cap);
        if (!q) { /* the block stays in RAM only, as without a directory */
            KS_LOG(WARN, "prefix cache: no room to queue a block write");
            return;
        }
        pc->q = q;
        pc->qcap = cap;
    }
    if (s) b->st_queued = true;
    else b->queued = true;
    b->refs++;
    pc->q[pc->qn++] = (pc_job){b, s, payload};
    pthread_cond_signal(&pc->cv);
}

void ks_prefix_cache_flush(ks_prefix_cache *pc) {
    if (!pc) return;
    pthread_mutex_lock(&pc->mu);
    while (pc->qn || pc->writing) pthread_cond_wait(&pc->done_cv, &pc->mu);
    pthread_mutex_unlock(&pc->mu);
}

/* Read a whole file of at most cap bytes (NULL and *len = 0 when absent). */
static ks_status read_file(const char *path, size_t cap, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? KS_ERR_NOT_FOUND : KS_FAIL(KS_ERR_IO, "open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return KS_FAIL(KS_ERR_IO, "%s is not a regular file", path);
    }
    if ((uint64_t)sb.st_size > cap) {
        close(fd);
        return KS_FAIL(KS_ERR_FORMAT, "%s has %lld bytes, more than a block can", path, (long long)sb.st_size);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    uint8_t *buf = ks_malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return KS_FAIL(KS_ERR_NOMEM, "reading %s (%zu bytes)", path, n);
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = got;
    return KS_OK;
}

/* A block from a parsed record (owned copy). */
static pc_block *block_from_record(const ks_pc_record *r) {
    pc_block *b = ks_calloc(1, sizeof *b);
    if (!b) return NULL;
    b->key = r->key;
    b->parent = r->parent;
    b->fmt = r->fmt;
    b->tok = ks_malloc(sizeof(int32_t) * r->fmt.page);
    b->kv_bytes = r->payload_bytes;
    b->kv = ks_malloc(r->payload_bytes);
    if (!b->tok || !b->kv) {
        ks_pc_block_free(b);
        return NULL;
    }
    memcpy(b->tok, r->tokens, sizeof(int32_t) * r->fmt.page);
    memcpy(b->kv, r->payload, r->payload_bytes);
    b->bytes = b->kv_bytes + sizeof(int32_t) * r->fmt.page + sizeof *b;
    return b;
}

/* The block of key from the directory, verified against the expected
 * parent, tokens and layout; NULL (counted when the file was bad) if none. */
pc_block *ks_pc_load_block(ks_prefix_cache *pc, const ks_pc_key *key, const ks_pc_key *parent, const int32_t *tokens,
                           const ks_pc_format *fmt) {
    if (!pc->dir) return NULL;
    char path[4096];
    file_name(pc, key, 0, path, sizeof path);
    size_t want = KS_PC_HEADER_BYTES + sizeof(int32_t) * fmt->page + ks_pc_payload_bytes(fmt);
    uint8_t *buf = NULL;
    size_t len = 0;
    ks_status st = read_file(path, want, &buf, &len);
    if (st == KS_ERR_NOT_FOUND || st == KS_ERR_NOMEM) return NULL; /* a miss: the rows are computed */
    if (st != KS_OK) {
        refuse(pc, path, ks_last_error(), key, 0, 0);
        return NULL;
    }
    ks_pc_record r;
    st = ks_pc_record_parse(buf, len, &pc->model, &r);
    pc_block *b = NULL;
    if (st != KS_OK) {
        refuse(pc, path, ks_last_error(), key, 0, len);
    } else if (!ks_pc_key_eq(&r.key, key) || !ks_pc_key_eq(&r.parent, parent) || memcmp(&r.fmt, fmt, sizeof *fmt) ||
               r.bytes != len || memcmp(r.tokens, tokens, sizeof(int32_t) * fmt->page)) {
        refuse(pc, path, "the block is not the one its name says", key, 0, len);
    } else {
        b = block_from_record(&r);
    }
    ks_free(buf);
    if (b) {
        pthread_mutex_lock(&pc->mu);
        pc->st.loads++;
        disk_note_locked(pc, key, 0, len, wall_us(), false);
        pthread_mutex_unlock(&pc->mu);
    }
    return b;
}

/* Files already in the directory join its LRU (oldest modified first out). */
void ks_pc_scan_dir(ks_prefix_cache *pc) {
    DIR *d = opendir(pc->dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        bool block = n == 36 && !strcmp(e->d_name + 32, ".kvb");
        bool state = n == 53 && e->d_name[32] == '-' && !strcmp(e->d_name + 49, ".kvs");
        if (!block && !state) continue;
        char a[17] = {0}, b[17] = {0}, c[17] = {0};
        memcpy(a, e->d_name, 16);
        memcpy(b, e->d_name + 16, 16);
        if (state) memcpy(c, e->d_name + 33, 16);
        char *end1, *end2, *end3 = c;
        ks_pc_key k = {strtoull(a, &end1, 16), strtoull(b, &end2, 16)};
        uint64_t pol = state ? strtoull(c, &end3, 16) : 0;
        if (*end1 || *end2 || *end3 || (state && !pol)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", pc->dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        disk_note_locked(pc, &k, pol, (uint64_t)sb.st_size,
                         (uint64_t)sb.st_mtim.tv_sec * 1000000u + (uint64_t)sb.st_mtim.tv_nsec / 1000u, false);
    }
    closedir(d);
    disk_trim_locked(pc);
}

/* A block's state for policy configuration pol: in RAM, else from its file
 * (verified and attached); NULL when there is none. */
pc_state *ks_pc_state_get(ks_prefix_cache *pc, pc_block *b, uint64_t pol, size_t want) {
    pthread_mutex_lock(&pc->mu);
    pc_state *s = ks_pc_state_of(b, pol);
    pthread_mutex_unlock(&pc->mu);
    if (s || !pc->dir) return s;
    char path[4096];
    file_name(pc, &b->key, pol, path, sizeof path);
    uint8_t *buf = NULL;
    size_t len = 0;
    ks_status st = read_file(path, KS_PC_STATE_HEADER_BYTES + want, &buf, &len);
    if (st == KS_ERR_NOT_FOUND || st == KS_ERR_NOMEM) return NULL; /* a miss: the rows are computed */
    if (st != KS_OK) {
        refuse(pc, path, ks_last_error(), &b->key, pol, 0);
        return NULL;
    }
    ks_pc_state_record r;
    if (ks_pc_state_parse(buf, len, &pc->model, &r) != KS_OK) {
        refuse(pc, path, ks_last_error(), &b->key, pol, len);
    } else if (!ks_pc_key_eq(&r.key, &b->key) || r.pol != pol || r.data_bytes != want || r.bytes != len) {
        refuse(pc, path, "the state is not the one its name says", &b->key, pol, len);
    } else {
        s = ks_calloc(1, sizeof *s);
        if (s && !(s->data = ks_malloc(want))) {
            ks_free(s);
            s = NULL;
        }
        if (s) { /* refused: a miss */
            s->pol = pol;
            s->bytes = want;
            memcpy(s->data, r.data, want);
        }
    }
    ks_free(buf);
    if (!s) return NULL;
    pthread_mutex_lock(&pc->mu);
    pc_state *there = ks_pc_state_of(b, pol);
    if (there) {
        ks_free(s->data);
        ks_free(s);
        s = there;
    } else {
        s->next = b->st;
        b->st = s;
        b->bytes += s->bytes;
        if (b->listed) pc->st.ram_bytes += s->bytes;
        pc->st.loads++;
        disk_note_locked(pc, &b->key, pol, len, wall_us(), false);
    }
    pthread_mutex_unlock(&pc->mu);
    return s;
}

/* The block of key (RAM, else the directory), referenced for the caller;
 * NULL when absent. */
/* ------------------------------------------------ one-file caches -- */
/* pread all n bytes at off; false at end of file or on an error */
static bool pread_all(int fd, void *dst, size_t n, off_t off) {
    uint8_t *d = dst;
    while (n) {
        ssize_t r = pread(fd, d, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        d += r;
        n -= (size_t)r;
        off += r;
    }
    return true;
}

/* Streamed, a record at a time (a 16K-token prompt's file is half a GB of
 * a 1B model's KV: never the whole file in memory beside its blocks). */
ks_status ks_prefix_cache_load_file(ks_prefix_cache *pc, const char *path, int32_t *n_blocks) {
    if (!pc || !path) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL argument");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return KS_FAIL(KS_ERR_NOT_FOUND, "no prompt cache at %s yet", path);
        return KS_FAIL(KS_ERR_IO, "open %s: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return KS_FAIL(KS_ERR_IO, "%s is not a regular file", path);
    }
    uint64_t len = (uint64_t)sb.st_size;
    uint8_t *buf = NULL;
    size_t cap = 0;
    int32_t k = 0;
    for (uint64_t off = 0; off < len;) {
        uint8_t hdr[KS_PC_HEADER_BYTES];
        const char *why = NULL;
        size_t rec = 0;
        if (len - off < KS_PC_HEADER_BYTES || !pread_all(fd, hdr, sizeof hdr, (off_t)off)) {
            why = "truncated record header";
        } else {
            ks_pc_format f = ks_pc_header_format(hdr);
            size_t pb = ks_pc_payload_bytes(&f);
            rec = KS_PC_HEADER_BYTES + sizeof(int32_t) * f.page + pb;
            if (!pb) rec = KS_PC_HEADER_BYTES; /* the parser names what is wrong */
            if (rec > len - off) rec = (size_t)(len - off);
        }
        if (!why) { /* a buffer per record: the block keeps it (no second copy of the payload) */
            if (!buf || rec > cap) {
                ks_free(buf);
                buf = ks_malloc(rec);
                cap = buf ? rec : 0;
            }
            if (!buf) {
                close(fd);
                return KS_FAIL(KS_ERR_NOMEM, "a record of %zu bytes from %s", rec, path);
            }
            if (!pread_all(fd, buf, rec, (off_t)off)) why = "read failed";
        }
        ks_pc_record r;
        if (!why && ks_pc_record_parse(buf, rec, &pc->model, &r) != KS_OK) why = ks_last_error();
        if (why) {
            skip_warn(pc, path, why);
            break;
        }
        pc_block *b = ks_calloc(1, sizeof *b);
        if (b && !(b->tok = ks_malloc(sizeof(int32_t) * r.fmt.page))) {
            ks_free(b);
            b = NULL;
        }
        if (!b) {
            ks_free(buf);
            close(fd);
            return KS_FAIL(KS_ERR_NOMEM, "a block from %s", path);
        }
        b->key = r.key;
        b->parent = r.parent;
        b->fmt = r.fmt;
        memcpy(b->tok, r.tokens, sizeof(int32_t) * r.fmt.page);
        b->kv_bytes = r.payload_bytes;
        b->raw = buf; /* the payload stays where it was read */
        b->in_file = true;
        b->kv = (uint8_t *)r.payload;
        b->bytes = b->kv_bytes + sizeof(int32_t) * r.fmt.page + sizeof *b;
        buf = NULL;
        cap = 0;
        pthread_mutex_lock(&pc->mu);
        if (ks_pc_find_locked(pc, &b->key) || !ks_pc_insert_locked(pc, b)) ks_pc_block_free(b);
        else k++;
        pthread_mutex_unlock(&pc->mu);
        off += r.bytes;
    }
    ks_free(buf);
    close(fd);
    if (n_blocks) *n_blocks = k;
    return KS_OK;
}
