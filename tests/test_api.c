/*
 * Public API basics: versions, names, defaults, context and model queries,
 * cache geometry, memory helpers, and a cache wrapped around caller memory
 * behaving exactly like a library-allocated one.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "msa/msa.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

static void test_version(void)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", MSA_VERSION_MAJOR, MSA_VERSION_MINOR,
             MSA_VERSION_PATCH);
    CHECK(msa_version_string() && !strcmp(msa_version_string(), want), "version string %s",
          msa_version_string());
    CHECK(msa_version_number() == MSA_VERSION_NUMBER, "version number %u", msa_version_number());
}

static void test_names(void)
{
    static const char *const status[] = {"MSA_OK",
                                         "MSA_ERR_INVALID_ARGUMENT",
                                         "MSA_ERR_INVALID_CONFIG",
                                         "MSA_ERR_OUT_OF_RANGE",
                                         "MSA_ERR_UNSUPPORTED",
                                         "MSA_ERR_OUT_OF_MEMORY",
                                         "MSA_ERR_IO",
                                         "MSA_ERR_CAPACITY",
                                         "MSA_ERR_BACKEND",
                                         "MSA_ERR_NO_DEVICE"};
    for (int s = 0; s < 10; s++)
        CHECK(!strcmp(msa_status_name((msa_status)s), status[s]), "status %d name %s", s,
              msa_status_name((msa_status)s));
    CHECK(!strcmp(msa_status_name((msa_status)10), "MSA_ERR_UNKNOWN"), "unknown status 10");
    CHECK(!strcmp(msa_status_name((msa_status)-1), "MSA_ERR_UNKNOWN"), "unknown status -1");

    static const char *const dtypes[] = {"fp32", "bf16", "fp16", "fp8_e4m3", "nvfp4"};
    static const size_t sizes[] = {4, 2, 2, 1, 0};
    for (int d = 0; d < 5; d++) {
        msa_dtype got = (msa_dtype)99;
        CHECK(!strcmp(msa_dtype_name((msa_dtype)d), dtypes[d]), "dtype %d name", d);
        CHECK(msa_dtype_from_name(dtypes[d], &got) == MSA_OK && got == (msa_dtype)d,
              "dtype_from_name %s", dtypes[d]);
        CHECK(msa_dtype_size((msa_dtype)d) == sizes[d], "dtype %d size %zu", d,
              msa_dtype_size((msa_dtype)d));
    }
    msa_dtype got = MSA_DTYPE_FP32;
    CHECK(msa_dtype_from_name("fp64", &got) != MSA_OK, "unknown dtype name rejected");
    CHECK(msa_dtype_from_name("FP32x", &got) != MSA_OK, "near-miss dtype name rejected");
    CHECK(msa_dtype_from_name(NULL, &got) != MSA_OK, "NULL dtype name rejected");
    CHECK(msa_dtype_from_name("bf16", NULL) != MSA_OK, "NULL out rejected");

    CHECK(!strcmp(msa_backend_name(MSA_BACKEND_CPU), "cpu"), "cpu name");
    CHECK(!strcmp(msa_backend_name(MSA_BACKEND_CUDA), "cuda"), "cuda name");
    CHECK(msa_backend_available(MSA_BACKEND_CPU) == 1, "cpu always available");
}

static void test_defaults(void)
{
    msa_context_params cp;
    memset(&cp, 0x5a, sizeof cp);
    msa_context_params_default(&cp);
    CHECK(cp.backend == MSA_BACKEND_CPU && cp.num_threads == 0 && cp.device == 0,
          "context params defaults");

    msa_model_config mc;
    memset(&mc, 0x5a, sizeof mc);
    msa_model_config_default(&mc);
    CHECK(mc.num_layers == 1 && mc.num_q_heads == 64 && mc.num_kv_heads == 4 &&
              mc.head_dim == 128 && mc.num_index_heads == 4 && mc.index_dim == 128 &&
              mc.block_size == 128 && mc.topk_blocks == 16 && mc.init_blocks == 0 &&
              mc.local_blocks == 1 && mc.score_type == MSA_SCORE_MAX,
          "model config defaults are the M3 shape");
    CHECK(mc.layer_sparse == NULL && mc.layer_index_value == NULL && mc.softmax_scale == 0 &&
              mc.index_softmax_scale == 0,
          "model config default arrays / scales");

    msa_cache_config cc;
    memset(&cc, 0x5a, sizeof cc);
    msa_cache_config_default(&cc);
    CHECK(cc.num_pages == 0 && cc.page_size == 128 && cc.kv_dtype == MSA_DTYPE_BF16 &&
              cc.index_dtype == MSA_DTYPE_BF16,
          "cache config defaults");

    msa_plan_params lim;
    memset(&lim, 0x5a, sizeof lim);
    msa_plan_params_default(&lim);
    CHECK(lim.max_requests == 0 && lim.max_tokens == 0 && lim.max_kv_len == 0 &&
              lim.act_dtype == MSA_DTYPE_BF16,
          "plan params defaults");

    msa_layer_io io;
    memset(&io, 0x5a, sizeof io);
    msa_layer_io_default(&io);
    CHECK(io.act_dtype == MSA_DTYPE_BF16 && io.write_cache == 1 && !io.q && !io.k && !io.v &&
              !io.idx_q && !io.idx_k && !io.idx_v && !io.o && !io.idx_o && !io.lse && !io.topk &&
              !io.stream,
          "layer io defaults");
}

static void test_context(void)
{
    msa_context_free(NULL);
    msa_context_params cp;
    msa_context_params_default(&cp);
    msa_context *ctx = NULL;
    char err[128] = "x";
    CHECK(msa_context_create(&cp, &ctx, err, sizeof err) == MSA_OK && ctx, "create");
    if (!ctx)
        return;
    CHECK(msa_context_backend(ctx) == MSA_BACKEND_CPU, "backend");
    CHECK(msa_context_num_threads(ctx) >= 1, "0 threads means all cores (%d)",
          msa_context_num_threads(ctx));
    CHECK(msa_context_last_error(ctx) && msa_context_last_error(ctx)[0] == 0, "no error yet");
    CHECK(msa_synchronize(ctx) == MSA_OK, "synchronize");
    msa_context_free(ctx);

    cp.num_threads = 2;
    ctx = NULL;
    CHECK(msa_context_create(&cp, &ctx, NULL, 0) == MSA_OK && ctx &&
              msa_context_num_threads(ctx) == 2,
          "2 threads");
    msa_context_free(ctx);

    if (!msa_backend_available(MSA_BACKEND_CUDA)) {
        cp.backend = MSA_BACKEND_CUDA;
        ctx = (msa_context *)&cp; /* must be reset to NULL on failure */
        err[0] = 0;
        msa_status st = msa_context_create(&cp, &ctx, err, sizeof err);
        CHECK(st == MSA_ERR_UNSUPPORTED || st == MSA_ERR_NO_DEVICE, "unavailable cuda: %s",
              msa_status_name(st));
        CHECK(ctx == NULL && err[0], "unavailable cuda: NULL context and a message");
    }
}

static void test_model_queries(msa_context *ctx)
{
    msa_model_config mc;
    msa_model_config_default(&mc);
    const uint8_t sparse[3] = {0, 1, 1}, iv[3] = {1, 1, 0};
    mc.num_layers = 3;
    mc.layer_sparse = sparse;
    mc.layer_index_value = iv;
    msa_model *m = NULL;
    CHECK(msa_model_create(ctx, &mc, &m) == MSA_OK && m, "model create");
    if (!m)
        return;
    msa_model_config got;
    msa_model_get_config(m, &got);
    CHECK(got.num_layers == 3 && got.num_q_heads == 64 && got.topk_blocks == 16, "get_config");
    CHECK(got.softmax_scale == (float)(1.0 / sqrt(128.0)) &&
              got.index_softmax_scale == (float)(1.0 / sqrt(128.0)),
          "resolved scales %g %g", got.softmax_scale, got.index_softmax_scale);
    CHECK(got.layer_sparse && got.layer_sparse != sparse && got.layer_sparse[0] == 0 &&
              got.layer_sparse[2] == 1,
          "layer arrays copied");
    CHECK(!msa_model_layer_is_sparse(m, 0) && msa_model_layer_is_sparse(m, 1) &&
              msa_model_layer_is_sparse(m, 2),
          "sparse flags");
    /* A dense layer has no index branch, whatever the value list says. */
    CHECK(!msa_model_layer_has_index_value(m, 0) && msa_model_layer_has_index_value(m, 1) &&
              !msa_model_layer_has_index_value(m, 2),
          "index value flags");
    CHECK(!msa_model_layer_is_sparse(m, 3) && !msa_model_layer_is_sparse(m, -1) &&
              !msa_model_layer_has_index_value(m, 7),
          "out of range layers are 0");
    CHECK(msa_model_topk_width(m) == 16, "width K");
    msa_model_free(m);
    msa_model_free(NULL);

    mc.num_layers = 1;
    mc.layer_sparse = NULL;
    mc.layer_index_value = NULL;
    mc.softmax_scale = 0.25f;
    mc.index_softmax_scale = 0.5f;
    mc.num_index_heads = 8; /* Hi = 2 Hkv: unions of two heads */
    m = NULL;
    CHECK(msa_model_create(ctx, &mc, &m) == MSA_OK && m, "union model");
    if (m) {
        msa_model_get_config(m, &got);
        CHECK(got.softmax_scale == 0.25f && got.index_softmax_scale == 0.5f, "explicit scales");
        CHECK(msa_model_topk_width(m) == 32, "union width 2K");
        CHECK(msa_model_layer_is_sparse(m, 0) && !msa_model_layer_has_index_value(m, 0),
              "NULL arrays: sparse, no index value");
        msa_model_free(m);
    }
    mc.num_index_heads = 2; /* Hkv = 2 Hi */
    m = NULL;
    CHECK(msa_model_create(ctx, &mc, &m) == MSA_OK && m && msa_model_topk_width(m) == 16,
          "split width K");
    msa_model_free(m);
}

static void test_buffers(msa_context *ctx)
{
    void *p = NULL;
    unsigned char in[100], out[100];
    for (int i = 0; i < 100; i++)
        in[i] = (unsigned char)(i * 7);
    CHECK(msa_buffer_alloc(ctx, 100, &p) == MSA_OK && p, "alloc");
    if (!p)
        return;
    CHECK(msa_copy_to_buffer(ctx, p, in, 100) == MSA_OK, "copy in");
    memset(out, 0, sizeof out);
    CHECK(msa_copy_from_buffer(ctx, out, p, 100) == MSA_OK && !memcmp(in, out, 100), "copy out");
    msa_buffer_free(ctx, p);
    msa_buffer_free(ctx, NULL);

    double gbps = 0;
    CHECK(msa_bench_read_bandwidth(ctx, 1 << 20, 3, &gbps) == MSA_OK && gbps > 0 && isfinite(gbps),
          "read bandwidth %g", gbps);
}

/* ---- wrapped cache == allocated cache ------------------------------------ */

enum { WL = 2, WHQ = 4, WHKV = 2, WD = 16, WHI = 2, WDI = 16, WP = 4, WPAGES = 12 };

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

typedef struct wrap_out {
    float o[4 * WHQ * WD], lse[4 * WHQ], idx_o[4 * WHI * WDI];
    int32_t topk[4 * WHKV * 3];
} wrap_out;

/* Two layers (dense, sparse with index value), one step, into `out`. */
static int run_wrap_step(msa_context *ctx, const msa_model *m, msa_cache *cache, wrap_out *out)
{
    static const int32_t q_len[2] = {3, 1}, kv_len[2] = {10, 7};
    static const int32_t table[2 * 3] = {5, 0, 9, 3, 11, -1};
    float q[4 * WHQ * WD], k[4 * WHKV * WD], v[4 * WHKV * WD], iq[4 * WHI * WDI], ik[4 * WDI],
        iv[4 * WDI];
    unsigned s = 77;
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = frand(&s);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        k[i] = frand(&s);
        v[i] = frand(&s);
    }
    for (size_t i = 0; i < sizeof iq / sizeof iq[0]; i++)
        iq[i] = frand(&s);
    for (size_t i = 0; i < sizeof ik / sizeof ik[0]; i++) {
        ik[i] = frand(&s);
        iv[i] = frand(&s);
    }
    msa_plan *plan = NULL;
    msa_step step = {2, 4, q_len, kv_len, table, 3};
    msa_plan_params lim;
    msa_plan_params_default(&lim);
    lim.act_dtype = MSA_DTYPE_FP32;
    if (msa_plan_create(ctx, m, cache, &lim, &plan) != MSA_OK)
        return -1;
    int rc = msa_plan_update(plan, &step, NULL) == MSA_OK ? 0 : -1;
    CHECK(msa_plan_kernel_name(plan, 1) && msa_plan_kernel_name(plan, 1)[0] &&
              msa_plan_fallback_reason(plan, 1),
          "kernel name / fallback reason");
    for (int layer = 0; layer < WL && rc == 0; layer++) {
        msa_layer_io io;
        msa_layer_io_default(&io);
        io.act_dtype = MSA_DTYPE_FP32;
        io.q = q;
        io.k = k;
        io.v = v;
        io.o = out->o;
        io.lse = out->lse;
        if (layer == 1) {
            io.idx_q = iq;
            io.idx_k = ik;
            io.idx_v = iv;
            io.idx_o = out->idx_o;
            io.topk = out->topk;
        }
        rc = msa_forward(ctx, plan, layer, &io) == MSA_OK ? 0 : -1;
    }
    msa_plan_free(plan);
    return rc;
}

static void test_cache(msa_context *ctx)
{
    msa_model_config mc;
    msa_model_config_default(&mc);
    const uint8_t sparse[WL] = {0, 1}, ivf[WL] = {0, 1};
    mc.num_layers = WL;
    mc.num_q_heads = WHQ;
    mc.num_kv_heads = WHKV;
    mc.head_dim = WD;
    mc.num_index_heads = WHI;
    mc.index_dim = WDI;
    mc.block_size = WP;
    mc.topk_blocks = 3;
    mc.layer_sparse = sparse;
    mc.layer_index_value = ivf;
    msa_model *m = NULL;
    if (msa_model_create(ctx, &mc, &m) != MSA_OK) {
        CHECK(0, "model create: %s", msa_context_last_error(ctx));
        return;
    }
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = WPAGES;
    cc.page_size = WP;
    cc.kv_dtype = MSA_DTYPE_FP32;
    cc.index_dtype = MSA_DTYPE_FP16;
    msa_cache *a = NULL, *b = NULL;
    CHECK(msa_cache_create(ctx, m, &cc, &a) == MSA_OK && a, "cache create");
    if (!a) {
        msa_model_free(m);
        return;
    }
    msa_cache_config got;
    msa_cache_get_config(a, &got);
    CHECK(got.num_pages == WPAGES && got.page_size == WP && got.kv_dtype == MSA_DTYPE_FP32 &&
              got.index_dtype == MSA_DTYPE_FP16,
          "cache get_config");

    /* Geometry per msa.h; dense layers and layers without value lack planes. */
    const size_t want[WL][4] = {{WPAGES * WHKV * WP * WD * 4, WPAGES * WHKV * WP * WD * 4, 0, 0},
                                {WPAGES * WHKV * WP * WD * 4, WPAGES * WHKV * WP * WD * 4,
                                 WPAGES * WP * WDI * 2, WPAGES * WP * WDI * 2}};
    void *mem[WL * 4];
    unsigned s = 5;
    int zero = 1;
    for (int l = 0; l < WL; l++)
        for (int p = 0; p < 4; p++) {
            size_t n = msa_cache_plane_bytes(a, l, (msa_plane)p);
            void *d = msa_cache_plane_data(a, l, (msa_plane)p);
            CHECK(n == want[l][p], "plane %d/%d bytes %zu want %zu", l, p, n, want[l][p]);
            CHECK((d != NULL) == (want[l][p] != 0), "plane %d/%d pointer", l, p);
            mem[l * 4 + p] = NULL;
            if (!n || !d)
                continue;
            unsigned char *host = malloc(n);
            msa_copy_from_buffer(ctx, host, d, n);
            for (size_t i = 0; i < n; i++)
                zero &= host[i] == 0;
            /* Same contents in both caches: small fp16-safe values. */
            for (size_t i = 0; i + 1 < n; i += 2) {
                host[i] = (unsigned char)((int)(frand(&s) * 100) & 0xff);
                host[i + 1] = 0x3c;
            }
            msa_copy_to_buffer(ctx, d, host, n);
            mem[l * 4 + p] = host;
        }
    CHECK(zero, "allocated cache is zero-filled");
    CHECK(msa_cache_plane_bytes(a, 2, MSA_PLANE_K) == 0 &&
              !msa_cache_plane_data(a, -1, MSA_PLANE_K),
          "out of range layer has no planes");
    CHECK(msa_cache_set_scales(a, 1, 0.5f, 2.0f, 1.0f, 1.0f) == MSA_OK, "valid scales");

    CHECK(msa_cache_wrap(ctx, m, &cc, mem, &b) == MSA_OK && b, "wrap");
    if (b) {
        CHECK(msa_cache_plane_data(b, 1, MSA_PLANE_INDEX_V) == mem[7], "wrap uses caller memory");
        wrap_out oa, ob;
        memset(&oa, 0, sizeof oa);
        memset(&ob, 0, sizeof ob);
        CHECK(run_wrap_step(ctx, m, a, &oa) == 0, "allocated cache step: %s",
              msa_context_last_error(ctx));
        CHECK(run_wrap_step(ctx, m, b, &ob) == 0, "wrapped cache step: %s",
              msa_context_last_error(ctx));
        CHECK(!memcmp(&oa, &ob, sizeof oa), "same outputs from both caches");
        int same = 1;
        for (int i = 0; i < WL * 4; i++) {
            if (!mem[i])
                continue;
            size_t n = msa_cache_plane_bytes(a, i / 4, (msa_plane)(i % 4));
            unsigned char *host = malloc(n);
            msa_copy_from_buffer(ctx, host, msa_cache_plane_data(a, i / 4, (msa_plane)(i % 4)), n);
            same &= !memcmp(host, mem[i], n);
            free(host);
        }
        CHECK(same, "the wrapped memory received the same cache writes");
        msa_cache_free(b);
    }
    msa_cache_free(a);
    msa_cache_free(NULL);
    for (int i = 0; i < WL * 4; i++)
        free(mem[i]);
    msa_model_free(m);
}

/* The CPU kernel level: every level the CPU runs gives a context of that
 * level; a level out of range, or one this build or CPU lacks, is refused
 * with a message and no context. */
static void test_cpu_isa(void)
{
    msa_context_params cp;
    msa_context_params_default(&cp);
    CHECK(cp.cpu_isa_max == MSA_CPU_ISA_AUTO, "default cap is auto");
    CHECK(msa_cpu_isa_supported(MSA_CPU_ISA_PORTABLE), "portable level always present");
    CHECK(!strcmp(msa_cpu_isa_name(MSA_CPU_ISA_AVX512_BF16), "avx512_bf16"), "level name");
    CHECK(!strcmp(msa_cpu_isa_name(MSA_CPU_ISA_NEON_BF16), "neon_bf16"), "level name");
    CHECK(!strcmp(msa_cpu_isa_name((msa_cpu_isa)99), "?"), "name of no level");
    msa_context *ctx = NULL;
    char err[256];
    for (int l = MSA_CPU_ISA_PORTABLE; l <= MSA_CPU_ISA_NEON_BF16; l++) {
        cp.cpu_isa_max = (msa_cpu_isa)l;
        cp.num_threads = 1;
        msa_status st = msa_context_create(&cp, &ctx, err, sizeof err);
        if (msa_cpu_isa_supported((msa_cpu_isa)l)) {
            CHECK(st == MSA_OK && msa_context_cpu_isa(ctx) == (msa_cpu_isa)l, "level %s runs",
                  msa_cpu_isa_name((msa_cpu_isa)l));
            CHECK(msa_context_cpu_kernel(ctx, "indexer") &&
                      msa_context_cpu_kernel(ctx, "attention") &&
                      msa_context_cpu_kernel(ctx, "gather") && !msa_context_cpu_kernel(ctx, "x"),
                  "stage kernels of %s", msa_cpu_isa_name((msa_cpu_isa)l));
        } else {
            CHECK(st == MSA_ERR_UNSUPPORTED && !ctx && strstr(err, "cpu_isa_max"),
                  "level %s refused: %s", msa_cpu_isa_name((msa_cpu_isa)l), err);
        }
        msa_context_free(ctx);
        ctx = NULL;
    }
    cp.cpu_isa_max = (msa_cpu_isa)42;
    CHECK(msa_context_create(&cp, &ctx, err, sizeof err) == MSA_ERR_INVALID_ARGUMENT && !ctx,
          "cap out of range refused");
    cp.cpu_isa_max = MSA_CPU_ISA_AUTO;
    CHECK(msa_context_create(&cp, &ctx, err, sizeof err) == MSA_OK &&
              msa_cpu_isa_supported(msa_context_cpu_isa(ctx)),
          "auto picks a supported level");
    msa_context_free(ctx);
    CHECK(msa_context_cpu_isa(NULL) == MSA_CPU_ISA_AUTO && !msa_context_cpu_kernel(NULL, "indexer"),
          "NULL context");
}

/* Arm64 levels follow the auxiliary vector: neon_bf16 is listed exactly
 * when the CPU has FEAT_BF16 (HWCAP2_BF16) and this build compiled the
 * level (MSA_CPU_HAVE_NEON_BF16, from CMakeLists.txt), and a default
 * context then runs it with BFDOT.  Other machines list neither. */
static void test_cpu_isa_arm64(void)
{
#if defined(__aarch64__) && defined(__linux__)
    const int hw_bf16 = (getauxval(AT_HWCAP2) & (1ul << 14)) != 0;
    printf("HWCAP2_BF16 %s\n", hw_bf16 ? "set" : "not set");
    CHECK(msa_cpu_isa_supported(MSA_CPU_ISA_NEON), "neon listed on Arm64");
#ifdef MSA_CPU_HAVE_NEON_BF16
    CHECK(msa_cpu_isa_supported(MSA_CPU_ISA_NEON_BF16) == hw_bf16,
          "neon_bf16 listed exactly when HWCAP2_BF16 is set");
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.num_threads = 1;
    msa_context *ctx = NULL;
    char err[256];
    CHECK(msa_context_create(&cp, &ctx, err, sizeof err) == MSA_OK, "default context: %s", err);
    if (ctx) {
        const msa_cpu_isa want = hw_bf16 ? MSA_CPU_ISA_NEON_BF16 : MSA_CPU_ISA_NEON;
        const char *attn = msa_context_cpu_kernel(ctx, "attention");
        CHECK(msa_context_cpu_isa(ctx) == want, "default context runs %s, not %s",
              msa_cpu_isa_name(want), msa_cpu_isa_name(msa_context_cpu_isa(ctx)));
        CHECK(attn && (strstr(attn, "BFDOT") != NULL) == hw_bf16,
              "attention kernels name BFDOT exactly on neon_bf16: %s", attn ? attn : "(none)");
        msa_context_free(ctx);
    }
#else
    printf("neon_bf16 not compiled (the compiler lacks -march=armv8.2-a+bf16)\n");
    CHECK(!msa_cpu_isa_supported(MSA_CPU_ISA_NEON_BF16),
          "neon_bf16 not listed without its kernels");
#endif
#else
    CHECK(!msa_cpu_isa_supported(MSA_CPU_ISA_NEON) && !msa_cpu_isa_supported(MSA_CPU_ISA_NEON_BF16),
          "no Arm64 level listed on another machine");
#endif
}

int main(void)
{
    test_version();
    test_names();
    test_defaults();
    test_context();
    test_cpu_isa();
    test_cpu_isa_arm64();
    msa_context_params cp;
    msa_context_params_default(&cp);
    msa_context *ctx = NULL;
    if (msa_context_create(&cp, &ctx, NULL, 0) == MSA_OK) {
        test_model_queries(ctx);
        test_buffers(ctx);
        test_cache(ctx);
        msa_context_free(ctx);
    } else {
        CHECK(0, "no CPU context");
    }
    return check_finish();
}
