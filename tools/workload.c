#include "workload.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_strict.h"

void workload_free(bench_case *cases, int num_cases)
{
    for (int i = 0; cases && i < num_cases; i++) {
        free(cases[i].q_len);
        free(cases[i].kv_len);
    }
    free(cases);
}

static int case_alloc(bench_case *c, int32_t n)
{
    c->num_requests = n;
    c->q_len = calloc((size_t)(n > 0 ? n : 1), sizeof(int32_t));
    c->kv_len = calloc((size_t)(n > 0 ? n : 1), sizeof(int32_t));
    return c->q_len && c->kv_len ? 0 : -1;
}

/* Whether `id` is one of the comma-separated names in `list`. */
static int in_list(const char *list, const char *id)
{
    size_t n = strlen(id);
    for (const char *p = list; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && strncmp(p, id, n) == 0)
            return 1;
        p += len + (comma ? 1 : 0);
    }
    return 0;
}

static int json_in_array(const cJSON *arr, const char *s)
{
    for (const cJSON *it = arr ? arr->child : NULL; it; it = it->next)
        if (cJSON_IsString(it) && strcmp(it->valuestring, s) == 0)
            return 1;
    return 0;
}

static int json_int(const cJSON *it, int64_t min, int64_t max, int64_t *out)
{
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        it->valuedouble < (double)min || it->valuedouble > (double)max)
        return -1;
    *out = (int64_t)it->valuedouble;
    return 0;
}

static int decode_selected(const cJSON *c, const cJSON *smoke, const workload_filter *f)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
    const cJSON *suite = cJSON_GetObjectItemCaseSensitive(c, "suite");
    if (!cJSON_IsString(id))
        return 0;
    if (f->ids)
        return in_list(f->ids, id->valuestring);
    const char *want = f->suite ? f->suite : "full";
    if (strcmp(want, "all") == 0)
        return 1;
    if (strcmp(want, "smoke") == 0)
        return json_in_array(smoke, id->valuestring);
    return cJSON_IsString(suite) && strcmp(suite->valuestring, want) == 0;
}

static int prefill_selected(const cJSON *c, const workload_filter *f)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(c, "tags");
    if (!cJSON_IsString(id))
        return 0;
    if (f->ids)
        return in_list(f->ids, id->valuestring);
    const char *want = f->suite ? f->suite : "representative";
    if (strcmp(want, "all") == 0)
        return 1;
    for (const cJSON *t = tags ? tags->child : NULL; t; t = t->next) {
        if (!cJSON_IsString(t))
            continue;
        if (strcmp(t->valuestring, want) == 0 ||
            (strcmp(want, "stress") == 0 && strncmp(t->valuestring, "stress", 6) == 0))
            return 1;
    }
    return 0;
}

/* Reads one case's requests; decode lengths come as kv_lens, prefill as
 * {prefix, new} pairs. */
static int read_requests(const cJSON *c, int prefill, int32_t q_default, bench_case *out, char *err,
                         size_t err_size)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(c, prefill ? "requests" : "kv_lens");
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) < 1) {
        snprintf(err, err_size, "case %s: no %s", out->id, prefill ? "requests" : "kv_lens");
        return -1;
    }
    if (case_alloc(out, cJSON_GetArraySize(list)) != 0) {
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    int r = 0;
    for (const cJSON *it = list->child; it; it = it->next, r++) {
        int64_t q = q_default, kv = 0, prefix = 0;
        int bad;
        if (prefill)
            bad = json_int(cJSON_GetObjectItemCaseSensitive(it, "prefix"), 0, INT32_MAX, &prefix) ||
                  json_int(cJSON_GetObjectItemCaseSensitive(it, "new"), 0, INT32_MAX, &q) ||
                  (kv = prefix + q) > INT32_MAX;
        else
            bad = json_int(it, 0, INT32_MAX, &kv) || kv < q;
        if (bad) {
            snprintf(err, err_size, "case %s: request %d has invalid lengths", out->id, r);
            return -1;
        }
        out->q_len[r] = (int32_t)q;
        out->kv_len[r] = (int32_t)kv;
    }
    return 0;
}

/* Shrinks a case whose longest request exceeds max_context, every length
 * by the same factor so the batch keeps its shape.  Prefill prefixes stay
 * page multiples (128), as in the source data. */
static void scale_case(bench_case *c, int64_t max_context)
{
    int64_t longest = 0;
    for (int32_t r = 0; r < c->num_requests; r++)
        if (c->kv_len[r] > longest)
            longest = c->kv_len[r];
    if (max_context <= 0 || longest <= max_context)
        return;
    double f = (double)max_context / (double)longest;
    for (int32_t r = 0; r < c->num_requests; r++) {
        if (c->prefill) {
            int64_t prefix = c->kv_len[r] - c->q_len[r];
            int64_t q = llround(c->q_len[r] * f);
            c->q_len[r] = (int32_t)(q > 0 ? q : (c->q_len[r] > 0));
            c->kv_len[r] = (int32_t)((int64_t)floor(prefix * f / 128.0) * 128 + c->q_len[r]);
        } else {
            int64_t kv = llround(c->kv_len[r] * f);
            c->kv_len[r] = (int32_t)(kv > c->q_len[r] ? kv : c->q_len[r]);
        }
    }
    c->scaled = 1;
}

int workload_load(const char *path, int prefill, const workload_filter *filter, bench_case **cases,
                  int *num_cases, char *err, size_t err_size)
{
    *cases = NULL;
    *num_cases = 0;
    size_t len = 0;
    /* A FIFO in the file's place is refused at once, never waited on. */
    char *text = msa_read_regular_file(path, (size_t)128 << 20, &len, err, err_size);
    if (!text)
        return -1;
    /* cJSON alone would take the first of two objects or of two equal keys
     * and cut strings at a NUL; the strict check refuses all of these. */
    char why[256];
    if (msa_json_check(text, len, why, sizeof why) != 0) {
        snprintf(err, err_size, "%s: not valid JSON: %s", path, why);
        free(text);
        return -1;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "cases");
    if (!root || !cJSON_IsArray(list)) {
        snprintf(err, err_size, "%s: not a workload file (no \"cases\" array)", path);
        cJSON_Delete(root);
        return -1;
    }
    int64_t q_default = 0;
    if (!prefill) {
        if (json_int(cJSON_GetObjectItemCaseSensitive(root, "q_len_per_request"), 1, 4096,
                     &q_default) != 0) {
            snprintf(err, err_size, "%s: q_len_per_request missing or invalid", path);
            cJSON_Delete(root);
            return -1;
        }
        if (filter->q_len > 0)
            q_default = filter->q_len;
    }
    const cJSON *smoke = cJSON_GetObjectItemCaseSensitive(root, "smoke");
    bench_case *out = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof *out);
    int n = 0, rc = out ? 0 : -1;
    if (!out)
        snprintf(err, err_size, "out of memory");
    for (const cJSON *c = list->child; rc == 0 && c; c = c->next) {
        if (!(prefill ? prefill_selected(c, filter) : decode_selected(c, smoke, filter)))
            continue;
        bench_case *bc = &out[n++];
        const cJSON *suite = cJSON_GetObjectItemCaseSensitive(c, "suite");
        const cJSON *tags = cJSON_GetObjectItemCaseSensitive(c, "tags");
        const cJSON *weight = cJSON_GetObjectItemCaseSensitive(c, "weight");
        snprintf(bc->id, sizeof bc->id, "%s",
                 cJSON_GetObjectItemCaseSensitive(c, "id")->valuestring);
        if (cJSON_IsString(suite))
            snprintf(bc->suite, sizeof bc->suite, "%s", suite->valuestring);
        else if (tags && cJSON_IsString(tags->child))
            snprintf(bc->suite, sizeof bc->suite, "%s", tags->child->valuestring);
        bc->weight = cJSON_IsNumber(weight) && weight->valuedouble > 0 ? weight->valuedouble : 0.0;
        bc->prefill = prefill;
        rc = read_requests(c, prefill, (int32_t)q_default, bc, err, err_size);
        if (rc == 0)
            scale_case(bc, filter->max_context);
    }
    /* Every id asked for by name must exist: a typo should not shrink a run silently. */
    for (const char *p = filter->ids; rc == 0 && p && *p;) {
        const char *comma = strchr(p, ',');
        size_t l = comma ? (size_t)(comma - p) : strlen(p);
        int found = 0;
        for (int i = 0; i < n && !found; i++)
            found = strlen(out[i].id) == l && strncmp(out[i].id, p, l) == 0;
        if (!found && l > 0) {
            snprintf(err, err_size, "%s: no case named '%.*s'", path, (int)l, p);
            rc = -1;
        }
        p += l + (comma ? 1 : 0);
    }
    if (rc == 0 && n == 0) {
        snprintf(err, err_size, "%s: no case matches suite '%s'", path,
                 filter->suite ? filter->suite : (prefill ? "representative" : "full"));
        rc = -1;
    }
    cJSON_Delete(root);
    if (rc != 0) {
        workload_free(out, n);
        return -1;
    }
    *cases = out;
    *num_cases = n;
    return 0;
}

int workload_single(int64_t context, int32_t batch, int32_t q_len, bench_case **cases,
                    int *num_cases, char *err, size_t err_size)
{
    bench_case *c = calloc(1, sizeof *c);
    if (!c || case_alloc(c, batch) != 0) {
        workload_free(c, c ? 1 : 0);
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    snprintf(c->id, sizeof c->id, "decode_b%d_ctx%lld_q%d", batch, (long long)context, q_len);
    snprintf(c->suite, sizeof c->suite, "single");
    c->weight = 1.0;
    for (int32_t r = 0; r < batch; r++) {
        c->q_len[r] = q_len;
        c->kv_len[r] = (int32_t)context;
    }
    *cases = c;
    *num_cases = 1;
    return 0;
}
