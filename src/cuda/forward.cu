/*
 * One layer on the CUDA backend: kernel choice, argument packing and the
 * launch sequence.  Only enqueues work on the caller's stream: no
 * allocation, no synchronisation, no read of device data, and every grid is
 * fixed by the device and the plan's capacities, so the sequence can be
 * captured into a CUDA graph and replayed after any plan update.
 *
 *   prologue      cache write of the step's rows; padding outputs
 *   sparse layer  indexer (decode) -> selection (decode + prefill, with the
 *                 per-request unions) -> split attention over the unions ->
 *                 merge + prefill rows [-> index-value attention: dense MQA
 *                 over the index planes, split, merge + prefill rows]
 *   dense layer   split attention over all keys -> merge + prefill rows
 *
 * Where the tensor-core prefill kernel serves a pass (cu_paths.pf_fast,
 * pf_iv_fast), its prefill rows run in that kernel, launched right after
 * the pass's merge, and the merge kernel skips them.
 */
#include "cuda/backend.cuh"
#include "cuda/params.cuh"
#include "cuda/arch/tma_sm90.cuh"
#include "cuda/common/timeline.cuh"
#include "cuda/kernels/indexer/indexer_prefill_mma_sm80.cuh"
#include "cuda/kernels/attention/attention_prefill_mma_sm80.cuh"
#include "cuda/kernels/attention/attention_prefill_tma_sm90.cuh"
#include "cuda/kernels/attention/attention_prefill_kbm_sm90.cuh"
#include "cuda/kernels/lean/lean_decode.cuh"

#include <stdio.h>
#include <string.h>

static int cu_aligned(const void *p, size_t a)
{
    return ((uintptr_t)p % a) == 0;
}

static int cu_is16(msa_dtype d)
{
    return d == MSA_DTYPE_BF16 || d == MSA_DTYPE_FP16;
}

/* Appends "; msg" to why. */
static void cu_why(char *why, size_t n, const char *msg)
{
    if (!why || n == 0)
        return;
    size_t len = strlen(why);
    if (len + 1 >= n)
        return;
    snprintf(why + len, n - len, "%s%s", len ? "; " : "", msg);
}

void cu_choose_paths(const msa_plan *plan, const cu_plan_state *st, int32_t layer, msa_dtype act,
                     cu_paths *out, char *why, size_t why_size)
{
    const msa_model *m = plan->model;
    const msa_model_config *cfg = &m->cfg;
    const msa_cache_config *cc = &plan->cache->cfg;
    const int sparse = m->layer_sparse[layer] != 0;
    const int iv = sparse && m->layer_index_value[layer] != 0;
    char buf[160];
    if (why && why_size)
        why[0] = '\0';
    out->idx_fast = out->attn_fast = out->iv_fast = 0;
    out->idx_tma = out->attn_tma = 0;
    out->pf_fast = out->pf_iv_fast = out->pf_tma = out->pf_kbm = 0;
    out->lean = 0;
    out->pf_idx = out->pf_idx_tma = 0;
    out->pf_widen = 0;

    const int act16 = cu_is16(act);
    if (!act16)
        cu_why(why, why_size,
               "act dtype fp32: SIMT kernels (exact fp32 products, no tensor cores)");
    const int kv_ok = act16 && cc->kv_dtype == act;
    const int idx_ok = act16 && cc->index_dtype == act;
    /* Quantized planes (fp8_e4m3, nvfp4): the SIMT kernels read them,
     * de-quantizing each row on read (cu_plane_load); with 16-bit
     * activations the tensor-core decode kernels widen their codes where
     * their shapes hold: K/V the Hopper or mma.sync attention, index keys
     * the Hopper or mma.sync indexer (prefill rows read 16-bit copies). */
    const int kv_quant = cc->kv_dtype == MSA_DTYPE_FP8_E4M3 || cc->kv_dtype == MSA_DTYPE_NVFP4;
    const int idx_quant =
        sparse && (cc->index_dtype == MSA_DTYPE_FP8_E4M3 || cc->index_dtype == MSA_DTYPE_NVFP4);
    /* The mma.sync attention copies code rows in 16-byte pieces: an nvfp4
     * page region is 72 bytes a row, so its rows start on 16 bytes only
     * for even page sizes. */
    const int kv_nv_rows16 = cc->page_size % 2 == 0;
    const int kv_q_mma = act16 && (cc->kv_dtype == MSA_DTYPE_FP8_E4M3 ||
                                   (cc->kv_dtype == MSA_DTYPE_NVFP4 && kv_nv_rows16));
    /* The prefill kernels read 16-bit copies of quantized planes where the
     * plan keeps them (widen_pages.cuh). */
    const cu_widen_copies *wc = st ? &st->widen : NULL;
    const int kv_copy = act16 && kv_quant && wc && wc->copy[MSA_PLANE_K] && wc->copy[MSA_PLANE_V];
    const int ik_copy = act16 && idx_quant && wc && wc->copy[MSA_PLANE_INDEX_K];
    const int iv_copy = iv && ik_copy && wc->copy[MSA_PLANE_INDEX_V];
    if (kv_quant) {
        /* Said below, once the decode attention is known. */
        if (act16 && cc->kv_dtype == MSA_DTYPE_NVFP4 && !kv_nv_rows16)
            cu_why(why, why_size,
                   "nvfp4 K/V planes in pages of an odd number of rows: code rows not 16-byte "
                   "aligned");
    } else if (act16 && !kv_ok) {
        snprintf(buf, sizeof buf, "kv dtype %s != act dtype %s: SIMT attention",
                 msa_dtype_name(cc->kv_dtype), msa_dtype_name(act));
        cu_why(why, why_size, buf);
    }
    out->attn_fast = (kv_ok || kv_q_mma) && cfg->head_dim == 128;
    if ((kv_ok || kv_q_mma) && cfg->head_dim != 128) {
        snprintf(buf, sizeof buf, "head_dim %d != 128: SIMT attention", cfg->head_dim);
        cu_why(why, why_size, buf);
    }
    if (sparse) {
        /* Quantized index keys on the tensor-core decode indexers, which
         * widen the codes (the Hopper one where its shapes and copies
         * hold, below).  An nvfp4 page's code rows start on
         * 16-byte boundaries only when it holds an even number of rows
         * (its region is 72 bytes a row). */
        const int nv_rows16 = cc->page_size % 2 == 0;
        const int idx_q_mma = act16 && (cc->index_dtype == MSA_DTYPE_FP8_E4M3 ||
                                        (cc->index_dtype == MSA_DTYPE_NVFP4 && nv_rows16));
        if (act16 && cc->index_dtype == MSA_DTYPE_NVFP4 && !nv_rows16)
            cu_why(why, why_size,
                   "nvfp4 index planes in pages of one row: code rows not 16-byte aligned, SIMT "
                   "indexer");
        if (act16 && !idx_ok && !idx_quant) {
            snprintf(buf, sizeof buf, "index dtype %s != act dtype %s: SIMT indexer",
                     msa_dtype_name(cc->index_dtype), msa_dtype_name(act));
            cu_why(why, why_size, buf);
        }
        int ok = idx_ok || idx_q_mma;
        const int pf_idx_type = idx_ok || ik_copy;
        if ((ok || pf_idx_type) && cfg->index_dim != 128) {
            snprintf(buf, sizeof buf, "index_dim %d != 128: SIMT indexer", cfg->index_dim);
            cu_why(why, why_size, buf);
            ok = 0;
        }
        if ((ok || pf_idx_type) && cfg->block_size % CU_TILE_KEYS != 0) {
            snprintf(buf, sizeof buf, "block_size %d not a multiple of 64: SIMT indexer",
                     cfg->block_size);
            cu_why(why, why_size, buf);
            ok = 0;
        }
        if ((ok || pf_idx_type) && cfg->num_index_heads > 4) {
            snprintf(buf, sizeof buf, "%d index heads > 4: SIMT indexer", cfg->num_index_heads);
            cu_why(why, why_size, buf);
            ok = 0;
        }
        /* The prefill indexer: the decode indexer's shapes, a 16-bit plane
         * or its copy. */
        out->pf_idx = pf_idx_type && cfg->index_dim == 128 && cfg->block_size % CU_TILE_KEYS == 0 &&
                      cfg->num_index_heads <= 4;
        if (ik_copy && out->pf_idx)
            out->pf_widen |= 1u << MSA_PLANE_INDEX_K;
        if (idx_quant && !ok) {
            snprintf(buf, sizeof buf,
                     "%s index planes: SIMT indexer and index-value rows de-quantize on read",
                     msa_dtype_name(cc->index_dtype));
            cu_why(why, why_size, buf);
        }
        out->idx_fast = ok;
        /* The index-value pass runs the decode attention over the index
         * planes: quantized ones on its code variants, as K/V above. */
        out->iv_fast = iv && (idx_ok || idx_q_mma) && cfg->index_dim == 128;
    }
    if ((act16 && (out->attn_fast || out->idx_fast)) && cc->page_size != 128) {
        snprintf(buf, sizeof buf, "page_size %d != 128: rows gathered through the page table",
                 cc->page_size);
        cu_why(why, why_size, buf);
    }

    /* Prefill rows: the tensor-core prefill kernel where the decode path's
     * products serve (16-bit types alike, head dim 128) and the plan set
     * it up (a step can hold a prefill request); else the scalar rows of
     * the merge kernel. */
    {
        const char *pf_why = NULL;
        const int pf_ready = st && st->grid_pfa > 0;
        const int pf_kv_ok = (kv_ok || kv_copy) && cfg->head_dim == 128;
        out->pf_fast = pf_kv_ok && pf_ready &&
                       cu_pfa_fits(cfg->head_dim, m->group, m->topk_width, sparse, &pf_why);
        out->pf_iv_fast = (out->iv_fast || (iv_copy && cfg->index_dim == 128)) && pf_ready &&
                          cu_pfa_fits(cfg->index_dim, cfg->num_index_heads, 0, 0, NULL);
        if (kv_copy && out->pf_fast)
            out->pf_widen |= (1u << MSA_PLANE_K) | (1u << MSA_PLANE_V);
        if (iv_copy && out->pf_iv_fast)
            out->pf_widen |= (1u << MSA_PLANE_INDEX_K) | (1u << MSA_PLANE_INDEX_V);
        if (pf_why && pf_ready && pf_kv_ok)
            cu_why(why, why_size, pf_why);
        if (st && !pf_ready && st->sz.pf_tiles_cap[0] > 0 && pf_kv_ok)
            cu_why(why, why_size,
                   "device blocks below 160 KB of shared memory: scalar prefill rows");
        /* Its Hopper version for the main pass (with the layer's K and V
         * maps, below). */
        pf_why = NULL;
        if (out->pf_fast && st->pfh)
            out->pf_tma = cu_pfh_fits(cfg->head_dim, cc->page_size, cfg->block_size, m->group,
                                      m->topk_width, sparse, &pf_why) &&
                          cc->num_pages * (int64_t)cc->page_size * cfg->num_kv_heads <
                              ((int64_t)1 << 31);
        if (pf_why)
            cu_why(why, why_size, pf_why);
        else if (out->pf_fast && !out->pf_tma)
            cu_why(why, why_size,
                   st->pfh
                       ? "cache rows beyond tensor-map coordinates: mma.sync prefill kernel"
                       : "no sm_90a products (or cuda_no_prefill_tma): mma.sync prefill kernel");
    }

    /* Hopper kernels: a key block is one page, streamed by tensor maps.
     * Their coordinates are per dimension now (slot, head, page); the
     * bound on a plane's rows below 2^31, from the earlier maps of one row
     * coordinate, stays (no plane on one device's memory reaches it). */
    const int hopper = st && st->tma;
    const int whole_pages = cc->page_size == 128 && cfg->block_size == 128;
    const int64_t rows = cc->num_pages * (int64_t)cc->page_size;
    if (sparse && hopper && whole_pages) {
        out->idx_tma = out->idx_fast && st->wgmma && rows < ((int64_t)1 << 31);
        out->pf_idx_tma = out->pf_idx && st->wgmma && rows < ((int64_t)1 << 31);
        out->attn_tma = out->attn_fast && cu_attn_tma_shape(plan, st) &&
                        rows * cfg->num_kv_heads < ((int64_t)1 << 31);
        if (out->attn_fast && m->group != 16) {
            snprintf(buf, sizeof buf, "%d query heads per KV head (not 16): mma attention",
                     m->group);
            cu_why(why, why_size, buf);
        }
    } else if (sparse && hopper && act16) {
        cu_why(why, why_size, "page_size or block_size != 128: no tensor-map kernels");
    }
    /* Tensor maps of the layer's planes, encoded with the plan state over
     * the planes' strides (the library layout's or an engine's); a plane
     * that could not be described falls back to the mma kernels. */
    const unsigned map_ok = st && st->map_ok ? st->map_ok[layer] : 0u;
    const unsigned kv_bits = (1u << CU_MAP_K) | (1u << CU_MAP_V);
    const int idx_map = (map_ok & (1u << CU_MAP_INDEX_K)) != 0;
    const int kv_maps = (map_ok & kv_bits) == kv_bits;
    /* The prefill kernels' maps: the copies' where they read copies. */
    const unsigned pf_map_ok = wc ? wc->map_ok : 0u;
    const int pf_idx_map = ik_copy ? (pf_map_ok & (1u << CU_MAP_INDEX_K)) != 0 : idx_map;
    const int pf_kv_maps = kv_copy ? (pf_map_ok & kv_bits) == kv_bits : kv_maps;
    if ((out->idx_tma && !idx_map) || (out->attn_tma && !kv_maps) ||
        (out->pf_idx_tma && !pf_idx_map) || (out->pf_tma && !pf_kv_maps))
        cu_why(why, why_size,
               msa_cache_layer_is_library_layout(plan->cache, layer)
                   ? "no tensor maps of the planes (driver, alignment or size): mma.sync kernels"
                   : "no tensor maps of the engine layout's planes (a stride not a multiple of "
                     "16 bytes below 2^40, or the driver): mma.sync kernels");
    if (!idx_map)
        out->idx_tma = 0;
    if (!pf_idx_map)
        out->pf_idx_tma = 0;
    if (!kv_maps)
        out->attn_tma = 0;
    if (!pf_kv_maps)
        out->pf_tma = 0;
    /* Quantized planes: which kernels read them (tensor-core kernels widen
     * their codes). */
    if (kv_quant) {
        const char *reader = out->attn_tma    ? "codes widened by the Hopper decode attention"
                             : out->attn_fast ? "codes widened by the mma.sync decode attention"
                                              : "SIMT attention de-quantizes rows on read";
        snprintf(buf, sizeof buf, "%s K/V planes: %s%s", msa_dtype_name(cc->kv_dtype), reader,
                 kv_copy ? "; prefill rows read 16-bit copies of the pages" : "");
        cu_why(why, why_size, buf);
    }
    if (idx_quant && out->idx_fast) {
        snprintf(buf, sizeof buf, "%s index planes: codes widened by the %s indexer%s%s",
                 msa_dtype_name(cc->index_dtype), out->idx_tma ? "Hopper" : "mma.sync",
                 iv && !out->iv_fast ? "; index-value decode rows SIMT, de-quantized on read" : "",
                 out->pf_idx ? "; prefill rows read 16-bit copies of the pages" : "");
        cu_why(why, why_size, buf);
    }
    /* The sparse pass's prefill rows key-block-major where the plan set
     * it up (its shapes and types, the debugging option). */
    out->pf_kbm = sparse && out->pf_tma && st->pfk &&
                  cu_pfk_fits(cfg->head_dim, cc->page_size, cfg->block_size, m->group, NULL);
    if (sparse && out->pf_tma && !out->pf_kbm)
        cu_why(why, why_size,
               st->pfk ? "prefill tiles over block unions (shape)"
                       : "key-block-major prefill not set up (shape, type, capacity or "
                         "cuda_no_prefill_kbm): prefill tiles over block unions");
    /* Plans of few one-token requests with short contexts: the whole layer
     * in the lean decode kernel where its shapes fit. */
    if (st && st->lean_ws) {
        const char *lean_why = NULL;
        out->lean = cu_lean_fits(m, layer, cc, act, &lean_why);
        /* The chain's notes describe kernels this layer does not run. */
        if (out->lean && why && why_size)
            why[0] = '\0';
        if (!out->lean) {
            snprintf(buf, sizeof buf,
                     "few one-token requests, short contexts, but %s: decode chain", lean_why);
            cu_why(why, why_size, buf);
        }
    }
}

int cu_plan_paths(const msa_plan *plan, cu_plan_state *st)
{
    const int32_t layers = plan->model->cfg.num_layers;
    st->path = (cu_paths *)calloc((size_t)layers, sizeof(cu_paths));
    st->path_why = (char(*)[CU_WHY_BYTES])calloc((size_t)layers, CU_WHY_BYTES);
    if (!st->path || !st->path_why)
        return 1;
    st->sparse_tma = 0;
    for (int32_t l = 0; l < layers; ++l) {
        cu_choose_paths(plan, st, l, plan->params.act_dtype, &st->path[l], st->path_why[l],
                        CU_WHY_BYTES);
        if (plan->model->layer_sparse[l] && st->path[l].attn_tma)
            st->sparse_tma = 1;
    }
    return 0;
}

void cu_describe(const msa_plan *plan, int32_t layer, const char **kernel, const char **reason)
{
    cu_plan_state *st = (cu_plan_state *)plan->backend;
    static const char *names[2][3] = {{"cuda.dense.simt", "cuda.dense.mma", "cuda.dense.mma"},
                                      {"cuda.sparse.simt", "cuda.sparse.mma", "cuda.sparse.tma"}};
    /* Steps with prefill rows on the Hopper prefill kernel. */
    static const char *names_pfh[2][3] = {{"cuda.dense.simt", "cuda.dense.mma+pf.tma",
                                           "cuda.dense.mma+pf.tma"},
                                          {"cuda.sparse.simt", "cuda.sparse.mma+pf.tma",
                                           "cuda.sparse.tma+pf.tma"}};
    static const char *names_pfk[3] = {"cuda.sparse.simt", "cuda.sparse.mma+pf.kbm",
                                       "cuda.sparse.tma+pf.kbm"};
    const msa_model *m = plan->model;
    const int sparse = m->layer_sparse[layer] != 0;
    static char no_state[] = "plan has no device state";
    if (!st || !st->path) {
        *kernel = names[sparse][0];
        *reason = no_state;
        return;
    }
    const cu_paths *p = &st->path[layer];
    int fast = sparse ? (p->idx_fast && p->attn_fast) : p->attn_fast;
    if (fast && sparse && p->idx_tma && p->attn_tma)
        fast = 2;
    *kernel = (st->step.n_pf > 0 && p->pf_tma ? names_pfh : names)[sparse][fast];
    if (p->lean) {
        *kernel = sparse ? "cuda.sparse.lean" : "cuda.dense.lean";
        *reason = st->path_why[layer];
        return;
    }
    if (st->step.n_pf > 0 && p->pf_kbm)
        *kernel = names_pfk[fast];
    *reason = st->path_why[layer];
    if (st->step.n_pf > 0) {
        /* The step's notes beside the plan's reason. */
        snprintf(st->why_step, sizeof st->why_step, "%s", st->path_why[layer]);
        cu_why(st->why_step, sizeof st->why_step,
               p->pf_kbm   ? "prefill requests (q_len > 16) in this step: key-block-major Hopper "
                             "prefill attention"
               : p->pf_tma ? "prefill requests (q_len > 16) in this step: Hopper prefill kernel"
               : p->pf_fast
                   ? "prefill requests (q_len > 16) in this step: tensor-core prefill kernel"
                   : "prefill requests (q_len > 16) in this step: simple prefill kernels");
        if (sparse)
            cu_why(st->why_step, sizeof st->why_step,
                   !(p->pf_idx && st->pfi_scratch)
                       ? "prefill index scores and selection: scalar (shape or dtype)"
                   : p->pf_idx_tma && st->pfit
                       ? "prefill index scores and selection: tensor cores, tensor-map pages"
                       : "prefill index scores and selection: tensor cores");
        *reason = st->why_step;
    }
}

/* maps: the K map, then the V map (NULL: no tensor-map kernel); pf_maps
 * the same for the Hopper prefill kernel (NULL: the mma.sync one);
 * pfk_chunks > 0: the sparse pass's prefill rows go key-block-major, in
 * that many chunks. */
static_assert(CU_MAP_V == CU_MAP_K + 1, "a layer's V map follows its K map");
static void cu_run_attention(const cu_attn_params *A, const cu_plan_state *st, int fast,
                             const CUtensorMap *maps, const CUtensorMap *pf_maps,
                             int32_t pfk_chunks, cudaStream_t s)
{
    if (maps)
        cu_launch_attn_tma(A, st, &maps[0], &maps[1], s);
    else if (fast)
        cu_launch_attn_decode_mma(A, st, s);
    else
        cu_launch_attn_decode_simt(A, st, s);
    cu_launch_merge_prefill(A, st, s);
    /* Prefill rows on tensor cores; the merge kernel left them. */
    if (A->prefill_on_tensor_cores) {
        /* The key-block-major kernels copy the queries and store the
         * partial rows by tensor maps encoded here (the query pointer is
         * the call's); cu_forward checked what the encoder needs, so the
         * union kernel below runs only if the driver still refuses. */
        cu_pfk_params pk;
        CUtensorMap qo[2];
        int kbm = 0;
        if (pf_maps && pfk_chunks > 0) {
            cu_pfk_build(A, &st->pfk_ws, st->pfk_chunk, st->sz.pf_blocks_cap, st->pfk_items_cap,
                         &pk);
            kbm = cu_pfk_encode_maps(&pk, st->sz.cap_tok, qo) == 0;
        }
        if (kbm) {
            cu_launch_attn_prefill_kbm(&pk, pfk_chunks, st, pf_maps, qo, s);
        } else if (pf_maps) {
            cu_pfh_params p;
            cu_pfh_build(A, &p);
            cu_launch_attn_prefill_tma(&p, st, pf_maps, s);
        } else {
            cu_pfa_params p;
            cu_pfa_build(A, &p);
            cu_launch_attn_prefill_mma(&p, st, s);
        }
    }
}

msa_status cu_forward(msa_context *ctx, msa_plan *plan, int32_t layer, const msa_layer_io *io)
{
    const cu_ctx_state *cs = (const cu_ctx_state *)ctx->backend_state;
    cu_plan_state *st = (cu_plan_state *)plan->backend;
    const msa_model *m = plan->model;
    if (!st)
        return msa_set_error(ctx, MSA_ERR_BACKEND, "CUDA plan has no device state");
    CU_TRY(ctx, cudaSetDevice(cs->device));
    cudaStream_t s = (cudaStream_t)io->stream;
    const int sparse = m->layer_sparse[layer] != 0;
    const int index_value = sparse && m->layer_index_value[layer] != 0;

    /* The plan's kernels for this layer (its act_dtype, which msa_forward
     * checked io's against); only the call's buffers can still turn a fast
     * kernel off: they use 4-byte (attention) and 16-byte (indexer)
     * accesses. */
    if (!st->path)
        return msa_set_error(ctx, MSA_ERR_BACKEND, "CUDA plan has no kernel paths");
    cu_paths paths = st->path[layer];
    if (!(cu_aligned(io->q, 4) && cu_aligned(io->o, 4)))
        paths.attn_fast = paths.attn_tma = paths.pf_fast = paths.pf_tma = 0;
    if (!cu_aligned(io->idx_q, 16))
        paths.idx_fast = paths.idx_tma = paths.pf_idx = paths.pf_idx_tma = 0;
    if (!(cu_aligned(io->idx_q, 4) && cu_aligned(io->idx_o, 4)))
        paths.iv_fast = paths.pf_iv_fast = 0;
    /* Copies only for the prefill kernels that still read them. */
    if (!paths.pf_fast)
        paths.pf_widen &= ~((1u << MSA_PLANE_K) | (1u << MSA_PLANE_V));
    if (!paths.pf_iv_fast)
        paths.pf_widen &= ~(1u << MSA_PLANE_INDEX_V);
    if (!paths.pf_idx && !paths.pf_iv_fast)
        paths.pf_widen &= ~(1u << MSA_PLANE_INDEX_K);
    /* Key-block-major: its merge writes 16-byte pieces, its queries come
     * by tensor map. */
    if (!paths.pf_tma || !cu_aligned(io->o, 16) || !cu_aligned(io->q, 16))
        paths.pf_kbm = 0;
    const CUtensorMap *maps = st->maps ? st->maps + (size_t)layer * CU_MAPS : NULL;
    /* The prefill kernels' maps: of the copies where they read copies. */
    const CUtensorMap *pf_layer_maps = maps;
    if (paths.pf_widen & (1u << MSA_PLANE_K))
        pf_layer_maps = st->widen.maps;
    const CUtensorMap *pf_maps = paths.pf_tma ? &pf_layer_maps[CU_MAP_K] : NULL;
    const CUtensorMap *pfi_map = NULL;
    if (paths.pf_idx_tma)
        pfi_map = (paths.pf_widen & (1u << MSA_PLANE_INDEX_K)) ? &st->widen.maps[CU_MAP_INDEX_K]
                                                               : &maps[CU_MAP_INDEX_K];
    /* The Hopper attention builds the unions of requests of several tokens
     * (up to CU_ATT_UNION_BLOCKS blocks) itself: the selection then ends
     * with its last row, without a completion count and a union pass. */
    const int32_t union_blocks = (st->sz.cap_blocks + 31) & ~31;
    int32_t attention_union_blocks = 0;
    /* A plan whose requests reach at most K blocks has no union to build
     * (each selects all its blocks): no shared memory is set aside for one. */
    if (paths.attn_tma && !cs->sel_unions && st->sz.cap_union <= CU_ATT_UNION_LIST &&
        st->sz.cap_blocks > m->cfg.topk_blocks)
        attention_union_blocks = union_blocks < CU_ATT_UNION_BLOCKS ? union_blocks
                                                                    : CU_ATT_UNION_BLOCKS;

    /* Prefill rows on the tensor-core indexer and selection (its own
     * kernel, after the selection's), which then gives its scalar prefill
     * role no CTAs.  Enqueued when the step has prefill rows, and always
     * under graph capture (a replay may follow an update that adds some). */
    int32_t prefill_ctas = st->sz.grid_pf;
    int pfi = sparse && paths.pf_idx && st->pfi_scratch != NULL;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (pfi || paths.pf_kbm || paths.pf_widen)
        CU_TRY(ctx, cudaStreamIsCapturing(s, &cap));
    const int capturing = cap != cudaStreamCaptureStatusNone;
    if (pfi) {
        prefill_ctas = 0;
        pfi = st->step.n_pf > 0 || capturing;
    }
    /* Key-block-major prefill: the chunks the step's prefill tokens need,
     * or under capture every chunk the plan's capacity may need (the
     * kernels of an empty chunk end at once). */
    int32_t pfk_chunks = 0;
    if (sparse && paths.pf_kbm) {
        const int32_t n = capturing ? st->sz.cap_tok : st->step.n_pf;
        pfk_chunks = (n + st->pfk_chunk - 1) / st->pfk_chunk;
    }

    /* For msa_bench_stages: CU_STAGE_MARK(first, last) marks stages first to
     * last - 1 as not run and records the start of stage last. */
#define CU_STAGE_MARK(first, last)                                   \
    do {                                                             \
        if (cs->stages) {                                            \
            for (int skip_ = (first); skip_ < (last); skip_++)       \
                cs->stages->skipped |= 1u << skip_;                  \
            CU_TRY(ctx, cudaEventRecord(cs->stages->ev[(last)], s)); \
        }                                                            \
    } while (0)
    if (cs->tl) /* profiling aid: the timeline holds this forward's stamps only */
        CU_TRY(ctx, cudaMemsetAsync(cs->tl, 0, CU_TL_WORDS * sizeof(unsigned long long), s));
    CU_STAGE_MARK(MSA_STAGE_CACHE_WRITE, MSA_STAGE_CACHE_WRITE);
    cu_prologue_params prologue;
    cu_prologue_build(plan, st, layer, io, cs->tl, &prologue);
    /* The lean decode kernel, where the call's buffers allow its loads
     * (4-byte query and output rows; the step's own rows, read from the
     * call's tensors, in 16-byte pieces).  Its time counts as the
     * attention stage's. */
    if (paths.lean && paths.attn_fast && (!prologue.write_cache || prologue.rows_in_pieces)) {
        cu_lean_params lean;
        lean.pro = prologue;
        cu_attn_build(plan, st, layer, io, sparse ? CU_KIND_SPARSE : CU_KIND_DENSE, 0, 0, cs->tl,
                      &lean.att);
        lean.new_rows_from_input = prologue.write_cache;
        cu_lean_ws_carve(st->lean_ws, st->lean_tasks, &lean);
        CU_STAGE_MARK(MSA_STAGE_INDEXER, MSA_STAGE_ATTENTION);
        cu_launch_lean(&lean, st->lean_tasks, s);
        CU_STAGE_MARK(MSA_STAGE_INDEX_VALUE, MSA_STAGE_COUNT);
        CU_TRY(ctx, cudaGetLastError());
        return MSA_OK;
    }
    cu_launch_prologue(&prologue, st, s);
    /* 16-bit copies of the quantized pages the prefill kernels read (part
     * of the cache-write stage); under capture always, as the prefill
     * kernels. */
    if (paths.pf_widen && (st->step.n_pf > 0 || capturing)) {
        cu_widen_params widen;
        cu_widen_build(plan, &st->widen, layer, paths.pf_widen, io->act_dtype, &st->dev,
                       st->sz.cap_pages, &widen);
        cu_launch_widen_pages(&widen, st->sz.num_sms, st->pdl, s);
    }
    cu_attn_params attn;
    if (sparse) {
        CU_STAGE_MARK(MSA_STAGE_INDEXER, MSA_STAGE_INDEXER);
        cu_indexer_params indexer;
        cu_indexer_build(plan, st, layer, io, cs->tl, &indexer);
        if (paths.idx_tma)
            cu_launch_indexer_tma(&indexer, st, &maps[CU_MAP_INDEX_K], s);
        else if (paths.idx_fast)
            cu_launch_indexer_mma(&indexer, st, s);
        else
            cu_launch_indexer_simt(&indexer, st, s);
        CU_STAGE_MARK(MSA_STAGE_SELECTION, MSA_STAGE_SELECTION);
        cu_select_params select;
        cu_select_build(plan, st, layer, io, cs->sel_warp_rows ? 0 : st->sz.grid_sel, prefill_ctas,
                        attention_union_blocks, cs->tl, &select);
        cu_launch_select(&select, st, s);
        if (pfi) {
            CU_STAGE_MARK(MSA_STAGE_PREFILL_INDEXER, MSA_STAGE_PREFILL_INDEXER);
            cu_launch_indexer_prefill_mma(&select, st, pfi_map, s);
            CU_STAGE_MARK(MSA_STAGE_ATTENTION, MSA_STAGE_ATTENTION);
        } else {
            CU_STAGE_MARK(MSA_STAGE_PREFILL_INDEXER, MSA_STAGE_ATTENTION);
        }
        cu_attn_build(plan, st, layer, io, CU_KIND_SPARSE, paths.pf_fast, attention_union_blocks,
                      cs->tl, &attn);
        cu_run_attention(&attn, st, paths.attn_fast, paths.attn_tma ? &maps[CU_MAP_K] : NULL,
                         pf_maps, pfk_chunks, s);
        if (index_value) {
            CU_STAGE_MARK(MSA_STAGE_INDEX_VALUE, MSA_STAGE_INDEX_VALUE);
            cu_attn_build(plan, st, layer, io, CU_KIND_IV, paths.pf_iv_fast, 0, cs->tl, &attn);
            cu_run_attention(&attn, st, paths.iv_fast, NULL, NULL, 0, s);
            CU_STAGE_MARK(MSA_STAGE_COUNT, MSA_STAGE_COUNT);
        } else {
            CU_STAGE_MARK(MSA_STAGE_INDEX_VALUE, MSA_STAGE_COUNT);
        }
    } else {
        CU_STAGE_MARK(MSA_STAGE_INDEXER, MSA_STAGE_ATTENTION);
        cu_attn_build(plan, st, layer, io, CU_KIND_DENSE, paths.pf_fast, 0, cs->tl, &attn);
        cu_run_attention(&attn, st, paths.attn_fast, NULL, pf_maps, 0, s);
        CU_STAGE_MARK(MSA_STAGE_INDEX_VALUE, MSA_STAGE_COUNT);
    }
#undef CU_STAGE_MARK
    CU_TRY(ctx, cudaGetLastError());
    return MSA_OK;
}
