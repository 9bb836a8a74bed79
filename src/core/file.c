/*
 * file.c — whole files in memory and streamed buffers (see file.h).
 *
 * Reads loop over pread until the size fstat reported, retrying on EINTR,
 * so a short read (a signal, a network file system) is not an error but a
 * file that shrinks underneath is.  A zero-byte file is valid here (mmap
 * refuses a zero length, so nothing is mapped); whether it is a valid model
 * file is the reader's call.
 */
#define _GNU_SOURCE /* pread, posix_memalign in C11 mode */
#include "core/file.h"

#include "core/platform.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void *ks_alloc_streamed(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (bytes >= huge) {
        size_t n = (bytes + huge - 1) / huge * huge;
        if (posix_memalign(&p, huge, n) != 0) return NULL;
        ks_platform_advise_huge(p, n);
        return p;
    }
    return posix_memalign(&p, 64, bytes ? bytes : 1) == 0 ? p : NULL;
}

static ks_status read_whole(int fd, const char *path, size_t size, void **out) {
    void *p = ks_alloc_streamed(size);
    if (!p) return KS_FAIL(KS_ERR_NOMEM, "cannot allocate %zu bytes to read '%s'", size, path);
    size_t done = 0;
    while (done < size) {
        ssize_t r = pread(fd, (uint8_t *)p + done, size - done, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(p);
            return KS_FAIL(KS_ERR_IO, "reading '%s' at offset %zu: %s", path, done,
                           r == 0 ? "unexpected end of file" : strerror(e));
        }
        done += (size_t)r;
    }
    *out = p;
    return KS_OK;
}

ks_status ks_file_map_open(const char *path, bool use_mmap, ks_file_map *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return KS_FAIL(KS_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    ks_status st = KS_OK;
    void *m = NULL;
    if (fstat(fd, &sb) != 0) {
        st = KS_FAIL(KS_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        st = KS_FAIL(KS_ERR_IO, "'%s' is not a regular file", path);
    } else if (sb.st_size > 0 && use_mmap) {
        m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) st = KS_FAIL(KS_ERR_IO, "cannot mmap '%s': %s", path, strerror(errno));
    } else if (sb.st_size > 0) {
        st = read_whole(fd, path, (size_t)sb.st_size, &m);
    }
    close(fd);
    if (st != KS_OK) return st;
    size_t size = (size_t)sb.st_size;
    *out = (ks_file_map){.data = m, .size = size, .mapped = use_mmap && size, .owned = !use_mmap && size};
    return KS_OK;
}

void ks_file_map_close(ks_file_map *m) {
    if (m->mapped) munmap((void *)m->data, m->size);
    if (m->owned) free((void *)m->data);
    *m = (ks_file_map){0};
}
