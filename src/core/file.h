/*
 * file.h — whole files in memory, for the readers of model files (GGUF,
 * safetensors), and buffers for data that is streamed end to end.
 *
 * A model file is either mapped (the default: pages come from the page
 * cache on demand, nothing is copied) or read whole into memory the reader
 * owns (--no-mmap), which is then 2 MiB aligned and advised for huge pages:
 * decode streams every weight byte each step, and a page-cache mapping costs
 * a TLB miss per 4 KiB of it.  The same holds for the KV store's pools, so
 * they share the allocator.
 */
#ifndef KS_CORE_FILE_H
#define KS_CORE_FILE_H

#include "core/core.h"

#include <stdbool.h>

/* A whole file's bytes.  Neither flag: borrowed from the caller. */
typedef struct ks_file_map {
    const uint8_t *data; /* [size]; NULL when size is 0 */
    size_t size;
    bool mapped;         /* an mmap, unmapped on close */
    bool owned;          /* a ks_alloc_streamed copy, freed on close */
} ks_file_map;

/* Open a regular file and map it (use_mmap) or read it whole.  KS_ERR_IO
 * names the file on failure; *out is untouched then. */
ks_status ks_file_map_open(const char *path, bool use_mmap, ks_file_map *out);
/* Unmap or free what the map holds (nothing when borrowed); then empty. */
void ks_file_map_close(ks_file_map *m);

/* Caller-sized memory for data streamed end to end: 64-byte aligned, and
 * from 2 MiB on 2 MiB aligned and advised for huge pages.  NULL when the
 * allocator refuses (callers report KS_ERR_NOMEM).  Release with free(). */
void *ks_alloc_streamed(size_t bytes);

#endif
