// The C API from C++: the header's extern "C" block gives the functions C
// linkage, so this program links against the C library as it is.  One
// decode step of one dense layer on the CPU, after a prefill of its context.
#include <msa/msa.h>

#include <cstdio>
#include <memory>
#include <vector>

namespace
{

// Owners that free the library's objects when they go out of scope.
struct context_deleter {
    void operator()(msa_context *c) const
    {
        msa_context_free(c);
    }
};
struct model_deleter {
    void operator()(msa_model *m) const
    {
        msa_model_free(m);
    }
};
struct cache_deleter {
    void operator()(msa_cache *c) const
    {
        msa_cache_free(c);
    }
};
struct plan_deleter {
    void operator()(msa_plan *p) const
    {
        msa_plan_free(p);
    }
};

bool ok(msa_status st, const msa_context *ctx, const char *what)
{
    if (st == MSA_OK)
        return true;
    std::fprintf(stderr, "%s: %s (%s)\n", what, msa_status_name(st), msa_context_last_error(ctx));
    return false;
}

} // namespace

int main()
{
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.num_threads = 2;
    msa_context *raw_ctx = nullptr;
    char err[256];
    if (msa_context_create(&cp, &raw_ctx, err, sizeof err) != MSA_OK) {
        std::fprintf(stderr, "%s\n", err);
        return 1;
    }
    std::unique_ptr<msa_context, context_deleter> ctx(raw_ctx);

    // A small dense model: 8 query heads over 2 KV heads of 64 dimensions.
    const uint8_t dense[1] = {0};
    msa_model_config mc;
    msa_model_config_default(&mc);
    mc.num_q_heads = 8;
    mc.num_kv_heads = 2;
    mc.head_dim = 64;
    mc.num_index_heads = 2;
    mc.layer_sparse = dense;
    msa_model *raw_model = nullptr;
    if (!ok(msa_model_create(ctx.get(), &mc, &raw_model), ctx.get(), "msa_model_create"))
        return 1;
    std::unique_ptr<msa_model, model_deleter> model(raw_model);

    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = 4;
    cc.page_size = 16;
    msa_cache *raw_cache = nullptr;
    if (!ok(msa_cache_create(ctx.get(), model.get(), &cc, &raw_cache), ctx.get(),
            "msa_cache_create"))
        return 1;
    std::unique_ptr<msa_cache, cache_deleter> cache(raw_cache);

    msa_plan_params pp;
    msa_plan_params_default(&pp);
    pp.act_dtype = MSA_DTYPE_FP32;
    msa_plan *raw_plan = nullptr;
    if (!ok(msa_plan_create(ctx.get(), model.get(), cache.get(), &pp, &raw_plan), ctx.get(),
            "msa_plan_create"))
        return 1;
    std::unique_ptr<msa_plan, plan_deleter> plan(raw_plan);

    // Prefill 40 tokens, then decode one more: both steps on pages 3, 0, 1.
    const int32_t pages[3] = {3, 0, 1};
    const int32_t prefill = 40;
    std::vector<float> o;
    for (int32_t q_len : {prefill, 1}) {
        const int32_t kv_len = q_len == 1 ? prefill + 1 : prefill;
        const msa_step step = {1, q_len, &q_len, &kv_len, pages, 3};
        if (!ok(msa_plan_update(plan.get(), &step, nullptr), ctx.get(), "msa_plan_update"))
            return 1;
        std::vector<float> q(static_cast<size_t>(q_len) * 8 * 64),
            k(static_cast<size_t>(q_len) * 2 * 64);
        for (size_t i = 0; i < q.size(); i++)
            q[i] = static_cast<float>(i % 29) / 29.0f - 0.5f;
        for (size_t i = 0; i < k.size(); i++)
            k[i] = static_cast<float>(i % 23) / 23.0f - 0.5f;
        std::vector<float> v(k.rbegin(), k.rend());
        o.assign(q.size(), 0.0f);
        msa_layer_io io;
        msa_layer_io_default(&io);
        io.act_dtype = MSA_DTYPE_FP32;
        io.q = q.data();
        io.k = k.data();
        io.v = v.data();
        io.o = o.data();
        if (!ok(msa_forward(ctx.get(), plan.get(), 0, &io), ctx.get(), "msa_forward"))
            return 1;
    }
    std::printf("libmsa %s from C++, decode on %s: o[0] = %.6f\n", msa_version_string(),
                msa_plan_kernel_name(plan.get(), 0), static_cast<double>(o[0]));
    return 0;
}
