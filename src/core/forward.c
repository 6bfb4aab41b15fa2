/* msa_forward: validation of one layer call, then the backend. */
#include "core/internal.h"

#include <string.h>

void msa_layer_io_default(msa_layer_io *io)
{
    if (!io)
        return;
    memset(io, 0, sizeof *io);
    io->act_dtype = MSA_DTYPE_BF16;
    io->write_cache = 1;
}

/* Rejects a tensor whose address is not a multiple of `align` bytes (the
 * size of its elements: the kernels read and write them as whole elements,
 * and the CUDA kernels take their wider accesses only where a tensor is
 * aligned for them).  NULL passes: the caller checks presence. */
static msa_status check_aligned(msa_context *ctx, int32_t layer, const void *p, const char *name,
                                size_t align, const char *elem)
{
    if (p && (uintptr_t)p % align != 0)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "layer %d: %s at %p is not aligned to %zu bytes (%s elements need it)",
                             layer, name, p, align, elem);
    return MSA_OK;
}

/* Every tensor the call reads or writes, aligned to its element size. */
static msa_status validate_alignment(msa_context *ctx, const msa_plan *plan, int32_t layer,
                                     const msa_layer_io *io)
{
    const msa_model *m = plan->model;
    const int sparse = m->layer_sparse[layer];
    const int ivalue = m->layer_index_value[layer];
    const size_t es = msa_dtype_size(io->act_dtype);
    const char *act = msa_dtype_name(io->act_dtype);
    const struct {
        const void *p;
        const char *name;
        int used;
    } act_tensors[] = {
        {io->q, "q", 1},
        {io->o, "o", 1},
        {io->idx_q, "idx_q", sparse},
        {io->idx_o, "idx_o", ivalue},
        {io->k, "k", io->write_cache},
        {io->v, "v", io->write_cache},
        {io->idx_k, "idx_k", io->write_cache && sparse},
        {io->idx_v, "idx_v", io->write_cache && ivalue},
    };
    msa_status st;
    for (size_t i = 0; i < sizeof act_tensors / sizeof act_tensors[0]; i++)
        if (act_tensors[i].used && (st = check_aligned(ctx, layer, act_tensors[i].p,
                                                       act_tensors[i].name, es, act)) != MSA_OK)
            return st;
    if ((st = check_aligned(ctx, layer, io->lse, "lse", sizeof(float), "fp32")) != MSA_OK)
        return st;
    if (sparse &&
        (st = check_aligned(ctx, layer, io->topk, "topk", sizeof(int32_t), "int32")) != MSA_OK)
        return st;
    return MSA_OK;
}

static msa_status validate_io(msa_context *ctx, const msa_plan *plan, int32_t layer,
                              const msa_layer_io *io)
{
    const msa_model *m = plan->model;
    if (io->act_dtype != MSA_DTYPE_FP32 && io->act_dtype != MSA_DTYPE_BF16 &&
        io->act_dtype != MSA_DTYPE_FP16)
        return msa_set_error(ctx, MSA_ERR_UNSUPPORTED,
                             "activation dtype %s is not supported (fp32, bf16, fp16)",
                             msa_dtype_name(io->act_dtype));
    if (io->act_dtype != plan->params.act_dtype)
        return msa_set_error(
            ctx, MSA_ERR_INVALID_ARGUMENT,
            "activation dtype %s differs from the plan's %s (msa_plan_params.act_dtype)",
            msa_dtype_name(io->act_dtype), msa_dtype_name(plan->params.act_dtype));
    if (io->write_cache != 0 && io->write_cache != 1)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "write_cache must be 0 or 1");
    if (plan->num_tokens == 0)
        return MSA_OK; /* nothing is read or written */
    const int sparse = m->layer_sparse[layer];
    const int ivalue = m->layer_index_value[layer];
#define NEED(ptr, what) \
    if (!(ptr))         \
    return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "layer %d: %s is NULL", layer, what)
    NEED(io->q, "q");
    NEED(io->o, "o");
    if (sparse) {
        NEED(io->idx_q, "idx_q");
    }
    if (ivalue) {
        NEED(io->idx_o, "idx_o (the layer keeps an index value)");
    }
    if (io->write_cache && plan->active_tokens > 0) {
        NEED(io->k, "k");
        NEED(io->v, "v");
        if (sparse) {
            NEED(io->idx_k, "idx_k");
        }
        if (ivalue) {
            NEED(io->idx_v, "idx_v");
        }
    }
#undef NEED
    msa_status st = validate_alignment(ctx, plan, layer, io);
    if (st != MSA_OK)
        return st;
    for (int pl = 0; pl < 4; pl++)
        if (msa_layer_has_plane(m, layer, (msa_plane)pl) && !plan->cache->planes[layer * 4 + pl])
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "layer %d: cache plane %d missing",
                                 layer, pl);
    return MSA_OK;
}

static msa_status validate_call(msa_context *ctx, const msa_plan *plan, int32_t layer)
{
    if (!plan)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "plan is NULL");
    if (plan->ctx != ctx)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "the plan belongs to another context");
    /* A fresh plan has capacities but no step: running it would compute
     * nothing and leave the outputs unwritten, which a caller would take
     * for results. */
    if (!plan->has_step)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "the plan holds no step yet: call msa_plan_update first");
    if (layer < 0 || layer >= plan->model->cfg.num_layers)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_RANGE, "layer %d out of range 0..%d", layer,
                             plan->model->cfg.num_layers - 1);
    return MSA_OK;
}

msa_status msa_forward(msa_context *ctx, msa_plan *plan, int32_t layer, const msa_layer_io *io)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    msa_status st = validate_call(ctx, plan, layer);
    if (st != MSA_OK)
        return st;
    if (!io)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "io is NULL");
    if ((st = validate_io(ctx, plan, layer, io)) != MSA_OK)
        return st;
    msa_clear_error(ctx);
    if (plan->num_tokens == 0)
        return MSA_OK;
    return ctx->ops->forward(ctx, plan, layer, io);
}

msa_status msa_bench_forward(msa_context *ctx, msa_plan *plan, int32_t layer,
                             const msa_layer_io *io_sets, int num_sets, int warmup, int reps,
                             double *times_us)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    msa_status st = validate_call(ctx, plan, layer);
    if (st != MSA_OK)
        return st;
    if (!io_sets || num_sets < 1 || warmup < 0 || reps < 1 || !times_us)
        return msa_set_error(
            ctx, MSA_ERR_INVALID_ARGUMENT,
            "msa_bench_forward: need io_sets, num_sets >= 1, warmup >= 0, reps >= 1, times_us");
    for (int i = 0; i < num_sets; i++)
        if ((st = validate_io(ctx, plan, layer, &io_sets[i])) != MSA_OK)
            return st;
    msa_clear_error(ctx);
    return ctx->ops->bench_forward(ctx, plan, layer, io_sets, num_sets, warmup, reps, times_us);
}

const char *msa_stage_name(msa_stage stage)
{
    static const char *const names[MSA_STAGE_COUNT] = {"cache_write", "indexer",
                                                       "selection",   "prefill_indexer",
                                                       "attention",   "index_value"};
    return (int)stage >= 0 && stage < MSA_STAGE_COUNT ? names[stage] : "?";
}

msa_status msa_bench_stages(msa_context *ctx, msa_plan *plan, int32_t layer,
                            const msa_layer_io *io_sets, int num_sets, int reps, double *stage_us)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    msa_status st = validate_call(ctx, plan, layer);
    if (st != MSA_OK)
        return st;
    if (!io_sets || num_sets < 1 || reps < 1 || !stage_us)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "msa_bench_stages: need io_sets, num_sets >= 1, reps >= 1, stage_us");
    for (int i = 0; i < num_sets; i++)
        if ((st = validate_io(ctx, plan, layer, &io_sets[i])) != MSA_OK)
            return st;
    if (!ctx->ops->bench_stages)
        return msa_set_error(ctx, MSA_ERR_UNSUPPORTED,
                             "msa_bench_stages: the %s backend does not time stages",
                             ctx->ops->name);
    msa_clear_error(ctx);
    if (plan->num_tokens == 0) { /* msa_forward runs nothing */
        for (int k = 0; k < MSA_STAGE_COUNT; k++)
            stage_us[k] = 0;
        return MSA_OK;
    }
    return ctx->ops->bench_stages(ctx, plan, layer, io_sets, num_sets, reps, stage_us);
}
