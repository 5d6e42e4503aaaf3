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
static nvmlReturn_t gate(const char *fn, void *handle, device **out) {
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
static nvmlReturn_t resolve(device *d, const char *field, jnode **out) {
    jnode *err = jget(jget(d->node, "errors"), field);
    if (err && err->type == J_NUM && jnum_u64(err) != 0) return (nvmlReturn_t)jnum_u64(err);
    if (jcontains(jget(d->node, "not_supported"), field)) return NVML_ERROR_NOT_SUPPORTED;
    jnode *v = jget(d->node, field);
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
    /* The scenario scripts volatile counts; aggregate (counter_type 1) reads the same. */
    (void)counter_type;
    return get_u64("nvmlDeviceGetTotalEccErrors", handle, error_type == 0 ? "ecc_corrected" : "ecc_uncorrected", count);
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
