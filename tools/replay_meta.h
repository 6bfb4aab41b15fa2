/*
 * meta.json of a replay directory (docs/REPLAY.md): parsed and validated in
 * full before any tensor is read, so a bad directory is refused with one
 * precise message.
 */
#ifndef MSA_TOOLS_REPLAY_META_H
#define MSA_TOOLS_REPLAY_META_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "msa/msa.h"

typedef struct replay_request {
    int32_t q_len, kv_len;
    int32_t num_pages; /* ceil(kv_len / page_size) */
    int32_t *pages;    /* [num_pages] */
} replay_request;

typedef struct replay_meta {
    /* layer */
    int sparse;
    int32_t Hq, Hkv, D, Hi, Di, block, topk, init_blocks, local_blocks;
    msa_score_type score;
    int index_value;
    float scale, index_scale; /* 0 = the library's default */
    /* cache */
    int32_t page_size;
    int64_t num_pages;
    msa_dtype kv_dtype, index_dtype;
    float k_scale, v_scale, index_k_scale, index_v_scale;
    /* step */
    msa_dtype act_dtype;
    int64_t tokens;
    int32_t num_requests;
    replay_request *requests;
    int32_t max_pages; /* longest page list, at least 1 */
    int write_cache;
} replay_meta;

/* Loads `path`.  On failure returns the status to report (MSA_ERR_IO when
 * the file cannot be read or parsed, MSA_ERR_INVALID_ARGUMENT or
 * MSA_ERR_OUT_OF_RANGE for bad content) with a message in msg. */
msa_status replay_meta_load(const char *path, replay_meta *meta, char *msg, size_t msg_size);
/* The same from the file's text[0..len) (need not end in a NUL); unknown
 * keys are reported on `warn` (NULL: not reported).  The text must be
 * strict JSON (src/util/json_strict.h). */
msa_status replay_meta_parse(const char *text, size_t len, replay_meta *meta, char *msg,
                             size_t msg_size, FILE *warn);
void replay_meta_free(replay_meta *meta);

#endif
