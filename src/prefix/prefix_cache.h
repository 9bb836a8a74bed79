/*
 * prefix_cache.h — the seams between the prefix cache's files, for those
 * files only (tests and the fuzz target use prefix.h, callers infer.h).
 *
 * The cache is one object (struct ks_prefix_cache, below) served by five
 * files, each with one job (the last in infer/, beside the context):
 *   prefix_record.c   the block and state records (hashing, serialise,
 *                     parse): the untrusted-bytes side, fuzzed
 *   prefix_table.c    the RAM tier's table of blocks, its LRU, pinned
 *                     store pages
 *   prefix_cache.c    create / destroy; acquire, release, trim
 *   prefix_files.c    the directory tier (write-behind block files, their
 *                     LRU) and reading a one-file prompt cache
 *   prefix_context.c  the context's side: restore into a sequence, capture
 *                     after a prefill, save a prompt's blocks to one file
 * Every function named *_locked is called with the cache's mutex held.
 */
#ifndef KS_PREFIX_PREFIX_CACHE_H
#define KS_PREFIX_PREFIX_CACHE_H

#include "kv/kv.h"
#include "prefix/prefix.h"

#include <pthread.h>

/* A policy's per-token state of a block (spec's retrieval keys), for one
 * policy configuration. */
typedef struct pc_state {
    uint64_t pol;          /* hash of the policy configuration */
    size_t bytes;
    uint8_t *data;
    struct pc_state *next;
} pc_state;

typedef struct pc_block {
    ks_pc_key key, parent;
    ks_pc_format fmt;
    int32_t *tok;          /* [page] */
    uint8_t *kv;           /* [n_layer][n_head_kv][page_bytes] */
    uint8_t *raw;          /* the record kv points into (a prompt-cache file's, read in place), or NULL: kv is its own */
    size_t kv_bytes, bytes; /* payload; everything counted against the RAM cap */
    pc_state *st;
    int32_t *pins;         /* [n_layer][n_head_kv] page ids pinned in the cache's pin store, or NULL (then kv) */
    bool dead;             /* pinned and unreferenced: its pages wait for ks_pc_reap_locked */
    struct pc_block *pnext; /* the cache's list of pinned blocks */
    uint64_t stamp;        /* LRU */
    int refs;              /* the table's (while listed), restores in progress, the writer's */
    bool listed;
    bool queued;           /* waiting for the writer */
    bool st_queued;        /* a state of it waits for the writer */
    bool in_file;          /* its record is in the one-file prompt cache this cache reads and appends
                            * (read back and checked, or appended): ks_prefix_cache_append_file */
    struct pc_block *hnext;
} pc_block;

typedef struct disk_ent {
    ks_pc_key key;
    uint64_t pol;          /* 0: the block's file; else the state file of that policy configuration */
    uint64_t bytes, stamp;
    bool bad;              /* failed validation here: the next write of it replaces the file (heals it) */
} disk_ent;

/* A write for the writer: a block's file (st NULL) or one of its states'. */
typedef struct pc_job {
    struct pc_block *b;
    struct pc_state *st;
    uint8_t *payload;      /* a pinned block's bytes, owned by the job (else b->kv is written) */
} pc_job;

enum { N_BUCKETS = 4096 };

struct ks_prefix_cache {
    ks_pc_key model;
    ks_prefix_cache_params p;
    uint64_t limit;         /* the RAM cap now: p.ram_bytes, or less while a memory cap needs the room */
    char *dir;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* writer: work or quit */
    pthread_cond_t done_cv; /* flush: queue drained */
    pc_block *buckets[N_BUCKETS];
    uint64_t clock;
    pc_job *q;              /* write queue */
    int32_t qn, qcap;
    bool writing, quit, has_writer;
    pthread_t writer;
    disk_ent *disk;
    int32_t n_disk, disk_cap;
    ks_kv_store *pin_kv;    /* the store the pinned blocks' pages live in, or NULL */
    pc_block *pinned;       /* blocks with pins (live and dead) */
    ks_prefix_cache_stats st;
};


/* ------------------------------------------------------- prefix_table.c -- */
/* The listed block of key, or NULL. */
pc_block *ks_pc_find_locked(ks_prefix_cache *pc, const ks_pc_key *k);
/* Free a block that nobody references (its states, tokens and bytes). */
void ks_pc_block_free(pc_block *b);
void ks_pc_unref_locked(pc_block *b);
/* List a new block (refs: the table's); false when it cannot fit the cap. */
bool ks_pc_insert_locked(ks_prefix_cache *pc, pc_block *b);
/* Let go of the pages of dead pinned blocks (the caller drives pc->pin_kv's context). */
void ks_pc_reap_locked(ks_prefix_cache *pc);
/* The pin store's release hook (ks_kv_set_pin_holder). */
void ks_pc_pins_released(void *arg, ks_kv_store *kv);
/* A block's state for policy configuration pol in RAM, or NULL. */
pc_state *ks_pc_state_of(pc_block *b, uint64_t pol);
/* Take a listed block off the table (dropping the table's reference). */
void ks_pc_unlist_locked(ks_prefix_cache *pc, pc_block *b);
/* Evict LRU blocks until `need` more bytes fit under cap. */
void ks_pc_make_room_locked(ks_prefix_cache *pc, uint64_t cap, uint64_t need);

/* ------------------------------------------------------- prefix_cache.c -- */
/* The block of key (RAM, else the directory), referenced for the caller;
 * NULL when absent.  ks_pc_release drops the reference. */
pc_block *ks_pc_acquire(ks_prefix_cache *pc, const ks_kv_store *kv, const ks_pc_key *key, const ks_pc_key *parent,
                        const int32_t *tokens, const ks_pc_format *fmt);
void ks_pc_release(ks_prefix_cache *pc, pc_block *b);

/* ------------------------------------------------------- prefix_files.c -- */
/* Files already in the directory join its LRU. */
void ks_pc_scan_dir(ks_prefix_cache *pc);
/* The write-behind thread (pthread_create's start routine). */
void *ks_pc_writer_main(void *arg);
/* The block of key from the directory, verified; NULL if none. */
pc_block *ks_pc_load_block(ks_prefix_cache *pc, const ks_pc_key *key, const ks_pc_key *parent, const int32_t *tokens,
                           const ks_pc_format *fmt);
/* Queue a listed block (s NULL) or one of its states for the directory. */
void ks_pc_enqueue_locked(ks_prefix_cache *pc, pc_block *b, pc_state *s, uint8_t *payload);
/* A block's state for pol: in RAM, else from its file; NULL when none. */
pc_state *ks_pc_state_get(ks_prefix_cache *pc, pc_block *b, uint64_t pol, size_t want);
/* write(2) all n bytes. */
ks_status ks_pc_write_all(int fd, const void *p, size_t n);

#endif
