/*
 * The oracle checked against values worked out by hand, so that the sweep's
 * reference is itself anchored: selection order, ties, NaN and -inf,
 * forced blocks, partial blocks, both score types, head mappings, and the
 * attention / LSE / index-value formulas.
 */
#include <math.h>
#include <string.h>

#include "check.h"
#include "oracle.h"

/* One request with one head of width 1 everywhere; callers fill arrays. */
static msa_oracle_layer tiny_layer(int B, int K, int I, int Lc)
{
    msa_oracle_layer L;
    memset(&L, 0, sizeof L);
    L.Hq = L.Hkv = L.Hi = 1;
    L.D = L.Di = 1;
    L.block = B;
    L.topk = K;
    L.init_blocks = I;
    L.local_blocks = Lc;
    L.sparse = 1;
    L.scale = 1.0;
    L.index_scale = 1.0;
    return L;
}

static int row_is(const int32_t *row, const int32_t *want, int n)
{
    return memcmp(row, want, sizeof(int32_t) * (size_t)n) == 0;
}

/* 8 blocks of 2 keys, token at p = 15; block max scores by construction:
 * b0 0, b1 5, b2 9, b3 9, b4 1, b5 NaN, b6 -inf, b7 2. */
static void test_selection_order(void)
{
    float idx_k[16] = {0, -1, 5, 4, 9, 3, 9, 3, 1, 0, NAN, NAN, -INFINITY, -INFINITY, 2, 1};
    float k[16] = {0}, v[16] = {0}, q[1] = {0}, idx_q[1] = {1};
    msa_oracle_request req = {1, 16, k, v, idx_k, NULL, q, idx_q};
    msa_oracle_layer L = tiny_layer(2, 4, 1, 1);
    double s[8];
    int32_t row[8];

    CHECK(msa_oracle_block_scores(&L, &req, 0, 0, s) == 8, "N = 8");
    CHECK(s[0] == 0 && s[1] == 5 && s[2] == 9 && s[3] == 9 && s[4] == 1, "max scores");
    CHECK(isnan(s[5]) && isinf(s[6]) && s[6] < 0 && s[7] == 2, "NaN / -inf scores");

    /* Forced {0, 7}; then 9 (b2) and 9 (b3). */
    msa_oracle_token(&L, &req, 0, NULL, NULL, row, NULL);
    CHECK(row_is(row, (int32_t[]){0, 2, 3, 7}, 4), "K=4 got %d %d %d %d", row[0], row[1], row[2],
          row[3]);
    /* Tie between b2 and b3 goes to the lower id. */
    L.topk = 3;
    msa_oracle_token(&L, &req, 0, NULL, NULL, row, NULL);
    CHECK(row_is(row, (int32_t[]){0, 2, 7}, 3), "K=3 tie toward lower id");
    /* -inf (b6) ranks above NaN (b5). */
    L.topk = 7;
    msa_oracle_token(&L, &req, 0, NULL, NULL, row, NULL);
    CHECK(row_is(row, (int32_t[]){0, 1, 2, 3, 4, 6, 7}, 7), "K=7 -inf above NaN");
    /* K >= N takes everything, padded with -1. */
    L.topk = 8;
    msa_oracle_token(&L, &req, 0, NULL, NULL, row, NULL);
    CHECK(row_is(row, (int32_t[]){0, 1, 2, 3, 4, 5, 6, 7}, 8), "K=N all");
    /* Forced blocks count against K: I=2, Lc=2, K=4 leaves nothing to rank. */
    L = tiny_layer(2, 4, 2, 2);
    msa_oracle_token(&L, &req, 0, NULL, NULL, row, NULL);
    CHECK(row_is(row, (int32_t[]){0, 1, 6, 7}, 4), "forced only");
    /* Lc = 3, I = 0, K = 4: forced 5, 6, 7, then the best: b2. */
    L = tiny_layer(2, 4, 0, 3);
    msa_oracle_token(&L, &req, 0, NULL, NULL, row, NULL);
    CHECK(row_is(row, (int32_t[]){2, 5, 6, 7}, 4), "local forced");
}

/* Only keys j <= p count in the last block; rows are -1 padded when N < K. */
static void test_partial_block(void)
{
    /* B = 4, kv_len 8, q_len 3: token 0 sits at p = 5 and sees 4, 5 only. */
    float idx_k[8] = {1, 2, 3, 4, 7, 6, 100, 100};
    float k[8] = {0}, v[8] = {0}, q[3] = {0}, idx_q[3] = {1, 1, 1};
    msa_oracle_request req = {3, 8, k, v, idx_k, NULL, q, idx_q};
    msa_oracle_layer L = tiny_layer(4, 4, 0, 1);
    double s[2];
    int32_t row[4];
    CHECK(msa_oracle_block_scores(&L, &req, 0, 0, s) == 2, "N = 2");
    CHECK(s[0] == 4 && s[1] == 7, "partial block max %g %g", s[0], s[1]);
    msa_oracle_token(&L, &req, 0, NULL, NULL, row, NULL);
    CHECK(row_is(row, (int32_t[]){0, 1, -1, -1}, 4), "padding -1");
    CHECK(msa_oracle_block_scores(&L, &req, 2, 0, s) == 2 && s[1] == 100, "p = 7 sees all");
}

static void test_lse_score(void)
{
    float idx_k[4] = {1, 3, -2, 0.5f};
    float k[4] = {0}, v[4] = {0}, q[1] = {0}, idx_q[1] = {2};
    msa_oracle_request req = {1, 4, k, v, idx_k, NULL, q, idx_q};
    msa_oracle_layer L = tiny_layer(2, 2, 0, 1);
    L.score_lse = 1;
    L.index_scale = 0.5;
    double s[2];
    msa_oracle_block_scores(&L, &req, 0, 0, s);
    /* s_j = 2 * k_j; S = ln(sum exp(0.5 * s_j)) = ln(sum exp(k_j)). */
    CHECK(fabs(s[0] - log(exp(1.0) + exp(3.0))) < 1e-12, "lse block 0 %.15g", s[0]);
    CHECK(fabs(s[1] - log(exp(-2.0) + exp(0.5))) < 1e-12, "lse block 1 %.15g", s[1]);
}

/* o, lse and idx_o against closed forms. */
static void test_attention(void)
{
    /* Two keys with logits 0 and ln 3: weights 1/4 and 3/4. */
    const float l3 = (float)log(3.0);
    float k[2] = {0, l3}, v[2] = {2, 6}, q[1] = {1};
    float idx_k[2] = {0, l3}, idx_v[2] = {-4, 8}, idx_q[1] = {1};
    msa_oracle_request req = {1, 2, k, v, idx_k, idx_v, q, idx_q};
    msa_oracle_layer L = tiny_layer(2, 1, 0, 1);
    L.index_value = 1;
    double o, lse, io;
    int32_t row[1];
    msa_oracle_token(&L, &req, 0, &o, &lse, row, &io);
    double w1 = 3.0 * exp((double)l3 - log(3.0)) / (1.0 + 3.0 * exp((double)l3 - log(3.0)));
    CHECK(fabs(o - (2.0 * (1.0 - w1) + 6.0 * w1)) < 1e-7, "o %.9g", o);
    CHECK(fabs(lse - log(1.0 + exp((double)l3))) < 1e-12, "lse %.15g", lse);
    CHECK(fabs(io - (-4.0 * (1.0 - w1) + 8.0 * w1)) < 1e-7, "idx_o %.9g", io);
    CHECK(row[0] == 0, "single block");

    /* Scale applies to the logits: scale 0 gives the plain mean. */
    L.scale = 0.0;
    L.index_scale = 0.0;
    msa_oracle_token(&L, &req, 0, &o, &lse, NULL, &io);
    CHECK(fabs(o - 4.0) < 1e-12 && fabs(lse - log(2.0)) < 1e-12 && fabs(io - 2.0) < 1e-12,
          "scale 0: o %g lse %g idx_o %g", o, lse, io);
}

/* Hi = 2 Hkv: union of two heads' selections; Hkv = 2 Hi: shared rows. */
static void test_head_mappings(void)
{
    /* 4 blocks of 1 key, Di = 2; head 0 likes block 0, head 1 block 1. */
    float idx_k[8] = {1, 0, 0, 1, -1, -1, -2, -2};
    float idx_q[4] = {1, 0, 0, 1};
    float k[4] = {0}, v[4] = {0}, q[2] = {0};
    msa_oracle_request req = {1, 4, k, v, idx_k, NULL, q, idx_q};
    msa_oracle_layer L = tiny_layer(1, 2, 0, 1);
    L.Hi = 2;
    L.Di = 2;
    int32_t row[4];
    CHECK(msa_oracle_topk_width(&L) == 4, "union width 2K");
    msa_oracle_token(&L, &req, 0, NULL, NULL, row, NULL);
    CHECK(row_is(row, (int32_t[]){0, 1, 3, -1}, 4), "union %d %d %d %d", row[0], row[1], row[2],
          row[3]);

    /* Hkv = 2, Hi = 1: both KV heads repeat head 0's row. */
    float kk[8] = {0}, vv[8] = {0}, qq[2] = {0};
    msa_oracle_request req2 = {1, 4, kk, vv, idx_k, NULL, qq, idx_q};
    L = tiny_layer(1, 2, 0, 1);
    L.Hkv = 2;
    L.Hq = 2;
    L.Di = 2;
    CHECK(msa_oracle_topk_width(&L) == 2, "split width K");
    int32_t rows[4];
    msa_oracle_token(&L, &req2, 0, NULL, NULL, rows, NULL);
    CHECK(row_is(rows, (int32_t[]){0, 3, 0, 3}, 4), "split rows %d %d %d %d", rows[0], rows[1],
          rows[2], rows[3]);
}

/* With N <= K a sparse layer equals the dense one; with N > K it differs. */
static void test_dense_equivalence(void)
{
    float k[12], v[12], idx_k[12], q[2] = {0.7f, -0.3f}, idx_q[2] = {1, 1};
    for (int j = 0; j < 12; j++) {
        k[j] = (float)sin(j * 1.3);
        v[j] = (float)cos(j * 0.7);
        idx_k[j] = (float)j * 0.25f - (float)(j % 3);
    }
    msa_oracle_request req = {2, 12, k, v, idx_k, NULL, q, idx_q};
    msa_oracle_layer L = tiny_layer(2, 6, 0, 1);
    double o_sparse[2], o_dense, l_sparse, l_dense;
    msa_oracle_token(&L, &req, 1, &o_sparse[0], &l_sparse, NULL, NULL);
    L.sparse = 0;
    msa_oracle_token(&L, &req, 1, &o_dense, &l_dense, NULL, NULL);
    CHECK(o_sparse[0] == o_dense && l_sparse == l_dense, "N <= K equals dense");
    L.sparse = 1;
    L.topk = 2;
    msa_oracle_token(&L, &req, 1, &o_sparse[1], NULL, NULL, NULL);
    CHECK(o_sparse[1] != o_dense, "N > K differs from dense");
}

int main(void)
{
    test_selection_order();
    test_partial_block();
    test_lse_score();
    test_attention();
    test_head_mappings();
    test_dense_equivalence();
    return check_finish();
}
