/* A small fork-join thread pool owned by the context.  Work functions have
 * the shape fn(arg, ith, nth) so an engine with its own pool can drive the
 * same kernels.  The caller runs as thread 0.  A pool made with
 * msa_threadpool_create_engine starts no threads and hands every run to the
 * engine's parallel_for instead.
 *
 * A decode step runs a few short stages of tens of microseconds each, so
 * waking sleeping threads through the kernel for every stage would cost as
 * much as the work: workers and the caller spin briefly on atomics before
 * they fall back to the condition variables. */
#include "core/internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Pause-spins, then yields (so that an oversubscribed machine can run the
 * thread being waited for), then sleeps. */
#define MSA_SPIN_ITERATIONS 2000
#define MSA_YIELD_ITERATIONS 200

struct msa_threadpool {
    int size;
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t start_cv;
    pthread_cond_t done_cv;
    msa_work_fn fn;
    void *arg;
    atomic_ulong generation; /* bumped for every job */
    atomic_int pending;      /* workers still running the current job */
    atomic_int quit;
    /* Set for a pool on an engine's threads (msa_threadpool_create_engine). */
    void (*parallel_for)(void *engine, int n_tasks, void (*task)(void *arg, int i), void *arg);
    void *engine;
};

typedef struct worker_arg {
    msa_threadpool *pool;
    int ith;
} worker_arg;

static inline void cpu_relax(int i)
{
    if (i >= MSA_SPIN_ITERATIONS) {
        sched_yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *p)
{
    worker_arg wa = *(worker_arg *)p;
    free(p);
    msa_threadpool *pool = wa.pool;
    unsigned long seen = 0;
    for (;;) {
        unsigned long gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        for (int i = 0; gen == seen && i < MSA_SPIN_ITERATIONS + MSA_YIELD_ITERATIONS &&
                        !atomic_load(&pool->quit);
             i++) {
            cpu_relax(i);
            gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        }
        if (gen == seen) {
            pthread_mutex_lock(&pool->lock);
            while (!atomic_load(&pool->quit) &&
                   (gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen)
                pthread_cond_wait(&pool->start_cv, &pool->lock);
            pthread_mutex_unlock(&pool->lock);
        }
        if (atomic_load(&pool->quit))
            break;
        seen = gen;
        pool->fn(pool->arg, wa.ith, pool->size);
        if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool->lock);
            pthread_cond_signal(&pool->done_cv);
            pthread_mutex_unlock(&pool->lock);
        }
    }
    return NULL;
}

/* A pool of `num_threads` slots with its locks and counters, no threads. */
static msa_threadpool *pool_new(int num_threads)
{
    msa_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return NULL;
    pool->size = num_threads < 1 ? 1 : num_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->start_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->quit, 0);
    return pool;
}

msa_status msa_threadpool_create(int num_threads, msa_threadpool **out)
{
    *out = NULL;
    msa_threadpool *pool = pool_new(num_threads);
    if (!pool)
        return MSA_ERR_OUT_OF_MEMORY;
    if (pool->size > 1) {
        pool->threads = calloc((size_t)pool->size, sizeof *pool->threads);
        if (!pool->threads) {
            msa_threadpool_free(pool);
            return MSA_ERR_OUT_OF_MEMORY;
        }
    }
    for (int i = 1; i < pool->size; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->pool = pool;
            wa->ith = i;
        }
        if (!wa || pthread_create(&pool->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            pool->size = i; /* only threads 1..i-1 exist */
            msa_threadpool_free(pool);
            return MSA_ERR_OUT_OF_MEMORY;
        }
    }
    *out = pool;
    return MSA_OK;
}

msa_status msa_threadpool_create_engine(int num_threads,
                                        void (*parallel_for)(void *engine, int n_tasks,
                                                             void (*task)(void *arg, int i),
                                                             void *arg),
                                        void *engine, msa_threadpool **out)
{
    *out = NULL;
    msa_threadpool *pool = pool_new(num_threads);
    if (!pool)
        return MSA_ERR_OUT_OF_MEMORY;
    pool->parallel_for = parallel_for;
    pool->engine = engine;
    *out = pool;
    return MSA_OK;
}

/* One run on an engine's threads: task i is the work function's share i. */
typedef struct engine_run {
    msa_work_fn fn;
    void *arg;
    int n;
} engine_run;

static void engine_task(void *p, int i)
{
    const engine_run *run = p;
    if (i >= 0 && i < run->n) /* an index out of range would share a slot */
        run->fn(run->arg, i, run->n);
}

void msa_threadpool_free(msa_threadpool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->quit, 1);
    pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->size && pool->threads; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->start_cv);
    pthread_cond_destroy(&pool->done_cv);
    free(pool->threads);
    free(pool);
}

void msa_threadpool_run(msa_threadpool *pool, msa_work_fn fn, void *arg)
{
    if (pool->parallel_for) {
        /* Every share runs on the engine's threads, one task each; the
         * work functions divide their work by (ith, nth) or take items
         * from an atomic counter, so any order and any overlap of the
         * tasks computes the same result. */
        engine_run run = {fn, arg, pool->size};
        pool->parallel_for(pool->engine, pool->size, engine_task, &run);
        return;
    }
    if (pool->size == 1) {
        fn(arg, 0, 1);
        return;
    }
    /* Workers read fn/arg after they see the new generation (acquire). */
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->pending, pool->size - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool->lock);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->lock);
    fn(arg, 0, pool->size);
    for (int i = 0; i < MSA_SPIN_ITERATIONS + MSA_YIELD_ITERATIONS &&
                    atomic_load_explicit(&pool->pending, memory_order_acquire) > 0;
         i++)
        cpu_relax(i);
    if (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&pool->lock);
        while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0)
            pthread_cond_wait(&pool->done_cv, &pool->lock);
        pthread_mutex_unlock(&pool->lock);
    }
}

int msa_threadpool_size(const msa_threadpool *pool)
{
    return pool ? pool->size : 1;
}
