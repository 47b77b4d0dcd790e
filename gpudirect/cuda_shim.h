// cuda_shim.h: the few CUDA driver API types and entry points b2bd uses,
// declared by hand (no CUDA SDK at build time), and C wrappers that call
// them through a table of pointers filled by dlsym at run time.
//
// Only the cgo files of the real implementation (cgo && linux) include it.
//
// One return convention: every wrapper below that calls into the driver
// returns int, 0 on success or a negative error code: a CUresult negated
// (-CUresult), or B2B_ERRNO(e) for a C library failure (errno e, offset by
// B2B_ERRNO_BASE so that it never collides with a CUresult). Values come
// back through out-parameters. One Go helper (cuErr, device.go) turns the code
// into an error naming the call, with CUDA's error name and string. The
// table accessors (b2b_sym_*, b2b_has, b2b_set, b2b_nsyms) call nothing and
// return what they look up.
//
// Symbol names are the versioned ones libcuda exports for the current ABI
// (cuda.h #defines the plain names to them): cuMemAlloc_v2, cuMemFree_v2,
// cuMemGetAddressRange_v2, cuDeviceTotalMem_v2, cuDevicePrimaryCtxRelease_v2,
// cuIpcOpenMemHandle_v2, cuMemHostRegister_v2, cuStreamDestroy_v2,
// cuEventDestroy_v2, cuMemcpyHtoDAsync_v2, cuMemcpyDtoHAsync_v2. The plain
// name of such a function is an older ABI and must not be used.
//
// cuMemcpyBatchAsync changed ABI in CUDA 13.0: the exported plain name
// "cuMemcpyBatchAsync" is the CUDA 12.8 signature (9 parameters, with
// size_t *failIdx before the stream); "cuMemcpyBatchAsync_v2" is the CUDA 13
// signature (8 parameters, no failIdx). Both are optional.

#ifndef B2B_CUDA_SHIM_H
#define B2B_CUDA_SHIM_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;                 // CUDA_SUCCESS = 0
typedef int CUdevice;                 // CUdevice_v1
typedef unsigned long long CUdeviceptr; // CUdeviceptr_v2 on 64-bit
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

#define B2B_IPC_HANDLE_SIZE 64 // CU_IPC_HANDLE_SIZE
typedef struct CUipcMemHandle_st { char reserved[B2B_IPC_HANDLE_SIZE]; } CUipcMemHandle;

// CUmemLocation and CUmemcpyAttributes (CUmemcpyAttributes_v1, CUDA 12.8+).
typedef struct CUmemLocation_st { int type; int id; } CUmemLocation;
typedef struct CUmemcpyAttributes_st {
	int srcAccessOrder;       // CUmemcpySrcAccessOrder
	CUmemLocation srcLocHint; // type 0 = CU_MEM_LOCATION_TYPE_INVALID: no hint
	CUmemLocation dstLocHint;
	unsigned int flags;       // CUmemcpyFlags
} CUmemcpyAttributes;

// Enum values from cuda.h.
#define B2B_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define B2B_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define B2B_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED 116
#define B2B_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124

#define B2B_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define B2B_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS 6
#define B2B_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define B2B_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define B2B_CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define B2B_CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE 15

#define B2B_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1
#define B2B_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1
#define B2B_CU_MEMHOSTALLOC_PORTABLE 0x01
#define B2B_CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define B2B_CU_STREAM_WAIT_VALUE_GEQ 0x0
#define B2B_CU_MEMHOSTREGISTER_PORTABLE 0x01
#define B2B_CU_STREAM_NON_BLOCKING 0x1
#define B2B_CU_EVENT_DISABLE_TIMING 0x2
#define B2B_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM 0x1

// X(name, optional, parameter list). Enum-typed parameters are declared int
// (same size and passing convention on the supported ABIs).
#define B2B_CU_SYMS(X) \
	X(cuInit, 0, (unsigned int flags)) \
	X(cuDriverGetVersion, 0, (int *version)) \
	X(cuGetErrorName, 0, (CUresult error, const char **str)) \
	X(cuGetErrorString, 0, (CUresult error, const char **str)) \
	X(cuDeviceGetCount, 0, (int *count)) \
	X(cuDeviceGet, 0, (CUdevice *device, int ordinal)) \
	X(cuDeviceGetName, 0, (char *name, int len, CUdevice dev)) \
	X(cuDeviceGetPCIBusId, 0, (char *pciBusId, int len, CUdevice dev)) \
	X(cuDeviceGetAttribute, 0, (int *pi, int attrib, CUdevice dev)) \
	X(cuDeviceTotalMem_v2, 0, (size_t *bytes, CUdevice dev)) \
	X(cuDevicePrimaryCtxRetain, 0, (CUcontext *pctx, CUdevice dev)) \
	X(cuDevicePrimaryCtxRelease_v2, 0, (CUdevice dev)) \
	X(cuCtxSetCurrent, 0, (CUcontext ctx)) \
	X(cuDeviceCanAccessPeer, 1, (int *canAccessPeer, CUdevice dev, CUdevice peerDev)) \
	X(cuCtxEnablePeerAccess, 1, (CUcontext peerContext, unsigned int flags)) \
	X(cuMemAlloc_v2, 0, (CUdeviceptr *dptr, size_t bytesize)) \
	X(cuMemFree_v2, 0, (CUdeviceptr dptr)) \
	X(cuMemGetAddressRange_v2, 0, (CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)) \
	X(cuPointerGetAttribute, 0, (void *data, int attribute, CUdeviceptr ptr)) \
	X(cuPointerSetAttribute, 0, (const void *value, int attribute, CUdeviceptr ptr)) \
	X(cuIpcGetMemHandle, 0, (CUipcMemHandle *pHandle, CUdeviceptr dptr)) \
	X(cuIpcOpenMemHandle_v2, 0, (CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)) \
	X(cuIpcCloseMemHandle, 0, (CUdeviceptr dptr)) \
	X(cuMemHostAlloc, 0, (void **pp, size_t bytesize, unsigned int flags)) \
	X(cuMemFreeHost, 0, (void *p)) \
	X(cuMemHostRegister_v2, 0, (void *p, size_t bytesize, unsigned int flags)) \
	X(cuMemHostUnregister, 0, (void *p)) \
	X(cuStreamCreate, 0, (CUstream *phStream, unsigned int flags)) \
	X(cuStreamDestroy_v2, 0, (CUstream hStream)) \
	X(cuStreamSynchronize, 0, (CUstream hStream)) \
	X(cuEventCreate, 0, (CUevent *phEvent, unsigned int flags)) \
	X(cuEventRecord, 0, (CUevent hEvent, CUstream hStream)) \
	X(cuEventQuery, 0, (CUevent hEvent)) \
	X(cuEventSynchronize, 0, (CUevent hEvent)) \
	X(cuEventDestroy_v2, 0, (CUevent hEvent)) \
	X(cuMemcpyAsync, 0, (CUdeviceptr dst, CUdeviceptr src, size_t byteCount, CUstream hStream)) \
	X(cuMemcpyHtoDAsync_v2, 0, (CUdeviceptr dstDevice, const void *srcHost, size_t byteCount, CUstream hStream)) \
	X(cuMemcpyDtoHAsync_v2, 0, (void *dstHost, CUdeviceptr srcDevice, size_t byteCount, CUstream hStream)) \
	X(cuMemGetHandleForAddressRange, 1, (void *handle, CUdeviceptr dptr, size_t size, int handleType, unsigned long long flags)) \
	X(cuMemcpyBatchAsync_v2, 1, (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, CUstream hStream)) \
	X(cuMemcpyBatchAsync, 1, (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream hStream)) \
	X(cuStreamWaitValue32_v2, 1, (CUstream stream, CUdeviceptr addr, unsigned int value, unsigned int flags)) \
	X(cuMemHostGetDevicePointer_v2, 1, (CUdeviceptr *pdptr, void *p, unsigned int flags))

#define B2B_ENUM(name, opt, params) B2B_SYM_##name,
enum { B2B_CU_SYMS(B2B_ENUM) B2B_NSYMS };
#undef B2B_ENUM

#define B2B_PFN(name, opt, params) typedef CUresult (*b2b_pfn_##name) params;
B2B_CU_SYMS(B2B_PFN)
#undef B2B_PFN

#define B2B_NAME(name, opt, params) #name,
static const char *const b2b_sym_names[B2B_NSYMS] = { B2B_CU_SYMS(B2B_NAME) };
#undef B2B_NAME

#define B2B_OPT(name, opt, params) opt,
static const int b2b_sym_opt[B2B_NSYMS] = { B2B_CU_SYMS(B2B_OPT) };
#undef B2B_OPT

typedef struct b2b_tab { void *fn[B2B_NSYMS]; } b2b_tab;

#define B2B_CALL(t, name) ((b2b_pfn_##name)((t)->fn[B2B_SYM_##name]))

// B2B_RC turns a CUresult into the shim's return convention.
#define B2B_RC(rc) (-(int)(rc))

// B2B_ERRNO_BASE offsets errno values: CUresults end below 1000 (999 is
// CUDA_ERROR_UNKNOWN), so -(B2B_ERRNO_BASE + e) is never a negated CUresult.
#define B2B_ERRNO_BASE 100000
#define B2B_ERRNO(e) (-(B2B_ERRNO_BASE + (e)))

// CUDA_ERROR_NOT_SUPPORTED, returned for an optional entry point the driver lacks.
#define B2B_CUDA_ERROR_NOT_SUPPORTED 801

// The hand-declared types must match the driver's ABI.
_Static_assert(sizeof(CUipcMemHandle) == B2B_IPC_HANDLE_SIZE, "CUipcMemHandle is CU_IPC_HANDLE_SIZE bytes");
_Static_assert(sizeof(CUmemcpyAttributes) == 24, "CUmemcpyAttributes_v1 is 24 bytes");
_Static_assert(sizeof(CUdeviceptr) == 8, "CUdeviceptr_v2 is 64 bits");

static inline int b2b_nsyms(void) { return B2B_NSYMS; }
static inline const char *b2b_sym_name(int i) { return (i >= 0 && i < B2B_NSYMS) ? b2b_sym_names[i] : ""; }
static inline int b2b_sym_optional(int i) { return (i >= 0 && i < B2B_NSYMS) ? b2b_sym_opt[i] : 0; }
static inline void b2b_set(b2b_tab *t, int i, void *p) { if (i >= 0 && i < B2B_NSYMS) t->fn[i] = p; }
static inline int b2b_has(const b2b_tab *t, int i) { return i >= 0 && i < B2B_NSYMS && t->fn[i] != NULL; }

// ---- the table, initialisation and errors -------------------------------------

static inline int b2b_tab_new(b2b_tab **out) {
	*out = (b2b_tab *)calloc(1, sizeof(b2b_tab));
	return *out == NULL ? B2B_ERRNO(ENOMEM) : 0;
}

static inline int b2b_tab_free(b2b_tab *t) {
	free(t);
	return 0;
}

static inline int b2b_init(const b2b_tab *t) { return B2B_RC(B2B_CALL(t, cuInit)(0)); }

static inline int b2b_driver_version(const b2b_tab *t, int *v) {
	*v = 0;
	return B2B_RC(B2B_CALL(t, cuDriverGetVersion)(v));
}

// b2b_error_text looks up the name and description of the CUresult -rc
// (NULL where the driver does not know it).
static inline int b2b_error_text(const b2b_tab *t, int rc, const char **name, const char **desc) {
	*name = NULL;
	*desc = NULL;
	if (B2B_CALL(t, cuGetErrorName)((CUresult)(-rc), name) != 0) *name = NULL;
	if (B2B_CALL(t, cuGetErrorString)((CUresult)(-rc), desc) != 0) *desc = NULL;
	return 0;
}

// ---- devices ---------------------------------------------------------------

static inline int b2b_device_count(const b2b_tab *t, int *n) {
	*n = 0;
	return B2B_RC(B2B_CALL(t, cuDeviceGetCount)(n));
}

// b2b_device_info fills name, bus id and total memory; *step says which call
// failed (B2B_STEP_* below).
enum { B2B_STEP_DEVICE_GET, B2B_STEP_DEVICE_NAME, B2B_STEP_PCI_BUS_ID, B2B_STEP_TOTAL_MEM };
static inline int b2b_device_info(const b2b_tab *t, int ordinal, CUdevice *dev,
		char *name, int nameLen, char *bus, int busLen, size_t *total, int *step) {
	CUresult rc;
	*step = B2B_STEP_DEVICE_GET;
	if ((rc = B2B_CALL(t, cuDeviceGet)(dev, ordinal)) != 0) return B2B_RC(rc);
	*step = B2B_STEP_DEVICE_NAME;
	if ((rc = B2B_CALL(t, cuDeviceGetName)(name, nameLen, *dev)) != 0) return B2B_RC(rc);
	name[nameLen - 1] = 0;
	*step = B2B_STEP_PCI_BUS_ID;
	if ((rc = B2B_CALL(t, cuDeviceGetPCIBusId)(bus, busLen, *dev)) != 0) return B2B_RC(rc);
	bus[busLen - 1] = 0;
	*step = B2B_STEP_TOTAL_MEM;
	return B2B_RC(B2B_CALL(t, cuDeviceTotalMem_v2)(total, *dev));
}

static inline int b2b_device_attr(const b2b_tab *t, CUdevice dev, int attr, int *v) {
	*v = 0;
	return B2B_RC(B2B_CALL(t, cuDeviceGetAttribute)(v, attr, dev));
}

// ---- contexts (run on the device's worker thread) --------------------------

// b2b_ctx_open retains the primary context and makes it current on this
// thread; *step says which call failed (B2B_CTX_STEP_*).
enum { B2B_CTX_STEP_DEVICE_GET, B2B_CTX_STEP_RETAIN, B2B_CTX_STEP_SET_CURRENT };
static inline int b2b_ctx_open(const b2b_tab *t, int ordinal, int *step) {
	CUdevice dev;
	CUcontext ctx = NULL;
	CUresult rc;
	*step = B2B_CTX_STEP_DEVICE_GET;
	if ((rc = B2B_CALL(t, cuDeviceGet)(&dev, ordinal)) != 0) return B2B_RC(rc);
	*step = B2B_CTX_STEP_RETAIN;
	if ((rc = B2B_CALL(t, cuDevicePrimaryCtxRetain)(&ctx, dev)) != 0) return B2B_RC(rc);
	*step = B2B_CTX_STEP_SET_CURRENT;
	if ((rc = B2B_CALL(t, cuCtxSetCurrent)(ctx)) != 0) {
		B2B_CALL(t, cuDevicePrimaryCtxRelease_v2)(dev);
		return B2B_RC(rc);
	}
	return 0;
}

// b2b_peer_enable lets the current context (ordinal's) reach peer's memory
// directly. *can is 0 where the devices cannot (no call is made then). The
// peer's primary context must be retained by its own worker: it is retained
// here only for the call.
#define B2B_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704
static inline int b2b_peer_enable(const b2b_tab *t, int ordinal, int peer, int *can) {
	CUdevice dev, pdev;
	CUcontext pctx = NULL;
	CUresult rc;
	*can = 0;
	if ((rc = B2B_CALL(t, cuDeviceGet)(&dev, ordinal)) != 0) return B2B_RC(rc);
	if ((rc = B2B_CALL(t, cuDeviceGet)(&pdev, peer)) != 0) return B2B_RC(rc);
	if ((rc = B2B_CALL(t, cuDeviceCanAccessPeer)(can, dev, pdev)) != 0 || !*can) return B2B_RC(rc);
	if ((rc = B2B_CALL(t, cuDevicePrimaryCtxRetain)(&pctx, pdev)) != 0) return B2B_RC(rc);
	rc = B2B_CALL(t, cuCtxEnablePeerAccess)(pctx, 0);
	B2B_CALL(t, cuDevicePrimaryCtxRelease_v2)(pdev);
	if (rc == B2B_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) rc = 0;
	return B2B_RC(rc);
}

static inline int b2b_ctx_close(const b2b_tab *t, int ordinal) {
	CUdevice dev;
	CUresult rc;
	B2B_CALL(t, cuCtxSetCurrent)(NULL);
	if ((rc = B2B_CALL(t, cuDeviceGet)(&dev, ordinal)) != 0) return B2B_RC(rc);
	return B2B_RC(B2B_CALL(t, cuDevicePrimaryCtxRelease_v2)(dev));
}

// ---- device memory -----------------------------------------------------------

static inline int b2b_mem_alloc(const b2b_tab *t, size_t n, CUdeviceptr *p) {
	*p = 0;
	return B2B_RC(B2B_CALL(t, cuMemAlloc_v2)(p, n));
}

static inline int b2b_mem_free(const b2b_tab *t, CUdeviceptr p) { return B2B_RC(B2B_CALL(t, cuMemFree_v2)(p)); }

static inline int b2b_addr_range(const b2b_tab *t, CUdeviceptr p, CUdeviceptr *base, size_t *size) {
	*base = 0;
	*size = 0;
	return B2B_RC(B2B_CALL(t, cuMemGetAddressRange_v2)(base, size, p));
}

// b2b_ptr_attr reads one pointer attribute into a zeroed 8-byte slot (the
// attributes used are int, unsigned int, CUdeviceptr or size_t).
static inline int b2b_ptr_attr(const b2b_tab *t, CUdeviceptr p, int attr, unsigned long long *out) {
	*out = 0;
	return B2B_RC(B2B_CALL(t, cuPointerGetAttribute)(out, attr, p));
}

static inline int b2b_set_sync_memops(const b2b_tab *t, CUdeviceptr p) {
	unsigned int one = 1;
	return B2B_RC(B2B_CALL(t, cuPointerSetAttribute)(&one, B2B_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
}

static inline int b2b_dmabuf_export(const b2b_tab *t, CUdeviceptr p, size_t n, unsigned long long flags, int *fd) {
	*fd = -1;
	if (!b2b_has(t, B2B_SYM_cuMemGetHandleForAddressRange)) return B2B_RC(B2B_CUDA_ERROR_NOT_SUPPORTED);
	return B2B_RC(B2B_CALL(t, cuMemGetHandleForAddressRange)(fd, p, n, B2B_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, flags));
}

// ---- IPC -----------------------------------------------------------------------

static inline int b2b_ipc_get(const b2b_tab *t, CUdeviceptr p, void *out) {
	CUipcMemHandle h;
	memset(&h, 0, sizeof h);
	CUresult rc = B2B_CALL(t, cuIpcGetMemHandle)(&h, p);
	memcpy(out, &h, sizeof h);
	return B2B_RC(rc);
}

static inline int b2b_ipc_open(const b2b_tab *t, const void *in, CUdeviceptr *p) {
	CUipcMemHandle h;
	memcpy(&h, in, sizeof h);
	*p = 0;
	return B2B_RC(B2B_CALL(t, cuIpcOpenMemHandle_v2)(p, h, B2B_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
}

static inline int b2b_ipc_close(const b2b_tab *t, CUdeviceptr p) { return B2B_RC(B2B_CALL(t, cuIpcCloseMemHandle)(p)); }

// ---- host memory ---------------------------------------------------------------

static inline int b2b_host_alloc(const b2b_tab *t, size_t n, void **p) {
	*p = NULL;
	return B2B_RC(B2B_CALL(t, cuMemHostAlloc)(p, n, B2B_CU_MEMHOSTALLOC_PORTABLE));
}

static inline int b2b_host_free(const b2b_tab *t, uintptr_t p) { return B2B_RC(B2B_CALL(t, cuMemFreeHost)((void *)p)); }

static inline int b2b_host_register(const b2b_tab *t, uintptr_t p, size_t n) {
	return B2B_RC(B2B_CALL(t, cuMemHostRegister_v2)((void *)p, n, B2B_CU_MEMHOSTREGISTER_PORTABLE));
}

static inline int b2b_host_unregister(const b2b_tab *t, uintptr_t p) { return B2B_RC(B2B_CALL(t, cuMemHostUnregister)((void *)p)); }

// ---- streams and events ----------------------------------------------------------
//
// Streams and events share one create and one destroy wrapper, by kind.

enum { B2B_KIND_STREAM, B2B_KIND_EVENT };

static inline int b2b_handle_create(const b2b_tab *t, int kind, uintptr_t *out) {
	CUresult rc;
	*out = 0;
	if (kind == B2B_KIND_STREAM) {
		CUstream h = NULL;
		rc = B2B_CALL(t, cuStreamCreate)(&h, B2B_CU_STREAM_NON_BLOCKING);
		*out = (uintptr_t)h;
	} else {
		CUevent h = NULL;
		rc = B2B_CALL(t, cuEventCreate)(&h, B2B_CU_EVENT_DISABLE_TIMING);
		*out = (uintptr_t)h;
	}
	return B2B_RC(rc);
}

static inline int b2b_handle_destroy(const b2b_tab *t, int kind, uintptr_t h) {
	if (kind == B2B_KIND_STREAM) return B2B_RC(B2B_CALL(t, cuStreamDestroy_v2)((CUstream)h));
	return B2B_RC(B2B_CALL(t, cuEventDestroy_v2)((CUevent)h));
}

// b2b_handle_sync waits for a stream or an event.
static inline int b2b_handle_sync(const b2b_tab *t, int kind, uintptr_t h) {
	if (kind == B2B_KIND_STREAM) return B2B_RC(B2B_CALL(t, cuStreamSynchronize)((CUstream)h));
	return B2B_RC(B2B_CALL(t, cuEventSynchronize)((CUevent)h));
}

static inline int b2b_event_record(const b2b_tab *t, uintptr_t e, uintptr_t s) { return B2B_RC(B2B_CALL(t, cuEventRecord)((CUevent)e, (CUstream)s)); }

// b2b_event_query returns -CUDA_ERROR_NOT_READY while the event is pending.
static inline int b2b_event_query(const b2b_tab *t, uintptr_t e) { return B2B_RC(B2B_CALL(t, cuEventQuery)((CUevent)e)); }

// ---- copies ------------------------------------------------------------------------

static inline int b2b_htod(const b2b_tab *t, uintptr_t s, CUdeviceptr dst, uintptr_t src, size_t n) {
	return B2B_RC(B2B_CALL(t, cuMemcpyHtoDAsync_v2)(dst, (const void *)src, n, (CUstream)s));
}

static inline int b2b_dtoh(const b2b_tab *t, uintptr_t s, uintptr_t dst, CUdeviceptr src, size_t n) {
	return B2B_RC(B2B_CALL(t, cuMemcpyDtoHAsync_v2)((void *)dst, src, n, (CUstream)s));
}

// ---- host-to-device batches on the copy engines only ---------------------------
//
// Measured on an H100 with a kernel of another process holding every SM
// (deploy/gpu/h2dprobe.cu beside smprobe.cu; docs/samehost.md): a
// host-to-device copy under 32 KiB queued on an IDLE stream is carried by
// the compute engine, not a copy engine: the driver time-slices this
// context onto the SMs, stalling every block of the other kernel for
// ~0.4 ms (one cuMemcpyBatchAsync of 10,000 such copies: 1-11 stalls,
// 1-7 ms). Queued behind pending copy-engine work, the same copies run on
// the copy engines (0 stalls at 128 B to 64 KiB), and in chunks of 256
// they are also faster than one call of 10,000 (H100: 4 KiB 8 vs 12.6 ms,
// 64 KiB 12.1 vs 17 ms). So a host-to-device batch goes in chunks of
// B2B_H2D_CHUNK copies, each queued right behind a B2B_PRIMER_BYTES copy
// (on the copy engines by its size) from a pinned scratch to a device
// scratch, which is still pending when the chunk is queued. The other
// directions stay one call: device-to-host copies never use the compute
// engine; same-device device-to-device copies always do (samehost stages
// them through host memory). From pageable host memory the driver stages
// each call itself, on the compute engine whatever is pending: chunks only
// multiply its waits for a time slice (H100: 10 -> 97 ms for 10,000 x 128 B
// beside a kernel holding every SM), so such a batch stays one call.
#define B2B_H2D_CHUNK 256
#define B2B_PRIMER_BYTES 65536
#define B2B_CU_MEMORYTYPE_HOST 1
#define B2B_CU_MEMORYTYPE_DEVICE 2

// b2b_primer_alloc makes the primer's two scratch buffers on the current
// context's device; nothing is left allocated on failure.
static inline int b2b_primer_alloc(const b2b_tab *t, CUdeviceptr *dev, uintptr_t *host) {
	void *h = NULL;
	CUresult rc;
	*dev = 0;
	*host = 0;
	if ((rc = B2B_CALL(t, cuMemAlloc_v2)(dev, B2B_PRIMER_BYTES)) != 0) {
		*dev = 0;
		return B2B_RC(rc);
	}
	if ((rc = B2B_CALL(t, cuMemHostAlloc)(&h, B2B_PRIMER_BYTES, B2B_CU_MEMHOSTALLOC_PORTABLE)) != 0) {
		B2B_CALL(t, cuMemFree_v2)(*dev);
		*dev = 0;
		return B2B_RC(rc);
	}
	memset(h, 0, B2B_PRIMER_BYTES);
	*host = (uintptr_t)h;
	return 0;
}

static inline int b2b_primer_free(const b2b_tab *t, CUdeviceptr dev, uintptr_t host) {
	CUresult rc = 0, rc2 = 0;
	if (dev) rc = B2B_CALL(t, cuMemFree_v2)(dev);
	if (host) rc2 = B2B_CALL(t, cuMemFreeHost)((void *)host);
	return B2B_RC(rc ? rc : rc2);
}

// ---- holding the parts of a host-to-device batch ------------------------------
//
// A host-to-device batch queued in parts by several threads
// (MemcpyBatchAsyncParts) must keep each chunk's primer pending while the
// chunk is queued, and threads contending for the driver do not: a part's
// stream drained its primer before the chunk came, and the chunk ran on the
// compute engine (one 0.4 ms stall of every SM, docs/samehost.md). So each
// part's stream first waits for a flag in pinned host memory
// (cuStreamWaitValue32, GEQ: cyclic, so the counter may wrap), and the
// caller writes the batch's value once every part is queued: nothing runs
// until then, so every primer is still pending when its chunk is queued.
// The flag is device-mapped so that the stream can read it.

// b2b_hold_alloc makes a device's hold flag and checks that a stream can
// wait on it (a wait already met, synchronised); nothing is left on failure.
static inline int b2b_hold_alloc(const b2b_tab *t, uintptr_t *host, CUdeviceptr *dev) {
	void *h = NULL;
	CUstream st = NULL;
	CUresult rc;
	*host = 0;
	*dev = 0;
	if (!b2b_has(t, B2B_SYM_cuStreamWaitValue32_v2) || !b2b_has(t, B2B_SYM_cuMemHostGetDevicePointer_v2))
		return B2B_RC(B2B_CUDA_ERROR_NOT_SUPPORTED);
	if ((rc = B2B_CALL(t, cuMemHostAlloc)(&h, 64, B2B_CU_MEMHOSTALLOC_PORTABLE | B2B_CU_MEMHOSTALLOC_DEVICEMAP)) != 0) return B2B_RC(rc);
	memset(h, 0, 64);
	if ((rc = B2B_CALL(t, cuMemHostGetDevicePointer_v2)(dev, h, 0)) == 0 &&
		(rc = B2B_CALL(t, cuStreamCreate)(&st, B2B_CU_STREAM_NON_BLOCKING)) == 0) {
		if ((rc = B2B_CALL(t, cuStreamWaitValue32_v2)(st, *dev, 0, B2B_CU_STREAM_WAIT_VALUE_GEQ)) == 0)
			rc = B2B_CALL(t, cuStreamSynchronize)(st);
		B2B_CALL(t, cuStreamDestroy_v2)(st);
	}
	if (rc != 0) {
		B2B_CALL(t, cuMemFreeHost)(h);
		*dev = 0;
		return B2B_RC(rc);
	}
	*host = (uintptr_t)h;
	return 0;
}

static inline int b2b_hold_free(const b2b_tab *t, uintptr_t host) {
	return host ? B2B_RC(B2B_CALL(t, cuMemFreeHost)((void *)host)) : 0;
}

// b2b_hold_release lets the streams that wait for v or less on the flag go.
static inline void b2b_hold_release(uintptr_t host, unsigned int v) {
	__atomic_store_n((unsigned int *)host, v, __ATOMIC_SEQ_CST);
}

// b2b_mem_type is p's CUmemorytype: B2B_CU_MEMORYTYPE_HOST (pinned or
// registered host memory), B2B_CU_MEMORYTYPE_DEVICE, or 0 where the driver
// does not know p (pageable host memory).
static inline unsigned int b2b_mem_type(const b2b_tab *t, CUdeviceptr p) {
	unsigned long long v = 0;
	if (B2B_CALL(t, cuPointerGetAttribute)(&v, B2B_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != 0) return 0;
	return (unsigned int)v;
}

// b2b_memcpy_batch queues n copies on stream s in one call. use_batch allows
// cuMemcpyBatchAsync. A batch from pinned host to device memory (by its
// first copy) with a primer (primer_dev != 0) goes in primed chunks (above); *chunks counts
// them (0: one call, or the loop); with hold_dev != 0 the stream first waits
// for hold_val on that flag (above), and *held says so. *path says which
// entry point ran last (B2B_PATH_*). *fail is the index of the failing copy
// where the driver says (SIZE_MAX when unknown).
enum { B2B_PATH_LOOP, B2B_PATH_BATCH_12_8, B2B_PATH_BATCH_V2, B2B_PATH_PRIMER, B2B_PATH_HOLD };
static inline int b2b_memcpy_batch(const b2b_tab *t, uintptr_t s, CUdeviceptr *dsts, CUdeviceptr *srcs,
		size_t *sizes, size_t n, int use_batch, CUdeviceptr primer_dev, uintptr_t primer_host,
		CUdeviceptr hold_dev, unsigned int hold_val, int *path, size_t *fail, size_t *chunks, int *held) {
	CUstream st = (CUstream)s;
	*path = B2B_PATH_LOOP;
	*fail = SIZE_MAX;
	*chunks = 0;
	*held = 0;
	if (n == 0) return 0;
	if (use_batch && (b2b_has(t, B2B_SYM_cuMemcpyBatchAsync_v2) || b2b_has(t, B2B_SYM_cuMemcpyBatchAsync))) {
		CUmemcpyAttributes attr;
		size_t attrIdx = 0;
		int v2 = b2b_has(t, B2B_SYM_cuMemcpyBatchAsync_v2);
		int h2d = primer_dev != 0 && b2b_mem_type(t, dsts[0]) == B2B_CU_MEMORYTYPE_DEVICE &&
			b2b_mem_type(t, srcs[0]) == B2B_CU_MEMORYTYPE_HOST;
		size_t step = h2d ? B2B_H2D_CHUNK : n;
		memset(&attr, 0, sizeof attr);
		attr.srcAccessOrder = B2B_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
		if (h2d && hold_dev != 0) {
			CUresult rc;
			*path = B2B_PATH_HOLD;
			if ((rc = B2B_CALL(t, cuStreamWaitValue32_v2)(st, hold_dev, hold_val, B2B_CU_STREAM_WAIT_VALUE_GEQ)) != 0) return B2B_RC(rc);
			*held = 1;
		}
		for (size_t lo = 0; lo < n; lo += step) {
			size_t c = n - lo < step ? n - lo : step, f = SIZE_MAX;
			CUresult rc;
			if (h2d) {
				*path = B2B_PATH_PRIMER;
				if ((rc = B2B_CALL(t, cuMemcpyHtoDAsync_v2)(primer_dev, (const void *)primer_host, B2B_PRIMER_BYTES, st)) != 0) return B2B_RC(rc);
				(*chunks)++;
			}
			if (v2) {
				*path = B2B_PATH_BATCH_V2;
				rc = B2B_CALL(t, cuMemcpyBatchAsync_v2)(dsts + lo, srcs + lo, sizes + lo, c, &attr, &attrIdx, 1, st);
			} else {
				*path = B2B_PATH_BATCH_12_8;
				rc = B2B_CALL(t, cuMemcpyBatchAsync)(dsts + lo, srcs + lo, sizes + lo, c, &attr, &attrIdx, 1, &f, st);
			}
			if (rc != 0) {
				if (f < c) *fail = lo + f;
				return B2B_RC(rc);
			}
		}
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		CUresult rc = B2B_CALL(t, cuMemcpyAsync)(dsts[i], srcs[i], sizes[i], st);
		if (rc != 0) {
			*fail = i;
			return B2B_RC(rc);
		}
	}
	return 0;
}

#endif // B2B_CUDA_SHIM_H
