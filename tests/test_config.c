/*
 * Configuration (SPEC 2): the config.json loader on M3-like fixtures and on
 * generated variants, defaults for missing keys, the tokens-to-blocks rule,
 * and every invalid configuration rejected with MSA_ERR_INVALID_CONFIG,
 * through both the loader and msa_model_create; text that is not strict
 * JSON (trailing text, a second object, NUL bytes, invalid UTF-8, duplicate
 * keys), a FIFO in place of the file, and the wording of number messages.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "util/json_strict.h"
#include "msa/msa.h"

#ifndef MSA_FIXTURE_DIR
#define MSA_FIXTURE_DIR "tests/fixtures"
#endif

static msa_context *ctx;

/* ---- generated configs ------------------------------------------------- */

typedef struct kv {
    const char *key, *val;
} kv;

/* A small valid model; tests override single keys. */
static const kv BASE_TOP[] = {{"num_hidden_layers", "4"},
                              {"num_attention_heads", "8"},
                              {"num_key_value_heads", "2"},
                              {"head_dim", "32"}};
static const kv BASE_SPARSE[] = {{"sparse_num_index_heads", "2"},
                                 {"sparse_index_dim", "32"},
                                 {"sparse_block_size", "64"},
                                 {"sparse_topk_blocks", "8"}};

static const char *override_of(const char *key, va_list ap, int *found)
{
    va_list aq;
    va_copy(aq, ap);
    const char *val = NULL;
    *found = 0;
    for (const char *k = va_arg(aq, const char *); k; k = va_arg(aq, const char *)) {
        const char *v = va_arg(aq, const char *);
        if (!strcmp(k, key)) {
            *found = 1;
            val = v;
        }
    }
    va_end(aq);
    return val;
}

static int is_base_key(const char *key)
{
    for (size_t i = 0; i < 4; i++)
        if (!strcmp(key, BASE_TOP[i].key) || !strcmp(key, BASE_SPARSE[i].key))
            return 1;
    return 0;
}

/* Builds the JSON of the base model with (key, value) overrides ended by
 * NULL.  A NULL value removes the key; "sparse_attention_config" NULL
 * removes the whole section.  Extra "sparse_*" keys go to that section,
 * others to the top level. */
static void build_json(char *out, size_t size, va_list ap)
{
    size_t n = (size_t)snprintf(out, size, "{");
    int found;
    for (size_t i = 0; i < 4; i++) {
        const char *v = override_of(BASE_TOP[i].key, ap, &found);
        if (!found)
            v = BASE_TOP[i].val;
        if (v)
            n += (size_t)snprintf(out + n, size - n, "\"%s\": %s, ", BASE_TOP[i].key, v);
    }
    va_list aq;
    va_copy(aq, ap);
    for (const char *k = va_arg(aq, const char *); k; k = va_arg(aq, const char *)) {
        const char *v = va_arg(aq, const char *);
        if (v && strncmp(k, "sparse_", 7) && !is_base_key(k))
            n += (size_t)snprintf(out + n, size - n, "\"%s\": %s, ", k, v);
    }
    va_end(aq);
    override_of("sparse_attention_config", ap, &found);
    if (!found) {
        n += (size_t)snprintf(out + n, size - n, "\"sparse_attention_config\": {");
        const char *sep = "";
        for (size_t i = 0; i < 4; i++) {
            const char *v = override_of(BASE_SPARSE[i].key, ap, &found);
            if (!found)
                v = BASE_SPARSE[i].val;
            if (v) {
                n +=
                    (size_t)snprintf(out + n, size - n, "%s\"%s\": %s", sep, BASE_SPARSE[i].key, v);
                sep = ", ";
            }
        }
        va_copy(aq, ap);
        for (const char *k = va_arg(aq, const char *); k; k = va_arg(aq, const char *)) {
            const char *v = va_arg(aq, const char *);
            if (v && !strncmp(k, "sparse_", 7) && !is_base_key(k) &&
                strcmp(k, "sparse_attention_config")) {
                n += (size_t)snprintf(out + n, size - n, "%s\"%s\": %s", sep, k, v);
                sep = ", ";
            }
        }
        va_end(aq);
        n += (size_t)snprintf(out + n, size - n, "}, ");
    }
    snprintf(out + n, size - n, "\"model_type\": \"test\"}");
}

/* Loads the base model with overrides; returns the status, *out the model. */
static msa_status load(msa_model **out, ...)
{
    char json[4096];
    va_list ap;
    va_start(ap, out);
    build_json(json, sizeof json, ap);
    va_end(ap);
    *out = NULL;
    return msa_model_load_config_json(ctx, json, strlen(json), out);
}

/* ---- helpers ------------------------------------------------------------ */

static msa_model_config config_of(const msa_model *m)
{
    msa_model_config c;
    memset(&c, 0, sizeof c);
    msa_model_get_config(m, &c);
    return c;
}

static int count_sparse(const msa_model *m, int layers)
{
    int n = 0;
    for (int l = 0; l < layers; l++)
        n += msa_model_layer_is_sparse(m, l);
    return n;
}

static int count_value(const msa_model *m, int layers)
{
    int n = 0;
    for (int l = 0; l < layers; l++)
        n += msa_model_layer_has_index_value(m, l);
    return n;
}

static void check_m3(const msa_model *m, const char *what, int I, int Lc)
{
    msa_model_config c = config_of(m);
    CHECK(c.num_layers == 60 && c.num_q_heads == 64 && c.num_kv_heads == 4 && c.head_dim == 128,
          "%s: main shape", what);
    CHECK(c.num_index_heads == 4 && c.index_dim == 128 && c.block_size == 128 &&
              c.topk_blocks == 16,
          "%s: index shape", what);
    CHECK(c.init_blocks == I && c.local_blocks == Lc, "%s: I %d Lc %d", what, c.init_blocks,
          c.local_blocks);
    CHECK(c.score_type == MSA_SCORE_MAX, "%s: score max", what);
    CHECK(!msa_model_layer_is_sparse(m, 0) && !msa_model_layer_is_sparse(m, 2) &&
              msa_model_layer_is_sparse(m, 3) && msa_model_layer_is_sparse(m, 59) &&
              count_sparse(m, 60) == 57,
          "%s: layers 3..59 sparse", what);
    CHECK(count_value(m, 60) == 0, "%s: no index value anywhere", what);
    CHECK(msa_model_topk_width(m) == 16, "%s: width", what);
    CHECK(c.softmax_scale == (float)(1.0 / sqrt(128.0)) &&
              c.index_softmax_scale == (float)(1.0 / sqrt(128.0)),
          "%s: default scales", what);
}

/* ---- fixtures ------------------------------------------------------------ */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    *len = fread(buf, 1, (size_t)n, f);
    buf[*len] = 0;
    fclose(f);
    return buf;
}

static void test_fixtures(void)
{
    msa_model *m = NULL;
    const char *m3 = MSA_FIXTURE_DIR "/m3_config.json";
    CHECK(msa_model_load_config_file(ctx, m3, &m) == MSA_OK && m, "M3 fixture: %s",
          msa_context_last_error(ctx));
    if (m)
        check_m3(m, "m3_config.json", 0, 1);
    msa_model_free(m);

    /* The same bytes through the in-memory loader. */
    size_t len = 0;
    char *text = read_file(m3, &len);
    CHECK(text != NULL, "read %s", m3);
    if (text) {
        m = NULL;
        /* Not NUL-terminated at len: the loader must honour the length. */
        text[len] = '}';
        CHECK(msa_model_load_config_json(ctx, text, len, &m) == MSA_OK && m, "json loader");
        if (m)
            check_m3(m, "m3 json", 0, 1);
        msa_model_free(m);
        /* Half a file is malformed. */
        m = NULL;
        msa_status st = msa_model_load_config_json(ctx, text, len / 2, &m);
        CHECK((st == MSA_ERR_IO || st == MSA_ERR_INVALID_CONFIG) && !m, "truncated file: %s",
              msa_status_name(st));
        free(text);
    }

    /* Keys under text_config, init/local given in tokens: 200 -> 2, 128 -> 2. */
    m = NULL;
    CHECK(msa_model_load_config_file(ctx, MSA_FIXTURE_DIR "/m3_text_config.json", &m) == MSA_OK &&
              m,
          "text_config fixture: %s", msa_context_last_error(ctx));
    if (m)
        check_m3(m, "m3_text_config.json", 2, 2);
    msa_model_free(m);

    /* lse, init block 1, local 100 tokens of 64 -> 3, index value on 1 and 3. */
    m = NULL;
    CHECK(msa_model_load_config_file(ctx, MSA_FIXTURE_DIR "/small_mixed_value.json", &m) ==
                  MSA_OK &&
              m,
          "small fixture: %s", msa_context_last_error(ctx));
    if (m) {
        msa_model_config c = config_of(m);
        CHECK(c.score_type == MSA_SCORE_LSE && c.init_blocks == 1 && c.local_blocks == 3,
              "small: lse I=1 Lc=3 (got %d %d)", c.init_blocks, c.local_blocks);
        CHECK(!msa_model_layer_is_sparse(m, 0) && count_sparse(m, 4) == 3, "small: sparse flags");
        CHECK(!msa_model_layer_has_index_value(m, 0) && msa_model_layer_has_index_value(m, 1) &&
                  !msa_model_layer_has_index_value(m, 2) && msa_model_layer_has_index_value(m, 3),
              "small: index value flags");
    }
    msa_model_free(m);
}

/* ---- rules of SPEC 2 ----------------------------------------------------- */

static void test_tokens_to_blocks(void)
{
    static const struct {
        const char *tokens;
        int blocks;
    } init[] = {{"0", 0}, {"1", 1}, {"64", 1}, {"65", 2}, {"200", 4}},
      local[] = {{"0", 1}, {"1", 2}, {"64", 2}, {"65", 3}, {"128", 3}};
    for (size_t i = 0; i < 5; i++) {
        msa_model *m;
        msa_status st = load(&m, "sparse_init_tokens", init[i].tokens, NULL);
        CHECK(st == MSA_OK && m && config_of(m).init_blocks == init[i].blocks,
              "init_tokens %s -> %d blocks (%s)", init[i].tokens, init[i].blocks,
              msa_status_name(st));
        msa_model_free(m);
        st = load(&m, "sparse_local_tokens", local[i].tokens, NULL);
        CHECK(st == MSA_OK && m && config_of(m).local_blocks == local[i].blocks,
              "local_tokens %s -> %d blocks (%s)", local[i].tokens, local[i].blocks,
              msa_status_name(st));
        msa_model_free(m);
    }
    /* _block wins over _tokens, even where the tokens would be invalid. */
    msa_model *m;
    msa_status st = load(&m, "sparse_init_block", "1", "sparse_init_tokens", "5000",
                         "sparse_local_block", "2", "sparse_local_tokens", "5000", NULL);
    CHECK(st == MSA_OK && m && config_of(m).init_blocks == 1 && config_of(m).local_blocks == 2,
          "_block wins (%s)", msa_status_name(st));
    msa_model_free(m);
}

static void test_defaults(void)
{
    msa_model *m;
    /* No sparse section: every layer dense. */
    CHECK(load(&m, "sparse_attention_config", NULL, NULL) == MSA_OK && m && count_sparse(m, 4) == 0,
          "no sparse_attention_config: all dense");
    msa_model_free(m);

    /* Sparse section without lists / init / local / score. */
    CHECK(load(&m, NULL) == MSA_OK && m, "base config: %s", msa_context_last_error(ctx));
    if (m) {
        msa_model_config c = config_of(m);
        CHECK(count_sparse(m, 4) == 4, "missing freq: all sparse");
        CHECK(count_value(m, 4) == 0, "missing disable list: no index value");
        CHECK(c.init_blocks == 0 && c.local_blocks == 1, "missing init/local: 0 / 1");
        CHECK(c.score_type == MSA_SCORE_MAX, "missing score: max");
        CHECK(c.num_layers == 4 && c.num_q_heads == 8 && c.num_kv_heads == 2 && c.head_dim == 32 &&
                  c.num_index_heads == 2 && c.index_dim == 32 && c.block_size == 64 &&
                  c.topk_blocks == 8,
              "values read");
    }
    msa_model_free(m);

    CHECK(load(&m, "sparse_attention_freq", "[1, 0, 1, 0]", "sparse_disable_index_value",
               "[0, 0, 1, 1]", "sparse_score_type", "\"lse\"", NULL) == MSA_OK &&
              m,
          "lists and lse");
    if (m) {
        CHECK(msa_model_layer_is_sparse(m, 0) && !msa_model_layer_is_sparse(m, 1) &&
                  msa_model_layer_is_sparse(m, 2) && !msa_model_layer_is_sparse(m, 3),
              "freq list");
        CHECK(msa_model_layer_has_index_value(m, 0) && count_value(m, 4) == 1,
              "disable list: only layer 0 keeps its value");
        CHECK(config_of(m).score_type == MSA_SCORE_LSE, "lse");
    }
    msa_model_free(m);

    /* Unrelated keys are ignored; heads may be unions or splits. */
    CHECK(load(&m, "rope_theta", "1e7", "sparse_num_index_heads", "4", "quantization_config",
               "{\"quant_method\": \"fp8\"}", NULL) == MSA_OK &&
              m && msa_model_topk_width(m) == 16,
          "Hi = 2 Hkv with extra keys");
    msa_model_free(m);
    CHECK(load(&m, "sparse_num_index_heads", "1", NULL) == MSA_OK && m, "Hkv = 2 Hi");
    msa_model_free(m);
}

static void expect_invalid(const char *what, msa_status st, msa_model *m)
{
    CHECK(st == MSA_ERR_INVALID_CONFIG, "%s: got %s, want MSA_ERR_INVALID_CONFIG", what,
          msa_status_name(st));
    CHECK(m == NULL, "%s: no model on failure", what);
    CHECK(msa_context_last_error(ctx)[0] != 0, "%s: message", what);
    msa_model_free(m);
}

static void test_invalid(void)
{
    msa_model *m;
    msa_status st;
#define INVALID(what, ...)                \
    do {                                  \
        st = load(&m, __VA_ARGS__, NULL); \
        expect_invalid(what, st, m);      \
    } while (0)
    INVALID("Hq % Hkv", "num_attention_heads", "7");
    INVALID("I + Lc > K", "sparse_init_block", "5", "sparse_local_block", "4");
    INVALID("I + Lc > K via tokens", "sparse_local_tokens", "600");
    INVALID("Lc < 1", "sparse_local_block", "0");
    INVALID("Hi, Hkv coprime", "sparse_num_index_heads", "3");
    INVALID("Hi, Hkv not dividing", "num_attention_heads", "12", "num_key_value_heads", "6",
            "sparse_num_index_heads", "4");
    INVALID("unknown score", "sparse_score_type", "\"mean\"");
    INVALID("score not a string", "sparse_score_type", "3");
    INVALID("freq too short", "sparse_attention_freq", "[1, 1, 1]");
    INVALID("freq too long", "sparse_attention_freq", "[1, 1, 1, 1, 1]");
    INVALID("disable list too short", "sparse_disable_index_value", "[0]");
    INVALID("negative init", "sparse_init_block", "-1");
    INVALID("negative init tokens", "sparse_init_tokens", "-5");
    INVALID("negative local tokens", "sparse_local_tokens", "-1");
    static const char *const sizes[] = {"num_hidden_layers",      "num_attention_heads",
                                        "num_key_value_heads",    "head_dim",
                                        "sparse_num_index_heads", "sparse_index_dim",
                                        "sparse_block_size",      "sparse_topk_blocks"};
    for (size_t i = 0; i < 8; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s = 0", sizes[i]);
        INVALID(what, sizes[i], "0");
        snprintf(what, sizeof what, "%s = -2", sizes[i]);
        INVALID(what, sizes[i], "-2");
    }
#undef INVALID

    /* The same rules through msa_model_create. */
    static const struct {
        const char *what;
        int Hq, Hkv, Hi, I, Lc, K, B, D, Di, layers;
    } bad[] = {
        {"create: Hq % Hkv", 6, 4, 4, 0, 1, 16, 128, 128, 128, 1},
        {"create: I + Lc > K", 64, 4, 4, 10, 7, 16, 128, 128, 128, 1},
        {"create: Lc < 1", 64, 4, 4, 0, 0, 16, 128, 128, 128, 1},
        {"create: Hi, Hkv", 64, 4, 6, 0, 1, 16, 128, 128, 128, 1},
        {"create: K = 0", 64, 4, 4, 0, 1, 0, 128, 128, 128, 1},
        {"create: B = 0", 64, 4, 4, 0, 1, 16, 0, 128, 128, 1},
        {"create: D = 0", 64, 4, 4, 0, 1, 16, 128, 0, 128, 1},
        {"create: Di < 0", 64, 4, 4, 0, 1, 16, 128, 128, -1, 1},
        {"create: layers = 0", 64, 4, 4, 0, 1, 16, 128, 128, 128, 0},
        {"create: Hkv = 0", 64, 0, 4, 0, 1, 16, 128, 128, 128, 1},
        {"create: I < 0", 64, 4, 4, -1, 1, 16, 128, 128, 128, 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msa_model_config c;
        msa_model_config_default(&c);
        c.num_q_heads = bad[i].Hq;
        c.num_kv_heads = bad[i].Hkv;
        c.num_index_heads = bad[i].Hi;
        c.init_blocks = bad[i].I;
        c.local_blocks = bad[i].Lc;
        c.topk_blocks = bad[i].K;
        c.block_size = bad[i].B;
        c.head_dim = bad[i].D;
        c.index_dim = bad[i].Di;
        c.num_layers = bad[i].layers;
        m = NULL;
        expect_invalid(bad[i].what, msa_model_create(ctx, &c, &m), m);
    }
    msa_model_config c;
    msa_model_config_default(&c);
    c.score_type = (msa_score_type)7;
    m = NULL;
    expect_invalid("create: score type 7", msa_model_create(ctx, &c, &m), m);
    c.score_type = MSA_SCORE_MAX;
    c.softmax_scale = -1.0f;
    m = NULL;
    st = msa_model_create(ctx, &c, &m);
    CHECK(st != MSA_OK && !m, "create: negative softmax scale rejected (%s)", msa_status_name(st));
    msa_model_free(m);
    c.softmax_scale = NAN;
    m = NULL;
    st = msa_model_create(ctx, &c, &m);
    CHECK(st != MSA_OK && !m, "create: NaN softmax scale rejected (%s)", msa_status_name(st));
    msa_model_free(m);
}

static void test_malformed(void)
{
    static const char *const texts[] = {
        "",
        "{",
        "}",
        "[]",
        "null",
        "42",
        "\"text\"",
        "{\"num_hidden_layers\": }",
        "{\"num_attention_heads\": \"64\", \"num_key_value_heads\": 4, \"head_dim\": 128, "
        "\"num_hidden_layers\": 1}",
        "{\"num_attention_heads\": 64.5, \"num_key_value_heads\": 4, \"head_dim\": 128, "
        "\"num_hidden_layers\": 1}",
        "{}",
        "{\"text_config\": 5}",
        "{\"num_attention_heads\": 64, \"num_key_value_heads\": 4, \"head_dim\": 128, "
        "\"num_hidden_layers\": 2, \"sparse_attention_config\": [1, 2]}",
        "{\"num_attention_heads\": 64, \"num_key_value_heads\": 4, \"head_dim\": 128, "
        "\"num_hidden_layers\": 2, \"sparse_attention_config\": {\"sparse_attention_freq\": 1}}",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        msa_model *m = NULL;
        msa_status st = msa_model_load_config_json(ctx, texts[i], strlen(texts[i]), &m);
        CHECK((st == MSA_ERR_IO || st == MSA_ERR_INVALID_CONFIG) && !m,
              "malformed #%zu '%.40s': %s", i, texts[i], msa_status_name(st));
        CHECK(msa_context_last_error(ctx)[0] != 0, "malformed #%zu: message", i);
        msa_model_free(m);
    }

    msa_model *m = NULL;
    msa_status st = msa_model_load_config_file(ctx, MSA_FIXTURE_DIR "/does_not_exist.json", &m);
    CHECK(st == MSA_ERR_IO && !m, "missing file: %s", msa_status_name(st));
    CHECK(msa_context_last_error(ctx)[0] != 0, "missing file: message");
    st = msa_model_load_config_file(ctx, MSA_FIXTURE_DIR, &m);
    CHECK(st == MSA_ERR_IO && !m, "directory: %s", msa_status_name(st));

    CHECK(msa_model_load_config_file(ctx, NULL, &m) == MSA_ERR_INVALID_ARGUMENT, "NULL path");
    CHECK(msa_model_load_config_json(ctx, NULL, 5, &m) == MSA_ERR_INVALID_ARGUMENT, "NULL json");
    CHECK(msa_model_load_config_json(ctx, "{}", 2, NULL) == MSA_ERR_INVALID_ARGUMENT, "NULL out");
    CHECK(msa_model_create(ctx, NULL, &m) == MSA_ERR_INVALID_ARGUMENT, "NULL config");
}

/* ---- strict JSON --------------------------------------------------------- */

/* A valid config whose top level is `top` (spliced in first) and whose
 * text_config holds `text`. */
#define CFG_TOP \
    "\"num_hidden_layers\": 4, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 32"

static int has(const char *s, const char *sub)
{
    return strstr(s, sub) != NULL;
}

/* Loads text[0..len) and checks the status and that the message holds every
 * substring given (NULL-ended). */
static void expect_refused(const char *what, const char *text, size_t len, msa_status want, ...)
{
    msa_model *m = NULL;
    msa_status st = msa_model_load_config_json(ctx, text, len, &m);
    CHECK(st == want && !m, "%s: got %s, want %s", what, msa_status_name(st),
          msa_status_name(want));
    const char *msg = msa_context_last_error(ctx);
    va_list ap;
    va_start(ap, want);
    for (const char *sub = va_arg(ap, const char *); sub; sub = va_arg(ap, const char *))
        CHECK(has(msg, sub), "%s: message '%s' lacks '%s'", what, msg, sub);
    va_end(ap);
    msa_model_free(m);
}

#define REFUSED(what, lit, st, ...) \
    expect_refused(what, lit, sizeof(lit) - 1, st, __VA_ARGS__, NULL)

static void test_strict_json(void)
{
    static const char good[] = "{" CFG_TOP "}";
    msa_model *m = NULL;
    CHECK(msa_model_load_config_json(ctx, good, sizeof good - 1, &m) == MSA_OK && m,
          "base of the strict cases loads: %s", msa_context_last_error(ctx));
    msa_model_free(m);

    REFUSED("trailing garbage", "{" CFG_TOP "} x", MSA_ERR_IO, "unexpected text after the value",
            "byte offset");
    REFUSED("trailing comma-less garbage", "{" CFG_TOP "}}", MSA_ERR_IO,
            "unexpected text after the value");
    REFUSED("second object", "{" CFG_TOP "}\n{\"num_attention_heads\": 4}", MSA_ERR_IO,
            "unexpected text after the value");
    REFUSED("NUL byte in a string", "{" CFG_TOP ", \"model_type\": \"a\0b\"}", MSA_ERR_IO,
            "NUL byte inside a string", "byte offset 109");
    REFUSED("NUL byte in a key", "{" CFG_TOP ", \"head_dim\0x\": 3}", MSA_ERR_IO, "NUL byte");
    REFUSED("NUL byte after the value", "{" CFG_TOP "}\0", MSA_ERR_IO, "NUL byte after the value");
    REFUSED("escaped NUL", "{" CFG_TOP ", \"model_type\": \"a\\u0000b\"}", MSA_ERR_IO,
            "escaped NUL");
    REFUSED("overlong UTF-8", "{" CFG_TOP ", \"model_type\": \"\xC0\xAF\"}", MSA_ERR_IO,
            "invalid UTF-8", "overlong");
    REFUSED("overlong 3-byte UTF-8", "{" CFG_TOP ", \"model_type\": \"\xE0\x80\xAF\"}", MSA_ERR_IO,
            "invalid UTF-8", "overlong");
    REFUSED("lone continuation byte", "{" CFG_TOP ", \"model_type\": \"a\x80z\"}", MSA_ERR_IO,
            "invalid UTF-8", "continuation byte");
    REFUSED("surrogate in UTF-8", "{" CFG_TOP ", \"model_type\": \"\xED\xA0\x80\"}", MSA_ERR_IO,
            "invalid UTF-8", "surrogate");
    REFUSED("above U+10FFFF", "{" CFG_TOP ", \"model_type\": \"\xF4\x90\x80\x80\"}", MSA_ERR_IO,
            "invalid UTF-8", "above U+10FFFF");
    REFUSED("truncated sequence", "{" CFG_TOP ", \"model_type\": \"\xE2\x82\"}", MSA_ERR_IO,
            "invalid UTF-8", "truncated");
    REFUSED("lone surrogate escape", "{" CFG_TOP ", \"model_type\": \"\\ud800\"}", MSA_ERR_IO,
            "unpaired surrogate");
    REFUSED("duplicate key at the top level", "{" CFG_TOP ", \"num_attention_heads\": 16}",
            MSA_ERR_IO, "duplicate key \"num_attention_heads\"", "at the top level", "byte offset");
    /* Only empty keys: the checker stores no key bytes at all (a fuzzer
     * found the sanitizers' complaint on this input). */
    REFUSED("duplicate empty keys", "{\"\" :8, \"\": [2]}", MSA_ERR_IO, "duplicate key \"\"");
    REFUSED("duplicate key through an escape", "{" CFG_TOP ", \"head_di\\u006d\": 16}", MSA_ERR_IO,
            "duplicate key \"head_dim\"");
    REFUSED("duplicate key in text_config", "{\"text_config\": {" CFG_TOP ", \"head_dim\": 64}}",
            MSA_ERR_IO, "duplicate key \"head_dim\"", "in \"text_config\"");
    REFUSED("duplicate key in sparse_attention_config",
            "{" CFG_TOP ", \"sparse_attention_config\": {\"sparse_block_size\": 64, "
            "\"sparse_block_size\": 32}}",
            MSA_ERR_IO, "duplicate key \"sparse_block_size\"", "in \"sparse_attention_config\"");
    REFUSED("duplicate text_config", "{\"text_config\": {" CFG_TOP "}, \"text_config\": {}}",
            MSA_ERR_IO, "duplicate key \"text_config\"");
    REFUSED("text_config a number", "{" CFG_TOP ", \"text_config\": 5}", MSA_ERR_INVALID_CONFIG,
            "'text_config' must be an object", "a number");
    REFUSED("text_config a string", "{" CFG_TOP ", \"text_config\": \"x\"}", MSA_ERR_INVALID_CONFIG,
            "'text_config' must be an object", "a string");
    REFUSED("text_config an array", "{" CFG_TOP ", \"text_config\": [1]}", MSA_ERR_INVALID_CONFIG,
            "'text_config' must be an object", "an array");
    REFUSED("single quotes", "{'num_hidden_layers': 4}", MSA_ERR_IO, "byte offset 1");
    REFUSED("trailing comma", "{" CFG_TOP ",}", MSA_ERR_IO, "byte offset");
    REFUSED("leading zero", "{" CFG_TOP ", \"x\": 012}", MSA_ERR_IO, "leading zero");
    REFUSED("NaN", "{" CFG_TOP ", \"x\": NaN}", MSA_ERR_IO, "unexpected 'N'");
    REFUSED("BOM", "\xEF\xBB\xBF{" CFG_TOP "}", MSA_ERR_IO, "byte offset 0");

    /* Equal keys in different objects, valid UTF-8 and escapes pass. */
    static const char ok2[] = "{\"text_config\": {" CFG_TOP ", \"model_type\": \"x\"}, "
                              "\"model_type\": \"caf\xC3\xA9 \xF0\x9F\x98\x80 \\ud83d\\ude00 "
                              "\\u00e9\", \"a\": {\"a\": {\"a\": []}}, \"null_text\": null}";
    m = NULL;
    CHECK(msa_model_load_config_json(ctx, ok2, sizeof ok2 - 1, &m) == MSA_OK && m,
          "nested equal keys and UTF-8 load: %s", msa_context_last_error(ctx));
    msa_model_free(m);
    static const char ok3[] = "{" CFG_TOP ", \"text_config\": null}";
    m = NULL;
    CHECK(msa_model_load_config_json(ctx, ok3, sizeof ok3 - 1, &m) == MSA_OK && m,
          "text_config null is absent: %s", msa_context_last_error(ctx));
    msa_model_free(m);

    /* The nesting bound: MSA_JSON_MAX_DEPTH levels pass, one more does not. */
    char deep[512];
    for (int extra = 0; extra <= 1; extra++) {
        int levels = MSA_JSON_MAX_DEPTH - 1 + extra; /* plus the top-level object */
        size_t n = (size_t)snprintf(deep, sizeof deep, "{" CFG_TOP ", \"x\": ");
        for (int i = 0; i < levels; i++)
            deep[n++] = '[';
        for (int i = 0; i < levels; i++)
            deep[n++] = ']';
        deep[n++] = '}';
        deep[n] = '\0';
        m = NULL;
        msa_status st = msa_model_load_config_json(ctx, deep, n, &m);
        if (extra)
            CHECK(st == MSA_ERR_IO && !m && has(msa_context_last_error(ctx), "nesting deeper"),
                  "depth %d refused: %s", levels + 1, msa_context_last_error(ctx));
        else
            CHECK(st == MSA_OK && m, "depth %d accepted: %s", levels + 1,
                  msa_context_last_error(ctx));
        msa_model_free(m);
    }

    /* The checker alone, on texts that are not objects. */
    char err[200];
    CHECK(msa_json_check("[1, 2] ", 7, err, sizeof err) == 0, "array: %s", err);
    CHECK(msa_json_check("\"\\u00e9\"", 8, err, sizeof err) == 0, "escaped string: %s", err);
    CHECK(msa_json_check("-0.5e+3", 7, err, sizeof err) == 0, "number: %s", err);
    CHECK(msa_json_check("1 2", 3, err, sizeof err) != 0 && has(err, "byte offset 2"),
          "two numbers: %s", err);
    CHECK(msa_json_check("", 0, err, sizeof err) != 0 && has(err, "ends"), "empty: %s", err);
    CHECK(msa_json_check("[1,]", 4, err, sizeof err) != 0, "trailing comma in an array");
    CHECK(msa_json_check("[{\"a\":1,\"a\":2}]", 15, err, sizeof err) != 0 &&
              has(err, "in the object at byte offset 1"),
          "duplicate in an array element: %s", err);
}

/* ---- messages about numbers ---------------------------------------------- */

static void expect_message(const char *what, msa_status st, msa_model *m, const char *want,
                           const char *not_want)
{
    const char *msg = msa_context_last_error(ctx);
    CHECK(st == MSA_ERR_INVALID_CONFIG && !m, "%s: %s", what, msa_status_name(st));
    CHECK(has(msg, want), "%s: message '%s' lacks '%s'", what, msg, want);
    if (not_want)
        CHECK(!has(msg, not_want), "%s: message '%s' says '%s'", what, msg, not_want);
    msa_model_free(m);
}

static void test_number_messages(void)
{
    msa_model *m;
    msa_status st;
    st = load(&m, "num_attention_heads", "2147483648", NULL);
    expect_message("heads 2^31", st, m, "out of range: 2147483648 is not in 1..4096",
                   "must be an integer");
    st = load(&m, "num_attention_heads", "1e999", NULL);
    expect_message("heads 1e999", st, m, "out of range", "must be an integer");
    st = load(&m, "num_attention_heads", "-1e999", NULL);
    expect_message("heads -1e999", st, m, "out of range", "must be an integer");
    st = load(&m, "num_attention_heads", "9007199254740993", NULL);
    expect_message("heads 2^53 + 1", st, m, "out of range", "must be an integer");
    st = load(&m, "num_attention_heads", "5000", NULL);
    expect_message("heads 5000", st, m, "1..4096", NULL);
    st = load(&m, "num_attention_heads", "-8", NULL);
    expect_message("heads -8", st, m, "out of range: -8 is not in 1..4096", NULL);
    st = load(&m, "num_attention_heads", "64.5", NULL);
    expect_message("heads 64.5", st, m, "must be an integer (got 64.5)", "out of range");
    st = load(&m, "num_attention_heads", "\"64\"", NULL);
    expect_message("heads \"64\"", st, m, "must be an integer, not a string", NULL);
    st = load(&m, "num_attention_heads", "true", NULL);
    expect_message("heads true", st, m, "must be an integer, not a boolean", NULL);
    st = load(&m, "num_hidden_layers", "100001", NULL);
    expect_message("layers 100001", st, m, "not in 1..100000", NULL);
    st = load(&m, "sparse_local_tokens", "-1", NULL);
    expect_message("local tokens -1", st, m, "'sparse_local_tokens' is out of range: -1", NULL);
    st = load(&m, "sparse_init_tokens", "4294967296", NULL);
    expect_message("init tokens 2^32", st, m, "'sparse_init_tokens' is out of range", NULL);
    st = load(&m, "sparse_block_size", "65537", NULL);
    expect_message("block 65537", st, m, "not in 1..65536", NULL);
    st = load(&m, "head_dim", NULL, "hidden_size", "1e10", NULL);
    expect_message("hidden 1e10", st, m, "'hidden_size' is out of range", NULL);
    /* The bounds named are the ones msa_model_create applies: the largest
     * accepted value loads. */
    st = load(&m, "num_attention_heads", "4096", NULL);
    CHECK(st == MSA_OK && m, "heads 4096 loads: %s", msa_context_last_error(ctx));
    msa_model_free(m);
    st = load(&m, "sparse_block_size", "65536", NULL);
    CHECK(st == MSA_OK && m, "block 65536 loads: %s", msa_context_last_error(ctx));
    msa_model_free(m);
}

/* ---- files that are not regular ------------------------------------------ */

static void test_not_regular(void)
{
    char dir[] = "/tmp/msa_test_config_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    char fifo[64];
    snprintf(fifo, sizeof fifo, "%s/config.json", dir);
    if (mkfifo(fifo, 0600) != 0) {
        CHECK(0, "mkfifo %s", fifo);
    } else {
        /* Without the check this call waits forever for a writer; CTest's
         * TIMEOUT turns that into a failure. */
        msa_model *m = NULL;
        msa_status st = msa_model_load_config_file(ctx, fifo, &m);
        CHECK(st == MSA_ERR_IO && !m, "FIFO: %s", msa_status_name(st));
        CHECK(has(msa_context_last_error(ctx), "not a regular file"), "FIFO message: %s",
              msa_context_last_error(ctx));
        unlink(fifo);
    }
    rmdir(dir);
    msa_model *m = NULL;
    msa_status st = msa_model_load_config_file(ctx, "/dev/null", &m);
    CHECK(st == MSA_ERR_IO && !m && has(msa_context_last_error(ctx), "not a regular file"),
          "/dev/null: %s", msa_context_last_error(ctx));
    st = msa_model_load_config_file(ctx, MSA_FIXTURE_DIR, &m);
    CHECK(st == MSA_ERR_IO && !m && has(msa_context_last_error(ctx), "a directory"),
          "directory: %s", msa_context_last_error(ctx));
}

int main(void)
{
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.num_threads = 1;
    if (msa_context_create(&cp, &ctx, NULL, 0) != MSA_OK) {
        CHECK(0, "no context");
        return check_finish();
    }
    test_fixtures();
    test_tokens_to_blocks();
    test_defaults();
    test_invalid();
    test_malformed();
    test_strict_json();
    test_number_messages();
    test_not_regular();
    msa_context_free(ctx);
    return check_finish();
}
