/* Per-context error messages (never a global string: engines run several
 * threads, each with its own context). */
#include "core/internal.h"

#include <stdio.h>

msa_status msa_set_error(msa_context *ctx, msa_status status, const char *fmt, ...)
{
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->last_error, sizeof ctx->last_error, fmt, ap);
        va_end(ap);
    }
    return status;
}

void msa_clear_error(msa_context *ctx)
{
    if (ctx)
        ctx->last_error[0] = '\0';
}

const char *msa_context_last_error(const msa_context *ctx)
{
    return ctx ? ctx->last_error : "no context";
}
