/*
 * A stand-in for libnvidia-ml.so.1 serving the NVML calls edra makes, for tests.
 *
 * The devices come from "nvml_stub.conf" in the directory holding this library (found
 * with dladdr), so every copy of the library in its own directory is an independent
 * fake machine. One record per line, fields separated by ';', "key=value" after the
 * record type; '#' starts a comment line:
 *
 *   driver;version=550.54.15;cuda=12040
 *   gpu;uuid=GPU-..;name=NVIDIA A100-SXM4-80GB;brand=2;arch=7;minor=0;index=0;
 *       bus=00000000:3B:00.0;mem=85899345920;sms=108;cc=8.0;mig=0
 *   mig;gpu=0;slot=0;gi=1;ci=0;uuid=MIG-..;mem=10200547328;sms=14;gislices=1;
 *       cislices=1;memmb=9728
 *   fail;call=nvmlDeviceGetUUID;device=1;code=15
 *
 * "gpu" records are enumerated in file order; a "mig" record belongs to the GPU with
 * that enumeration position and sits in MIG slot "slot". A "fail" record makes the named
 * call return the NVML error "code" (for every device, or only for GPU "device"; MIG
 * handles count as their parent). Without a config file nvmlInit_v2 returns
 * NVML_ERROR_DRIVER_NOT_LOADED.
 *
 * Events: a "gpu" record's "events=<mask>" sets the event types it supports (default
 * 0xf: single- and double-bit ECC, P-state, critical XID). nvmlEventSetWait_v2 reads
 * "nvml_stub.events" beside the library from where it ended when the set was created,
 * one event per line: "<gpu position> xid <n>", "<gpu position> dbe", or "lost" (the wait
 * returns NVML_ERROR_GPU_IS_LOST); events of types a GPU did not register are skipped.
 * nvmlDeviceRegisterEvents refuses types a GPU does not support with NOT_SUPPORTED.
 * nvmlInit_v2 and nvmlShutdown are reference-counted, as NVML's are.
 *
 * Field 230 (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) answers a GPU's last "<gpu position>
 * <action>" line of "nvml_stub.recovery" beside the library; without one it is
 * NOT_SUPPORTED, as on drivers that lack the field. Other fields are NOT_SUPPORTED.
 *
 * Compute modes outlive the process, as a GPU's do: nvmlDeviceSetComputeMode appends
 * "<uuid> <mode>" to "nvml_stub.modes" beside the library, and nvmlDeviceGetComputeMode
 * answers a GPU's last line there (none: 0, DEFAULT). MIG handles are refused with
 * NVML_ERROR_NOT_SUPPORTED.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEVS 64
#define MAX_FAILS 16
#define SUCCESS 0
#define ERR_UNINITIALIZED 1
#define ERR_INVALID_ARGUMENT 2
#define ERR_NOT_SUPPORTED 3
#define ERR_NOT_FOUND 6
#define ERR_INSUFFICIENT_SIZE 7
#define ERR_DRIVER_NOT_LOADED 9
#define ERR_ARGUMENT_VERSION_MISMATCH 25
#define ERR_TIMEOUT 10
#define ERR_GPU_IS_LOST 15
#define DEFAULT_EVENTS 0xfULL

struct dev {
    int used, is_mig, parent, slot;
    char uuid[96], name[96], bus[32];
    unsigned brand, arch, minor, index, gi, ci, sms, gislices, cislices, mig_mode;
    int cc_major, cc_minor;
    unsigned long long mem, memmb, ev_supported, ev_registered;
    int ev_given;
};

struct fail {
    char call[64];
    int device;
    int code;
};

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} pci_info_t;

typedef struct {
    unsigned version;
    unsigned long long total, reserved, free, used;
} memory_v2_t;

typedef struct {
    unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} attributes_t;

static struct dev devs[MAX_DEVS];
static struct fail fails[MAX_FAILS];
static int ndevs, ngpus, nfails, initialized;
static char driver_version[80] = "550.54.15";
static int cuda_version = 12040;
static char modes_path[4200];
static char events_path[4200];
static char recovery_path[4200];
static long events_offset;

static int failure(const char *call, const struct dev *d) {
    for (int i = 0; i < nfails; i++) {
        if (strcmp(fails[i].call, call) != 0) continue;
        if (fails[i].device < 0 || d == NULL) return fails[i].code;
        int gpu = d->is_mig ? d->parent : (int)(d - devs);
        if (devs[gpu].index == (unsigned)fails[i].device) return fails[i].code;
    }
    return SUCCESS;
}

#define CHECK(call, d)                                  \
    do {                                                \
        if (!initialized) return ERR_UNINITIALIZED;     \
        int rc_ = failure(call, d);                     \
        if (rc_ != SUCCESS) return rc_;                 \
    } while (0)

static struct dev *handle(void *h) {
    struct dev *d = h;
    if (d < devs || d >= devs + ndevs || !d->used) return NULL;
    return d;
}

static int copy_str(char *out, unsigned len, const char *s) {
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return ERR_INSUFFICIENT_SIZE;
    strcpy(out, s);
    return SUCCESS;
}

static void field(struct dev *d, struct fail *f, const char *kind, const char *key, const char *v) {
    unsigned long long n = strtoull(v, NULL, 0);
    if (strcmp(kind, "driver") == 0) {
        if (!strcmp(key, "version")) snprintf(driver_version, sizeof driver_version, "%s", v);
        if (!strcmp(key, "cuda")) cuda_version = (int)n;
        return;
    }
    if (f != NULL) {
        if (!strcmp(key, "call")) snprintf(f->call, sizeof f->call, "%s", v);
        if (!strcmp(key, "device")) f->device = (int)n;
        if (!strcmp(key, "code")) f->code = (int)n;
        return;
    }
    if (!strcmp(key, "uuid")) snprintf(d->uuid, sizeof d->uuid, "%s", v);
    else if (!strcmp(key, "name")) snprintf(d->name, sizeof d->name, "%s", v);
    else if (!strcmp(key, "bus")) snprintf(d->bus, sizeof d->bus, "%s", v);
    else if (!strcmp(key, "brand")) d->brand = (unsigned)n;
    else if (!strcmp(key, "arch")) d->arch = (unsigned)n;
    else if (!strcmp(key, "minor")) d->minor = (unsigned)n;
    else if (!strcmp(key, "index")) d->index = (unsigned)n;
    else if (!strcmp(key, "mem")) d->mem = n;
    else if (!strcmp(key, "sms")) d->sms = (unsigned)n;
    else if (!strcmp(key, "mig")) d->mig_mode = (unsigned)n;
    else if (!strcmp(key, "gpu")) d->parent = (int)n;
    else if (!strcmp(key, "slot")) d->slot = (int)n;
    else if (!strcmp(key, "gi")) d->gi = (unsigned)n;
    else if (!strcmp(key, "ci")) d->ci = (unsigned)n;
    else if (!strcmp(key, "gislices")) d->gislices = (unsigned)n;
    else if (!strcmp(key, "cislices")) d->cislices = (unsigned)n;
    else if (!strcmp(key, "memmb")) d->memmb = n;
    else if (!strcmp(key, "events")) {
        d->ev_supported = n;
        d->ev_given = 1;
    }
    else if (!strcmp(key, "cc")) sscanf(v, "%d.%d", &d->cc_major, &d->cc_minor);
}

static int load_config(void) {
    Dl_info info;
    if (!dladdr((void *)&load_config, &info) || info.dli_fname == NULL) return ERR_DRIVER_NOT_LOADED;
    char path[4096];
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char *slash = strrchr(path, '/');
    if (slash == NULL) return ERR_DRIVER_NOT_LOADED;
    snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "nvml_stub.conf");
    snprintf(modes_path, sizeof modes_path, "%.*snvml_stub.modes", (int)(slash + 1 - path), path);
    snprintf(events_path, sizeof events_path, "%.*snvml_stub.events", (int)(slash + 1 - path), path);
    snprintf(recovery_path, sizeof recovery_path, "%.*snvml_stub.recovery", (int)(slash + 1 - path), path);
    FILE *fp = fopen(path, "r");
    if (fp == NULL) return ERR_DRIVER_NOT_LOADED;
    memset(devs, 0, sizeof devs);
    ndevs = ngpus = nfails = 0;
    char line[1024];
    while (fgets(line, sizeof line, fp) != NULL) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0] == '#' || line[0] == 0) continue;
        char *save = NULL;
        char *kind = strtok_r(line, ";", &save);
        if (kind == NULL) continue;
        struct dev *d = NULL;
        struct fail *f = NULL;
        if ((!strcmp(kind, "gpu") || !strcmp(kind, "mig")) && ndevs < MAX_DEVS) {
            d = &devs[ndevs++];
            d->used = 1;
            d->is_mig = !strcmp(kind, "mig");
            if (!d->is_mig) ngpus++;
        } else if (!strcmp(kind, "fail") && nfails < MAX_FAILS) {
            f = &fails[nfails++];
            f->device = -1;
        } else if (strcmp(kind, "driver") != 0) {
            continue;
        }
        for (char *tok = strtok_r(NULL, ";", &save); tok != NULL; tok = strtok_r(NULL, ";", &save)) {
            char *eq = strchr(tok, '=');
            if (eq == NULL) continue;
            *eq = 0;
            field(d, f, kind, tok, eq + 1);
        }
    }
    fclose(fp);
    for (int i = 0; i < ndevs; i++) {
        if (!devs[i].ev_given) devs[i].ev_supported = DEFAULT_EVENTS;
    }
    /* MIG records name their GPU by enumeration position; store it as an array index. */
    for (int i = 0; i < ndevs; i++) {
        if (!devs[i].is_mig) continue;
        int pos = devs[i].parent, seen = 0;
        devs[i].parent = -1;
        for (int j = 0; j < ndevs; j++) {
            if (devs[j].is_mig) continue;
            if (seen++ == pos) devs[i].parent = j;
        }
        if (devs[i].parent < 0) devs[i].used = 0;
    }
    return SUCCESS;
}

static struct dev *nth_gpu(unsigned n) {
    unsigned seen = 0;
    for (int i = 0; i < ndevs; i++) {
        if (devs[i].is_mig) continue;
        if (seen++ == n) return &devs[i];
    }
    return NULL;
}

int nvmlInit_v2(void) {
    if (initialized > 0) {
        initialized++;
        return SUCCESS;
    }
    int rc = load_config();
    if (rc != SUCCESS) return rc;
    initialized = 1;
    rc = failure("nvmlInit_v2", NULL);
    if (rc != SUCCESS) initialized = 0;
    return rc;
}

int nvmlShutdown(void) {
    if (!initialized) return ERR_UNINITIALIZED;
    initialized--;
    return SUCCESS;
}

const char *nvmlErrorString(int code) {
    return code == SUCCESS ? "Success" : "Stand-in NVML error";
}

int nvmlSystemGetDriverVersion(char *out, unsigned len) {
    CHECK("nvmlSystemGetDriverVersion", NULL);
    return copy_str(out, len, driver_version);
}

int nvmlSystemGetCudaDriverVersion_v2(int *out) {
    CHECK("nvmlSystemGetCudaDriverVersion_v2", NULL);
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    *out = cuda_version;
    return SUCCESS;
}

int nvmlDeviceGetCount_v2(unsigned *out) {
    CHECK("nvmlDeviceGetCount_v2", NULL);
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    *out = (unsigned)ngpus;
    return SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **out) {
    struct dev *d = nth_gpu(index);
    CHECK("nvmlDeviceGetHandleByIndex_v2", d);
    if (d == NULL || out == NULL) return ERR_INVALID_ARGUMENT;
    *out = d;
    return SUCCESS;
}

#define DEVICE(call)                             \
    struct dev *d = handle(h);                   \
    CHECK(call, d);                              \
    if (d == NULL) return ERR_INVALID_ARGUMENT;

int nvmlDeviceGetUUID(void *h, char *out, unsigned len) {
    DEVICE("nvmlDeviceGetUUID");
    return copy_str(out, len, d->uuid);
}

int nvmlDeviceGetName(void *h, char *out, unsigned len) {
    DEVICE("nvmlDeviceGetName");
    return copy_str(out, len, d->is_mig ? devs[d->parent].name : d->name);
}

int nvmlDeviceGetPciInfo_v3(void *h, pci_info_t *out) {
    DEVICE("nvmlDeviceGetPciInfo_v3");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    const struct dev *g = d->is_mig ? &devs[d->parent] : d;
    memset(out, 0, sizeof *out);
    snprintf(out->busId, sizeof out->busId, "%s", g->bus);
    sscanf(g->bus, "%x:%x:%x", &out->domain, &out->bus, &out->device);
    return SUCCESS;
}

int nvmlDeviceGetBrand(void *h, unsigned *out) {
    DEVICE("nvmlDeviceGetBrand");
    *out = d->is_mig ? devs[d->parent].brand : d->brand;
    return SUCCESS;
}

int nvmlDeviceGetArchitecture(void *h, unsigned *out) {
    DEVICE("nvmlDeviceGetArchitecture");
    *out = d->is_mig ? devs[d->parent].arch : d->arch;
    return SUCCESS;
}

int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
    DEVICE("nvmlDeviceGetCudaComputeCapability");
    const struct dev *g = d->is_mig ? &devs[d->parent] : d;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return SUCCESS;
}

int nvmlDeviceGetIndex(void *h, unsigned *out) {
    DEVICE("nvmlDeviceGetIndex");
    *out = d->is_mig ? devs[d->parent].index : d->index;
    return SUCCESS;
}

int nvmlDeviceGetMinorNumber(void *h, unsigned *out) {
    DEVICE("nvmlDeviceGetMinorNumber");
    *out = d->is_mig ? devs[d->parent].minor : d->minor;
    return SUCCESS;
}

int nvmlDeviceGetMemoryInfo_v2(void *h, memory_v2_t *out) {
    DEVICE("nvmlDeviceGetMemoryInfo_v2");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    if (out->version != (unsigned)(sizeof(memory_v2_t) | (2u << 24))) return ERR_ARGUMENT_VERSION_MISMATCH;
    out->total = d->mem;
    out->reserved = 0;
    out->used = d->mem / 100;
    out->free = d->mem - out->used;
    return SUCCESS;
}

int nvmlDeviceGetAttributes_v2(void *h, attributes_t *out) {
    DEVICE("nvmlDeviceGetAttributes_v2");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    out->multiprocessorCount = d->sms;
    out->gpuInstanceSliceCount = d->is_mig ? d->gislices : 7;
    out->computeInstanceSliceCount = d->is_mig ? d->cislices : 7;
    out->memorySizeMB = d->is_mig ? d->memmb : d->mem >> 20;
    return SUCCESS;
}

int nvmlDeviceGetMigMode(void *h, unsigned *current, unsigned *pending) {
    DEVICE("nvmlDeviceGetMigMode");
    if (d->is_mig) return ERR_NOT_SUPPORTED;
    *current = d->mig_mode;
    *pending = d->mig_mode;
    return SUCCESS;
}

int nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned *out) {
    DEVICE("nvmlDeviceGetMaxMigDeviceCount");
    *out = d->mig_mode ? 7 : 0;
    return SUCCESS;
}

int nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned slot, void **out) {
    DEVICE("nvmlDeviceGetMigDeviceHandleByIndex");
    if (!d->mig_mode) return ERR_INVALID_ARGUMENT;
    for (int i = 0; i < ndevs; i++) {
        if (devs[i].used && devs[i].is_mig && &devs[devs[i].parent] == d && devs[i].slot == (int)slot) {
            *out = &devs[i];
            return SUCCESS;
        }
    }
    return ERR_NOT_FOUND;
}

int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *h, void **out) {
    DEVICE("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    if (!d->is_mig) return ERR_INVALID_ARGUMENT;
    *out = &devs[d->parent];
    return SUCCESS;
}

int nvmlDeviceGetGpuInstanceId(void *h, unsigned *out) {
    DEVICE("nvmlDeviceGetGpuInstanceId");
    if (!d->is_mig) return ERR_INVALID_ARGUMENT;
    *out = d->gi;
    return SUCCESS;
}

int nvmlDeviceGetComputeInstanceId(void *h, unsigned *out) {
    DEVICE("nvmlDeviceGetComputeInstanceId");
    if (!d->is_mig) return ERR_INVALID_ARGUMENT;
    *out = d->ci;
    return SUCCESS;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, void **out) {
    CHECK("nvmlDeviceGetHandleByUUID", NULL);
    if (uuid == NULL || out == NULL) return ERR_INVALID_ARGUMENT;
    for (int i = 0; i < ndevs; i++) {
        if (strcmp(devs[i].uuid, uuid) == 0) {
            *out = &devs[i];
            return SUCCESS;
        }
    }
    return ERR_NOT_FOUND;
}

int nvmlDeviceGetComputeMode(void *h, unsigned *out) {
    DEVICE("nvmlDeviceGetComputeMode");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    if (d->is_mig) return ERR_NOT_SUPPORTED;
    *out = 0;
    FILE *fp = fopen(modes_path, "r");
    if (fp == NULL) return SUCCESS;
    char uuid[96];
    unsigned mode;
    while (fscanf(fp, "%95s %u", uuid, &mode) == 2) {
        if (strcmp(uuid, d->uuid) == 0) *out = mode;
    }
    fclose(fp);
    return SUCCESS;
}

int nvmlDeviceSetComputeMode(void *h, unsigned mode) {
    DEVICE("nvmlDeviceSetComputeMode");
    if (d->is_mig) return ERR_NOT_SUPPORTED;
    if (mode > 3) return ERR_INVALID_ARGUMENT;
    FILE *fp = fopen(modes_path, "a");
    if (fp == NULL) return ERR_INVALID_ARGUMENT;
    fprintf(fp, "%s %u\n", d->uuid, mode);
    fclose(fp);
    return SUCCESS;
}

typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} event_data_t;

static int event_set_token;

int nvmlEventSetCreate(void **set) {
    CHECK("nvmlEventSetCreate", NULL);
    if (set == NULL) return ERR_INVALID_ARGUMENT;
    FILE *fp = fopen(events_path, "r");
    events_offset = 0;
    if (fp != NULL) {
        fseek(fp, 0, SEEK_END);
        events_offset = ftell(fp);
        fclose(fp);
    }
    *set = &event_set_token;
    return SUCCESS;
}

int nvmlEventSetFree(void *set) {
    (void)set;
    return SUCCESS;
}

int nvmlDeviceGetSupportedEventTypes(void *h, unsigned long long *out) {
    DEVICE("nvmlDeviceGetSupportedEventTypes");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    *out = d->ev_supported;
    return SUCCESS;
}

int nvmlDeviceRegisterEvents(void *h, unsigned long long types, void *set) {
    DEVICE("nvmlDeviceRegisterEvents");
    if (set != &event_set_token) return ERR_INVALID_ARGUMENT;
    if (types & ~d->ev_supported) return ERR_NOT_SUPPORTED;
    d->ev_registered |= types;
    return SUCCESS;
}

/* The next event line after events_offset, or 0 when none is complete yet. */
static int next_event_line(char *line, size_t len) {
    FILE *fp = fopen(events_path, "r");
    if (fp == NULL) return 0;
    int got = 0;
    if (fseek(fp, events_offset, SEEK_SET) == 0 && fgets(line, (int)len, fp) != NULL && strchr(line, '\n') != NULL) {
        events_offset = ftell(fp);
        got = 1;
    }
    fclose(fp);
    return got;
}

int nvmlEventSetWait_v2(void *set, event_data_t *data, unsigned timeoutms) {
    CHECK("nvmlEventSetWait_v2", NULL);
    if (set != &event_set_token || data == NULL) return ERR_INVALID_ARGUMENT;
    for (unsigned waited = 0;; waited += 10) {
        char line[256];
        while (next_event_line(line, sizeof line)) {
            unsigned pos = 0, xid = 0;
            char kind[16] = "";
            if (strncmp(line, "lost", 4) == 0) return ERR_GPU_IS_LOST;
            if (sscanf(line, "%u %15s %u", &pos, kind, &xid) < 2) continue;
            struct dev *d = nth_gpu(pos);
            if (d == NULL) continue;
            unsigned long long type = !strcmp(kind, "xid") ? 0x8ULL : !strcmp(kind, "dbe") ? 0x2ULL : 0;
            if (type == 0 || !(d->ev_registered & type)) continue;
            data->device = d;
            data->eventType = type;
            data->eventData = type == 0x8ULL ? xid : 0;
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            return SUCCESS;
        }
        if (waited >= timeoutms) return ERR_TIMEOUT;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned valueType, nvmlReturn;
    unsigned long long value;
} field_value_t;

/* The GPU's last recovery action in nvml_stub.recovery, or -1. */
static long long recovery_action(const struct dev *d) {
    FILE *fp = fopen(recovery_path, "r");
    if (fp == NULL) return -1;
    long long found = -1;
    unsigned pos, action;
    char line[128];
    while (fgets(line, sizeof line, fp) != NULL) {
        if (sscanf(line, "%u %u", &pos, &action) == 2 && nth_gpu(pos) == d) found = action;
    }
    fclose(fp);
    return found;
}

int nvmlDeviceGetFieldValues(void *h, int count, field_value_t *values) {
    DEVICE("nvmlDeviceGetFieldValues");
    if (count < 0 || (count > 0 && values == NULL)) return ERR_INVALID_ARGUMENT;
    const struct dev *gpu = d->is_mig ? &devs[d->parent] : d;
    for (int i = 0; i < count; i++) {
        long long action = values[i].fieldId == 230 ? recovery_action(gpu) : -1;
        values[i].latencyUsec = 0;
        values[i].timestamp = 0;
        if (action < 0) {
            values[i].nvmlReturn = ERR_NOT_SUPPORTED;
            continue;
        }
        values[i].nvmlReturn = SUCCESS;
        values[i].valueType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
        values[i].value = (unsigned long long)action;
    }
    return SUCCESS;
}
