/* The nvfp4 bf16 table of cpu_nvfp4_table.h. */
#include "cpu/cpu_nvfp4_table.h"

#include "core/quant.h"

#include <pthread.h>
#include <string.h>

static uint16_t nvfp4_bf16[256 * 16];
static pthread_once_t nvfp4_bf16_once = PTHREAD_ONCE_INIT;

static void nvfp4_bf16_build(void)
{
    for (int s = 0; s < 256; s++) {
        const float scale = msa_e4m3_to_f32((uint8_t)s);
        for (int c = 0; c < 16; c++) {
            const float v = msa_e2m1_to_f32((uint8_t)c) * scale; /* exact */
            uint32_t u;
            memcpy(&u, &v, sizeof u);
            nvfp4_bf16[s * 16 + c] = (uint16_t)(u >> 16); /* exact: low half is zero */
        }
    }
}

const uint16_t *msa_cpu_nvfp4_bf16_table(void)
{
    pthread_once(&nvfp4_bf16_once, nvfp4_bf16_build);
    return nvfp4_bf16;
}
