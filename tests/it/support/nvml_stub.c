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
 * A "gpu" record's "procs=<pid>:<bytes>,..." lists the compute processes on it (at most
 * 8; nvmlDeviceGetComputeRunningProcesses_v3); persistence mode is on for every GPU.
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
 *
 * Dynamic MIG: a GPU whose "model" is a100-40gb, a100-80gb or h100-80gb (or, without the
 * key, whose name holds "A100"/"H100" and whose memory is within 4 GiB of 40/80 GiB) has
 * that model's GPU instance profiles ("model=none": no MIG support). GPU and compute
 * instances are created, listed and destroyed with the NVML calls (placements, occupancy:
 * an overlapping placement or a profile at its instance limit is INSUFFICIENT_RESOURCES;
 * one compute instance per GPU instance here). A GPU instance with a compute instance is
 * also a MIG device (nvmlDeviceGetMigDeviceHandleByIndex, its UUID, GI and CI IDs), next to
 * the "mig" records, which take no placement. Instances outlive the process, as on a GPU:
 * they are kept in "nvml_stub.mig" beside the library (or the "path" of a "migstate"
 * record), rewritten after every create and destroy and read again by every MIG call, one
 * line each: "<gpu uuid> <gi> <profile id> <start> <size> <ci or -1> <slot> <mig uuid>".
 * Removing the file is a reboot. Processes are not locked against each other: two creating
 * at the same moment may lose one's line. "fail" records apply to these calls too (a GPU or
 * compute instance counts as its GPU). Built with STUB_NO_CREATE_GI defined, the library
 * lacks nvmlDeviceCreateGpuInstanceWithPlacement, as an old driver does.
 *
 * Memory limits per cgroup (r615): nvmlDeviceSetMemoryLimits_v1 appends "set <uuid> <soft>
 * <hard> <cgroup path>" to "nvml_stub.memlimits" beside the library, after checking what
 * NVML checks (no MIG handle: NOT_SUPPORTED; soft above hard or a hard limit other than
 * NVML_DEVICE_MEMORY_LIMIT_MAX above the GPU's memory: INVALID_ARGUMENT; a path that is not
 * a directory: OPERATING_SYSTEM). nvmlDeviceGetMemoryLimits_v1 answers the last line for
 * the GPU and path (NOT_FOUND when none), with the bytes allocated by nvmlStubAllocate in
 * this process. nvmlStubAllocate(device, cgroup, bytes) is a fake allocation: it fails
 * with NVML_ERROR_MEMORY when the cgroup's use would pass the hard limit of the cgroup or
 * of its nearest ancestor with one. Built with STUB_NO_MEMORY_LIMITS defined, the library
 * lacks both NVML functions, as a driver older than r615 does.
 *
 * NVML is thread-safe; so is the stand-in within a process: every call but the blocking
 * event wait holds one (recursive) lock from start to return.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVS 64
#define MAX_FAILS 16
#define SUCCESS 0
#define ERR_UNINITIALIZED 1
#define ERR_INVALID_ARGUMENT 2
#define ERR_NOT_SUPPORTED 3
#define ERR_NO_PERMISSION 4
#define ERR_NOT_FOUND 6
#define ERR_INSUFFICIENT_SIZE 7
#define ERR_DRIVER_NOT_LOADED 9
#define ERR_ARGUMENT_VERSION_MISMATCH 25
#define ERR_TIMEOUT 10
#define ERR_GPU_IS_LOST 15
#define ERR_IN_USE 19
#define ERR_INSUFFICIENT_RESOURCES 23
#define DEFAULT_EVENTS 0xfULL

struct dev {
    int used, is_mig, parent, slot;
    char uuid[96], name[96], bus[32];
    unsigned brand, arch, minor, index, gi, ci, sms, gislices, cislices, mig_mode;
    int cc_major, cc_minor;
    unsigned long long mem, memmb, ev_supported, ev_registered;
    int ev_given;
    char model[16];
    unsigned nprocs, proc_pid[8];
    unsigned long long proc_mem[8];
};

struct fail {
    char call[64];
    int device;
    int code;
};

/* A GPU instance created through NVML, with at most one compute instance. */
#define MAX_GIS 64
struct gi {
    int used, gpu; /* gpu: index into devs */
    unsigned id, profile_id, start, size;
    int has_ci;
    unsigned ci_id;
    int ci_token;  /* its address is the compute instance handle */
    struct dev mig; /* the MIG device, when it has a compute instance */
};
static struct gi gis[MAX_GIS];
static void sync_mig_state(void);

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
static char mig_state_path[4200];
static char memlimits_path[4200];
static long events_offset;
static int mig_state_given;

static int failure(const char *call, const struct dev *d) {
    for (int i = 0; i < nfails; i++) {
        if (strcmp(fails[i].call, call) != 0) continue;
        if (fails[i].device < 0 || d == NULL) return fails[i].code;
        int gpu = d->is_mig ? d->parent : (int)(d - devs);
        if (devs[gpu].index == (unsigned)fails[i].device) return fails[i].code;
    }
    return SUCCESS;
}

static pthread_mutex_t stub_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static int stub_lock_now(void) {
    pthread_mutex_lock(&stub_lock);
    return 1;
}
static void stub_unlock(int *held) {
    if (*held) pthread_mutex_unlock(&stub_lock);
}
/* Held until the calling function returns. */
#define STUB_LOCK __attribute__((cleanup(stub_unlock))) int stub_held_ = stub_lock_now()

#define CHECK(call, d)                                  \
    do {                                                \
        if (!initialized) return ERR_UNINITIALIZED;     \
        int rc_ = failure(call, d);                     \
        if (rc_ != SUCCESS) return rc_;                 \
    } while (0)

static struct dev *handle(void *h) {
    for (int i = 0; i < ndevs; i++) {
        if (h == &devs[i]) return devs[i].used ? &devs[i] : NULL;
    }
    for (int i = 0; i < MAX_GIS; i++) {
        if (h == &gis[i].mig) return gis[i].used && gis[i].has_ci ? &gis[i].mig : NULL;
    }
    return NULL;
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
    if (strcmp(kind, "migstate") == 0) {
        if (!strcmp(key, "path")) {
            snprintf(mig_state_path, sizeof mig_state_path, "%s", v);
            mig_state_given = 1;
        }
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
    else if (!strcmp(key, "procs")) {
        /* "pid:bytes,pid:bytes": compute processes on the GPU */
        const char *p = v;
        while (*p && d->nprocs < 8) {
            unsigned pid;
            unsigned long long mem;
            int used = 0;
            if (sscanf(p, "%u:%llu%n", &pid, &mem, &used) != 2) break;
            d->proc_pid[d->nprocs] = pid;
            d->proc_mem[d->nprocs] = mem;
            d->nprocs++;
            p += used;
            if (*p == ',') p++;
        }
    }
    else if (!strcmp(key, "model")) snprintf(d->model, sizeof d->model, "%s", v);
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
    snprintf(mig_state_path, sizeof mig_state_path, "%.*snvml_stub.mig", (int)(slash + 1 - path), path);
    snprintf(memlimits_path, sizeof memlimits_path, "%.*snvml_stub.memlimits", (int)(slash + 1 - path), path);
    mig_state_given = 0;
    FILE *fp = fopen(path, "r");
    if (fp == NULL) return ERR_DRIVER_NOT_LOADED;
    memset(devs, 0, sizeof devs);
    memset(gis, 0, sizeof gis);
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
        } else if (strcmp(kind, "driver") != 0 && strcmp(kind, "migstate") != 0) {
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
    STUB_LOCK;
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
    STUB_LOCK;
    if (!initialized) return ERR_UNINITIALIZED;
    initialized--;
    return SUCCESS;
}

const char *nvmlErrorString(int code) {
    return code == SUCCESS ? "Success" : "Stand-in NVML error";
}

int nvmlSystemGetDriverVersion(char *out, unsigned len) {
    STUB_LOCK;
    CHECK("nvmlSystemGetDriverVersion", NULL);
    return copy_str(out, len, driver_version);
}

int nvmlSystemGetCudaDriverVersion_v2(int *out) {
    STUB_LOCK;
    CHECK("nvmlSystemGetCudaDriverVersion_v2", NULL);
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    *out = cuda_version;
    return SUCCESS;
}

int nvmlDeviceGetCount_v2(unsigned *out) {
    STUB_LOCK;
    CHECK("nvmlDeviceGetCount_v2", NULL);
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    *out = (unsigned)ngpus;
    return SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **out) {
    STUB_LOCK;
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
    STUB_LOCK;
    DEVICE("nvmlDeviceGetUUID");
    return copy_str(out, len, d->uuid);
}

int nvmlDeviceGetName(void *h, char *out, unsigned len) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetName");
    return copy_str(out, len, d->is_mig ? devs[d->parent].name : d->name);
}

int nvmlDeviceGetPciInfo_v3(void *h, pci_info_t *out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetPciInfo_v3");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    const struct dev *g = d->is_mig ? &devs[d->parent] : d;
    memset(out, 0, sizeof *out);
    snprintf(out->busId, sizeof out->busId, "%s", g->bus);
    sscanf(g->bus, "%x:%x:%x", &out->domain, &out->bus, &out->device);
    return SUCCESS;
}

int nvmlDeviceGetBrand(void *h, unsigned *out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetBrand");
    *out = d->is_mig ? devs[d->parent].brand : d->brand;
    return SUCCESS;
}

int nvmlDeviceGetArchitecture(void *h, unsigned *out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetArchitecture");
    *out = d->is_mig ? devs[d->parent].arch : d->arch;
    return SUCCESS;
}

int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetCudaComputeCapability");
    const struct dev *g = d->is_mig ? &devs[d->parent] : d;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return SUCCESS;
}

int nvmlDeviceGetIndex(void *h, unsigned *out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetIndex");
    *out = d->is_mig ? devs[d->parent].index : d->index;
    return SUCCESS;
}

int nvmlDeviceGetMinorNumber(void *h, unsigned *out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetMinorNumber");
    *out = d->is_mig ? devs[d->parent].minor : d->minor;
    return SUCCESS;
}

int nvmlDeviceGetMemoryInfo_v2(void *h, memory_v2_t *out) {
    STUB_LOCK;
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
    STUB_LOCK;
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
    STUB_LOCK;
    DEVICE("nvmlDeviceGetMigMode");
    if (d->is_mig) return ERR_NOT_SUPPORTED;
    *current = d->mig_mode;
    *pending = d->mig_mode;
    return SUCCESS;
}

int nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned *out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetMaxMigDeviceCount");
    *out = d->mig_mode ? 7 : 0;
    return SUCCESS;
}

int nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned slot, void **out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetMigDeviceHandleByIndex");
    if (!d->mig_mode) return ERR_INVALID_ARGUMENT;
    for (int i = 0; i < ndevs; i++) {
        if (devs[i].used && devs[i].is_mig && &devs[devs[i].parent] == d && devs[i].slot == (int)slot) {
            *out = &devs[i];
            return SUCCESS;
        }
    }
    sync_mig_state();
    for (int i = 0; i < MAX_GIS; i++) {
        if (gis[i].used && gis[i].has_ci && &devs[gis[i].gpu] == d && gis[i].mig.slot == (int)slot) {
            *out = &gis[i].mig;
            return SUCCESS;
        }
    }
    return ERR_NOT_FOUND;
}

int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *h, void **out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    if (!d->is_mig) return ERR_INVALID_ARGUMENT;
    *out = &devs[d->parent];
    return SUCCESS;
}

int nvmlDeviceGetGpuInstanceId(void *h, unsigned *out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetGpuInstanceId");
    if (!d->is_mig) return ERR_INVALID_ARGUMENT;
    *out = d->gi;
    return SUCCESS;
}

int nvmlDeviceGetComputeInstanceId(void *h, unsigned *out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetComputeInstanceId");
    if (!d->is_mig) return ERR_INVALID_ARGUMENT;
    *out = d->ci;
    return SUCCESS;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, void **out) {
    STUB_LOCK;
    CHECK("nvmlDeviceGetHandleByUUID", NULL);
    if (uuid == NULL || out == NULL) return ERR_INVALID_ARGUMENT;
    for (int i = 0; i < ndevs; i++) {
        if (strcmp(devs[i].uuid, uuid) == 0) {
            *out = &devs[i];
            return SUCCESS;
        }
    }
    sync_mig_state();
    for (int i = 0; i < MAX_GIS; i++) {
        if (gis[i].used && gis[i].has_ci && strcmp(gis[i].mig.uuid, uuid) == 0) {
            *out = &gis[i].mig;
            return SUCCESS;
        }
    }
    return ERR_NOT_FOUND;
}

/* Persistence mode: on for every GPU. */
int nvmlDeviceGetPersistenceMode(void *h, unsigned *out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetPersistenceMode");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    *out = 1;
    return SUCCESS;
}

typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId, computeInstanceId;
} process_info_t;

/* The compute processes of a GPU's "procs" field. */
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *count, process_info_t *out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetComputeRunningProcesses_v3");
    if (count == NULL) return ERR_INVALID_ARGUMENT;
    if (*count < d->nprocs || (out == NULL && d->nprocs > 0)) {
        *count = d->nprocs;
        return ERR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < d->nprocs; i++) {
        out[i].pid = d->proc_pid[i];
        out[i].usedGpuMemory = d->proc_mem[i];
        out[i].gpuInstanceId = 0xffffffff;
        out[i].computeInstanceId = 0xffffffff;
    }
    *count = d->nprocs;
    return SUCCESS;
}

int nvmlDeviceGetComputeMode(void *h, unsigned *out) {
    STUB_LOCK;
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
    STUB_LOCK;
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
    STUB_LOCK;
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
    STUB_LOCK;
    (void)set;
    return SUCCESS;
}

int nvmlDeviceGetSupportedEventTypes(void *h, unsigned long long *out) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetSupportedEventTypes");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    *out = d->ev_supported;
    return SUCCESS;
}

int nvmlDeviceRegisterEvents(void *h, unsigned long long types, void *set) {
    STUB_LOCK;
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
    STUB_LOCK;
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

/* ---- Dynamic MIG ------------------------------------------------------------------- */

/*
 * GPU instance profiles, from NVIDIA's published `nvidia-smi mig -lgip` and `-lgipp`
 * figures (MIG user guide and driver output): memory in MiB is the GiB column times 1024,
 * placements are a bit mask of the allowed start slices (bit n = start n).
 */
struct profile {
    unsigned index, id, slices, instances, sms, ce, dec, enc, jpeg, ofa;
    unsigned long long memmb;
    unsigned size, starts;
};

#define STARTS_0_TO_6 0x7fu /* {0,1,2,3,4,5,6} */
#define STARTS_EVEN 0x55u   /* {0,2,4,6} */
#define STARTS_0_2_4 0x15u  /* {0,2,4} */
#define STARTS_0_4 0x11u    /* {0,4} */
#define STARTS_0 0x01u      /* {0} */

/* A100-SXM4-40GB: 1g.5gb 4.75 GiB, 1g.10gb/2g.10gb 9.62, 3g/4g.20gb 19.50, 7g.40gb 39.25. */
static const struct profile a100_40gb[] = {
    /* idx   id sl inst  SM CE DEC ENC JPG OFA  MiB    size starts */
    {0x0, 19, 1, 7, 14, 1, 0, 0, 0, 0, 4864, 1, STARTS_0_TO_6},  /* 1g.5gb */
    {0x7, 20, 1, 1, 14, 1, 1, 0, 1, 1, 4864, 1, STARTS_0_TO_6},  /* 1g.5gb+me */
    {0x9, 15, 1, 4, 14, 1, 1, 0, 0, 0, 9856, 2, STARTS_EVEN},    /* 1g.10gb */
    {0x1, 14, 2, 3, 28, 2, 1, 0, 0, 0, 9856, 2, STARTS_0_2_4},   /* 2g.10gb */
    {0x2, 9, 3, 2, 42, 3, 2, 0, 0, 0, 19968, 4, STARTS_0_4},     /* 3g.20gb */
    {0x3, 5, 4, 1, 56, 4, 2, 0, 0, 0, 19968, 4, STARTS_0},       /* 4g.20gb */
    {0x4, 0, 7, 1, 98, 7, 5, 0, 1, 1, 40192, 8, STARTS_0},       /* 7g.40gb */
};

/* A100-SXM4-80GB: 1g.10gb 9.50 GiB, 1g.20gb/2g.20gb 19.50, 3g/4g.40gb 39.25, 7g.80gb 78.75. */
static const struct profile a100_80gb[] = {
    {0x0, 19, 1, 7, 14, 1, 0, 0, 0, 0, 9728, 1, STARTS_0_TO_6},  /* 1g.10gb */
    {0x7, 20, 1, 1, 14, 1, 1, 0, 1, 1, 9728, 1, STARTS_0_TO_6},  /* 1g.10gb+me */
    {0x9, 15, 1, 4, 14, 1, 1, 0, 0, 0, 19968, 2, STARTS_EVEN},   /* 1g.20gb */
    {0x1, 14, 2, 3, 28, 2, 1, 0, 0, 0, 19968, 2, STARTS_0_2_4},  /* 2g.20gb */
    {0x2, 9, 3, 2, 42, 3, 2, 0, 0, 0, 40192, 4, STARTS_0_4},     /* 3g.40gb */
    {0x3, 5, 4, 1, 56, 4, 2, 0, 0, 0, 40192, 4, STARTS_0},       /* 4g.40gb */
    {0x4, 0, 7, 1, 98, 7, 5, 0, 1, 1, 80640, 8, STARTS_0},       /* 7g.80gb */
};

/* H100 80GB HBM3: 1g.10gb 9.75 GiB, 1g.20gb/2g.20gb 19.62, 3g/4g.40gb 39.50, 7g.80gb 79.25. */
static const struct profile h100_80gb[] = {
    {0x0, 19, 1, 7, 16, 1, 1, 0, 1, 0, 9984, 1, STARTS_0_TO_6},   /* 1g.10gb */
    {0x7, 20, 1, 1, 16, 1, 1, 0, 1, 1, 9984, 1, STARTS_0_TO_6},   /* 1g.10gb+me */
    {0x9, 15, 1, 4, 26, 1, 1, 0, 1, 0, 20096, 2, STARTS_EVEN},    /* 1g.20gb */
    {0x1, 14, 2, 3, 32, 2, 2, 0, 2, 0, 20096, 2, STARTS_0_2_4},   /* 2g.20gb */
    {0x2, 9, 3, 2, 60, 3, 3, 0, 3, 0, 40448, 4, STARTS_0_4},      /* 3g.40gb */
    {0x3, 5, 4, 1, 64, 4, 4, 0, 4, 0, 40448, 4, STARTS_0},        /* 4g.40gb */
    {0x4, 0, 7, 1, 132, 8, 7, 0, 7, 1, 81152, 8, STARTS_0},       /* 7g.80gb */
};

#define NPROFILES 7
#define GI_PROFILE_INDEX_END 0x12u
#define CI_PROFILE_INDEX_END 0x9u

/* The profile table of a GPU (not a MIG device), or NULL when it has none. */
static const struct profile *table_of(const struct dev *g) {
    if (g == NULL || g->is_mig) return NULL;
    if (!strcmp(g->model, "a100-40gb")) return a100_40gb;
    if (!strcmp(g->model, "a100-80gb")) return a100_80gb;
    if (!strcmp(g->model, "h100-80gb")) return h100_80gb;
    if (g->model[0] != 0) return NULL;
    unsigned long long gib = g->mem >> 30;
    int near40 = gib >= 36 && gib <= 44, near80 = gib >= 76 && gib <= 84;
    if (strstr(g->name, "A100") && near40) return a100_40gb;
    if (strstr(g->name, "A100") && near80) return a100_80gb;
    if (strstr(g->name, "H100") && near80) return h100_80gb;
    return NULL;
}

static const struct profile *profile_by_id(const struct dev *g, unsigned id) {
    const struct profile *t = table_of(g);
    for (int i = 0; t != NULL && i < NPROFILES; i++) {
        if (t[i].id == id) return &t[i];
    }
    return NULL;
}

static int gpu_index_of(const struct dev *g) {
    for (int i = 0; i < ndevs; i++) {
        if (&devs[i] == g) return i;
    }
    return -1;
}

static struct gi *gi_handle(void *h) {
    for (int i = 0; i < MAX_GIS; i++) {
        if (h == &gis[i]) return gis[i].used ? &gis[i] : NULL;
    }
    return NULL;
}

static struct gi *ci_handle(void *h) {
    for (int i = 0; i < MAX_GIS; i++) {
        if (h == &gis[i].ci_token) return gis[i].used && gis[i].has_ci ? &gis[i] : NULL;
    }
    return NULL;
}

static int overlaps(unsigned s1, unsigned n1, unsigned s2, unsigned n2) {
    return s1 < s2 + n2 && s2 < s1 + n1;
}

/* Fills in the MIG device of a GPU instance that has a compute instance. */
static void fill_mig_device(struct gi *g) {
    const struct profile *p = profile_by_id(&devs[g->gpu], g->profile_id);
    struct dev *m = &g->mig;
    char uuid[96];
    int slot = m->slot;
    snprintf(uuid, sizeof uuid, "%s", m->uuid);
    memset(m, 0, sizeof *m);
    m->used = 1;
    m->is_mig = 1;
    m->parent = g->gpu;
    m->slot = slot;
    m->gi = g->id;
    m->ci = g->ci_id;
    snprintf(m->uuid, sizeof m->uuid, "%s", uuid);
    m->sms = p ? p->sms : 0;
    m->gislices = p ? p->slices : 0;
    m->cislices = m->gislices;
    m->memmb = p ? p->memmb : 0;
    m->mem = m->memmb << 20;
}

static void write_mig_state(void) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", mig_state_path);
    FILE *fp = fopen(tmp, "w");
    if (fp == NULL) return;
    for (int i = 0; i < MAX_GIS; i++) {
        const struct gi *g = &gis[i];
        if (!g->used) continue;
        fprintf(fp, "%s %u %u %u %u %d %d %s\n", devs[g->gpu].uuid, g->id, g->profile_id, g->start, g->size,
                g->has_ci ? (int)g->ci_id : -1, g->has_ci ? g->mig.slot : -1, g->has_ci ? g->mig.uuid : "-");
    }
    fclose(fp);
    rename(tmp, mig_state_path);
}

/* Reads the state file: instances gone from it are forgotten, new ones are added; the
 * ones that stay keep their handles. */
static void sync_mig_state(void) {
    struct gi fresh[MAX_GIS];
    int n = 0;
    memset(fresh, 0, sizeof fresh);
    FILE *fp = fopen(mig_state_path, "r");
    char line[512];
    while (fp != NULL && n < MAX_GIS && fgets(line, sizeof line, fp) != NULL) {
        char gpu[96], uuid[96];
        unsigned id, profile, start, size;
        int ci, slot;
        if (sscanf(line, "%95s %u %u %u %u %d %d %95s", gpu, &id, &profile, &start, &size, &ci, &slot, uuid) != 8)
            continue;
        if (size == 0 || size > 8 || start > 8 - size || slot < -1 || slot > 6) continue;
        struct gi *f = &fresh[n];
        f->gpu = -1;
        for (int i = 0; i < ndevs; i++) {
            if (!devs[i].is_mig && devs[i].used && !strcmp(devs[i].uuid, gpu)) f->gpu = i;
        }
        if (f->gpu < 0 || profile_by_id(&devs[f->gpu], profile) == NULL) continue;
        f->used = 1;
        f->id = id;
        f->profile_id = profile;
        f->start = start;
        f->size = size;
        f->has_ci = ci >= 0;
        f->ci_id = ci >= 0 ? (unsigned)ci : 0;
        f->mig.slot = slot;
        snprintf(f->mig.uuid, sizeof f->mig.uuid, "%s", f->has_ci ? uuid : "");
        n++;
    }
    if (fp != NULL) fclose(fp);
    int matched[MAX_GIS] = {0};
    for (int i = 0; i < MAX_GIS; i++) {
        struct gi *g = &gis[i];
        if (!g->used) continue;
        int keep = 0;
        for (int j = 0; j < n && !keep; j++) {
            struct gi *f = &fresh[j];
            if (!matched[j] && f->gpu == g->gpu && f->id == g->id && f->profile_id == g->profile_id &&
                f->start == g->start && f->has_ci == g->has_ci && f->ci_id == g->ci_id &&
                (!g->has_ci || !strcmp(f->mig.uuid, g->mig.uuid))) {
                matched[j] = keep = 1;
            }
        }
        if (!keep) memset(g, 0, sizeof *g);
    }
    for (int j = 0; j < n; j++) {
        if (matched[j]) continue;
        for (int i = 0; i < MAX_GIS; i++) {
            if (gis[i].used) continue;
            gis[i] = fresh[j];
            if (gis[i].has_ci) fill_mig_device(&gis[i]);
            break;
        }
    }
}

#define GPU_MIG(call)                                        \
    struct dev *d = handle(h);                               \
    CHECK(call, d);                                          \
    if (d == NULL || d->is_mig) return ERR_INVALID_ARGUMENT; \
    sync_mig_state();

#define GI(call)                                    \
    struct gi *g = gi_handle(h);                    \
    CHECK(call, g ? &devs[g->gpu] : NULL);          \
    sync_mig_state();                               \
    if (gi_handle(h) == NULL) return ERR_NOT_FOUND;

typedef struct {
    unsigned id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount, decoderCount,
        encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} gi_profile_info_t;

typedef struct {
    unsigned start, size;
} placement_t;

typedef struct {
    void *device;
    unsigned id, profileId;
    placement_t placement;
} gi_info_t;

typedef struct {
    unsigned id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} ci_profile_info_t;

typedef struct {
    void *device, *gpuInstance;
    unsigned id, profileId;
    placement_t placement;
} ci_info_t;

int nvmlDeviceGetGpuInstanceProfileInfo(void *h, unsigned index, gi_profile_info_t *out) {
    STUB_LOCK;
    GPU_MIG("nvmlDeviceGetGpuInstanceProfileInfo");
    if (out == NULL || index >= GI_PROFILE_INDEX_END) return ERR_INVALID_ARGUMENT;
    const struct profile *t = table_of(d);
    for (int i = 0; t != NULL && i < NPROFILES; i++) {
        const struct profile *p = &t[i];
        if (p->index != index) continue;
        memset(out, 0, sizeof *out);
        out->id = p->id;
        out->sliceCount = p->slices;
        out->instanceCount = p->instances;
        out->multiprocessorCount = p->sms;
        out->copyEngineCount = p->ce;
        out->decoderCount = p->dec;
        out->encoderCount = p->enc;
        out->jpegCount = p->jpeg;
        out->ofaCount = p->ofa;
        out->memorySizeMB = p->memmb;
        return SUCCESS;
    }
    return ERR_NOT_SUPPORTED;
}

int nvmlDeviceGetGpuInstancePossiblePlacements_v2(void *h, unsigned id, placement_t *out, unsigned *count) {
    STUB_LOCK;
    GPU_MIG("nvmlDeviceGetGpuInstancePossiblePlacements_v2");
    if (count == NULL) return ERR_INVALID_ARGUMENT;
    const struct profile *p = profile_by_id(d, id);
    if (p == NULL) return table_of(d) ? ERR_INVALID_ARGUMENT : ERR_NOT_SUPPORTED;
    unsigned n = 0;
    for (unsigned s = 0; s < 32; s++) n += (p->starts >> s) & 1u;
    if (out == NULL) {
        *count = n;
        return SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return ERR_INSUFFICIENT_SIZE;
    }
    unsigned k = 0;
    for (unsigned s = 0; s < 32; s++) {
        if (!((p->starts >> s) & 1u)) continue;
        out[k].start = s;
        out[k].size = p->size;
        k++;
    }
    *count = n;
    return SUCCESS;
}

/* Why a GPU instance of profile p cannot be created at start now, or SUCCESS. */
static int room_for(int gpu, const struct profile *p, unsigned start) {
    unsigned same = 0;
    for (int i = 0; i < MAX_GIS; i++) {
        const struct gi *g = &gis[i];
        if (!g->used || g->gpu != gpu) continue;
        if (g->profile_id == p->id) same++;
        if (overlaps(g->start, g->size, start, p->size)) return ERR_INSUFFICIENT_RESOURCES;
    }
    return same >= p->instances ? ERR_INSUFFICIENT_RESOURCES : SUCCESS;
}

int nvmlDeviceGetGpuInstanceRemainingCapacity(void *h, unsigned id, unsigned *count) {
    STUB_LOCK;
    GPU_MIG("nvmlDeviceGetGpuInstanceRemainingCapacity");
    if (count == NULL) return ERR_INVALID_ARGUMENT;
    const struct profile *p = profile_by_id(d, id);
    if (p == NULL) return table_of(d) ? ERR_INVALID_ARGUMENT : ERR_NOT_SUPPORTED;
    /* Memory slices taken, then placements that still fit, first fit from slice 0. */
    unsigned taken = 0, same = 0, fits = 0;
    for (int i = 0; i < MAX_GIS; i++) {
        const struct gi *g = &gis[i];
        if (!g->used || &devs[g->gpu] != d) continue;
        taken |= ((1u << g->size) - 1u) << g->start;
        if (g->profile_id == id) same++;
    }
    for (unsigned s = 0; s < 24; s++) {
        unsigned mask = ((1u << p->size) - 1u) << s;
        if (!((p->starts >> s) & 1u) || (taken & mask)) continue;
        taken |= mask;
        fits++;
    }
    unsigned left = p->instances > same ? p->instances - same : 0;
    *count = fits < left ? fits : left;
    return SUCCESS;
}

/* Left out when built as a driver without GPU instance creation (STUB_NO_CREATE_GI). */
#ifndef STUB_NO_CREATE_GI
int nvmlDeviceCreateGpuInstanceWithPlacement(void *h, unsigned id, const placement_t *placement, void **out) {
    STUB_LOCK;
    GPU_MIG("nvmlDeviceCreateGpuInstanceWithPlacement");
    if (placement == NULL || out == NULL) return ERR_INVALID_ARGUMENT;
    if (!d->mig_mode) return ERR_NOT_SUPPORTED;
    const struct profile *p = profile_by_id(d, id);
    if (p == NULL) return table_of(d) ? ERR_INVALID_ARGUMENT : ERR_NOT_SUPPORTED;
    unsigned start = placement->start;
    if (start >= 32 || !((p->starts >> start) & 1u) || placement->size != p->size) return ERR_INVALID_ARGUMENT;
    int gpu = gpu_index_of(d);
    int rc = room_for(gpu, p, start);
    if (rc != SUCCESS) return rc;
    struct gi *slot = NULL;
    for (int i = 0; i < MAX_GIS && slot == NULL; i++) {
        if (!gis[i].used) slot = &gis[i];
    }
    if (slot == NULL) return ERR_INSUFFICIENT_RESOURCES;
    unsigned id_free = 1;
    for (int again = 1; again;) {
        again = 0;
        for (int i = 0; i < MAX_GIS; i++) {
            if (gis[i].used && gis[i].gpu == gpu && gis[i].id == id_free) {
                id_free++;
                again = 1;
            }
        }
    }
    memset(slot, 0, sizeof *slot);
    slot->used = 1;
    slot->gpu = gpu;
    slot->id = id_free;
    slot->profile_id = p->id;
    slot->start = start;
    slot->size = p->size;
    write_mig_state();
    *out = slot;
    return SUCCESS;
}

#endif

int nvmlDeviceGetGpuInstances(void *h, unsigned id, void **out, unsigned *count) {
    STUB_LOCK;
    GPU_MIG("nvmlDeviceGetGpuInstances");
    if (out == NULL || count == NULL) return ERR_INVALID_ARGUMENT;
    const struct profile *p = profile_by_id(d, id);
    if (p == NULL) return table_of(d) ? ERR_INVALID_ARGUMENT : ERR_NOT_SUPPORTED;
    unsigned n = 0;
    for (int i = 0; i < MAX_GIS && n < p->instances; i++) {
        if (gis[i].used && &devs[gis[i].gpu] == d && gis[i].profile_id == id) out[n++] = &gis[i];
    }
    *count = n;
    return SUCCESS;
}

int nvmlDeviceGetGpuInstanceById(void *h, unsigned id, void **out) {
    STUB_LOCK;
    GPU_MIG("nvmlDeviceGetGpuInstanceById");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_GIS; i++) {
        if (gis[i].used && &devs[gis[i].gpu] == d && gis[i].id == id) {
            *out = &gis[i];
            return SUCCESS;
        }
    }
    return ERR_NOT_FOUND;
}

int nvmlGpuInstanceGetInfo(void *h, gi_info_t *out) {
    STUB_LOCK;
    GI("nvmlGpuInstanceGetInfo");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    out->device = &devs[g->gpu];
    out->id = g->id;
    out->profileId = g->profile_id;
    out->placement.start = g->start;
    out->placement.size = g->size;
    return SUCCESS;
}

/* Compute slices of a compute instance profile index, 0 when it has none here. */
static unsigned ci_slices(unsigned index) {
    static const unsigned slices[] = {1, 2, 3, 4, 7, 0, 0, 0, 0};
    return index < CI_PROFILE_INDEX_END ? slices[index] : 0;
}

int nvmlGpuInstanceGetComputeInstanceProfileInfo(void *h, unsigned index, unsigned eng, ci_profile_info_t *out) {
    STUB_LOCK;
    GI("nvmlGpuInstanceGetComputeInstanceProfileInfo");
    if (out == NULL || index >= CI_PROFILE_INDEX_END || eng != 0) return ERR_INVALID_ARGUMENT;
    const struct profile *p = profile_by_id(&devs[g->gpu], g->profile_id);
    unsigned n = ci_slices(index);
    if (p == NULL || n == 0 || n > p->slices) return ERR_NOT_SUPPORTED;
    memset(out, 0, sizeof *out);
    out->id = index;
    out->sliceCount = n;
    out->instanceCount = p->slices / n;
    out->multiprocessorCount = p->sms * n / p->slices;
    out->sharedCopyEngineCount = p->ce;
    out->sharedDecoderCount = p->dec;
    out->sharedEncoderCount = p->enc;
    out->sharedJpegCount = p->jpeg;
    out->sharedOfaCount = p->ofa;
    return SUCCESS;
}

/* A fresh MIG UUID: made unique by the GPU, the instance, the time and the process. */
static void new_mig_uuid(struct gi *g) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long x = 1469598103934665603ULL;
    const char *u = devs[g->gpu].uuid;
    for (; *u; u++) x = (x ^ (unsigned char)*u) * 1099511628211ULL;
    unsigned long long mix[] = {g->id, g->start, g->ci_id, (unsigned long long)ts.tv_sec,
                                (unsigned long long)ts.tv_nsec, (unsigned long long)getpid()};
    for (unsigned i = 0; i < sizeof mix / sizeof mix[0]; i++) x = (x ^ mix[i]) * 1099511628211ULL;
    unsigned long long y = x * 6364136223846793005ULL + 1442695040888963407ULL;
    snprintf(g->mig.uuid, sizeof g->mig.uuid, "MIG-%08x-%04x-%04x-%04x-%012llx", (unsigned)(x >> 32),
             (unsigned)(x >> 16) & 0xffffu, (unsigned)x & 0xffffu, (unsigned)(y >> 48),
             y & 0xffffffffffffULL);
}

int nvmlGpuInstanceCreateComputeInstance(void *h, unsigned profile, void **out) {
    STUB_LOCK;
    GI("nvmlGpuInstanceCreateComputeInstance");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    const struct profile *p = profile_by_id(&devs[g->gpu], g->profile_id);
    unsigned n = ci_slices(profile);
    if (p == NULL || n == 0 || n > p->slices) return ERR_NOT_SUPPORTED;
    if (g->has_ci) return ERR_INSUFFICIENT_RESOURCES;
    /* The MIG device's slot: the first one no MIG device of this GPU holds. */
    int slot = -1;
    for (int s = 0; s < 7 && slot < 0; s++) {
        int taken = 0;
        for (int i = 0; i < ndevs; i++) {
            if (devs[i].used && devs[i].is_mig && devs[i].parent == g->gpu && devs[i].slot == s) taken = 1;
        }
        for (int i = 0; i < MAX_GIS; i++) {
            if (gis[i].used && gis[i].has_ci && gis[i].gpu == g->gpu && gis[i].mig.slot == s) taken = 1;
        }
        if (!taken) slot = s;
    }
    if (slot < 0) return ERR_INSUFFICIENT_RESOURCES;
    g->has_ci = 1;
    g->ci_id = 0;
    g->mig.slot = slot;
    new_mig_uuid(g);
    fill_mig_device(g);
    write_mig_state();
    *out = &g->ci_token;
    return SUCCESS;
}

int nvmlGpuInstanceGetComputeInstances(void *h, unsigned profile, void **out, unsigned *count) {
    STUB_LOCK;
    GI("nvmlGpuInstanceGetComputeInstances");
    if (out == NULL || count == NULL) return ERR_INVALID_ARGUMENT;
    const struct profile *p = profile_by_id(&devs[g->gpu], g->profile_id);
    unsigned n = ci_slices(profile);
    if (p == NULL || n == 0 || n > p->slices) return ERR_NOT_SUPPORTED;
    *count = 0;
    if (g->has_ci && n == p->slices) {
        out[0] = &g->ci_token;
        *count = 1;
    }
    return SUCCESS;
}

int nvmlGpuInstanceGetComputeInstanceById(void *h, unsigned id, void **out) {
    STUB_LOCK;
    GI("nvmlGpuInstanceGetComputeInstanceById");
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    if (!g->has_ci || g->ci_id != id) return ERR_NOT_FOUND;
    *out = &g->ci_token;
    return SUCCESS;
}

int nvmlComputeInstanceGetInfo_v2(void *h, ci_info_t *out) {
    STUB_LOCK;
    struct gi *g = ci_handle(h);
    CHECK("nvmlComputeInstanceGetInfo_v2", g ? &devs[g->gpu] : NULL);
    sync_mig_state();
    if (ci_handle(h) == NULL) return ERR_NOT_FOUND;
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    out->device = &g->mig;
    out->gpuInstance = g;
    out->id = g->ci_id;
    out->profileId = g->mig.cislices == 7 ? 4 : g->mig.cislices - 1;
    out->placement.start = 0;
    out->placement.size = g->mig.cislices;
    return SUCCESS;
}

int nvmlComputeInstanceDestroy(void *h) {
    STUB_LOCK;
    struct gi *g = ci_handle(h);
    CHECK("nvmlComputeInstanceDestroy", g ? &devs[g->gpu] : NULL);
    sync_mig_state();
    if (ci_handle(h) == NULL) return ERR_NOT_FOUND;
    g->has_ci = 0;
    g->ci_id = 0;
    memset(&g->mig, 0, sizeof g->mig);
    write_mig_state();
    return SUCCESS;
}

int nvmlGpuInstanceDestroy(void *h) {
    STUB_LOCK;
    GI("nvmlGpuInstanceDestroy");
    if (g->has_ci) return ERR_IN_USE;
    memset(g, 0, sizeof *g);
    write_mig_state();
    return SUCCESS;
}

/* ---- Memory limits per cgroup (nvmlDeviceSetMemoryLimits_v1, r615) ---- */
#ifndef STUB_NO_MEMORY_LIMITS
#include <sys/stat.h>

#define ERR_OPERATING_SYSTEM 17
#define ERR_MEMORY 20
#define LIMIT_MAX 0xFFFFFFFFFFFFFFFFULL

typedef struct {
    const char *nameSpace;
    unsigned long long softLimit, hardLimit;
} set_limits_t;

typedef struct {
    const char *nameSpace;
    unsigned long long softLimit, hardLimit, currentUsed;
} get_limits_t;

/* Bytes nvmlStubAllocate handed out in this process, per GPU and cgroup. */
#define MAX_USES 64
static struct {
    char uuid[96];
    char path[4096];
    unsigned long long used;
} uses[MAX_USES];

static unsigned long long *use_of(const char *uuid, const char *path, int create) {
    for (int i = 0; i < MAX_USES; i++) {
        if (uses[i].uuid[0] && !strcmp(uses[i].uuid, uuid) && !strcmp(uses[i].path, path)) return &uses[i].used;
    }
    if (!create) return NULL;
    for (int i = 0; i < MAX_USES; i++) {
        if (!uses[i].uuid[0]) {
            snprintf(uses[i].uuid, sizeof uses[i].uuid, "%s", uuid);
            snprintf(uses[i].path, sizeof uses[i].path, "%s", path);
            return &uses[i].used;
        }
    }
    return NULL;
}

/* The last limits set for GPU uuid on path; 0 when none was. */
static int last_limits(const char *uuid, const char *path, unsigned long long *soft, unsigned long long *hard) {
    FILE *fp = fopen(memlimits_path, "r");
    if (fp == NULL) return 0;
    char line[4400], u[96];
    int found = 0, n = 0;
    unsigned long long s, h;
    while (fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\n")] = 0;
        if (sscanf(line, "set %95s %llu %llu %n", u, &s, &h, &n) == 3 && n > 0 && !strcmp(u, uuid) &&
            !strcmp(line + n, path)) {
            *soft = s;
            *hard = h;
            found = 1;
        }
    }
    fclose(fp);
    return found;
}

int nvmlDeviceSetMemoryLimits_v1(void *h, set_limits_t *limits) {
    STUB_LOCK;
    DEVICE("nvmlDeviceSetMemoryLimits_v1");
    if (d->is_mig) return ERR_NOT_SUPPORTED;
    if (limits == NULL || limits->nameSpace == NULL) return ERR_INVALID_ARGUMENT;
    if (limits->softLimit > limits->hardLimit) return ERR_INVALID_ARGUMENT;
    if (limits->hardLimit != LIMIT_MAX && limits->hardLimit > d->mem) return ERR_INVALID_ARGUMENT;
    struct stat st;
    if (stat(limits->nameSpace, &st) != 0 || !S_ISDIR(st.st_mode)) return ERR_OPERATING_SYSTEM;
    FILE *fp = fopen(memlimits_path, "a");
    if (fp == NULL) return ERR_OPERATING_SYSTEM;
    fprintf(fp, "set %s %llu %llu %s\n", d->uuid, limits->softLimit, limits->hardLimit, limits->nameSpace);
    fclose(fp);
    return SUCCESS;
}

int nvmlDeviceGetMemoryLimits_v1(void *h, get_limits_t *limits) {
    STUB_LOCK;
    DEVICE("nvmlDeviceGetMemoryLimits_v1");
    if (d->is_mig) return ERR_NOT_SUPPORTED;
    if (limits == NULL || limits->nameSpace == NULL) return ERR_INVALID_ARGUMENT;
    struct stat st;
    if (stat(limits->nameSpace, &st) != 0 || !S_ISDIR(st.st_mode)) return ERR_OPERATING_SYSTEM;
    unsigned long long soft, hard;
    if (!last_limits(d->uuid, limits->nameSpace, &soft, &hard)) return ERR_NOT_FOUND;
    unsigned long long *used = use_of(d->uuid, limits->nameSpace, 0);
    limits->softLimit = soft;
    limits->hardLimit = hard;
    limits->currentUsed = used ? *used : 0;
    return SUCCESS;
}

/* A fake allocation of bytes on GPU h by a process in cgroup path (not an NVML call). */
int nvmlStubAllocate(void *h, const char *path, unsigned long long bytes) {
    STUB_LOCK;
    DEVICE("nvmlStubAllocate");
    if (path == NULL) return ERR_INVALID_ARGUMENT;
    unsigned long long *used = use_of(d->uuid, path, 1);
    if (used == NULL) return ERR_INSUFFICIENT_SIZE;
    char at[4096];
    snprintf(at, sizeof at, "%s", path);
    for (;;) {
        unsigned long long soft, hard;
        if (last_limits(d->uuid, at, &soft, &hard) && hard != LIMIT_MAX) {
            if (*used + bytes > hard) return ERR_MEMORY;
            break;
        }
        char *slash = strrchr(at, '/');
        if (slash == NULL || slash == at) break;
        *slash = 0;
    }
    *used += bytes;
    return SUCCESS;
}
#endif
