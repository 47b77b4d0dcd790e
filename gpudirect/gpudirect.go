// Package gpudirect is b2bd's thin layer over the CUDA driver API: what the
// daemon needs to hand GPU memory to an RDMA NIC (GPUDirect: dma-buf export,
// SYNC_MEMOPS, pointer checks), to share it with applications (CUDA IPC), and
// to stage blocks through copy engines (streams, events, async and batched
// copies) — zero GPU SMs throughout.
//
// Shape (modelled on NVIDIA/go-nvml):
//
//   - libcuda.so.1 is opened at run time through internal/dl; no CUDA header
//     or library is needed at build time. The few driver types and function
//     signatures used are declared by hand in cuda_shim.h.
//   - Interface is what the daemon calls; Load returns the real
//     implementation. A hand-written in-memory one for tests lives in
//     gpudirect/cudatest, so the daemon does not link it.
//   - cgo lives only in the files of the real implementation, split by
//     handle kind (driver.go, mem.go, host.go, stream.go, copy.go; build tag
//     cgo && linux), each with a _stub.go twin (!cgo || !linux) so that
//     CGO_ENABLED=0 builds work; there Load reports ErrNoDriver.
//   - Every call that needs a device's context runs on that device's worker:
//     one goroutine locked to one OS thread (runtime.LockOSThread) on which
//     the device's primary context was retained and made current once. Calls
//     are handed to it as pooled request structs, so the copy paths allocate
//     nothing. Stream and event synchronisation run on the caller's thread
//     instead, so a long wait never blocks the device's other calls. Three
//     more such threads per device queue the parts of MemcpyBatchAsyncParts
//     beside the worker (ParallelParts says why).
//   - Errors name the CUDA call, its arguments and the CUresult name, and wrap
//     one of the package's error classes (errors.go; through *Error for a
//     failed call). The package imports nothing of b2bd's but internal/dl:
//     the daemon maps the classes onto its domain errors itself.
package gpudirect

import (
	"fmt"
	"strings"
)

// DefaultLibrary is the CUDA driver library Load opens unless WithLibrary
// names another.
const DefaultLibrary = "libcuda.so.1"

// IPCHandleSize is the size of a CUDA IPC memory handle (CU_IPC_HANDLE_SIZE).
const IPCHandleSize = 64

// Interface is the CUDA driver as b2bd uses it. Device arguments are CUDA
// ordinals (0 .. DeviceCount()-1). Addresses are device pointers (CUdeviceptr)
// or host virtual addresses; host memory passed to async copies must stay
// valid, and must not be in the Go heap, until the stream has been
// synchronised. All methods are safe for concurrent use.
//
// After Close, every method that returns an error returns one wrapping
// ErrClosed (Close itself does nothing again); so does every call on a
// stream or event after it was destroyed, but destroying it again. No call
// after Close reaches the driver.
type Interface interface {
	// DriverVersion is cuDriverGetVersion's value, e.g. 13000 for CUDA 13.0.
	DriverVersion() int
	// DeviceCount is the number of CUDA devices.
	DeviceCount() int
	// DeviceInfo describes a device (name, PCI bus id, capabilities).
	DeviceInfo(dev int) (DeviceInfo, error)
	// Capabilities says which optional driver entry points are in use.
	Capabilities() Capabilities
	// DeviceNotes says what dev's context could not set up that makes some
	// of its copies slower (the copy-engine primer of host-to-device
	// batches, the hold of their parts), a sentence each; nil when all of
	// it is set up, or dev's context is not open yet.
	DeviceNotes(dev int) []string

	// MemAlloc allocates size bytes of device memory (cuMemAlloc).
	MemAlloc(dev int, size uint64) (uintptr, error)
	// MemFree frees memory from MemAlloc (cuMemFree).
	MemFree(dev int, ptr uintptr) error
	// PointerInfo reads ptr's pointer attributes (cuPointerGetAttribute). A
	// host address CUDA does not know fails with ErrInvalidValue.
	PointerInfo(dev int, ptr uintptr) (PointerInfo, error)
	// SetSyncMemops sets CU_POINTER_ATTRIBUTE_SYNC_MEMOPS on the allocation
	// holding ptr, as GPUDirect RDMA requires: synchronous memory operations
	// on it then complete before returning, so a NIC never sees stale data.
	SetSyncMemops(dev int, ptr uintptr) error
	// ExportDmabuf exports [ptr, ptr+size) as a dma-buf file descriptor for
	// ibv_reg_dmabuf_mr (cuMemGetHandleForAddressRange). The driver wants a
	// host-page-aligned range, so the exported range is widened to page
	// boundaries; Dmabuf.Offset is ptr's offset inside it. Fails with
	// ErrNotSupported where the driver or device has no dma-buf support.
	ExportDmabuf(dev int, ptr uintptr, size uint64, flags DmabufFlags) (*Dmabuf, error)

	// IPCGetMemHandle returns the IPC handle of the allocation whose base is ptr.
	IPCGetMemHandle(dev int, ptr uintptr) (IPCHandle, error)
	// IPCOpenMemHandle maps another process's allocation into this one
	// (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) and returns its base. A handle
	// exported by this same process cannot be opened (a CUDA restriction).
	IPCOpenMemHandle(dev int, h IPCHandle) (uintptr, error)
	// IPCCloseMemHandle unmaps memory from IPCOpenMemHandle.
	IPCCloseMemHandle(dev int, ptr uintptr) error
	// EnablePeerAccess lets copies queued on dev's streams reach memory
	// allocated on peer directly, over NVLink or PCIe peer-to-peer
	// (cuCtxEnablePeerAccess), until Close; enabling it again is not an
	// error. ErrNotSupported where the two devices cannot
	// (cuDeviceCanAccessPeer) or the driver lacks the calls.
	EnablePeerAccess(dev, peer int) error

	// HostAlloc allocates size bytes of pinned, portable host memory
	// (cuMemHostAlloc). The slice is outside the Go heap.
	HostAlloc(dev int, size int) ([]byte, error)
	// HostFree frees memory from HostAlloc; b must start where it started.
	HostFree(dev int, b []byte) error
	// HostRegister pins existing host memory, e.g. an mmap'd region, for
	// fast copy-engine access (cuMemHostRegister, portable).
	HostRegister(dev int, addr uintptr, size uint64) error
	// HostUnregister undoes HostRegister.
	HostUnregister(dev int, addr uintptr) error

	// StreamCreate creates a non-blocking stream on dev.
	StreamCreate(dev int) (*Stream, error)
	// StreamSynchronize waits until all work queued on s has finished.
	StreamSynchronize(s *Stream) error
	// StreamDestroy destroys s; destroying it twice is not an error.
	StreamDestroy(s *Stream) error
	// EventCreate creates an event (timing disabled) on dev.
	EventCreate(dev int) (*Event, error)
	// EventRecord records e on s; both must belong to the same device.
	EventRecord(e *Event, s *Stream) error
	// EventQuery reports whether all work captured by e has finished.
	EventQuery(e *Event) (bool, error)
	// EventSynchronize waits for e.
	EventSynchronize(e *Event) error
	// EventDestroy destroys e; destroying it twice is not an error.
	EventDestroy(e *Event) error

	// MemcpyHtoDAsync queues a host-to-device copy on s.
	MemcpyHtoDAsync(s *Stream, dst, src uintptr, size uint64) error
	// MemcpyDtoHAsync queues a device-to-host copy on s.
	MemcpyDtoHAsync(s *Stream, dst, src uintptr, size uint64) error
	// MemcpyBatchAsync queues len(sizes) copies dsts[i] <- srcs[i] of
	// sizes[i] bytes on s, in one cgo call: cuMemcpyBatchAsync where the
	// driver has it, else a C loop of cuMemcpyAsync. Addresses may be host or
	// device (unified addressing). Copies within a batch are unordered.
	MemcpyBatchAsync(s *Stream, dsts, srcs, sizes []uint64) error
	// MemcpyBatchAsyncParts queues the same copies in up to len(ss) parts
	// of about equal count (at most ParallelParts), part j on ss[j], queued
	// at once from as many threads of the device, and returns once all are
	// queued (or failed: the first failure, naming its copy). The streams
	// must be of one device. For batches of many small copies, whose
	// driver time is CPU time per copy (ParallelParts). A host-to-device
	// batch's primed chunks (cuda_shim.h) need their primer still pending
	// when they are queued, which threads contending for the driver do not
	// keep (the chunk then runs on the SMs): so each part's stream waits on
	// a flag until every part is queued (cuStreamWaitValue32), and without
	// that call the batch goes in one part.
	MemcpyBatchAsyncParts(ss []*Stream, dsts, srcs, sizes []uint64) error

	// Close releases every resource still held (streams, events, IPC
	// mappings, registrations, allocations, primary contexts). Safe twice.
	Close() error
}

// ParallelParts is how many threads of a device queue the parts of one
// MemcpyBatchAsyncParts at once, and so the most parts it takes.
//
// The driver's time to queue a batch of small copies is CPU time, about
// 0.42 µs a copy on an H200 host's fast cores: with the stream held on a
// flag, the enqueue of 10,000 copies alone took as long as the whole batch
// (deploy/gpu/peerprobe.cu, "held"). On that host (a VM) some cores are
// slower: one thread pinned to core 15 took 7.0 ms for 10,000 primed
// host-to-device copies, on core 0 4.4 ms, and unpinned a batch landed in
// either. Queued in four parts from four threads on four streams, the same
// batches took 4.0-4.4 ms round after round, and 10,000 peer copies GPU0 ->
// GPU1 4.3-4.8 ms. (Host-to-device parts are held until all are queued:
// see MemcpyBatchAsyncParts.)
const ParallelParts = 4

// DeviceInfo describes one CUDA device.
type DeviceInfo struct {
	Ordinal int
	Name    string
	// PCIBusID is in sysfs form, lower case: "0000:3b:00.0".
	PCIBusID     string
	TotalMem     uint64
	ComputeMajor int
	ComputeMinor int
	// DmabufSupported is CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: device memory
	// can be exported as dma-buf (needs NVIDIA's open kernel modules).
	DmabufSupported bool
	// GPUDirectRDMASupported is CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED.
	GPUDirectRDMASupported bool
}

// Capabilities lists the optional driver features in use.
type Capabilities struct {
	// MemcpyBatch: MemcpyBatchAsync issues one cuMemcpyBatchAsync (CUDA
	// 12.8+) instead of a C loop of cuMemcpyAsync.
	MemcpyBatch bool
	// MemcpyBatchSymbol is the entry point used: "cuMemcpyBatchAsync_v2"
	// (CUDA 13 ABI), "cuMemcpyBatchAsync" (CUDA 12.8 ABI, with failIdx), or "".
	MemcpyBatchSymbol string
	// DmabufExport: the driver exports cuMemGetHandleForAddressRange (11.7+).
	// Whether a device supports it is DeviceInfo.DmabufSupported.
	DmabufExport bool
	// PeerAccess: the driver exports cuDeviceCanAccessPeer and
	// cuCtxEnablePeerAccess (EnablePeerAccess).
	PeerAccess bool
}

// MemoryType is CU_POINTER_ATTRIBUTE_MEMORY_TYPE's value (CUmemorytype).
type MemoryType int

const (
	MemoryTypeHost    MemoryType = 1 // CU_MEMORYTYPE_HOST
	MemoryTypeDevice  MemoryType = 2 // CU_MEMORYTYPE_DEVICE
	MemoryTypeArray   MemoryType = 3 // CU_MEMORYTYPE_ARRAY
	MemoryTypeUnified MemoryType = 4 // CU_MEMORYTYPE_UNIFIED
)

func (t MemoryType) String() string {
	switch t {
	case MemoryTypeHost:
		return "host"
	case MemoryTypeDevice:
		return "device"
	case MemoryTypeArray:
		return "array"
	case MemoryTypeUnified:
		return "unified"
	}
	return fmt.Sprintf("memorytype(%d)", int(t))
}

// PointerInfo is what the driver knows about an address.
type PointerInfo struct {
	MemoryType MemoryType
	Device     int     // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
	RangeStart uintptr // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: the allocation's base
	RangeSize  uint64  // CU_POINTER_ATTRIBUTE_RANGE_SIZE
	SyncMemops bool    // CU_POINTER_ATTRIBUTE_SYNC_MEMOPS
	// GPUDirectRDMACapable is CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE
	// (false where the driver predates it).
	GPUDirectRDMACapable bool
}

// DmabufFlags are cuMemGetHandleForAddressRange flags (CUmemRangeFlags).
type DmabufFlags uint64

// DmabufMappingPCIe (CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE, CUDA
// 12.8+) forces the dma-buf to be mapped through the PCIe BAR1, as a NIC on
// the PCIe bus needs on systems where the default mapping is C2C.
const DmabufMappingPCIe DmabufFlags = 1

// IPCHandle is a CUDA IPC memory handle (CUipcMemHandle).
type IPCHandle [IPCHandleSize]byte

// ParseIPCHandle validates an IPC handle received from a client. field names
// the request field in errors (e.g. "cuda_ipc.handle"). A handle must be
// exactly IPCHandleSize bytes and not all zeros.
func ParseIPCHandle(field string, b []byte) (IPCHandle, error) {
	var h IPCHandle
	if field == "" {
		field = "ipc_handle"
	}
	if len(b) != IPCHandleSize {
		return h, fmt.Errorf("%w: %s: a CUDA IPC handle is %d bytes, got %d", ErrInvalidValue, field, IPCHandleSize, len(b))
	}
	copy(h[:], b)
	if h == (IPCHandle{}) {
		return IPCHandle{}, fmt.Errorf("%w: %s: CUDA IPC handle is all zeros", ErrInvalidValue, field)
	}
	return h, nil
}

// Options for Load.
type options struct {
	library       string
	noMemcpyBatch bool
}

// Option configures Load.
type Option func(*options)

// WithLibrary makes Load open name instead of DefaultLibrary (tests use a
// name that does not exist to exercise the no-driver path).
func WithLibrary(name string) Option { return func(o *options) { o.library = name } }

// WithoutMemcpyBatch makes MemcpyBatchAsync use the cuMemcpyAsync loop even
// where the driver has cuMemcpyBatchAsync (still one cgo call per batch).
func WithoutMemcpyBatch() Option { return func(o *options) { o.noMemcpyBatch = true } }

func buildOptions(opts []Option) options {
	o := options{library: DefaultLibrary}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o
}

// AlignRange widens [addr, addr+size) to page boundaries. It reports false
// when the range is empty, page is not a power of two, or the end overflows.
func AlignRange(addr uintptr, size, page uint64) (base uintptr, length, offset uint64, ok bool) {
	if size == 0 || page == 0 || page&(page-1) != 0 {
		return 0, 0, 0, false
	}
	a := uint64(addr)
	end := a + size
	if end < a {
		return 0, 0, 0, false
	}
	b := a &^ (page - 1)
	e := end + page - 1
	if e < end {
		return 0, 0, 0, false
	}
	e &^= page - 1
	return uintptr(b), e - b, a - b, true
}

// NormalizePCIBusID turns the driver's "0000:3B:00.0" (or NVML-style
// "00000000:3B:00.0") into sysfs form "0000:3b:00.0".
func NormalizePCIBusID(s string) string {
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	s = strings.ToLower(strings.TrimSpace(s))
	if dom, rest, ok := strings.Cut(s, ":"); ok && len(dom) == 8 && strings.HasPrefix(dom, "0000") {
		s = dom[4:] + ":" + rest
	}
	return s
}

// CheckBatch validates MemcpyBatchAsync's arrays (for every implementation).
func CheckBatch(dsts, srcs, sizes []uint64) error {
	if len(dsts) != len(sizes) || len(srcs) != len(sizes) {
		return fmt.Errorf("%w: gpudirect: batch copy arrays differ in length: %d destinations, %d sources, %d sizes", ErrInvalidValue, len(dsts), len(srcs), len(sizes))
	}
	for i, n := range sizes {
		if n == 0 {
			return fmt.Errorf("%w: gpudirect: batch copy %d has size 0", ErrInvalidValue, i)
		}
	}
	return nil
}
