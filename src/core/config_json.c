/* Hugging Face config.json loader (SPEC section 2), on cJSON. */
#include "core/internal.h"
#include "util/json_strict.h"

#ifdef MSA_HAVE_CJSON
#include <cjson/cJSON.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONFIG_BYTES (64u << 20)

#ifdef MSA_HAVE_CJSON
typedef struct loader {
    msa_context *ctx;
    const cJSON *top; /* text_config when present, else the root */
    const cJSON *root;
    const cJSON *sparse; /* sparse_attention_config or NULL */
} loader;

/* A key of the model: text_config first, then the top level. */
static const cJSON *model_key(const loader *ld, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(ld->top, key);
    if (!v && ld->top != ld->root)
        v = cJSON_GetObjectItemCaseSensitive(ld->root, key);
    return v;
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

/* The values each integer key may take.  The shape bounds are those that
 * msa_model_create enforces (model.c, SPEC section 2); checking them here
 * as well lets the message name the key and its range for any number in
 * the file, including ones that do not fit 32 bits. */
typedef struct key_range {
    const char *key;
    int64_t lo, hi;
} key_range;

static const key_range KEY_RANGES[] = {
    {"num_hidden_layers", 1, 100000},      {"num_attention_heads", 1, 4096},
    {"num_key_value_heads", 1, 4096},      {"head_dim", 1, 4096},
    {"hidden_size", 1, INT32_MAX},         {"sparse_num_index_heads", 1, 4096},
    {"sparse_index_dim", 1, 4096},         {"sparse_block_size", 1, 65536},
    {"sparse_topk_blocks", 1, 65536},      {"sparse_init_block", 0, 65535},
    {"sparse_local_block", 1, 65536},      {"sparse_init_tokens", 0, INT32_MAX},
    {"sparse_local_tokens", 0, INT32_MAX},
};

static void range_of(const char *key, int64_t *lo, int64_t *hi)
{
    *lo = INT32_MIN;
    *hi = INT32_MAX;
    for (size_t i = 0; i < sizeof KEY_RANGES / sizeof KEY_RANGES[0]; i++)
        if (strcmp(KEY_RANGES[i].key, key) == 0) {
            *lo = KEY_RANGES[i].lo;
            *hi = KEY_RANGES[i].hi;
        }
}

/* Reads an integer value; 1 = found, 0 = absent, -1 = error (message set).
 * The message tells apart a value that is no number, a number that is not
 * whole, and a whole number outside the key's range. */
static int read_int(const loader *ld, const cJSON *v, const char *key, int64_t *out)
{
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v)) {
        msa_set_error(ld->ctx, MSA_ERR_INVALID_CONFIG, "config key '%s' must be an integer, not %s",
                      key, json_kind(v));
        return -1;
    }
    const double d = v->valuedouble;
    int64_t lo, hi;
    range_of(key, &lo, &hi);
    if (isfinite(d) && d != floor(d)) {
        msa_set_error(ld->ctx, MSA_ERR_INVALID_CONFIG,
                      "config key '%s' must be an integer (got %.17g)", key, d);
        return -1;
    }
    /* Bounds within +-2^31 convert to double exactly, so the comparison is
     * exact; infinities (1e999) fall outside too. */
    if (!(d >= (double)lo && d <= (double)hi)) {
        char shown[40];
        if (!isfinite(d))
            snprintf(shown, sizeof shown, "%s",
                     d > 0 ? "a number too large for a double" : "a number too small for a double");
        else if (fabs(d) < 1e18)
            snprintf(shown, sizeof shown, "%.0f", d);
        else
            snprintf(shown, sizeof shown, "%.6g", d);
        msa_set_error(ld->ctx, MSA_ERR_INVALID_CONFIG,
                      "config key '%s' is out of range: %s is not in %lld..%lld", key, shown,
                      (long long)lo, (long long)hi);
        return -1;
    }
    *out = (int64_t)d;
    return 1;
}

static int model_int(const loader *ld, const char *key, int64_t *out)
{
    return read_int(ld, model_key(ld, key), key, out);
}

static int sparse_int(const loader *ld, const char *key, int64_t *out)
{
    return ld->sparse ? read_int(ld, cJSON_GetObjectItemCaseSensitive(ld->sparse, key), key, out)
                      : 0;
}

static msa_status clamp_int32(msa_context *ctx, const char *key, int64_t v, int32_t *out)
{
    if (v < -2147483647 || v > 2147483647)
        return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG,
                             "config key '%s' is out of range: %lld does not fit 32 bits", key,
                             (long long)v);
    *out = (int32_t)v;
    return MSA_OK;
}

/* Per-layer 0/1 list; absent leaves `out` untouched (caller pre-fills). */
static msa_status layer_list(const loader *ld, const char *key, int32_t n, uint8_t *out)
{
    const cJSON *v = ld->sparse ? cJSON_GetObjectItemCaseSensitive(ld->sparse, key) : NULL;
    if (!v || cJSON_IsNull(v))
        return MSA_OK;
    if (!cJSON_IsArray(v))
        return msa_set_error(ld->ctx, MSA_ERR_INVALID_CONFIG, "config key '%s' must be a list",
                             key);
    int len = cJSON_GetArraySize(v);
    if (len != n)
        return msa_set_error(ld->ctx, MSA_ERR_INVALID_CONFIG,
                             "config key '%s' has %d entries, expected num_hidden_layers = %d", key,
                             len, n);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v)
    {
        double d;
        if (cJSON_IsBool(e))
            d = cJSON_IsTrue(e) ? 1.0 : 0.0;
        else if (cJSON_IsNumber(e))
            d = e->valuedouble;
        else
            d = -1.0;
        if (d != 0.0 && d != 1.0)
            return msa_set_error(ld->ctx, MSA_ERR_INVALID_CONFIG,
                                 "config key '%s'[%d] must be 0 or 1", key, i);
        out[i++] = (uint8_t)d;
    }
    return MSA_OK;
}

/* Blocks from the `_block` key, else from `_tokens` (ceil(tokens/B) + extra). */
static msa_status block_count(const loader *ld, const char *block_key, const char *tokens_key,
                              int32_t block_size, int32_t extra, int32_t dflt, int32_t *out)
{
    int64_t v;
    int r = sparse_int(ld, block_key, &v);
    if (r < 0)
        return MSA_ERR_INVALID_CONFIG;
    if (r == 1)
        return clamp_int32(ld->ctx, block_key, v, out);
    r = sparse_int(ld, tokens_key, &v);
    if (r < 0)
        return MSA_ERR_INVALID_CONFIG;
    if (r == 0) {
        *out = dflt;
        return MSA_OK;
    }
    if (block_size < 1)
        return msa_set_error(ld->ctx, MSA_ERR_INVALID_CONFIG, "sparse_block_size must be positive");
    return clamp_int32(ld->ctx, tokens_key, (v + block_size - 1) / block_size + extra, out);
}

static msa_status required_int(const loader *ld, const char *key, int sparse, int32_t *out)
{
    int64_t v;
    int r = sparse ? sparse_int(ld, key, &v) : model_int(ld, key, &v);
    if (r < 0)
        return MSA_ERR_INVALID_CONFIG;
    if (r == 0)
        return msa_set_error(ld->ctx, MSA_ERR_INVALID_CONFIG, "config key '%s' is missing", key);
    return clamp_int32(ld->ctx, key, v, out);
}

static msa_status parse(loader *ld, msa_model **out)
{
    msa_context *ctx = ld->ctx;
    msa_model_config cfg;
    msa_model_config_default(&cfg);
    msa_status st;
    int64_t v;
    int r;

    if ((st = required_int(ld, "num_attention_heads", 0, &cfg.num_q_heads)) != MSA_OK)
        return st;
    if ((st = required_int(ld, "num_hidden_layers", 0, &cfg.num_layers)) != MSA_OK)
        return st;
    /* Hugging Face defaults: no KV-head count means MHA, no head_dim means
     * hidden_size / heads. */
    if ((r = model_int(ld, "num_key_value_heads", &v)) < 0)
        return MSA_ERR_INVALID_CONFIG;
    if ((st = clamp_int32(ctx, "num_key_value_heads", r ? v : cfg.num_q_heads,
                          &cfg.num_kv_heads)) != MSA_OK)
        return st;
    if ((r = model_int(ld, "head_dim", &v)) < 0)
        return MSA_ERR_INVALID_CONFIG;
    if (r == 0) {
        int64_t hidden;
        int rh = model_int(ld, "hidden_size", &hidden);
        if (rh < 0)
            return MSA_ERR_INVALID_CONFIG;
        if (rh == 0)
            return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG,
                                 "config has neither 'head_dim' nor 'hidden_size'");
        if (cfg.num_q_heads <= 0 || hidden % cfg.num_q_heads != 0)
            return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG,
                                 "hidden_size is not a multiple of num_attention_heads");
        v = hidden / cfg.num_q_heads;
    }
    if ((st = clamp_int32(ctx, "head_dim", v, &cfg.head_dim)) != MSA_OK)
        return st;
    if (cfg.num_layers < 1 || cfg.num_layers > 100000)
        return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG, "num_hidden_layers must be in 1..100000");

    uint8_t *sparse = malloc((size_t)cfg.num_layers);
    uint8_t *ivalue = malloc((size_t)cfg.num_layers);
    if (!sparse || !ivalue) {
        free(sparse);
        free(ivalue);
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "out of memory");
    }

    if (!ld->sparse) {
        /* No sparse config: every layer dense; index shapes are unused but
         * must still form a valid configuration. */
        memset(sparse, 0, (size_t)cfg.num_layers);
        memset(ivalue, 0, (size_t)cfg.num_layers);
        cfg.num_index_heads = cfg.num_kv_heads;
        cfg.index_dim = cfg.head_dim;
    } else {
        /* Defaults: every layer sparse; index value disabled everywhere. */
        memset(sparse, 1, (size_t)cfg.num_layers);
        memset(ivalue, 1, (size_t)cfg.num_layers);
        if ((st = required_int(ld, "sparse_num_index_heads", 1, &cfg.num_index_heads)) != MSA_OK ||
            (st = required_int(ld, "sparse_index_dim", 1, &cfg.index_dim)) != MSA_OK ||
            (st = required_int(ld, "sparse_block_size", 1, &cfg.block_size)) != MSA_OK ||
            (st = required_int(ld, "sparse_topk_blocks", 1, &cfg.topk_blocks)) != MSA_OK ||
            (st = block_count(ld, "sparse_init_block", "sparse_init_tokens", cfg.block_size, 0, 0,
                              &cfg.init_blocks)) != MSA_OK ||
            (st = block_count(ld, "sparse_local_block", "sparse_local_tokens", cfg.block_size, 1, 1,
                              &cfg.local_blocks)) != MSA_OK ||
            (st = layer_list(ld, "sparse_attention_freq", cfg.num_layers, sparse)) != MSA_OK ||
            (st = layer_list(ld, "sparse_disable_index_value", cfg.num_layers, ivalue)) != MSA_OK)
            goto fail;
        /* The config says "disable"; the model stores "keeps". */
        for (int32_t l = 0; l < cfg.num_layers; l++)
            ivalue[l] = (uint8_t)!ivalue[l];
        const cJSON *score = cJSON_GetObjectItemCaseSensitive(ld->sparse, "sparse_score_type");
        if (score && !cJSON_IsNull(score)) {
            if (cJSON_IsString(score) && strcmp(score->valuestring, "max") == 0)
                cfg.score_type = MSA_SCORE_MAX;
            else if (cJSON_IsString(score) && strcmp(score->valuestring, "lse") == 0)
                cfg.score_type = MSA_SCORE_LSE;
            else {
                st = msa_set_error(ctx, MSA_ERR_INVALID_CONFIG,
                                   "sparse_score_type must be \"max\" or \"lse\"");
                goto fail;
            }
        }
    }
    cfg.layer_sparse = sparse;
    cfg.layer_index_value = ivalue;
    st = msa_model_create(ctx, &cfg, out);
fail:
    free(sparse);
    free(ivalue);
    return st;
}

msa_status msa_model_load_config_json(msa_context *ctx, const char *json, size_t len,
                                      msa_model **out)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!json || !out)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "msa_model_load_config_json: NULL argument");
    *out = NULL;
    /* cJSON alone would take the first of two objects, the first of two
     * equal keys and strings cut at a NUL: the strict check refuses what
     * other readers of the file could read differently. */
    char why[256];
    if (msa_json_check(json, len, why, sizeof why) != 0)
        return msa_set_error(ctx, MSA_ERR_IO, "config is not valid JSON: %s", why);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root)
        return msa_set_error(ctx, MSA_ERR_IO,
                             "config: the JSON parser refused the text (out of memory, or a "
                             "number longer than it reads)");
    msa_status st;
    if (!cJSON_IsObject(root)) {
        st = msa_set_error(ctx, MSA_ERR_INVALID_CONFIG, "config must be a JSON object, not %s",
                           json_kind(root));
    } else {
        loader ld = {ctx, root, root, NULL};
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
        if (text && !cJSON_IsNull(text) && !cJSON_IsObject(text)) {
            cJSON_Delete(root);
            return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG,
                                 "config key 'text_config' must be an object, not %s",
                                 json_kind(text));
        }
        if (cJSON_IsObject(text))
            ld.top = text;
        const cJSON *sp = model_key(&ld, "sparse_attention_config");
        if (sp && !cJSON_IsNull(sp)) {
            if (!cJSON_IsObject(sp)) {
                cJSON_Delete(root);
                return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG,
                                     "config key 'sparse_attention_config' must be an object, "
                                     "not %s",
                                     json_kind(sp));
            }
            ld.sparse = sp;
        }
        st = parse(&ld, out);
    }
    cJSON_Delete(root);
    return st;
}
#else
/* A build without cJSON (a cross build for a target without it) has no
 * JSON reader: the loader refuses every text and writes nothing. */
msa_status msa_model_load_config_json(msa_context *ctx, const char *json, size_t len,
                                      msa_model **out)
{
    (void)len;
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!json || !out)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "msa_model_load_config_json: NULL argument");
    *out = NULL;
    return msa_set_error(ctx, MSA_ERR_UNSUPPORTED,
                         "this build of libmsa has no JSON reader (built without cJSON)");
}
#endif

msa_status msa_model_load_config_file(msa_context *ctx, const char *path, msa_model **out)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!path || !out)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "msa_model_load_config_file: NULL argument");
    *out = NULL;
    /* A FIFO or device in the file's place is refused, never waited on. */
    char why[512];
    size_t len = 0;
    char *buf = msa_read_regular_file(path, MAX_CONFIG_BYTES, &len, why, sizeof why);
    if (!buf)
        return msa_set_error(ctx, MSA_ERR_IO, "config file %s", why);
    msa_status st = msa_model_load_config_json(ctx, buf, len, out);
    free(buf);
    return st;
}
