/*
 * libFuzzer harness: arbitrary bytes as a replay meta.json, through the
 * `msa` program's parser (tools/replay_meta.c, after the strict JSON
 * check).  It must never crash or leak, must say why on failure with one
 * of the documented statuses, and on success must hold a step the replay
 * can size its arrays from: positive shapes, one page list per request of
 * exactly ceil(kv_len / page_size) pages inside the pool, q_len <= kv_len,
 * and no more query rows than tokens.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "replay_meta.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    replay_meta m;
    char msg[512];
    msg[0] = '\0';
    msa_status st = replay_meta_parse((const char *)data, size, &m, msg, sizeof msg, NULL);
    if (st != MSA_OK) {
        if (!msg[0] || m.requests)
            abort();
        if (st != MSA_ERR_IO && st != MSA_ERR_INVALID_ARGUMENT && st != MSA_ERR_OUT_OF_RANGE &&
            st != MSA_ERR_OUT_OF_MEMORY)
            abort();
        return 0;
    }
    if (m.Hq < 1 || m.Hkv < 1 || m.D < 1 || m.page_size < 1 || m.num_pages < 1 ||
        m.num_requests < 0 || m.tokens < 0 || m.max_pages < 1 || !m.requests)
        abort();
    if (m.sparse && (m.Hi < 1 || m.Di < 1 || m.block < 1 || m.topk < 1 || m.init_blocks < 0 ||
                     m.local_blocks < 1))
        abort();
    int64_t sum_q = 0;
    for (int32_t r = 0; r < m.num_requests; r++) {
        const replay_request *q = &m.requests[r];
        int64_t need = ((int64_t)q->kv_len + m.page_size - 1) / m.page_size;
        if (q->q_len < 0 || q->q_len > q->kv_len || q->num_pages != need ||
            q->num_pages > m.max_pages || !q->pages)
            abort();
        for (int32_t p = 0; p < q->num_pages; p++)
            if (q->pages[p] < 0 || q->pages[p] >= m.num_pages)
                abort();
        sum_q += q->q_len;
    }
    if (sum_q > m.tokens)
        abort();
    replay_meta_free(&m);
    return 0;
}
