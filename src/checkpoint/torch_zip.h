/*
 * torch_zip.h — the zip container of a torch.save file (checkpoint/torch_zip.c),
 * for the restricted unpickler in torch_bin.c: a sorted directory of stored
 * entries, each a view into the caller's buffer.
 */
#ifndef KS_CHECKPOINT_TORCH_ZIP_H
#define KS_CHECKPOINT_TORCH_ZIP_H

#include "core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Little-endian fields (zip and pickle alike). */
static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static inline uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* A bounded, printable copy of untrusted bytes for messages. */
static inline const char *printable(const char *s, size_t n, char *buf, size_t cap) {
    size_t i = 0;
    for (; i < n && i + 1 < cap; i++) buf[i] = (s[i] >= 32 && s[i] < 127) ? s[i] : '?';
    buf[i] = 0;
    return buf;
}

typedef struct {
    const char *name;      /* into the buffer, not NUL-terminated */
    uint32_t name_len;
    const uint8_t *data;   /* stored bytes */
    uint64_t size;
} zip_entry;

typedef struct {
    zip_entry *e;
    int64_t n;
} zip_dir;


/* Read the central directory of the zip in buf[size] into z (z->e owned by
 * the caller, freed with ks_free even on failure): stored entries only,
 * every extent checked to lie inside the buffer, names sorted and unique.
 * KS_ERR_FORMAT / KS_ERR_UNSUPPORTED with a message otherwise. */
ks_status ks_zip_read(const uint8_t *buf, size_t size, zip_dir *z);
/* The entry named name[len], or NULL. */
const zip_entry *ks_zip_find(const zip_dir *z, const char *name, size_t len);

#endif
