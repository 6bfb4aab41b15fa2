/*
 * The one CPU context a harness process uses (single-threaded, created on
 * first use, kept for every input).
 */
#ifndef MSA_FUZZ_CONTEXT_H
#define MSA_FUZZ_CONTEXT_H

#include <stdlib.h>

#include "msa/msa.h"

static msa_context *fuzz_context(void)
{
    static msa_context *ctx;
    if (!ctx) {
        msa_context_params p;
        msa_context_params_default(&p);
        p.num_threads = 1;
        if (msa_context_create(&p, &ctx, NULL, 0) != MSA_OK)
            abort();
    }
    return ctx;
}

#endif /* MSA_FUZZ_CONTEXT_H */
