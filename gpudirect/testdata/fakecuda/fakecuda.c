// fakecuda.c: a stand-in for libcuda.so.1 so that the cgo half of gpudirect
// can be tested on machines without a GPU (see fake_test.go, which compiles
// it). "Device" memory is host memory; copies are memcpy and complete
// immediately. Calls that need a current context fail with
// CUDA_ERROR_INVALID_CONTEXT unless one is current on the calling thread, as
// with the real driver, which checks that gpudirect makes such calls on the
// device's worker thread.
//
// Variants: -DFAKE_CUDA_12080 exports the CUDA 12.8 cuMemcpyBatchAsync (with
// failIdx) instead of cuMemcpyBatchAsync_v2; -DFAKE_OLD exports neither nor
// cuMemGetHandleForAddressRange; -DFAKE_BROKEN lacks cuMemAlloc_v2;
// -DFAKE_PAGEABLE copies from memory it does not know (pageable host memory);
// -DFAKE_NO_WAIT lacks cuStreamWaitValue32_v2.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct { int srcAccessOrder; CUmemLocation src, dst; unsigned flags; } CUmemcpyAttributes;

enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, NO_DEVICE = 100, INVALID_DEVICE = 101,
	INVALID_CONTEXT = 201, INVALID_HANDLE = 400, NOT_READY = 600, ALREADY_REGISTERED = 712,
	NOT_REGISTERED = 713, NOT_SUPPORTED = 801 };

#define MAXR 4096
struct range { uintptr_t base; size_t size; int kind; int sync; int refs; }; // kind 1 device, 2 host alloc, 3 host reg
static struct range ranges[MAXR];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized, ctxrefs;
static __thread void *current;
static char ctx_token;

static struct range *find(uintptr_t p, int exact) {
	for (int i = 0; i < MAXR; i++) {
		struct range *r = &ranges[i];
		if (!r->kind) continue;
		if (exact ? p == r->base : (p >= r->base && p < r->base + r->size)) return r;
	}
	return NULL;
}
static struct range *add(uintptr_t p, size_t n, int kind) {
	for (int i = 0; i < MAXR; i++) if (!ranges[i].kind) {
		ranges[i] = (struct range){p, n, kind, 0, 1};
		return &ranges[i];
	}
	return NULL;
}
#define NEED_CTX() do { if (!initialized) return NOT_INITIALIZED; if (!current) return INVALID_CONTEXT; } while (0)

CUresult cuInit(unsigned f) {
	if (f != 0) return INVALID_VALUE;
	if (getenv("FAKE_CUDA_INIT_FAIL")) return NO_DEVICE;
	initialized = 1;
	return OK;
}
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
static const char *names[][2] = {
	{"CUDA_SUCCESS", "no error"}, {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"}, {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
};
static const char *lookup(CUresult e, int which) {
	if (e >= 0 && e <= 3) return names[e][which];
	switch (e) {
	case NO_DEVICE: return which ? "no CUDA-capable device is detected" : "CUDA_ERROR_NO_DEVICE";
	case INVALID_DEVICE: return which ? "invalid device ordinal" : "CUDA_ERROR_INVALID_DEVICE";
	case INVALID_CONTEXT: return which ? "invalid device context" : "CUDA_ERROR_INVALID_CONTEXT";
	case INVALID_HANDLE: return which ? "invalid resource handle" : "CUDA_ERROR_INVALID_HANDLE";
	case NOT_READY: return which ? "device not ready" : "CUDA_ERROR_NOT_READY";
	case ALREADY_REGISTERED: return which ? "already registered" : "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
	case NOT_REGISTERED: return which ? "not registered" : "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
	case NOT_SUPPORTED: return which ? "operation not supported" : "CUDA_ERROR_NOT_SUPPORTED";
	}
	return NULL;
}
CUresult cuGetErrorName(CUresult e, const char **s) { *s = lookup(e, 0); return *s ? OK : INVALID_VALUE; }
CUresult cuGetErrorString(CUresult e, const char **s) { *s = lookup(e, 1); return *s ? OK : INVALID_VALUE; }
CUresult cuDeviceGetCount(int *n) { if (!initialized) return NOT_INITIALIZED; *n = 1; return OK; }
CUresult cuDeviceGet(int *d, int ord) { if (ord != 0) return INVALID_DEVICE; *d = 0; return OK; }
CUresult cuDeviceGetName(char *s, int len, int d) { strncpy(s, "Fake GPU", len); return d ? INVALID_DEVICE : OK; }
CUresult cuDeviceGetPCIBusId(char *s, int len, int d) { strncpy(s, "0000:3B:00.0", len); return d ? INVALID_DEVICE : OK; }
CUresult cuDeviceGetAttribute(int *v, int a, int d) {
	if (d) return INVALID_DEVICE;
	switch (a) {
	case 75: *v = 9; return OK;
	case 76: *v = 0; return OK;
	case 116: *v = 1; return OK;
#ifndef FAKE_OLD
	case 124: *v = 1; return OK;
#endif
	}
	return INVALID_VALUE;
}
CUresult cuDeviceTotalMem_v2(size_t *b, int d) { *b = 1 << 30; return d ? INVALID_DEVICE : OK; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) {
	if (d) return INVALID_DEVICE;
	pthread_mutex_lock(&mu); ctxrefs++; pthread_mutex_unlock(&mu);
	*c = &ctx_token;
	return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int d) {
	if (d) return INVALID_DEVICE;
	pthread_mutex_lock(&mu); ctxrefs--; pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuCtxSetCurrent(void *c) { current = c; return OK; }

#ifndef FAKE_BROKEN
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX();
	if (n == 0) return INVALID_VALUE;
	void *m = aligned_alloc(2 << 20, (n + (2 << 20) - 1) & ~(size_t)((2 << 20) - 1));
	if (!m) return 2;
	memset(m, 0, n);
	pthread_mutex_lock(&mu); add((uintptr_t)m, n, 1); pthread_mutex_unlock(&mu);
	*p = (uintptr_t)m;
	return OK;
}
#endif
static CUresult drop(uintptr_t p, int kind, int freeit) {
	pthread_mutex_lock(&mu);
	struct range *r = find(p, 1);
	if (!r || r->kind != kind) { pthread_mutex_unlock(&mu); return kind == 3 ? NOT_REGISTERED : INVALID_VALUE; }
	r->kind = 0;
	pthread_mutex_unlock(&mu);
	if (freeit) free((void *)p);
	return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { NEED_CTX(); return drop(p, 1, 1); }
CUresult cuMemGetAddressRange_v2(CUdeviceptr *b, size_t *s, CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct range *r = find(p, 0);
	if (r && r->kind == 1) { *b = r->base; *s = r->size; }
	pthread_mutex_unlock(&mu);
	return r && r->kind == 1 ? OK : INVALID_VALUE;
}
CUresult cuPointerGetAttribute(void *data, int a, CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct range *r = find(p, 0);
	struct range c = r ? *r : (struct range){0};
	pthread_mutex_unlock(&mu);
	if (!r) return INVALID_VALUE;
	switch (a) {
	case 2: *(unsigned *)data = c.kind == 1 ? 2 : 1; return OK;
	case 6: *(int *)data = c.sync; return OK;
	case 9: *(int *)data = 0; return OK;
	case 11: *(CUdeviceptr *)data = c.base; return OK;
	case 12: *(size_t *)data = c.size; return OK;
	case 15: *(int *)data = c.kind == 1; return OK;
	}
	return INVALID_VALUE;
}
CUresult cuPointerSetAttribute(const void *v, int a, CUdeviceptr p) {
	NEED_CTX();
	if (a != 6) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	struct range *r = find(p, 0);
	if (r && r->kind == 1) r->sync = *(const unsigned *)v != 0;
	pthread_mutex_unlock(&mu);
	return r && r->kind == 1 ? OK : INVALID_VALUE;
}
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct range *r = find(p, 1);
	pthread_mutex_unlock(&mu);
	if (!r || r->kind != 1) return INVALID_VALUE;
	memset(h, 0, sizeof *h);
	memcpy(h->reserved, "fakeipc", 7);
	memcpy(h->reserved + 8, &p, sizeof p);
	pid_t pid = getpid();
	memcpy(h->reserved + 16, &pid, sizeof pid);
	return OK;
}
// Same-process opens fail as in CUDA; others cannot work with host memory.
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned f) {
	NEED_CTX();
	if (f != 1) return INVALID_VALUE;
	if (memcmp(h.reserved, "fakeipc", 7) != 0) return INVALID_VALUE;
	*p = 0;
	return INVALID_CONTEXT;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) { NEED_CTX(); return INVALID_VALUE; }
CUresult cuMemHostAlloc(void **pp, size_t n, unsigned f) {
	NEED_CTX();
	if ((f != 1 && f != 3) || n == 0) return INVALID_VALUE;
	*pp = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
	pthread_mutex_lock(&mu); add((uintptr_t)*pp, n, 2); pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuMemFreeHost(void *p) { NEED_CTX(); return drop((uintptr_t)p, 2, 1); }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct range *r = find((uintptr_t)p, 0);
	if (!r) add((uintptr_t)p, n, 3);
	pthread_mutex_unlock(&mu);
	return r ? ALREADY_REGISTERED : OK;
}
CUresult cuMemHostUnregister(void *p) { NEED_CTX(); return drop((uintptr_t)p, 3, 0); }

// Streams and events: copies run at once, except on a stream held by
// cuStreamWaitValue32_v2 whose flag is not yet met: they wait in the stream
// until a synchronisation sees the flag met (the test's release), and a
// synchronisation that waits 5 s for it fails, as a hold never released
// would hang. Synchronisation needs no current context (as with CUDA, where
// the handle names its context).
static int known(uintptr_t p, size_t n);
struct pending { uintptr_t d, s; size_t n; };
struct handle {
	int magic;
	volatile unsigned *hold; // the flag a held stream waits on (NULL: not held)
	unsigned hold_val;
	struct pending *q; size_t nq, capq;
	struct handle *stream; // an event's stream, as recorded
};
static int met(struct handle *h) { return !h->hold || (int)(*h->hold - h->hold_val) >= 0; }
static CUresult drain(struct handle *h) {
	for (int i = 0; !met(h); i++) {
		if (i >= 5000) return 702; // CUDA_ERROR_LAUNCH_TIMEOUT
		usleep(1000);
	}
	h->hold = NULL;
	for (size_t i = 0; i < h->nq; i++) memmove((void *)h->q[i].d, (const void *)h->q[i].s, h->q[i].n);
	h->nq = 0;
	return OK;
}
CUresult cuStreamCreate(void **s, unsigned f) { NEED_CTX(); if (f != 1) return INVALID_VALUE; struct handle *h = calloc(1, sizeof *h); h->magic = 0x5757; *s = h; return OK; }
CUresult cuStreamDestroy_v2(void *s) { NEED_CTX(); struct handle *h = s; if (!h || h->magic != 0x5757) return INVALID_HANDLE; h->magic = 0; free(h->q); free(h); return OK; }
CUresult cuStreamSynchronize(void *s) { struct handle *h = s; return h && h->magic == 0x5757 ? drain(h) : INVALID_HANDLE; }
#ifndef FAKE_NO_WAIT
CUresult cuStreamWaitValue32_v2(void *s, CUdeviceptr addr, unsigned v, unsigned f) {
	NEED_CTX();
	struct handle *h = s;
	if (!h || h->magic != 0x5757) return INVALID_HANDLE;
	if (f != 0 || !addr || (addr & 3)) return INVALID_VALUE;
	if (h->hold) { CUresult rc = drain(h); if (rc) return rc; }
	h->hold = (volatile unsigned *)(uintptr_t)addr;
	h->hold_val = v;
	return OK;
}
#endif
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned f) {
	NEED_CTX();
	if (f != 0 || !known((uintptr_t)p, 1)) return INVALID_VALUE;
	*d = (CUdeviceptr)(uintptr_t)p;
	return OK;
}
CUresult cuEventCreate(void **e, unsigned f) { NEED_CTX(); if (f != 2) return INVALID_VALUE; struct handle *h = calloc(1, sizeof *h); h->magic = 0xe7e7; *e = h; return OK; }
CUresult cuEventRecord(void *e, void *s) {
	NEED_CTX();
	struct handle *he = e, *hs = s;
	if (!(he && he->magic == 0xe7e7 && hs && hs->magic == 0x5757)) return INVALID_HANDLE;
	he->stream = hs;
	return OK;
}
CUresult cuEventQuery(void *e) {
	struct handle *h = e;
	if (!h || h->magic != 0xe7e7) return INVALID_HANDLE;
	return h->stream && h->stream->magic == 0x5757 && !met(h->stream) ? NOT_READY : OK;
}
CUresult cuEventSynchronize(void *e) {
	struct handle *h = e;
	if (!h || h->magic != 0xe7e7) return INVALID_HANDLE;
	return h->stream && h->stream->magic == 0x5757 ? drain(h->stream) : OK;
}
CUresult cuEventDestroy_v2(void *e) { NEED_CTX(); struct handle *h = e; if (!h || h->magic != 0xe7e7) return INVALID_HANDLE; h->magic = 0; free(h); return OK; }

static int known(uintptr_t p, size_t n) {
	pthread_mutex_lock(&mu);
	struct range *r = find(p, 0);
	int ok = r && p + n <= r->base + r->size;
	pthread_mutex_unlock(&mu);
	return ok;
}
static CUresult copy(uintptr_t d, uintptr_t s, size_t n, void *st) {
	struct handle *h = st;
	if (!h || h->magic != 0x5757) return INVALID_HANDLE;
	if (!known(d, n)) return INVALID_VALUE;
#ifdef FAKE_PAGEABLE
	if (!known(s, n) && s < 0x10000) return INVALID_VALUE; // memory it does not know is pageable host memory
#else
	if (!known(s, n)) return INVALID_VALUE;
#endif
	if (!met(h)) {
		if (h->nq == h->capq) {
			size_t c = h->capq ? 2 * h->capq : 256;
			struct pending *q = realloc(h->q, c * sizeof *q);
			if (!q) return 2; // CUDA_ERROR_OUT_OF_MEMORY
			h->q = q;
			h->capq = c;
		}
		h->q[h->nq++] = (struct pending){d, s, n};
		return OK;
	}
	if (h->hold) { CUresult rc = drain(h); if (rc) return rc; }
	memmove((void *)d, (const void *)s, n);
	return OK;
}
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { NEED_CTX(); return copy(d, s, n, st); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { NEED_CTX(); return copy(d, (uintptr_t)s, n, st); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { NEED_CTX(); return copy((uintptr_t)d, s, n, st); }

#ifndef FAKE_OLD
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t n, int type, unsigned long long flags) {
	NEED_CTX();
	if (type != 1 || (p & 4095) || (n & 4095) || flags > 1) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	struct range *r = find(p, 0);
	int ok = r && r->kind == 1 && p + n <= r->base + ((r->size + 4095) & ~(size_t)4095);
	pthread_mutex_unlock(&mu);
	if (!ok) return INVALID_VALUE;
	*(int *)handle = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return OK;
}
static CUresult batch(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, CUmemcpyAttributes *a,
		size_t *ai, size_t na, size_t *fail, void *st) {
	NEED_CTX();
	if (count == 0 || na != 1 || ai[0] != 0 || a[0].srcAccessOrder != 1 || a[0].src.type || a[0].dst.type) return INVALID_VALUE;
	for (size_t i = 0; i < count; i++) {
		CUresult rc = copy(d[i], s[i], n[i], st);
		if (rc) { if (fail) *fail = i; return rc; }
	}
	return OK;
}
#ifdef FAKE_CUDA_12080
CUresult cuMemcpyBatchAsync(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, CUmemcpyAttributes *a,
		size_t *ai, size_t na, size_t *fail, void *st) { return batch(d, s, n, count, a, ai, na, fail, st); }
#else
CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, CUmemcpyAttributes *a,
		size_t *ai, size_t na, void *st) { return batch(d, s, n, count, a, ai, na, NULL, st); }
#endif
#endif
