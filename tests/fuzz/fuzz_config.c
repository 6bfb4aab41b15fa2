/*
 * libFuzzer harness: arbitrary bytes as config.json.  The loader must never
 * crash, and must keep its contract: a model on success, no model and a
 * message on failure, and only documented status codes.
 */
#include <stdint.h>
#include <stdlib.h>

#include "msa/msa.h"
#include "fuzz_context.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    msa_context *ctx = fuzz_context();
    msa_model *m = NULL;
    msa_status st = msa_model_load_config_json(ctx, (const char *)data, size, &m);
    if (st == MSA_OK) {
        if (!m)
            abort();
        msa_model_config c;
        msa_model_get_config(m, &c);
        /* A loaded model satisfies every rule of SPEC 2. */
        if (c.num_layers < 1 || c.num_q_heads < 1 || c.num_kv_heads < 1 || c.head_dim < 1 ||
            c.num_q_heads % c.num_kv_heads != 0 || c.local_blocks < 1 || c.init_blocks < 0)
            abort();
        int any_sparse = 0;
        for (int32_t l = 0; l < c.num_layers; l++)
            any_sparse |= msa_model_layer_is_sparse(m, l);
        if (any_sparse &&
            (c.init_blocks + c.local_blocks > c.topk_blocks || c.block_size < 1 ||
             c.index_dim < 1 || c.num_index_heads < 1 ||
             (c.num_index_heads % c.num_kv_heads != 0 && c.num_kv_heads % c.num_index_heads != 0)))
            abort();
        if (msa_model_topk_width(m) < c.topk_blocks)
            abort();
        msa_model_free(m);
    } else {
        if (m || !msa_context_last_error(ctx)[0])
            abort();
        if (st != MSA_ERR_INVALID_CONFIG && st != MSA_ERR_IO && st != MSA_ERR_INVALID_ARGUMENT &&
            st != MSA_ERR_OUT_OF_MEMORY)
            abort();
    }
    return 0;
}
