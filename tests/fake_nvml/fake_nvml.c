/*
 * A fake libnvidia-ml.so.1 for tests: the real pynvml binding loads it and calls
 * real C functions, whose GPUs, values and failures come from a JSON scenario
 * file named by $FAKE_NVML_SCENARIO (read at every first nvmlInit).
 * See README.md next to this file for the scenario format and tick rules.
 * Not thread-safe: the sampler serialises its calls under its own lock.
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

/* ---------------------------------------------------------------- JSON -- */

enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jnode {
    int type;
    double num;
    unsigned long long u64; /* exact value of a non-negative integer literal */
    int is_uint;
    char *str;           /* J_STR value */
    char *key;           /* member name when the parent is an object */
    struct jnode *child; /* first element / member */
    struct jnode *next;  /* next sibling */
} jnode;

typedef struct {
    const char *p;
    const char *err;
    int depth;
} jparser;

static void jfree(jnode *n) {
    while (n) {
        jnode *next = n->next;
        jfree(n->child);
        free(n->str);
        free(n->key);
        free(n);
        n = next;
    }
}

static void jskip(jparser *ps) {
    while (*ps->p && isspace((unsigned char)*ps->p)) ps->p++;
}

static char *jparse_string(jparser *ps) {
    /* ps->p points at the opening quote. \uXXXX escapes keep ASCII only. */
    size_t cap = 16, len = 0;
    char *out = malloc(cap);
    if (!out) { ps->err = "out of memory"; return NULL; }
    ps->p++;
    for (;;) {
        char c = *ps->p++;
        if (c == '\0') { ps->err = "unterminated string"; free(out); return NULL; }
        if (c == '"') break;
        if (c == '\\') {
            char e = *ps->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    char h = *ps->p++;
                    if (!isxdigit((unsigned char)h)) { ps->err = "bad \\u escape"; free(out); return NULL; }
                    v = v * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
                }
                c = v < 128 ? (char)v : '?';
                break;
            }
            case '"': case '\\': case '/': c = e; break;
            default: ps->err = "bad escape"; free(out); return NULL;
            }
        }
        if (len + 2 > cap) {
            char *bigger = realloc(out, cap *= 2);
            if (!bigger) { ps->err = "out of memory"; free(out); return NULL; }
            out = bigger;
        }
        out[len++] = c;
    }
    out[len] = '\0';
    return out;
}

static jnode *jparse_value(jparser *ps) {
    jskip(ps);
    if (++ps->depth > 64) { ps->err = "nested too deep"; return NULL; }
    jnode *n = calloc(1, sizeof *n);
    if (!n) { ps->err = "out of memory"; return NULL; }
    char c = *ps->p;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        n->type = c == '{' ? J_OBJ : J_ARR;
        ps->p++;
        jnode **tail = &n->child;
        jskip(ps);
        if (*ps->p == close) { ps->p++; goto done; }
        for (;;) {
            char *key = NULL;
            jskip(ps);
            if (n->type == J_OBJ) {
                if (*ps->p != '"') { ps->err = "expected member name"; goto fail; }
                if (!(key = jparse_string(ps))) goto fail;
                jskip(ps);
                if (*ps->p != ':') { free(key); ps->err = "expected ':'"; goto fail; }
                ps->p++;
            }
            jnode *item = jparse_value(ps);
            if (!item) { free(key); goto fail; }
            item->key = key;
            *tail = item;
            tail = &item->next;
            jskip(ps);
            if (*ps->p == ',') { ps->p++; continue; }
            if (*ps->p == close) { ps->p++; break; }
            ps->err = n->type == J_OBJ ? "expected ',' or '}'" : "expected ',' or ']'";
            goto fail;
        }
    } else if (c == '"') {
        n->type = J_STR;
        if (!(n->str = jparse_string(ps))) goto fail;
    } else if (!strncmp(ps->p, "true", 4) || !strncmp(ps->p, "false", 5)) {
        n->type = J_BOOL;
        n->num = c == 't';
        ps->p += c == 't' ? 4 : 5;
    } else if (!strncmp(ps->p, "null", 4)) {
        n->type = J_NULL;
        ps->p += 4;
    } else if (c == '-' || isdigit((unsigned char)c)) {
        const char *start = ps->p;
        char *end;
        n->type = J_NUM;
        n->num = strtod(start, &end);
        if (end == start) { ps->err = "bad number"; goto fail; }
        if (strcspn(start, ".eE-") >= (size_t)(end - start)) { /* plain non-negative integer */
            errno = 0;
            n->u64 = strtoull(start, NULL, 10);
            n->is_uint = errno == 0;
        }
        ps->p = end;
    } else {
        ps->err = "unexpected character";
        goto fail;
    }
done:
    ps->depth--;
    return n;
fail:
    jfree(n);
    return NULL;
}

static jnode *jget(const jnode *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (jnode *m = obj->child; m; m = m->next)
        if (!strcmp(m->key, key)) return m;
    return NULL;
}

static int jlen(const jnode *arr) {
    int n = 0;
    if (arr && arr->type == J_ARR)
        for (jnode *e = arr->child; e; e = e->next) n++;
    return n;
}

static jnode *jat(const jnode *arr, int i) {
    if (!arr || arr->type != J_ARR) return NULL;
    jnode *e = arr->child;
    while (e && i-- > 0) e = e->next;
    return e;
}

static int jcontains(const jnode *arr, const char *s) {
    if (!arr || arr->type != J_ARR) return 0;
    for (jnode *e = arr->child; e; e = e->next)
        if (e->type == J_STR && !strcmp(e->str, s)) return 1;
    return 0;
}

static unsigned long long jnum_u64(const jnode *n) {
    if (n->is_uint) return n->u64;
    if (!(n->num > 0)) return 0; /* negative or NaN */
    return n->num >= 18446744073709551615.0 ? ~0ULL : (unsigned long long)n->num;
}

/* ------------------------------------------------------------ scenario -- */

#define MAX_GPUS 64
#define MAX_MIG 8

typedef struct device {
    int is_mig;
    unsigned index;    /* GPU index; for a MIG device its parent's */
    unsigned mig_slot; /* MIG device index within the parent */
    jnode *node;       /* this device's scenario object */
    struct device *parent;
    unsigned tick;     /* physical GPUs: utilisation reads so far */
    unsigned calls;    /* physical GPUs: device calls on it or its MIG devices */
} device;

static jnode *g_root;
static int g_init_count;

/* Test hook: calls per NVML function since the scenario was loaded (fake_nvml_calls). The
 * names are the string literals each function passes, so they live as long as the library. */
#define MAX_COUNTED 128
static struct { const char *fn; unsigned n; } g_counts[MAX_COUNTED];
static unsigned g_counted;

static void count_call(const char *fn) {
    for (unsigned i = 0; i < g_counted; i++)
        if (!strcmp(g_counts[i].fn, fn)) { g_counts[i].n++; return; }
    if (g_counted < MAX_COUNTED) { g_counts[g_counted].fn = fn; g_counts[g_counted++].n = 1; }
}

/* An event set: the event types each GPU is registered for, and each GPU's next scripted Xid
 * not yet delivered to this set. */
#define MAX_SETS 16
typedef struct {
    int live;
    unsigned long long types[MAX_GPUS];
    int next_xid[MAX_GPUS];
} event_set;
static event_set g_sets[MAX_SETS];
static unsigned g_gpu_count;
static device g_gpus[MAX_GPUS];
static device g_migs[MAX_GPUS][MAX_MIG];
static unsigned g_mig_count[MAX_GPUS];

static void unload_scenario(void) {
    jfree(g_root);
    g_root = NULL;
    g_gpu_count = 0;
    memset(g_gpus, 0, sizeof g_gpus);
    memset(g_migs, 0, sizeof g_migs);
    memset(g_mig_count, 0, sizeof g_mig_count);
    memset(g_sets, 0, sizeof g_sets); /* a new scenario: sets of the old one are gone */
    memset(g_counts, 0, sizeof g_counts);
    g_counted = 0;
}

static nvmlReturn_t load_scenario(void) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if (!path || !*path) {
        fprintf(stderr, "fake_nvml: FAKE_NVML_SCENARIO is not set\n");
        return NVML_ERROR_UNKNOWN;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fake_nvml: cannot open %s: %s\n", path, strerror(errno));
        return NVML_ERROR_UNKNOWN;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = size >= 0 ? malloc((size_t)size + 1) : NULL;
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "fake_nvml: cannot read %s\n", path);
        free(text);
        fclose(f);
        return NVML_ERROR_UNKNOWN;
    }
    fclose(f);
    text[size] = '\0';

    jparser ps = {text, NULL, 0};
    jnode *root = jparse_value(&ps);
    if (root) {
        jskip(&ps);
        if (*ps.p) { ps.err = "trailing characters"; jfree(root); root = NULL; }
    }
    if (!root || root->type != J_OBJ) {
        fprintf(stderr, "fake_nvml: %s: %s at byte %ld\n", path,
                ps.err ? ps.err : "top level must be an object", (long)(ps.p - text));
        jfree(root);
        free(text);
        return NVML_ERROR_UNKNOWN;
    }
    free(text);

    unload_scenario();
    g_root = root;
    jnode *gpus = jget(root, "gpus");
    for (jnode *g = gpus ? gpus->child : NULL; g && g_gpu_count < MAX_GPUS; g = g->next) {
        unsigned i = g_gpu_count++;
        g_gpus[i] = (device){.index = i, .node = g};
        jnode *migs = jget(g, "mig");
        for (jnode *m = migs ? migs->child : NULL; m && g_mig_count[i] < MAX_MIG; m = m->next) {
            unsigned s = g_mig_count[i]++;
            g_migs[i][s] = (device){.is_mig = 1, .index = i, .mig_slot = s, .node = m, .parent = &g_gpus[i]};
        }
    }
    return NVML_SUCCESS;
}

static device *as_device(const void *handle) {
    const char *h = handle;
    if (h >= (const char *)g_gpus && h < (const char *)(g_gpus + g_gpu_count))
        return (device *)handle;
    if (h >= (const char *)g_migs && h < (const char *)(g_migs + MAX_GPUS)) {
        device *d = (device *)handle;
        if (d->is_mig && d->mig_slot < g_mig_count[d->index]) return d;
    }
    return NULL;
}

static device *physical(device *d) { return d->is_mig ? d->parent : d; }

static int is_lost(device *d) {
    device *gpu = physical(d);
    jnode *k = jget(gpu->node, "lost_after_tick");
    if (!k || k->type != J_NUM) return 0;
    return k->num < 0 || (double)gpu->tick > k->num;
}

/* The common gate of every device call: initialised, a known handle, the
 * function not scripted as missing, the GPU not lost. */
static int is_missing(const char *fn) { return jcontains(jget(g_root, "missing"), fn); }

static nvmlReturn_t gate(const char *fn, void *handle, device **out) {
    count_call(fn);
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    device *d = as_device(handle);
    if (!d) return NVML_ERROR_INVALID_ARGUMENT;
    physical(d)->calls++;
    if (jcontains(jget(g_root, "missing"), fn) || jcontains(jget(physical(d)->node, "missing"), fn))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (is_lost(d)) return NVML_ERROR_GPU_IS_LOST;
    *out = d;
    return NVML_SUCCESS;
}

/* A scripted value: a number, or a list indexed by the GPU's tick (tick 1 reads
 * element 0; the last element holds). Absent or listed in "not_supported" →
 * NOT_SUPPORTED; listed in "errors" → that error code. */
static nvmlReturn_t resolve_in(jnode *obj, device *d, const char *field, jnode **out) {
    jnode *err = jget(jget(obj, "errors"), field);
    if (err && err->type == J_NUM && jnum_u64(err) != 0) return (nvmlReturn_t)jnum_u64(err);
    if (jcontains(jget(obj, "not_supported"), field)) return NVML_ERROR_NOT_SUPPORTED;
    jnode *v = jget(obj, field);
    if (v && v->type == J_ARR) {
        int n = jlen(v);
        if (n == 0) return NVML_ERROR_NOT_SUPPORTED;
        unsigned tick = physical(d)->tick;
        int i = tick == 0 ? 0 : (int)(tick - 1);
        v = jat(v, i < n ? i : n - 1);
    }
    if (!v || v->type != J_NUM) return NVML_ERROR_NOT_SUPPORTED;
    *out = v;
    return NVML_SUCCESS;
}

static nvmlReturn_t resolve(device *d, const char *field, jnode **out) { return resolve_in(d->node, d, field, out); }

static nvmlReturn_t value_of(device *d, const char *field, unsigned long long *out) {
    jnode *v;
    nvmlReturn_t r = resolve(d, field, &v);
    if (r == NVML_SUCCESS) *out = jnum_u64(v);
    return r;
}

static nvmlReturn_t get_uint(const char *fn, void *handle, const char *field, unsigned *out) {
    device *d;
    unsigned long long v = 0;
    nvmlReturn_t r = gate(fn, handle, &d);
    if (r == NVML_SUCCESS) r = out ? value_of(d, field, &v) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) *out = (unsigned)v;
    return r;
}

static nvmlReturn_t get_u64(const char *fn, void *handle, const char *field, unsigned long long *out) {
    device *d;
    unsigned long long v = 0;
    nvmlReturn_t r = gate(fn, handle, &d);
    if (r == NVML_SUCCESS) r = out ? value_of(d, field, &v) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) *out = v;
    return r;
}

static nvmlReturn_t copy_string(const char *s, char *buf, unsigned len) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, s);
    return NVML_SUCCESS;
}

static const char *str_field(device *d, const char *key, const char *fallback) {
    jnode *v = jget(d->node, key);
    return v && v->type == J_STR ? v->str : fallback;
}

/* ------------------------------------------------------------- library -- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    if (g_init_count == 0) {
        nvmlReturn_t r = load_scenario();
        if (r != NVML_SUCCESS) return r;
        jnode *fails = jget(g_root, "init_fails");
        if (fails && fails->type == J_NUM && jnum_u64(fails) != 0) return (nvmlReturn_t)jnum_u64(fails);
        if (fails && fails->type == J_BOOL && fails->num) return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    g_init_count++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    g_init_count--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned len) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    jnode *v = jget(g_root, "driver_version");
    return copy_string(v && v->type == J_STR ? v->str : "550.54.15", version, len);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = g_gpu_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, void **handle) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (index >= g_gpu_count || !handle) return NVML_ERROR_INVALID_ARGUMENT;
    /* lost_after_tick < 0: lost before anyone looked, as after an Xid 79. */
    if (is_lost(&g_gpus[index])) return NVML_ERROR_GPU_IS_LOST;
    *handle = &g_gpus[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **handle) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !handle) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g_gpu_count; i++) {
        if (!strcmp(str_field(&g_gpus[i], "uuid", ""), uuid)) { *handle = &g_gpus[i]; return NVML_SUCCESS; }
        for (unsigned s = 0; s < g_mig_count[i]; s++)
            if (!strcmp(str_field(&g_migs[i][s], "uuid", ""), uuid)) { *handle = &g_migs[i][s]; return NVML_SUCCESS; }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(void *handle, char *uuid, unsigned len) {
    device *d;
    nvmlReturn_t r = gate("nvmlDeviceGetUUID", handle, &d);
    return r != NVML_SUCCESS ? r : copy_string(str_field(d, "uuid", "GPU-00000000-0000-0000-0000-000000000000"), uuid, len);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(void *handle, char *name, unsigned len) {
    device *d;
    nvmlReturn_t r = gate("nvmlDeviceGetName", handle, &d);
    if (r != NVML_SUCCESS) return r;
    const char *fallback = d->is_mig ? str_field(d->parent, "name", "Fake GPU") : "Fake GPU";
    return copy_string(str_field(d, "name", fallback), name, len);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(void *handle, unsigned *index) {
    device *d;
    nvmlReturn_t r = gate("nvmlDeviceGetIndex", handle, &d);
    if (r != NVML_SUCCESS) return r;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->index;
    return NVML_SUCCESS;
}

typedef struct { unsigned gpu, memory; } nvmlUtilization_t;

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(void *handle, nvmlUtilization_t *util) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    device *d = as_device(handle);
    /* The tick advances before any check, so a GPU whose utilisation is
     * unsupported or missing still moves through its scripted values. */
    if (d && !d->is_mig) d->tick++;
    device *ok;
    unsigned long long g = 0, m = 0;
    nvmlReturn_t r = gate("nvmlDeviceGetUtilizationRates", handle, &ok);
    if (r == NVML_SUCCESS && !util) r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) r = value_of(ok, "util_gpu", &g);
    if (r == NVML_SUCCESS) r = value_of(ok, "util_mem", &m);
    if (r == NVML_SUCCESS) { util->gpu = (unsigned)g; util->memory = (unsigned)m; }
    return r;
}

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

static nvmlReturn_t memory(const char *fn, void *handle, unsigned long long *total, unsigned long long *used) {
    device *d;
    nvmlReturn_t r = gate(fn, handle, &d);
    if (r == NVML_SUCCESS) r = value_of(d, "mem_total", total);
    if (r == NVML_SUCCESS) r = value_of(d, "mem_used", used);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *mem) {
    unsigned long long total = 0, used = 0;
    nvmlReturn_t r = memory("nvmlDeviceGetMemoryInfo", handle, &total, &used);
    if (r == NVML_SUCCESS && !mem) r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) *mem = (nvmlMemory_t){total, total > used ? total - used : 0, used};
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *handle, nvmlMemory_v2_t *mem) {
    unsigned long long total = 0, used = 0;
    nvmlReturn_t r = memory("nvmlDeviceGetMemoryInfo_v2", handle, &total, &used);
    if (r == NVML_SUCCESS && !mem) r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) *mem = (nvmlMemory_v2_t){mem->version, total, 0, total > used ? total - used : 0, used};
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(void *handle, unsigned *mw) {
    return get_uint("nvmlDeviceGetPowerUsage", handle, "power_mw", mw);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void *handle, unsigned long long *mj) {
    return get_u64("nvmlDeviceGetTotalEnergyConsumption", handle, "energy_mj", mj);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(void *handle, int sensor, unsigned *temp) {
    if (sensor != 0) return g_init_count <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_NOT_SUPPORTED;
    return get_uint("nvmlDeviceGetTemperature", handle, "temp_c", temp);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(void *handle, int type, unsigned *mhz) {
    /* NVML_CLOCK_GRAPHICS = 0 and NVML_CLOCK_SM = 1 read the SM clock. */
    const char *field = type == 0 || type == 1 ? "sm_clock_mhz" : type == 2 ? "mem_clock_mhz" : "video_clock_mhz";
    return get_uint("nvmlDeviceGetClockInfo", handle, field, mhz);
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(void *handle, int counter, unsigned *kbs) {
    if (counter != 0 && counter != 1) return g_init_count <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    return get_uint("nvmlDeviceGetPcieThroughput", handle, counter == 0 ? "pcie_tx_kbs" : "pcie_rx_kbs", kbs);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *handle, unsigned long long *reasons) {
    return get_u64("nvmlDeviceGetCurrentClocksEventReasons", handle, "throttle_reasons", reasons);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *handle, unsigned long long *reasons) {
    return get_u64("nvmlDeviceGetCurrentClocksThrottleReasons", handle, "throttle_reasons", reasons);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *handle, int error_type, int counter_type, unsigned long long *count) {
    /* nvmlMemoryErrorType_t: 0 corrected, 1 uncorrected; nvmlEccCounterType_t: 0 volatile (since
     * the driver loaded), 1 aggregate (the GPU's lifetime), which reads the volatile key unless
     * its own is scripted. */
    const char *fn = "nvmlDeviceGetTotalEccErrors";
    if ((error_type != 0 && error_type != 1) || (counter_type != 0 && counter_type != 1)) {
        count_call(fn);
        return g_init_count <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    }
    const char *field = error_type == 0 ? "ecc_corrected" : "ecc_uncorrected";
    if (counter_type == 1) {
        const char *aggregate = error_type == 0 ? "ecc_aggregate_corrected" : "ecc_aggregate_uncorrected";
        device *d = as_device(handle);
        if (d && jget(d->node, aggregate)) field = aggregate;
    }
    return get_u64(fn, handle, field, count);
}

/* ------------------------------------------------ counters of faults -- */

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(void *handle, unsigned *value) {
    return get_uint("nvmlDeviceGetPcieReplayCounter", handle, "pcie_replays", value);
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(void *handle, unsigned *corrected, unsigned *uncorrected,
                                              unsigned *pending, unsigned *failure) {
    device *d;
    unsigned long long c = 0, u = 0, p = 0, f = 0;
    nvmlReturn_t r = gate("nvmlDeviceGetRemappedRows", handle, &d);
    if (r == NVML_SUCCESS && (!corrected || !uncorrected || !pending || !failure)) r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) r = value_of(d, "remapped_corrected", &c);
    if (r == NVML_SUCCESS) r = value_of(d, "remapped_uncorrected", &u);
    if (r == NVML_SUCCESS) r = value_of(d, "remap_pending", &p);
    if (r == NVML_SUCCESS) r = value_of(d, "remap_failure", &f);
    if (r == NVML_SUCCESS) {
        *corrected = (unsigned)c; *uncorrected = (unsigned)u;
        *pending = p != 0; *failure = f != 0; /* NVML says 0 or 1 */
    }
    return r;
}

/* nvmlEnableState_t *isPending: 0 disabled, 1 enabled. */
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(void *handle, unsigned *pending) {
    device *d;
    unsigned long long v = 0;
    nvmlReturn_t r = gate("nvmlDeviceGetRetiredPagesPendingStatus", handle, &d);
    if (r == NVML_SUCCESS) r = pending ? value_of(d, "retired_pages_pending", &v) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) *pending = v != 0;
    return r;
}

/* NVLink: "nvlink" lists the GPU's links; each link is an object whose value keys ("active",
 * "replay", "recovery", "crc_flit", "crc_data", "ecc_data") follow the GPU's tick, with its own
 * "not_supported" and "errors". */
#define NVML_NVLINK_MAX_LINKS 36

static nvmlReturn_t nvlink(const char *fn, void *handle, unsigned link, device **d, jnode **out) {
    nvmlReturn_t r = gate(fn, handle, d);
    if (r != NVML_SUCCESS) return r;
    if (link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    jnode *err = jget(jget((*d)->node, "errors"), "nvlink");
    if (err && err->type == J_NUM && jnum_u64(err) != 0) return (nvmlReturn_t)jnum_u64(err);
    jnode *links = jget((*d)->node, "nvlink");
    if (!links || links->type != J_ARR || jcontains(jget((*d)->node, "not_supported"), "nvlink"))
        return NVML_ERROR_NOT_SUPPORTED; /* a PCIe card, or a MIG device */
    *out = jat(links, (int)link);
    /* As NVML: a link past the GPU's own is an invalid argument. */
    return *out && (*out)->type == J_OBJ ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(void *handle, unsigned link, unsigned *active) {
    device *d;
    jnode *l, *v;
    nvmlReturn_t r = nvlink("nvmlDeviceGetNvLinkState", handle, link, &d, &l);
    if (r != NVML_SUCCESS) return r;
    if (!active) return NVML_ERROR_INVALID_ARGUMENT;
    if (!jget(l, "active") && !jget(jget(l, "errors"), "active")) { *active = 1; return NVML_SUCCESS; }
    r = resolve_in(l, d, "active", &v);
    if (r == NVML_SUCCESS) *active = jnum_u64(v) != 0;
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(void *handle, unsigned link, int counter, unsigned long long *value) {
    /* nvmlNvLinkErrorCounter_t */
    static const char *const names[] = {"replay", "recovery", "crc_flit", "crc_data", "ecc_data"};
    device *d;
    jnode *l, *v;
    nvmlReturn_t r = nvlink("nvmlDeviceGetNvLinkErrorCounter", handle, link, &d, &l);
    if (r != NVML_SUCCESS) return r;
    if (counter < 0 || counter > 4 || !value) return NVML_ERROR_INVALID_ARGUMENT;
    r = resolve_in(l, d, names[counter], &v);
    if (r == NVML_SUCCESS) *value = jnum_u64(v);
    return r;
}

/* nvmlDeviceGetFieldValues, for the fields of faults: the NVLink error totals
 * (NVML_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL: each the sum of that counter over every link of the GPU
 * that has it, up or down, as an unsigned long long; a link's error code fails the slot) and the
 * scalars below (their value keys, as an unsigned int: only the union's first 4 bytes are
 * written, as NVML does). Any other field answers NOT_SUPPORTED in its own slot. */
typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;            /* nvmlValueType_t */
    nvmlReturn_t nvmlReturn;
    unsigned char value[8];   /* the union nvmlValue_t */
} nvmlFieldValue_t;

static const struct { unsigned id; const char *key; int flag; } scalar_fields[] = {
    {94, "pcie_replays", 0},           /* NVML_FI_DEV_PCIE_REPLAY_COUNTER */
    {142, "remapped_corrected", 0},    /* NVML_FI_DEV_REMAPPED_COR */
    {143, "remapped_uncorrected", 0},  /* NVML_FI_DEV_REMAPPED_UNC */
    {144, "remap_pending", 1},         /* NVML_FI_DEV_REMAPPED_PENDING */
    {145, "remap_failure", 1},         /* NVML_FI_DEV_REMAPPED_FAILURE */
    {31, "retired_pages_pending", 1},  /* NVML_FI_DEV_RETIRED_PENDING */
};

static void nvlink_total(device *d, const char *counter, nvmlFieldValue_t *f) {
    jnode *links = jget(d->node, "nvlink");
    if (!links || links->type != J_ARR || jcontains(jget(d->node, "not_supported"), "nvlink")) {
        f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        return;
    }
    unsigned long long total = 0;
    int found = 0;
    for (jnode *l = links->child; l; l = l->next) {
        jnode *v;
        nvmlReturn_t r = resolve_in(l, d, counter, &v);
        if (r == NVML_ERROR_NOT_SUPPORTED) continue;
        if (r != NVML_SUCCESS) { f->nvmlReturn = r; return; }
        total += jnum_u64(v);
        found = 1;
    }
    f->nvmlReturn = found ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    f->valueType = 3; /* NVML_VALUE_TYPE_UNSIGNED_LONG_LONG */
    memcpy(f->value, &total, sizeof total);
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(void *handle, int count, nvmlFieldValue_t *values) {
    device *d;
    nvmlReturn_t r = gate("nvmlDeviceGetFieldValues", handle, &d);
    if (r != NVML_SUCCESS) return r;
    if (count < 0 || (count > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *f = &values[i];
        f->timestamp = 0;
        f->latencyUsec = 0;
        f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        switch (f->fieldId) {
        case 38: nvlink_total(d, "crc_flit", f); continue;
        case 45: nvlink_total(d, "crc_data", f); continue;
        case 52: nvlink_total(d, "replay", f); continue;
        case 59: nvlink_total(d, "recovery", f); continue;
        }
        for (size_t k = 0; k < sizeof scalar_fields / sizeof scalar_fields[0]; k++) {
            if (scalar_fields[k].id != f->fieldId) continue;
            unsigned long long v = 0;
            f->nvmlReturn = value_of(d, scalar_fields[k].key, &v);
            if (f->nvmlReturn == NVML_SUCCESS) {
                unsigned u = scalar_fields[k].flag ? v != 0 : (unsigned)v;
                f->valueType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
                memcpy(f->value, &u, sizeof u);
            }
        }
    }
    return NVML_SUCCESS;
}

/* -------------------------------------------------------------- events -- */

#define EVENT_XID 0x8ULL /* nvmlEventTypeXidCriticalError */
/* What a data centre GPU supports: single/double bit ECC, P-state, Xid, clock. */
#define DEFAULT_EVENT_TYPES 0x1FULL

typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

typedef struct { void *device; unsigned long long eventType, eventData; } nvmlEventData_v1_t;

static event_set *as_set(void *set) {
    event_set *s = set;
    if (s < g_sets || s >= g_sets + MAX_SETS || (char *)s != (char *)&g_sets[s - g_sets] || !s->live) return NULL;
    return s;
}

static nvmlReturn_t event_types(device *d, unsigned long long *types) {
    jnode *ns = jget(d->node, "not_supported");
    if (d->is_mig || jcontains(ns, "events")) return NVML_ERROR_NOT_SUPPORTED;
    jnode *v = jget(d->node, "event_types");
    *types = v && v->type == J_NUM ? jnum_u64(v) : DEFAULT_EVENT_TYPES;
    if (jcontains(ns, "xids")) *types &= ~EVENT_XID;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(void **set) {
    count_call("nvmlEventSetCreate");
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (is_missing("nvmlEventSetCreate")) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_SETS; i++) {
        if (!g_sets[i].live) {
            memset(&g_sets[i], 0, sizeof g_sets[i]);
            g_sets[i].live = 1;
            *set = &g_sets[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_UNKNOWN; /* out of sets: a leak in the caller */
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *handle, unsigned long long *types) {
    device *d;
    nvmlReturn_t r = gate("nvmlDeviceGetSupportedEventTypes", handle, &d);
    if (r != NVML_SUCCESS) return r;
    return types ? event_types(d, types) : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(void *handle, unsigned long long types, void *set) {
    device *d;
    unsigned long long supported = 0;
    nvmlReturn_t r = gate("nvmlDeviceRegisterEvents", handle, &d);
    if (r != NVML_SUCCESS) return r;
    event_set *s = as_set(set);
    if (!s) return NVML_ERROR_INVALID_ARGUMENT;
    if ((r = event_types(d, &supported)) != NVML_SUCCESS) return r;
    if (types & ~supported) return NVML_ERROR_NOT_SUPPORTED;
    if ((types & EVENT_XID) && !(s->types[d->index] & EVENT_XID)) {
        /* Only what happens from now on is delivered: Xids scripted at or before the GPU's tick are past. */
        jnode *xids = jget(d->node, "xids");
        int past = 0;
        for (jnode *e = xids && xids->type == J_ARR ? xids->child : NULL; e; e = e->next, past++) {
            jnode *t = jget(e, "tick");
            if (t && t->type == J_NUM && t->num > (double)d->tick) break;
        }
        s->next_xid[d->index] = past;
    }
    s->types[d->index] |= types;
    return NVML_SUCCESS;
}

/* The earliest Xid of a registered GPU whose tick has come (ties: the lowest index), or TIMEOUT.
 * The fake never waits: time passes only through the GPUs' ticks. A lost GPU still delivers its
 * Xids (NVML reports the Xid 79 that loses it). */
static nvmlReturn_t event_wait(const char *fn, void *set, nvmlEventData_t *data) {
    count_call(fn);
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (is_missing(fn)) return NVML_ERROR_FUNCTION_NOT_FOUND;
    event_set *s = as_set(set);
    if (!s || !data) return NVML_ERROR_INVALID_ARGUMENT;
    int best = -1;
    double best_tick = 0;
    jnode *best_event = NULL;
    for (unsigned i = 0; i < g_gpu_count; i++) {
        if (!(s->types[i] & EVENT_XID)) continue;
        jnode *e = jat(jget(g_gpus[i].node, "xids"), s->next_xid[i]);
        if (!e) continue;
        jnode *t = jget(e, "tick");
        double tick = t && t->type == J_NUM ? t->num : 0;
        if (tick <= (double)g_gpus[i].tick && (best < 0 || tick < best_tick)) {
            best = (int)i, best_tick = tick, best_event = e;
        }
    }
    if (best < 0) return NVML_ERROR_TIMEOUT;
    s->next_xid[best]++;
    jnode *code = jget(best_event, "code");
    *data = (nvmlEventData_t){
        .device = &g_gpus[best],
        .eventType = EVENT_XID,
        .eventData = code && code->type == J_NUM ? jnum_u64(code) : 0,
        .gpuInstanceId = ~0U, /* not a MIG instance's */
        .computeInstanceId = ~0U,
    };
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned timeout_ms) {
    (void)timeout_ms;
    return event_wait("nvmlEventSetWait_v2", set, data);
}

/* The first version's nvmlEventData_t has no instance ids. */
EXPORT nvmlReturn_t nvmlEventSetWait(void *set, nvmlEventData_v1_t *data, unsigned timeout_ms) {
    (void)timeout_ms;
    nvmlEventData_t full;
    nvmlReturn_t r = event_wait("nvmlEventSetWait", set, data ? &full : NULL);
    if (r == NVML_SUCCESS) *data = (nvmlEventData_v1_t){full.device, full.eventType, full.eventData};
    return r;
}

EXPORT nvmlReturn_t nvmlEventSetFree(void *set) {
    count_call("nvmlEventSetFree");
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    event_set *s = as_set(set);
    if (!s) return NVML_ERROR_INVALID_ARGUMENT;
    s->live = 0;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId;
    unsigned computeInstanceId;
} nvmlProcessInfo_t;

static nvmlReturn_t running_processes(const char *fn, void *handle, unsigned *count, nvmlProcessInfo_t *infos) {
    device *d;
    nvmlReturn_t r = gate(fn, handle, &d);
    if (r != NVML_SUCCESS) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (jcontains(jget(d->node, "not_supported"), "processes")) return NVML_ERROR_NOT_SUPPORTED;
    jnode *procs = jget(d->node, "processes");
    unsigned n = (unsigned)jlen(procs);
    if (n == 0) { *count = 0; return NVML_SUCCESS; }
    if (!infos || *count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    unsigned i = 0;
    for (jnode *p = procs->child; p; p = p->next, i++) {
        jnode *pid = jget(p, "pid"), *mem = jget(p, "used_memory");
        infos[i] = (nvmlProcessInfo_t){
            .pid = pid && pid->type == J_NUM ? (unsigned)jnum_u64(pid) : 0,
            .usedGpuMemory = mem && mem->type == J_NUM ? jnum_u64(mem) : ~0ULL, /* NVML_VALUE_NOT_AVAILABLE */
            .gpuInstanceId = d->is_mig ? d->mig_slot : ~0U,
            .computeInstanceId = d->is_mig ? 0 : ~0U,
        };
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned *count, nvmlProcessInfo_t *infos) {
    return running_processes("nvmlDeviceGetComputeRunningProcesses_v3", handle, count, infos);
}

/* v2 has the same layout as v3. */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void *handle, unsigned *count, nvmlProcessInfo_t *infos) {
    return running_processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(void *handle, unsigned *current, unsigned *pending) {
    device *d;
    nvmlReturn_t r = gate("nvmlDeviceGetMigMode", handle, &d);
    if (r != NVML_SUCCESS) return r;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    jnode *mode = jget(d->node, "mig_mode");
    if (mode && mode->type == J_NUM) *current = (unsigned)jnum_u64(mode);
    else if (jget(d->node, "mig")) *current = 1;
    else return NVML_ERROR_NOT_SUPPORTED; /* not a MIG-capable GPU */
    *pending = *current;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *handle, unsigned *count) {
    device *d;
    nvmlReturn_t r = gate("nvmlDeviceGetMaxMigDeviceCount", handle, &d);
    if (r != NVML_SUCCESS) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || !jget(d->node, "mig")) return NVML_ERROR_NOT_SUPPORTED;
    *count = 7; /* as an A100/H100: slots past the configured instances are empty */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *handle, unsigned index, void **mig) {
    device *d;
    nvmlReturn_t r = gate("nvmlDeviceGetMigDeviceHandleByIndex", handle, &d);
    if (r != NVML_SUCCESS) return r;
    if (!mig || d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= g_mig_count[d->index]) return NVML_ERROR_NOT_FOUND;
    *mig = &g_migs[d->index][index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *handle, unsigned *is_mig) {
    device *d;
    nvmlReturn_t r = gate("nvmlDeviceIsMigDeviceHandle", handle, &d);
    if (r != NVML_SUCCESS) return r;
    if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = (unsigned)d->is_mig;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *handle, void **parent) {
    device *d;
    nvmlReturn_t r = gate("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle, &d);
    if (r != NVML_SUCCESS) return r;
    if (!parent || !d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = d->parent;
    return NVML_SUCCESS;
}

/* GPM: a GPU supports it when its scenario has "gpm_sm_active" or
 * "gpm_tensor_active"; a sample remembers the GPU and its tick, and the metrics
 * read the values at the second sample's tick. */
typedef struct { unsigned version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct { device *gpu; unsigned tick; } gpm_sample;
typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct {
    unsigned metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;
#define GPM_METRIC_MAX 477
typedef struct {
    unsigned version, numMetrics;
    gpm_sample *sample1, *sample2;
    nvmlGpmMetric_t metrics[GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

static int has_gpm(device *d) {
    return !d->is_mig && (jget(d->node, "gpm_sm_active") || jget(d->node, "gpm_tensor_active"));
}

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(void *handle, nvmlGpmSupport_t *support) {
    device *d;
    nvmlReturn_t r = gate("nvmlGpmQueryDeviceSupport", handle, &d);
    if (r != NVML_SUCCESS) return r;
    if (!support) return NVML_ERROR_INVALID_ARGUMENT;
    support->isSupportedDevice = (unsigned)has_gpm(d);
    return NVML_SUCCESS;
}

static unsigned g_gpm_live; /* samples allocated and not freed, for the leak check */

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(gpm_sample **sample) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (jcontains(jget(g_root, "missing"), "nvmlGpmSampleAlloc")) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!sample) return NVML_ERROR_INVALID_ARGUMENT;
    if (!(*sample = calloc(1, sizeof **sample))) return NVML_ERROR_UNKNOWN;
    g_gpm_live++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(gpm_sample *sample) {
    if (!sample) return NVML_ERROR_INVALID_ARGUMENT;
    free(sample);
    g_gpm_live--;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(void *handle, gpm_sample *sample) {
    device *d;
    nvmlReturn_t r = gate("nvmlGpmSampleGet", handle, &d);
    if (r != NVML_SUCCESS) return r;
    if (!sample) return NVML_ERROR_INVALID_ARGUMENT;
    if (!has_gpm(d)) return NVML_ERROR_NOT_SUPPORTED;
    *sample = (gpm_sample){d, d->tick};
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *req) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (jcontains(jget(g_root, "missing"), "nvmlGpmMetricsGet")) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!req || !req->sample1 || !req->sample2 || req->numMetrics > GPM_METRIC_MAX) return NVML_ERROR_INVALID_ARGUMENT;
    device *d = req->sample2->gpu;
    if (!d || req->sample1->gpu != d || req->sample1->tick > req->sample2->tick) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned now = d->tick;
    d->tick = req->sample2->tick; /* read the values as they were at the second sample */
    for (unsigned i = 0; i < req->numMetrics; i++) {
        nvmlGpmMetric_t *m = &req->metrics[i];
        const char *field = m->metricId == 2 ? "gpm_sm_active" : m->metricId == 5 ? "gpm_tensor_active" : NULL;
        jnode *v = NULL;
        m->nvmlReturn = field ? resolve(d, field, &v) : NVML_ERROR_NOT_SUPPORTED;
        m->value = m->nvmlReturn == NVML_SUCCESS ? v->num : 0.0;
    }
    d->tick = now;
    return NVML_SUCCESS;
}

/* Test hook, not NVML: GPM samples allocated and not yet freed. */
EXPORT unsigned fake_nvml_gpm_samples_live(void) { return g_gpm_live; }

/* Test hook, not NVML: how many device calls GPU `index` has had since nvmlInit
 * (to check that a lost GPU is not asked again). */
EXPORT unsigned fake_nvml_device_calls(unsigned index) {
    return index < g_gpu_count ? g_gpus[index].calls : 0;
}

/* Test hook, not NVML: how many times the NVML function `fn` was called since the scenario was
 * loaded, on every device (to check that what a GPU lacks is not asked again). */
EXPORT unsigned fake_nvml_calls(const char *fn) {
    if (!fn) return 0;
    for (unsigned i = 0; i < g_counted; i++)
        if (!strcmp(g_counts[i].fn, fn)) return g_counts[i].n;
    return 0;
}

/* Test hook, not NVML: event sets created and not yet freed. */
EXPORT unsigned fake_nvml_event_sets_live(void) {
    unsigned n = 0;
    for (int i = 0; i < MAX_SETS; i++) n += (unsigned)g_sets[i].live;
    return n;
}
