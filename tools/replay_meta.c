#include "replay_meta.h"

#include "json_strict.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct meta_err {
    msa_status status;
    char *msg;
    size_t size;
    FILE *warn; /* unknown keys are reported here; NULL = not reported */
} meta_err;

static int fail(meta_err *e, msa_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int fail(meta_err *e, msa_status status, const char *fmt, ...)
{
    e->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, e->size, fmt, ap);
    va_end(ap);
    return -1;
}

/* What a JSON value is, for messages. */
static const char *json_kind(const cJSON *v)
{
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsNumber(v))
        return "a number";
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsArray(v))
        return "an array";
    if (cJSON_IsObject(v))
        return "an object";
    return "null";
}

/* Unknown keys are most often typos ("index_dtyp") that would silently take
 * a default, so they are reported; they are not errors because engines may
 * add their own fields to the dump. */
static void warn_unknown(FILE *warn, const cJSON *obj, const char *where, const char *const *known)
{
    if (!warn)
        return;
    for (const cJSON *it = obj ? obj->child : NULL; it; it = it->next) {
        int found = 0;
        for (const char *const *k = known; *k && !found; k++)
            found = it->string && strcmp(it->string, *k) == 0;
        if (!found)
            fprintf(warn, "msa replay: warning: unknown key %s%s'%s' ignored\n", where,
                    where[0] ? "." : "", it->string ? it->string : "?");
    }
}

/* The field `key` of obj in *it: 1 when present, 0 when absent or null,
 * -1 (error set) when absent and required. */
static int get_field(meta_err *e, const cJSON *obj, const char *where, const char *key,
                     int required, const cJSON **it)
{
    *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (*it && !cJSON_IsNull(*it))
        return 1;
    if (required)
        return fail(e, MSA_ERR_INVALID_ARGUMENT, "meta.json: %s%s%s is missing", where,
                    where[0] ? "." : "", key);
    return 0;
}

/* An integer field: absent -> def (or an error when required). */
static int get_int(meta_err *e, const cJSON *obj, const char *where, const char *key, int required,
                   int64_t def, int64_t min, int64_t max, int64_t *out)
{
    const cJSON *it;
    const int has = get_field(e, obj, where, key, required, &it);
    if (has <= 0) {
        if (has == 0)
            *out = def;
        return has;
    }
    const char *dot = where[0] ? "." : "";
    double v = it->valuedouble;
    /* Three different faults, three messages: no number, a number that is
     * not whole, a whole number out of range. */
    if (!cJSON_IsNumber(it))
        return fail(e, MSA_ERR_INVALID_ARGUMENT, "meta.json: %s%s%s must be an integer, not %s",
                    where, dot, key, json_kind(it));
    if (isfinite(v) && v != floor(v))
        return fail(e, MSA_ERR_INVALID_ARGUMENT, "meta.json: %s%s%s must be an integer (got %.17g)",
                    where, dot, key, v);
    if (!(v >= (double)min && v <= (double)max))
        return fail(e, MSA_ERR_INVALID_ARGUMENT,
                    "meta.json: %s%s%s is out of range: %.6g is not in [%lld, %lld]", where, dot,
                    key, v, (long long)min, (long long)max);
    *out = (int64_t)v;
    return 0;
}

static int get_i32(meta_err *e, const cJSON *obj, const char *where, const char *key, int required,
                   int32_t def, int32_t min, int32_t *out)
{
    int64_t v;
    if (get_int(e, obj, where, key, required, def, min, INT32_MAX, &v) != 0)
        return -1;
    *out = (int32_t)v;
    return 0;
}

static int get_bool(meta_err *e, const cJSON *obj, const char *where, const char *key, int def,
                    int *out)
{
    const cJSON *it;
    if (get_field(e, obj, where, key, 0, &it) == 0) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(it))
        return fail(e, MSA_ERR_INVALID_ARGUMENT, "meta.json: %s%s%s must be true or false", where,
                    where[0] ? "." : "", key);
    *out = cJSON_IsTrue(it);
    return 0;
}

/* A positive finite float; absent or null -> def. */
static int get_scale(meta_err *e, const cJSON *obj, const char *where, const char *key, float def,
                     float *out)
{
    const cJSON *it;
    if (get_field(e, obj, where, key, 0, &it) == 0) {
        *out = def;
        return 0;
    }
    float v = (float)it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || !(v > 0.0f) || !isfinite(v))
        return fail(e, MSA_ERR_INVALID_ARGUMENT,
                    "meta.json: %s.%s must be a positive finite number or null", where, key);
    *out = v;
    return 0;
}

static int get_dtype(meta_err *e, const cJSON *obj, const char *where, const char *key,
                     int required, msa_dtype def, msa_dtype *out)
{
    const cJSON *it;
    const int has = get_field(e, obj, where, key, required, &it);
    if (has <= 0) {
        if (has == 0)
            *out = def;
        return has;
    }
    if (!cJSON_IsString(it) || msa_dtype_from_name(it->valuestring, out) != MSA_OK)
        return fail(e, MSA_ERR_INVALID_ARGUMENT,
                    "meta.json: %s%s%s must be one of \"fp32\", \"bf16\", \"fp16\", "
                    "\"fp8_e4m3\", \"nvfp4\"",
                    where, where[0] ? "." : "", key);
    return 0;
}

static const cJSON *get_object(meta_err *e, const cJSON *root, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsObject(it)) {
        fail(e, MSA_ERR_INVALID_ARGUMENT, "meta.json: \"%s\" must be an object", key);
        return NULL;
    }
    return it;
}

static int parse_layer(meta_err *e, const cJSON *layer, replay_meta *m)
{
    static const char *const known[] = {"type",        "Hq",           "Hkv",   "D",
                                        "Hi",          "Di",           "block", "topk",
                                        "init_blocks", "local_blocks", "score", "index_value",
                                        "scale",       "index_scale",  NULL};
    warn_unknown(e->warn, layer, "layer", known);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(layer, "type");
    if (!cJSON_IsString(type) ||
        (strcmp(type->valuestring, "sparse") != 0 && strcmp(type->valuestring, "dense") != 0))
        return fail(e, MSA_ERR_INVALID_ARGUMENT,
                    "meta.json: layer.type must be \"sparse\" or \"dense\"");
    m->sparse = strcmp(type->valuestring, "sparse") == 0;
    if (get_i32(e, layer, "layer", "Hq", 1, 0, 1, &m->Hq) ||
        get_i32(e, layer, "layer", "Hkv", 1, 0, 1, &m->Hkv) ||
        get_i32(e, layer, "layer", "D", 1, 0, 1, &m->D) ||
        get_scale(e, layer, "layer", "scale", 0.0f, &m->scale))
        return -1;
    if (!m->sparse) {
        /* A dense layer ignores the index fields; the model still needs a
         * well-formed index shape, so use one that is valid for any Hkv. */
        m->Hi = m->Hkv;
        m->Di = m->D;
        m->block = 128;
        m->topk = 16;
        m->init_blocks = 0;
        m->local_blocks = 1;
        m->score = MSA_SCORE_MAX;
        m->index_value = 0;
        m->index_scale = 0.0f;
        return 0;
    }
    if (get_i32(e, layer, "layer", "Hi", 1, 0, 1, &m->Hi) ||
        get_i32(e, layer, "layer", "Di", 1, 0, 1, &m->Di) ||
        get_i32(e, layer, "layer", "block", 1, 0, 1, &m->block) ||
        get_i32(e, layer, "layer", "topk", 1, 0, 1, &m->topk) ||
        get_i32(e, layer, "layer", "init_blocks", 0, 0, 0, &m->init_blocks) ||
        get_i32(e, layer, "layer", "local_blocks", 0, 1, 1, &m->local_blocks) ||
        get_bool(e, layer, "layer", "index_value", 0, &m->index_value) ||
        get_scale(e, layer, "layer", "index_scale", 0.0f, &m->index_scale))
        return -1;
    const cJSON *score = cJSON_GetObjectItemCaseSensitive(layer, "score");
    if (!score || cJSON_IsNull(score) ||
        (cJSON_IsString(score) && strcmp(score->valuestring, "max") == 0))
        m->score = MSA_SCORE_MAX;
    else if (cJSON_IsString(score) && strcmp(score->valuestring, "lse") == 0)
        m->score = MSA_SCORE_LSE;
    else
        return fail(e, MSA_ERR_INVALID_ARGUMENT,
                    "meta.json: layer.score must be \"max\" or \"lse\"");
    return 0;
}

static int check_plane_dtype(meta_err *e, const char *key, msa_dtype d, msa_dtype act)
{
    if (d == act || d == MSA_DTYPE_FP8_E4M3 || d == MSA_DTYPE_NVFP4)
        return 0;
    return fail(e, MSA_ERR_INVALID_ARGUMENT,
                "meta.json: cache.%s is %s; it must be the activation dtype (%s), fp8_e4m3 "
                "or nvfp4",
                key, msa_dtype_name(d), msa_dtype_name(act));
}

static int parse_cache(meta_err *e, const cJSON *cache, replay_meta *m)
{
    static const char *const known[] = {"page_size",     "num_pages",     "dtype",
                                        "index_dtype",   "k_scale",       "v_scale",
                                        "index_k_scale", "index_v_scale", NULL};
    warn_unknown(e->warn, cache, "cache", known);
    if (get_i32(e, cache, "cache", "page_size", 1, 0, 1, &m->page_size) ||
        get_int(e, cache, "cache", "num_pages", 1, 0, 1, INT32_MAX, &m->num_pages) ||
        get_dtype(e, cache, "cache", "dtype", 0, m->act_dtype, &m->kv_dtype) ||
        get_dtype(e, cache, "cache", "index_dtype", 0, m->act_dtype, &m->index_dtype) ||
        get_scale(e, cache, "cache", "k_scale", 1.0f, &m->k_scale) ||
        get_scale(e, cache, "cache", "v_scale", 1.0f, &m->v_scale) ||
        get_scale(e, cache, "cache", "index_k_scale", 1.0f, &m->index_k_scale) ||
        get_scale(e, cache, "cache", "index_v_scale", 1.0f, &m->index_v_scale))
        return -1;
    if (check_plane_dtype(e, "dtype", m->kv_dtype, m->act_dtype) != 0)
        return -1;
    /* The index dtype of a dense layer is irrelevant (no index planes). */
    if (!m->sparse)
        m->index_dtype = m->act_dtype;
    return check_plane_dtype(e, "index_dtype", m->index_dtype, m->act_dtype);
}

static int parse_requests(meta_err *e, const cJSON *reqs, replay_meta *m)
{
    static const char *const known[] = {"q_len", "kv_len", "pages", NULL};
    if (!cJSON_IsArray(reqs))
        return fail(e, MSA_ERR_INVALID_ARGUMENT, "meta.json: \"requests\" must be an array");
    int n = cJSON_GetArraySize(reqs);
    m->num_requests = n;
    m->requests = calloc((size_t)(n > 0 ? n : 1), sizeof *m->requests);
    if (!m->requests)
        return fail(e, MSA_ERR_OUT_OF_MEMORY, "out of memory");
    m->max_pages = 1;
    int64_t sum_q = 0;
    int r = 0;
    for (const cJSON *it = reqs->child; it; it = it->next, r++) {
        replay_request *q = &m->requests[r];
        char where[48];
        snprintf(where, sizeof where, "requests[%d]", r);
        if (!cJSON_IsObject(it))
            return fail(e, MSA_ERR_INVALID_ARGUMENT, "meta.json: %s must be an object", where);
        warn_unknown(e->warn, it, where, known);
        if (get_i32(e, it, where, "q_len", 1, 0, 0, &q->q_len) ||
            get_i32(e, it, where, "kv_len", 1, 0, 0, &q->kv_len))
            return -1;
        if (q->q_len > q->kv_len)
            return fail(e, MSA_ERR_INVALID_ARGUMENT,
                        "meta.json: %s has q_len %d > kv_len %d (kv_len counts the new "
                        "tokens too)",
                        where, q->q_len, q->kv_len);
        sum_q += q->q_len;
        int64_t need = ((int64_t)q->kv_len + m->page_size - 1) / m->page_size;
        const cJSON *pages = cJSON_GetObjectItemCaseSensitive(it, "pages");
        if (!cJSON_IsArray(pages))
            return fail(e, MSA_ERR_INVALID_ARGUMENT, "meta.json: %s.pages must be an array", where);
        if (cJSON_GetArraySize(pages) != need)
            return fail(e, MSA_ERR_INVALID_ARGUMENT,
                        "meta.json: %s.pages has %d entries; kv_len %d with page_size %d "
                        "needs exactly %lld",
                        where, cJSON_GetArraySize(pages), q->kv_len, m->page_size, (long long)need);
        q->num_pages = (int32_t)need;
        q->pages = malloc((size_t)(need > 0 ? need : 1) * sizeof *q->pages);
        if (!q->pages)
            return fail(e, MSA_ERR_OUT_OF_MEMORY, "out of memory");
        int n_page = 0;
        for (const cJSON *p = pages->child; p; p = p->next, n_page++) {
            double v = p->valuedouble;
            if (!cJSON_IsNumber(p))
                return fail(e, MSA_ERR_INVALID_ARGUMENT,
                            "meta.json: %s.pages[%d] must be an integer, not %s", where, n_page,
                            json_kind(p));
            if (isfinite(v) && v != floor(v))
                return fail(e, MSA_ERR_INVALID_ARGUMENT,
                            "meta.json: %s.pages[%d] must be an integer (got %.17g)", where, n_page,
                            v);
            /* Checked here as well as in the library: the program promises to
             * refuse a bad step with a status, whatever the library does. */
            if (!(v >= 0 && v < (double)m->num_pages))
                return fail(e, MSA_ERR_OUT_OF_RANGE,
                            "meta.json: %s.pages[%d] = %.6g is outside the pool of %lld pages",
                            where, n_page, v, (long long)m->num_pages);
            q->pages[n_page] = (int32_t)v;
        }
        if (q->num_pages > m->max_pages)
            m->max_pages = q->num_pages;
    }
    if (m->tokens < sum_q)
        return fail(e, MSA_ERR_INVALID_ARGUMENT,
                    "meta.json: tokens = %lld is less than the sum of q_len (%lld)",
                    (long long)m->tokens, (long long)sum_q);
    return 0;
}

msa_status replay_meta_parse(const char *text, size_t len, replay_meta *m, char *msg,
                             size_t msg_size, FILE *warn)
{
    static const char *const known[] = {"layer",    "cache",       "act_dtype", "tokens",
                                        "requests", "write_cache", NULL};
    meta_err e = {MSA_OK, msg, msg_size, warn};
    memset(m, 0, sizeof *m);
    /* cJSON alone would take the first of two objects or of two equal keys
     * and cut strings at a NUL; the strict check refuses all of these. */
    char why[256];
    if (msa_json_check(text, len, why, sizeof why) != 0) {
        fail(&e, MSA_ERR_IO, "meta.json: not valid JSON: %s", why);
        return e.status;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        fail(&e, MSA_ERR_IO, "meta.json: the JSON parser refused the text");
        return e.status;
    }
    const cJSON *layer, *cache;
    int64_t tokens = 0;
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        fail(&e, MSA_ERR_INVALID_ARGUMENT, "meta.json: the top level must be an object");
        goto done;
    }
    warn_unknown(e.warn, root, "", known);
    if (!(layer = get_object(&e, root, "layer")) || parse_layer(&e, layer, m) != 0 ||
        get_dtype(&e, root, "", "act_dtype", 1, MSA_DTYPE_BF16, &m->act_dtype) != 0)
        goto done;
    if (m->act_dtype != MSA_DTYPE_FP32 && m->act_dtype != MSA_DTYPE_BF16 &&
        m->act_dtype != MSA_DTYPE_FP16) {
        fail(&e, MSA_ERR_INVALID_ARGUMENT, "meta.json: act_dtype must be fp32, bf16 or fp16");
        goto done;
    }
    if (!(cache = get_object(&e, root, "cache")) || parse_cache(&e, cache, m) != 0 ||
        get_int(&e, root, "", "tokens", 1, 0, 0, INT32_MAX, &tokens) != 0 ||
        get_bool(&e, root, "", "write_cache", 1, &m->write_cache) != 0)
        goto done;
    m->tokens = tokens;
    if (parse_requests(&e, cJSON_GetObjectItemCaseSensitive(root, "requests"), m) != 0)
        goto done;
    rc = 0;
done:
    cJSON_Delete(root);
    if (rc != 0) {
        replay_meta_free(m);
        return e.status;
    }
    return MSA_OK;
}

msa_status replay_meta_load(const char *path, replay_meta *m, char *msg, size_t msg_size)
{
    memset(m, 0, sizeof *m);
    size_t len = 0;
    /* A FIFO in the file's place is refused at once, never waited on. */
    char *text = msa_read_regular_file(path, (size_t)128 << 20, &len, msg, msg_size);
    if (!text)
        return MSA_ERR_IO;
    msa_status st = replay_meta_parse(text, len, m, msg, msg_size, stderr);
    free(text);
    return st;
}

void replay_meta_free(replay_meta *m)
{
    if (!m)
        return;
    for (int32_t r = 0; m->requests && r < m->num_requests; r++)
        free(m->requests[r].pages);
    free(m->requests);
    m->requests = NULL;
    m->num_requests = 0;
}
