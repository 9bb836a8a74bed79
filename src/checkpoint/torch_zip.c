/*
 * torch_zip.c — the zip container of a torch.save file: where each entry's
 * stored bytes are, checked, for the unpickler (torch_bin.c) to find
 * data.pkl and each storage in.
 *
 * Why a reader of our own rather than libzip: torch writes its archives
 * uncompressed ("stored"), so a storage is a contiguous byte range of the
 * file and a tensor can be a view into the mapping, as a safetensors tensor
 * is.  That needs each entry's data offset, which libzip does not expose
 * (it hands out copies through zip_fread); and the subset used here — the
 * end-of-central-directory record (zip64 too: torch's writer emits it), the
 * central directory and the local headers, method 0 only — is small enough
 * to check field by field.  CRCs are not verified: a flipped bit in a
 * weight is not a memory-safety question, and reading every byte at open
 * would cost what the mapping avoids.
 *
 * Order of distrust: every offset from the file (the central directory's
 * place and size, each entry's local header, name and data extent) is
 * bounds-checked against the buffer before it is read, with 64-bit
 * arithmetic that cannot wrap (all quantities are below 2^63).  Entry names
 * are sorted once, which finds duplicates and makes each storage lookup a
 * binary search.
 */
#include "checkpoint/torch_zip.h"

#include <stdlib.h>
#include <string.h>

static int entry_cmp(const void *a, const void *b) {
    const zip_entry *x = a, *y = b;
    uint32_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    if (c) return c;
    return (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

const zip_entry *ks_zip_find(const zip_dir *z, const char *name, size_t len) {
    zip_entry key = {.name = name, .name_len = (uint32_t)len};
    return bsearch(&key, z->e, (size_t)z->n, sizeof *z->e, entry_cmp);
}

enum { EOCD_SIZE = 22, EOCD64_LOC_SIZE = 20, EOCD64_SIZE = 56, CDH_SIZE = 46, LFH_SIZE = 30 };

/* The zip64 extra field (id 1) of a central directory entry: the 64-bit
 * values of the fields whose 32-bit slot is saturated, in this order. */
static ks_status zip64_extra(const uint8_t *x, size_t n, uint64_t *usize, uint64_t *csize, uint64_t *lho, bool need_u,
                             bool need_c, bool need_o) {
    while (n >= 4) {
        uint16_t id = rd16(x), len = rd16(x + 2);
        if ((size_t)len > n - 4) return KS_FAIL(KS_ERR_FORMAT, "zip: an extra field runs past its entry");
        if (id == 1) {
            size_t at = 0;
            uint64_t *want[3] = {need_u ? usize : NULL, need_c ? csize : NULL, need_o ? lho : NULL};
            for (int i = 0; i < 3; i++) {
                if (!want[i]) continue;
                if (at + 8 > len) return KS_FAIL(KS_ERR_FORMAT, "zip: a zip64 extra field is too short");
                *want[i] = rd64(x + 4 + at);
                at += 8;
            }
            return KS_OK;
        }
        x += 4 + len;
        n -= 4 + (size_t)len;
    }
    if (need_u || need_c || need_o) return KS_FAIL(KS_ERR_FORMAT, "zip: an entry's size or offset needs a zip64 extra field it lacks");
    return KS_OK;
}

ks_status ks_zip_read(const uint8_t *buf, size_t size, zip_dir *z) {
    memset(z, 0, sizeof *z);
    if (size >= 2 && buf[0] == 0x80 && buf[1] <= 5)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "a bare pickle (torch.save before PyTorch 1.6, or pickle.dump): only the zip "
                                           "format of PyTorch >= 1.6 is read; re-save it with a current torch.save or as safetensors");
    if (size < EOCD_SIZE || rd32(buf) != 0x04034b50)
        return KS_FAIL(KS_ERR_FORMAT, "not a zip archive (torch.save of PyTorch >= 1.6 writes one)");
    /* the end-of-central-directory record: within the last 22 + 65535 bytes */
    size_t lo = size > EOCD_SIZE + 65535 ? size - EOCD_SIZE - 65535 : 0;
    size_t eocd = SIZE_MAX;
    for (size_t p = size - EOCD_SIZE + 1; p-- > lo;)
        if (rd32(buf + p) == 0x06054b50 && p + EOCD_SIZE + rd16(buf + p + 20) <= size) {
            eocd = p;
            break;
        }
    if (eocd == SIZE_MAX)
        return KS_FAIL(KS_ERR_FORMAT, "zip: no end-of-central-directory record (truncated file?)");
    const uint8_t *e = buf + eocd;
    if (rd16(e + 4) != 0 || rd16(e + 6) != 0)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "zip: multi-disk archives are not supported");
    uint64_t n_entries = rd16(e + 10), cd_size = rd32(e + 12), cd_off = rd32(e + 16);
    if (n_entries == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) {
        if (eocd < EOCD64_LOC_SIZE || rd32(buf + eocd - EOCD64_LOC_SIZE) != 0x07064b50)
            return KS_FAIL(KS_ERR_FORMAT, "zip: saturated end-of-central-directory fields but no zip64 locator");
        uint64_t r = rd64(buf + eocd - EOCD64_LOC_SIZE + 8);
        if (r > size || size - r < EOCD64_SIZE || rd32(buf + r) != 0x06064b50)
            return KS_FAIL(KS_ERR_FORMAT, "zip: the zip64 end-of-central-directory record is missing or out of the file");
        n_entries = rd64(buf + r + 32);
        cd_size = rd64(buf + r + 40);
        cd_off = rd64(buf + r + 48);
    }
    if (cd_off > size || cd_size > size - cd_off)
        return KS_FAIL(KS_ERR_FORMAT, "zip: the central directory [%llu, +%llu) lies outside the %zu-byte file (truncated?)",
                       (unsigned long long)cd_off, (unsigned long long)cd_size, size);
    if (n_entries > cd_size / CDH_SIZE)
        return KS_FAIL(KS_ERR_FORMAT, "zip: %llu entries cannot fit a %llu-byte central directory", (unsigned long long)n_entries,
                       (unsigned long long)cd_size);
    z->e = ks_calloc((size_t)n_entries + 1, sizeof *z->e);
    if (!z->e) return KS_FAIL(KS_ERR_NOMEM, "zip: %llu entries", (unsigned long long)n_entries);
    const uint8_t *p = buf + cd_off, *end = buf + cd_off + cd_size;
    for (uint64_t i = 0; i < n_entries; i++) {
        if ((size_t)(end - p) < CDH_SIZE || rd32(p) != 0x02014b50)
            return KS_FAIL(KS_ERR_FORMAT, "zip: central directory entry %llu is malformed", (unsigned long long)i);
        uint16_t flags = rd16(p + 8), method = rd16(p + 10);
        uint64_t csize = rd32(p + 20), usize = rd32(p + 24), lho = rd32(p + 42);
        size_t nl = rd16(p + 28), xl = rd16(p + 30), cl = rd16(p + 32);
        if ((size_t)(end - p) - CDH_SIZE < nl + xl + cl)
            return KS_FAIL(KS_ERR_FORMAT, "zip: central directory entry %llu runs past the directory", (unsigned long long)i);
        const char *name = (const char *)p + CDH_SIZE;
        char nb[96];
        printable(name, nl, nb, sizeof nb);
        KS_TRY(zip64_extra(p + CDH_SIZE + nl, xl, &usize, &csize, &lho, usize == 0xFFFFFFFFu, csize == 0xFFFFFFFFu,
                           lho == 0xFFFFFFFFu));
        if (flags & 1) return KS_FAIL(KS_ERR_UNSUPPORTED, "zip: entry '%s' is encrypted", nb);
        if (method != 0)
            return KS_FAIL(KS_ERR_UNSUPPORTED, "zip: entry '%s' is compressed (method %u); torch.save stores entries uncompressed",
                           nb, method);
        if (csize != usize) return KS_FAIL(KS_ERR_FORMAT, "zip: stored entry '%s' has differing sizes", nb);
        if (lho > cd_off || cd_off - lho < LFH_SIZE || rd32(buf + lho) != 0x04034b50)
            return KS_FAIL(KS_ERR_FORMAT, "zip: entry '%s' has no local header where the directory says", nb);
        uint64_t data = lho + LFH_SIZE + rd16(buf + lho + 26) + rd16(buf + lho + 28);
        if (data > cd_off || usize > cd_off - data)
            return KS_FAIL(KS_ERR_FORMAT, "zip: entry '%s' ([%llu, +%llu)) runs past the entries' area (truncated file?)", nb,
                           (unsigned long long)data, (unsigned long long)usize);
        z->e[z->n++] = (zip_entry){.name = name, .name_len = (uint32_t)nl, .data = buf + data, .size = usize};
        p += CDH_SIZE + nl + xl + cl;
    }
    if (z->n > 1) qsort(z->e, (size_t)z->n, sizeof *z->e, entry_cmp);
    for (int64_t i = 1; i < z->n; i++)
        if (!entry_cmp(&z->e[i - 1], &z->e[i])) {
            char nb[96];
            return KS_FAIL(KS_ERR_FORMAT, "zip: entry '%s' appears twice", printable(z->e[i].name, z->e[i].name_len, nb, sizeof nb));
        }
    return KS_OK;
}
