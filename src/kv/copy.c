/*
 * copy.c — copy engine workers (see copy.h).
 *
 * A mutex-protected ring of jobs and a condition variable; transfers are a
 * few KiB to a few hundred KiB, so the queue is never the bottleneck and a
 * simple lock is the right tool.  Completion is an atomic counter per event
 * that the waiter spins on briefly and then sleeps on the engine's done
 * condition — a layer usually waits microseconds, if at all.
 */
#define _GNU_SOURCE
#include "kv/copy.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

struct ks_copy_engine {
    pthread_t *threads;
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t has_job, done;
    ks_copy_job *ring;     /* [cap] */
    size_t cap, head, count;
    bool stop;
    _Atomic uint64_t busy_ns;
};

/* Read n bytes at (src + off) or (fd, offset + off) into dst. */
static bool copy_piece(const ks_copy_job *j, uint8_t *dst, size_t n, size_t off, char *msg, size_t cap) {
    if (j->src) {
        memcpy(dst, j->src + off, n);
        return true;
    }
    for (size_t done = 0; done < n;) {
        ssize_t r = pread(j->fd, dst + done, n - done, j->offset + (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(msg, cap, "%s:%d: slow-tier read of %zu bytes at offset %lld failed: %s", __FILE__, __LINE__, n,
                     (long long)j->offset, r == 0 ? "unexpected end of file" : strerror(errno));
            return false;
        }
        done += (size_t)r;
    }
    return true;
}

void ks_copy_run(const ks_copy_job *j) {
    bool ok = true;
    char msg[256] = "";
    if (j->fail) {
        ok = false;
        snprintf(msg, sizeof msg, "%s:%d: slow-tier read of %zu bytes failed (injected)", __FILE__, __LINE__, j->bytes);
    } else if (j->src2_off && j->dst2) {
        /* rows of a page: K and V halves apart in the source too */
        size_t h = j->bytes / 2;
        ok = copy_piece(j, j->dst, h, 0, msg, sizeof msg) && copy_piece(j, j->dst2, j->bytes - h, j->src2_off, msg, sizeof msg);
    } else if (j->src) {
        if (j->dst2) {
            memcpy(j->dst, j->src, j->bytes / 2);
            memcpy(j->dst2, j->src + j->bytes / 2, j->bytes - j->bytes / 2);
        } else {
            memcpy(j->dst, j->src, j->bytes);
        }
    } else {
        size_t done = 0, h = j->dst2 ? j->bytes / 2 : j->bytes;
        while (done < j->bytes) {
            /* one read, two destinations: the iovec of what is still missing */
            struct iovec iov[2];
            int n_iov = 0;
            if (done < h) iov[n_iov++] = (struct iovec){j->dst + done, h - done};
            if (j->dst2) {
                size_t d2 = done > h ? done - h : 0;
                iov[n_iov++] = (struct iovec){j->dst2 + d2, j->bytes - h - d2};
            }
            ssize_t r = preadv(j->fd, iov, n_iov, j->offset + (off_t)done);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                ok = false;
                snprintf(msg, sizeof msg, "%s:%d: slow-tier read of %zu bytes at offset %lld failed: %s", __FILE__,
                         __LINE__, j->bytes, (long long)j->offset, r == 0 ? "unexpected end of file" : strerror(errno));
                break;
            }
            done += (size_t)r;
        }
    }
    if (!ok && j->ev) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&j->ev->failed, &expected, 1)) memcpy(j->ev->msg, msg, sizeof msg);
    }
}

static void *worker(void *arg) {
    ks_copy_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->count && !e->stop) pthread_cond_wait(&e->has_job, &e->mu);
        if (!e->count && e->stop) {
            pthread_mutex_unlock(&e->mu);
            return NULL;
        }
        ks_copy_job j = e->ring[e->head];
        e->head = (e->head + 1) % e->cap;
        e->count--;
        pthread_mutex_unlock(&e->mu);
        double t0 = ks_time_sec();
        ks_copy_run(&j);
        atomic_fetch_add(&e->busy_ns, (uint64_t)((ks_time_sec() - t0) * 1e9));
        if (atomic_fetch_sub(&j.ev->pending, 1) == 1) {
            pthread_mutex_lock(&e->mu);
            pthread_cond_broadcast(&e->done);
            pthread_mutex_unlock(&e->mu);
        }
    }
}

ks_status ks_copy_engine_create(int n_threads, ks_copy_engine **out) {
    if (n_threads < 1) n_threads = 1;
    ks_copy_engine *e = ks_calloc(1, sizeof *e);
    if (!e) return KS_FAIL(KS_ERR_NOMEM, "copy engine");
    e->cap = 1024;
    e->ring = ks_malloc(sizeof(ks_copy_job) * e->cap);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->has_job, NULL);
    pthread_cond_init(&e->done, NULL);
    e->threads = ks_calloc((size_t)n_threads, sizeof(pthread_t));
    if (!e->ring || !e->threads) {
        ks_copy_engine_destroy(e); /* no thread started: n_threads is 0 */
        return KS_FAIL(KS_ERR_NOMEM, "copy engine of %d threads", n_threads);
    }
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&e->threads[i], NULL, worker, e) != 0) {
            e->n_threads = i;
            ks_copy_engine_destroy(e);
            return KS_FAIL(KS_ERR_NOMEM, "cannot start copy worker thread %d", i);
        }
        e->n_threads = i + 1;
    }
    *out = e;
    return KS_OK;
}

void ks_copy_engine_destroy(ks_copy_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_broadcast(&e->has_job);
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < e->n_threads; i++) pthread_join(e->threads[i], NULL);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->has_job);
    pthread_cond_destroy(&e->done);
    ks_free(e->threads);
    ks_free(e->ring);
    ks_free(e);
}

void ks_copy_submit(ks_copy_engine *e, const ks_copy_job *job) {
    KS_ASSERT(job->ev);
    atomic_fetch_add(&job->ev->pending, 1);
    pthread_mutex_lock(&e->mu);
    if (e->count == e->cap) { /* grow, unrolling the ring */
        ks_copy_job *r = ks_malloc(sizeof(ks_copy_job) * e->cap * 2);
        if (!r) { /* the ring cannot grow: the caller does the copy itself */
            pthread_mutex_unlock(&e->mu);
            ks_copy_run(job);
            if (atomic_fetch_sub(&job->ev->pending, 1) == 1) {
                pthread_mutex_lock(&e->mu);
                pthread_cond_broadcast(&e->done);
                pthread_mutex_unlock(&e->mu);
            }
            return;
        }
        for (size_t i = 0; i < e->count; i++) r[i] = e->ring[(e->head + i) % e->cap];
        ks_free(e->ring);
        e->ring = r;
        e->head = 0;
        e->cap *= 2;
    }
    e->ring[(e->head + e->count) % e->cap] = *job;
    e->count++;
    pthread_cond_signal(&e->has_job);
    pthread_mutex_unlock(&e->mu);
}

ks_status ks_copy_wait(ks_copy_event *ev, double *waited) {
    double t0 = ks_time_sec();
    for (int spin = 0; atomic_load(&ev->pending) > 0; spin++) {
        if (spin > 2000) usleep(20);
    }
    if (waited) *waited += ks_time_sec() - t0;
    if (atomic_load(&ev->failed)) {
        atomic_store(&ev->failed, 0);
        return KS_FAIL(KS_ERR_IO, "%s", ev->msg);
    }
    return KS_OK;
}

double ks_copy_take_busy(ks_copy_engine *e) { return (double)atomic_exchange(&e->busy_ns, 0) * 1e-9; }
