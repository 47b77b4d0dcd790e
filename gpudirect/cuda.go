//go:build cgo && linux

package gpudirect

/*
#include <stdlib.h>
#include "cuda_shim.h"

// The copy-path wrappers neither keep Go pointers nor call back into Go.
#cgo noescape b2b_htod
#cgo nocallback b2b_htod
#cgo noescape b2b_dtoh
#cgo nocallback b2b_dtoh
#cgo noescape b2b_memcpy_batch
#cgo nocallback b2b_memcpy_batch
#cgo nocallback b2b_event_record
#cgo nocallback b2b_stream_sync
#cgo nocallback b2b_event_sync
#cgo nocallback b2b_event_query
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/b2bd/b2bd/internal/dl"
	"github.com/b2bd/b2bd/internal/errs"
)

// libcuda is one loaded driver library and its table of entry points. Once
// cuInit has been called on it, it is kept for the life of the process: the
// driver starts threads of its own, and unloading it under them is unsafe.
// A later Load with the same name reuses it.
type libcuda struct {
	name        string
	lib         *dl.Library
	tab         *C.b2b_tab
	initialized bool
}

var (
	libMu sync.Mutex
	libs  = map[string]*libcuda{}
)

func unavailable(format string, args ...any) error {
	return fmt.Errorf("gpudirect: "+format+"; GPU memory is disabled, host memory is still served: %w", append(args, errs.ErrUnavailable)...)
}

func openLibcuda(name string) (*libcuda, error) {
	libMu.Lock()
	defer libMu.Unlock()
	l, ok := libs[name]
	if !ok {
		lib, err := dl.Open(name)
		if err != nil {
			return nil, unavailable("CUDA driver library not loadable: %v", err)
		}
		tab := (*C.b2b_tab)(C.calloc(1, C.sizeof_b2b_tab))
		if tab == nil {
			lib.Close()
			return nil, unavailable("out of memory for the CUDA entry-point table")
		}
		for i := 0; i < int(C.b2b_nsyms()); i++ {
			sym := C.GoString(C.b2b_sym_name(C.int(i)))
			p, err := lib.Sym(sym)
			if err != nil {
				if C.b2b_sym_optional(C.int(i)) != 0 {
					continue
				}
				C.free(unsafe.Pointer(tab))
				lib.Close()
				return nil, unavailable("%s lacks %s (driver too old?): %v", name, sym, err)
			}
			C.b2b_set(tab, C.int(i), p)
		}
		l = &libcuda{name: name, lib: lib, tab: tab}
		libs[name] = l
	}
	if !l.initialized {
		if rc := C.b2b_init(l.tab); rc != 0 {
			return nil, unavailable("cuInit(0) via %s: %v", name, l.cuErr(rc))
		}
		l.initialized = true
	}
	return l, nil
}

func (l *libcuda) cuErr(rc C.CUresult) *Error {
	var name, desc *C.char
	C.b2b_error_text(l.tab, rc, &name, &desc)
	e := &Error{Result: Result(rc)}
	if name != nil {
		e.Name = C.GoString(name)
	}
	if desc != nil {
		e.Desc = C.GoString(desc)
	}
	return e
}

// Load opens the CUDA driver, initialises it and returns the real
// implementation of Interface. Without a usable driver (library missing,
// cuInit failing, no device) the error wraps errs.ErrUnavailable: the daemon
// then serves host memory only.
func Load(opts ...Option) (Interface, error) {
	o := buildOptions(opts)
	l, err := openLibcuda(o.library)
	if err != nil {
		return nil, err
	}
	d := &driver{l: l, tab: l.tab, opts: o, pageSize: uint64(os.Getpagesize())}
	var v C.int
	if rc := C.b2b_driver_version(d.tab, &v); rc != 0 {
		return nil, unavailable("cuDriverGetVersion: %v", l.cuErr(rc))
	}
	d.version = int(v)
	var n C.int
	if rc := C.b2b_device_count(d.tab, &n); rc != 0 {
		return nil, unavailable("cuDeviceGetCount: %v", l.cuErr(rc))
	}
	if n <= 0 {
		return nil, unavailable("the CUDA driver (version %d) sees no devices", d.version)
	}
	d.count = int(n)
	d.infos = make([]DeviceInfo, d.count)
	for i := range d.infos {
		if d.infos[i], err = d.queryInfo(i); err != nil {
			return nil, fmt.Errorf("%w (%w)", err, errs.ErrUnavailable)
		}
	}
	d.devs = make([]atomic.Pointer[devState], d.count)
	d.caps.DmabufExport = C.b2b_has(d.tab, C.B2B_SYM_cuMemGetHandleForAddressRange) != 0
	if !o.noMemcpyBatch {
		switch {
		case C.b2b_has(d.tab, C.B2B_SYM_cuMemcpyBatchAsync_v2) != 0:
			d.caps.MemcpyBatch, d.caps.MemcpyBatchSymbol = true, "cuMemcpyBatchAsync_v2"
		case C.b2b_has(d.tab, C.B2B_SYM_cuMemcpyBatchAsync) != 0:
			d.caps.MemcpyBatch, d.caps.MemcpyBatchSymbol = true, "cuMemcpyBatchAsync"
		}
	}
	return d, nil
}

type driver struct {
	l        *libcuda
	tab      *C.b2b_tab
	opts     options
	version  int
	count    int
	infos    []DeviceInfo
	caps     Capabilities
	pageSize uint64

	mu     sync.Mutex // guards closed and starting workers
	closed bool
	devs   []atomic.Pointer[devState]

	// syncFallbacks counts synchronisations that had to be re-run on the
	// device thread because the driver wanted a current context.
	syncFallbacks atomic.Uint64
}

// devState is one device's worker and the resources made through it. The
// maps are touched only on the worker's thread.
type devState struct {
	ord        int
	w          *worker
	allocs     map[uintptr]uint64
	hostAllocs map[uintptr]uint64
	hostRegs   map[uintptr]uint64
	ipcOpen    map[uintptr]int // CUDA returns the same pointer (refcounted) when a handle is opened again
	streams    map[*Stream]struct{}
	events     map[*Event]struct{}
}

// callErr wraps a failed CUDA call: "gpudirect: <call> on device N: <name>: <desc>".
func (d *driver) callErr(rc C.CUresult, dev int, call string, args ...any) error {
	if len(args) > 0 {
		call = fmt.Sprintf(call, args...)
	}
	return fmt.Errorf("gpudirect: %s on device %d: %w", call, dev, d.l.cuErr(rc))
}

func (d *driver) checkDev(dev int) error {
	if dev < 0 || dev >= d.count {
		return fmt.Errorf("%w: gpudirect: CUDA device %d does not exist (this host has %d)", errs.ErrInvalidArgument, dev, d.count)
	}
	return nil
}

// device returns dev's state, starting its worker (and retaining its
// primary context) on first use.
func (d *driver) device(dev int) (*devState, error) {
	if err := d.checkDev(dev); err != nil {
		return nil, err
	}
	if ds := d.devs[dev].Load(); ds != nil {
		return ds, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if ds := d.devs[dev].Load(); ds != nil {
		return ds, nil
	}
	ds := &devState{
		ord:        dev,
		allocs:     map[uintptr]uint64{},
		hostAllocs: map[uintptr]uint64{},
		hostRegs:   map[uintptr]uint64{},
		ipcOpen:    map[uintptr]int{},
		streams:    map[*Stream]struct{}{},
		events:     map[*Event]struct{}{},
	}
	open := func() error {
		var step C.int
		if rc := C.b2b_ctx_open(d.tab, C.int(dev), &step); rc != 0 {
			calls := [...]string{"cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"}
			return d.callErr(rc, dev, calls[min(int(step), len(calls)-1)])
		}
		return nil
	}
	w, err := startWorker(fmt.Sprintf("device %d", dev), open, func() error { return d.releaseAll(ds) })
	if err != nil {
		return nil, err
	}
	ds.w = w
	d.devs[dev].Store(ds)
	return ds, nil
}

// releaseAll runs on ds's worker thread when the driver closes.
func (d *driver) releaseAll(ds *devState) error {
	var all []error
	note := func(rc C.CUresult, call string, args ...any) {
		if rc != 0 {
			all = append(all, d.callErr(rc, ds.ord, call, args...))
		}
	}
	for e := range ds.events {
		e.mu.Lock()
		if e.h != 0 {
			note(C.b2b_event_destroy(d.tab, C.uintptr_t(e.h)), "cuEventDestroy_v2")
			e.h = 0
		}
		e.mu.Unlock()
	}
	for s := range ds.streams {
		s.mu.Lock()
		if s.h != 0 {
			note(C.b2b_stream_destroy(d.tab, C.uintptr_t(s.h)), "cuStreamDestroy_v2")
			s.h = 0
		}
		s.mu.Unlock()
	}
	for p, n := range ds.ipcOpen {
		for ; n > 0; n-- {
			note(C.b2b_ipc_close(d.tab, C.CUdeviceptr(p)), "cuIpcCloseMemHandle(%#x)", p)
		}
	}
	for p := range ds.hostRegs {
		note(C.b2b_host_unregister(d.tab, C.uintptr_t(p)), "cuMemHostUnregister(%#x)", p)
	}
	for p := range ds.hostAllocs {
		note(C.b2b_host_free(d.tab, C.uintptr_t(p)), "cuMemFreeHost(%#x)", p)
	}
	for p := range ds.allocs {
		note(C.b2b_mem_free(d.tab, C.CUdeviceptr(p)), "cuMemFree_v2(%#x)", p)
	}
	clear(ds.events)
	clear(ds.streams)
	clear(ds.ipcOpen)
	clear(ds.hostRegs)
	clear(ds.hostAllocs)
	clear(ds.allocs)
	note(C.b2b_ctx_close(d.tab, C.int(ds.ord)), "cuDevicePrimaryCtxRelease_v2")
	return errors.Join(all...)
}

func (d *driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	var all []error
	for i := range d.devs {
		if ds := d.devs[i].Load(); ds != nil {
			if err := ds.w.stop(); err != nil {
				all = append(all, err)
			}
		}
	}
	return errors.Join(all...)
}

// ---- information -------------------------------------------------------------

func (d *driver) DriverVersion() int         { return d.version }
func (d *driver) DeviceCount() int           { return d.count }
func (d *driver) Capabilities() Capabilities { return d.caps }

func (d *driver) DeviceInfo(dev int) (DeviceInfo, error) {
	if err := d.checkDev(dev); err != nil {
		return DeviceInfo{}, err
	}
	return d.infos[dev], nil
}

func (d *driver) queryInfo(ord int) (DeviceInfo, error) {
	var (
		cudev C.CUdevice
		name  [256]C.char
		bus   [64]C.char
		total C.size_t
		step  C.int
	)
	if rc := C.b2b_device_info(d.tab, C.int(ord), &cudev, &name[0], C.int(len(name)), &bus[0], C.int(len(bus)), &total, &step); rc != 0 {
		calls := [...]string{"cuDeviceGet", "cuDeviceGetName", "cuDeviceGetPCIBusId", "cuDeviceTotalMem_v2"}
		return DeviceInfo{}, d.callErr(rc, ord, calls[min(int(step), len(calls)-1)])
	}
	info := DeviceInfo{
		Ordinal:  ord,
		Name:     C.GoString(&name[0]),
		PCIBusID: normalizePCIBusID(C.GoString(&bus[0])),
		TotalMem: uint64(total),
	}
	attr := func(a C.int, what string) (int, error) {
		var v C.int
		rc := C.b2b_device_attr(d.tab, cudev, a, &v)
		switch {
		case rc == 0:
			return int(v), nil
		case Result(rc) == ErrorInvalidValue:
			return 0, nil // an attribute this driver predates
		default:
			return 0, d.callErr(rc, ord, "cuDeviceGetAttribute(%s)", what)
		}
	}
	var err error
	if info.ComputeMajor, err = attr(C.B2B_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"); err != nil {
		return DeviceInfo{}, err
	}
	if info.ComputeMinor, err = attr(C.B2B_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"); err != nil {
		return DeviceInfo{}, err
	}
	v, err := attr(C.B2B_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED")
	if err != nil {
		return DeviceInfo{}, err
	}
	info.DmabufSupported = v != 0
	if v, err = attr(C.B2B_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED"); err != nil {
		return DeviceInfo{}, err
	}
	info.GPUDirectRDMASupported = v != 0
	return info, nil
}

// ---- device memory -----------------------------------------------------------

func (d *driver) MemAlloc(dev int, size uint64) (uintptr, error) {
	if size == 0 {
		return 0, fmt.Errorf("%w: gpudirect: cuMemAlloc_v2 on device %d: size is 0", errs.ErrInvalidArgument, dev)
	}
	ds, err := d.device(dev)
	if err != nil {
		return 0, err
	}
	var p C.CUdeviceptr
	var rc C.CUresult
	if err := ds.w.do(func() {
		if rc = C.b2b_mem_alloc(d.tab, C.size_t(size), &p); rc == 0 {
			ds.allocs[uintptr(p)] = size
		}
	}); err != nil {
		return 0, err
	}
	if rc != 0 {
		return 0, d.callErr(rc, dev, "cuMemAlloc_v2(size=%d)", size)
	}
	return uintptr(p), nil
}

func (d *driver) MemFree(dev int, ptr uintptr) error {
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	var rc C.CUresult
	known := true
	if err := ds.w.do(func() {
		if _, known = ds.allocs[ptr]; !known {
			return
		}
		rc = C.b2b_mem_free(d.tab, C.CUdeviceptr(ptr))
		delete(ds.allocs, ptr)
	}); err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("%w: gpudirect: cuMemFree_v2(%#x) on device %d: not an allocation made by MemAlloc", errs.ErrInvalidArgument, ptr, dev)
	}
	if rc != 0 {
		return d.callErr(rc, dev, "cuMemFree_v2(%#x)", ptr)
	}
	return nil
}

func (d *driver) PointerInfo(dev int, ptr uintptr) (PointerInfo, error) {
	ds, err := d.device(dev)
	if err != nil {
		return PointerInfo{}, err
	}
	var (
		rc   C.CUresult
		info PointerInfo
	)
	if err := ds.w.do(func() {
		var v C.ulonglong
		if rc = C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, &v); rc != 0 {
			return
		}
		info.MemoryType = MemoryType(v)
		if C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, &v) == 0 {
			info.Device = int(int32(uint32(v)))
		} else {
			info.Device = -1
		}
		if C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, &v) == 0 {
			info.RangeStart = uintptr(v)
		}
		if C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_RANGE_SIZE, &v) == 0 {
			info.RangeSize = uint64(v)
		}
		if C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, &v) == 0 {
			info.SyncMemops = uint32(v) != 0
		}
		if C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, &v) == 0 {
			info.GPUDirectRDMACapable = uint32(v) != 0
		}
	}); err != nil {
		return PointerInfo{}, err
	}
	if rc != 0 {
		err := d.callErr(rc, dev, "cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, %#x)", ptr)
		if Result(rc) == ErrorInvalidValue {
			return PointerInfo{}, fmt.Errorf("address %#x is not memory CUDA knows: %w", ptr, err)
		}
		return PointerInfo{}, err
	}
	return info, nil
}

func (d *driver) SetSyncMemops(dev int, ptr uintptr) error {
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	var rc C.CUresult
	if err := ds.w.do(func() { rc = C.b2b_set_sync_memops(d.tab, C.CUdeviceptr(ptr)) }); err != nil {
		return err
	}
	if rc != 0 {
		return d.callErr(rc, dev, "cuPointerSetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS=1, %#x)", ptr)
	}
	return nil
}

func (d *driver) ExportDmabuf(dev int, ptr uintptr, size uint64, flags DmabufFlags) (*Dmabuf, error) {
	if err := d.checkDev(dev); err != nil {
		return nil, err
	}
	if !d.caps.DmabufExport {
		return nil, fmt.Errorf("%w: gpudirect: the CUDA driver (version %d) has no cuMemGetHandleForAddressRange; dma-buf export needs CUDA 11.7 or later", errs.ErrUnimplemented, d.version)
	}
	if !d.infos[dev].DmabufSupported {
		return nil, fmt.Errorf("%w: gpudirect: device %d (%s) reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=0: dma-buf export needs NVIDIA's open kernel modules and Linux 5.12 or later", errs.ErrUnimplemented, dev, d.infos[dev].Name)
	}
	base, length, off, ok := alignRange(ptr, size, d.pageSize)
	if !ok {
		return nil, fmt.Errorf("%w: gpudirect: dma-buf export of [%#x, +%d) on device %d: empty or overflowing range", errs.ErrInvalidArgument, ptr, size, dev)
	}
	ds, err := d.device(dev)
	if err != nil {
		return nil, err
	}
	var (
		fd       C.int
		rc, rc2  C.CUresult
		abase    C.CUdeviceptr
		asize    C.size_t
		fellBack bool
	)
	if err := ds.w.do(func() {
		rc = C.b2b_dmabuf_export(d.tab, C.CUdeviceptr(base), C.size_t(length), C.ulonglong(flags), &fd)
		if Result(rc) != ErrorInvalidValue {
			return
		}
		// Should the driver refuse a sub-range, export the whole
		// allocation: ibv_reg_dmabuf_mr takes an offset into it anyway.
		if rc2 = C.b2b_addr_range(d.tab, C.CUdeviceptr(ptr), &abase, &asize); rc2 != 0 {
			return
		}
		if uint64(abase)%d.pageSize != 0 || uint64(asize)%d.pageSize != 0 || (uintptr(abase) == base && uint64(asize) == length) {
			return
		}
		var fd2 C.int
		if C.b2b_dmabuf_export(d.tab, abase, asize, C.ulonglong(flags), &fd2) == 0 {
			fd, rc, fellBack = fd2, 0, true
		}
	}); err != nil {
		return nil, err
	}
	if rc != 0 {
		return nil, d.callErr(rc, dev, "cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, ptr=%#x, size=%d, flags=%#x) for [%#x, +%d)", base, length, uint64(flags), ptr, size)
	}
	if fellBack {
		base, length, off = uintptr(abase), uint64(asize), uint64(ptr)-uint64(abase)
	}
	return &Dmabuf{FD: int(fd), Base: base, Len: length, Offset: off, closeFD: syscall.Close}, nil
}

// ---- IPC -----------------------------------------------------------------------

func (d *driver) IPCGetMemHandle(dev int, ptr uintptr) (IPCHandle, error) {
	var h IPCHandle
	ds, err := d.device(dev)
	if err != nil {
		return h, err
	}
	var rc C.CUresult
	if err := ds.w.do(func() { rc = C.b2b_ipc_get(d.tab, C.CUdeviceptr(ptr), unsafe.Pointer(&h[0])) }); err != nil {
		return IPCHandle{}, err
	}
	if rc != 0 {
		return IPCHandle{}, d.callErr(rc, dev, "cuIpcGetMemHandle(%#x)", ptr)
	}
	return h, nil
}

func (d *driver) IPCOpenMemHandle(dev int, h IPCHandle) (uintptr, error) {
	if h == (IPCHandle{}) {
		return 0, fmt.Errorf("%w: gpudirect: cuIpcOpenMemHandle_v2 on device %d: IPC handle is all zeros", errs.ErrInvalidArgument, dev)
	}
	ds, err := d.device(dev)
	if err != nil {
		return 0, err
	}
	var p C.CUdeviceptr
	var rc C.CUresult
	if err := ds.w.do(func() {
		if rc = C.b2b_ipc_open(d.tab, unsafe.Pointer(&h[0]), &p); rc == 0 {
			ds.ipcOpen[uintptr(p)]++
		}
	}); err != nil {
		return 0, err
	}
	if rc != 0 {
		return 0, d.callErr(rc, dev, "cuIpcOpenMemHandle_v2(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)")
	}
	return uintptr(p), nil
}

func (d *driver) IPCCloseMemHandle(dev int, ptr uintptr) error {
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	var rc C.CUresult
	known := true
	if err := ds.w.do(func() {
		if _, known = ds.ipcOpen[ptr]; !known {
			return
		}
		rc = C.b2b_ipc_close(d.tab, C.CUdeviceptr(ptr))
		if ds.ipcOpen[ptr]--; ds.ipcOpen[ptr] <= 0 {
			delete(ds.ipcOpen, ptr)
		}
	}); err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("%w: gpudirect: cuIpcCloseMemHandle(%#x) on device %d: not a mapping made by IPCOpenMemHandle", errs.ErrInvalidArgument, ptr, dev)
	}
	if rc != 0 {
		return d.callErr(rc, dev, "cuIpcCloseMemHandle(%#x)", ptr)
	}
	return nil
}

// ---- host memory ---------------------------------------------------------------

func (d *driver) HostAlloc(dev int, size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: gpudirect: cuMemHostAlloc on device %d: size %d", errs.ErrInvalidArgument, dev, size)
	}
	ds, err := d.device(dev)
	if err != nil {
		return nil, err
	}
	var p unsafe.Pointer
	var rc C.CUresult
	if err := ds.w.do(func() {
		if rc = C.b2b_host_alloc(d.tab, C.size_t(size), &p); rc == 0 {
			ds.hostAllocs[uintptr(p)] = uint64(size)
		}
	}); err != nil {
		return nil, err
	}
	if rc != 0 {
		return nil, d.callErr(rc, dev, "cuMemHostAlloc(size=%d, CU_MEMHOSTALLOC_PORTABLE)", size)
	}
	return unsafe.Slice((*byte)(p), size), nil
}

func (d *driver) HostFree(dev int, b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: gpudirect: cuMemFreeHost on device %d: empty slice", errs.ErrInvalidArgument, dev)
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	var rc C.CUresult
	known := true
	if err := ds.w.do(func() {
		if _, known = ds.hostAllocs[p]; !known {
			return
		}
		rc = C.b2b_host_free(d.tab, C.uintptr_t(p))
		delete(ds.hostAllocs, p)
	}); err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("%w: gpudirect: cuMemFreeHost(%#x) on device %d: not memory from HostAlloc", errs.ErrInvalidArgument, p, dev)
	}
	if rc != 0 {
		return d.callErr(rc, dev, "cuMemFreeHost(%#x)", p)
	}
	return nil
}

func (d *driver) HostRegister(dev int, addr uintptr, size uint64) error {
	if size == 0 || addr == 0 {
		return fmt.Errorf("%w: gpudirect: cuMemHostRegister_v2(%#x, %d) on device %d: empty range", errs.ErrInvalidArgument, addr, size, dev)
	}
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	var rc C.CUresult
	dup := false
	if err := ds.w.do(func() {
		if _, dup = ds.hostRegs[addr]; dup {
			return
		}
		if rc = C.b2b_host_register(d.tab, C.uintptr_t(addr), C.size_t(size)); rc == 0 {
			ds.hostRegs[addr] = size
		}
	}); err != nil {
		return err
	}
	if dup {
		return fmt.Errorf("%w: gpudirect: cuMemHostRegister_v2(%#x) on device %d: already registered", errs.ErrAlreadyExists, addr, dev)
	}
	if rc != 0 {
		return d.callErr(rc, dev, "cuMemHostRegister_v2(%#x, size=%d, CU_MEMHOSTREGISTER_PORTABLE)", addr, size)
	}
	return nil
}

func (d *driver) HostUnregister(dev int, addr uintptr) error {
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	var rc C.CUresult
	known := true
	if err := ds.w.do(func() {
		if _, known = ds.hostRegs[addr]; !known {
			return
		}
		rc = C.b2b_host_unregister(d.tab, C.uintptr_t(addr))
		delete(ds.hostRegs, addr)
	}); err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("%w: gpudirect: cuMemHostUnregister(%#x) on device %d: not registered with HostRegister", errs.ErrNotFound, addr, dev)
	}
	if rc != 0 {
		return d.callErr(rc, dev, "cuMemHostUnregister(%#x)", addr)
	}
	return nil
}

// ---- streams and events ----------------------------------------------------------

var (
	errNilStream       = fmt.Errorf("%w: gpudirect: nil stream", errs.ErrInvalidArgument)
	errForeignStream   = fmt.Errorf("%w: gpudirect: stream was created by another Interface", errs.ErrInvalidArgument)
	errStreamDestroyed = fmt.Errorf("%w: gpudirect: stream was destroyed", errs.ErrFailedPrecondition)
	errNilEvent        = fmt.Errorf("%w: gpudirect: nil event", errs.ErrInvalidArgument)
	errForeignEvent    = fmt.Errorf("%w: gpudirect: event was created by another Interface", errs.ErrInvalidArgument)
	errEventDestroyed  = fmt.Errorf("%w: gpudirect: event was destroyed", errs.ErrFailedPrecondition)
)

func (d *driver) streamDev(s *Stream) (*devState, error) {
	if s == nil {
		return nil, errNilStream
	}
	if s.owner != any(d) {
		return nil, errForeignStream
	}
	return d.device(s.dev)
}

func (d *driver) eventDev(e *Event) (*devState, error) {
	if e == nil {
		return nil, errNilEvent
	}
	if e.owner != any(d) {
		return nil, errForeignEvent
	}
	return d.device(e.dev)
}

func (d *driver) StreamCreate(dev int) (*Stream, error) {
	ds, err := d.device(dev)
	if err != nil {
		return nil, err
	}
	var h C.uintptr_t
	var rc C.CUresult
	s := &Stream{dev: dev, owner: d, id: handleIDs.Add(1)}
	if err := ds.w.do(func() {
		if rc = C.b2b_stream_create(d.tab, &h); rc == 0 {
			s.h = uintptr(h)
			ds.streams[s] = struct{}{}
		}
	}); err != nil {
		return nil, err
	}
	if rc != 0 {
		return nil, d.callErr(rc, dev, "cuStreamCreate(CU_STREAM_NON_BLOCKING)")
	}
	return s, nil
}

func (d *driver) StreamDestroy(s *Stream) error {
	ds, err := d.streamDev(s)
	if err != nil {
		return err
	}
	var rc C.CUresult
	if err := ds.w.do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.h == 0 {
			return
		}
		rc = C.b2b_stream_destroy(d.tab, C.uintptr_t(s.h))
		s.h = 0
		delete(ds.streams, s)
	}); err != nil {
		return err
	}
	if rc != 0 {
		return d.callErr(rc, s.dev, "cuStreamDestroy_v2")
	}
	return nil
}

// StreamSynchronize runs on the caller's thread: a stream names its context,
// so no context need be current, and a long wait does not hold up the
// device's other calls. Should a driver still want a current context, the
// call is repeated on the device thread.
func (d *driver) StreamSynchronize(s *Stream) error {
	ds, err := d.streamDev(s)
	if err != nil {
		return err
	}
	s.mu.RLock()
	h := s.h
	var rc C.CUresult
	if h != 0 {
		rc = C.b2b_stream_sync(d.tab, C.uintptr_t(h))
	}
	s.mu.RUnlock()
	if h == 0 {
		return errStreamDestroyed
	}
	if Result(rc) == ErrorInvalidContext {
		d.syncFallbacks.Add(1)
		if err := ds.w.do(func() {
			if s.h == 0 {
				rc = 0
				return
			}
			rc = C.b2b_stream_sync(d.tab, C.uintptr_t(s.h))
		}); err != nil {
			return err
		}
	}
	if rc != 0 {
		return d.callErr(rc, s.dev, "cuStreamSynchronize")
	}
	return nil
}

func (d *driver) EventCreate(dev int) (*Event, error) {
	ds, err := d.device(dev)
	if err != nil {
		return nil, err
	}
	var h C.uintptr_t
	var rc C.CUresult
	e := &Event{dev: dev, owner: d, id: handleIDs.Add(1)}
	if err := ds.w.do(func() {
		if rc = C.b2b_event_create(d.tab, &h); rc == 0 {
			e.h = uintptr(h)
			ds.events[e] = struct{}{}
		}
	}); err != nil {
		return nil, err
	}
	if rc != 0 {
		return nil, d.callErr(rc, dev, "cuEventCreate(CU_EVENT_DISABLE_TIMING)")
	}
	return e, nil
}

func (d *driver) EventDestroy(e *Event) error {
	ds, err := d.eventDev(e)
	if err != nil {
		return err
	}
	var rc C.CUresult
	if err := ds.w.do(func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.h == 0 {
			return
		}
		rc = C.b2b_event_destroy(d.tab, C.uintptr_t(e.h))
		e.h = 0
		delete(ds.events, e)
	}); err != nil {
		return err
	}
	if rc != 0 {
		return d.callErr(rc, e.dev, "cuEventDestroy_v2")
	}
	return nil
}

func eventRecordFn(r *request) {
	e, s := r.obj.(*Event), r.obj2.(*Stream)
	switch {
	case e.h == 0:
		r.err = errEventDestroyed
	case s.h == 0:
		r.err = errStreamDestroyed
	default:
		r.rc = int32(C.b2b_event_record((*C.b2b_tab)(r.p), C.uintptr_t(e.h), C.uintptr_t(s.h)))
	}
}

func (d *driver) EventRecord(e *Event, s *Stream) error {
	ds, err := d.eventDev(e)
	if err != nil {
		return err
	}
	if _, err := d.streamDev(s); err != nil {
		return err
	}
	if s.dev != e.dev {
		return fmt.Errorf("%w: gpudirect: cuEventRecord: event is on device %d, stream on device %d", errs.ErrInvalidArgument, e.dev, s.dev)
	}
	r := getRequest()
	r.fn, r.p, r.obj, r.obj2 = eventRecordFn, unsafe.Pointer(d.tab), e, s
	err = ds.w.submit(r)
	rc, rerr := r.rc, r.err
	putRequest(r)
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return rerr
	case rc != 0:
		return d.callErr(C.CUresult(rc), e.dev, "cuEventRecord")
	}
	return nil
}

func (d *driver) EventQuery(e *Event) (bool, error) {
	ds, err := d.eventDev(e)
	if err != nil {
		return false, err
	}
	e.mu.RLock()
	h := e.h
	var rc C.CUresult
	if h != 0 {
		rc = C.b2b_event_query(d.tab, C.uintptr_t(h))
	}
	e.mu.RUnlock()
	if h == 0 {
		return false, errEventDestroyed
	}
	if Result(rc) == ErrorInvalidContext {
		d.syncFallbacks.Add(1)
		if err := ds.w.do(func() {
			if e.h != 0 {
				rc = C.b2b_event_query(d.tab, C.uintptr_t(e.h))
			}
		}); err != nil {
			return false, err
		}
	}
	switch Result(rc) {
	case Success:
		return true, nil
	case ErrorNotReady:
		return false, nil
	}
	return false, d.callErr(rc, e.dev, "cuEventQuery")
}

func (d *driver) EventSynchronize(e *Event) error {
	ds, err := d.eventDev(e)
	if err != nil {
		return err
	}
	e.mu.RLock()
	h := e.h
	var rc C.CUresult
	if h != 0 {
		rc = C.b2b_event_sync(d.tab, C.uintptr_t(h))
	}
	e.mu.RUnlock()
	if h == 0 {
		return errEventDestroyed
	}
	if Result(rc) == ErrorInvalidContext {
		d.syncFallbacks.Add(1)
		if err := ds.w.do(func() {
			if e.h != 0 {
				rc = C.b2b_event_sync(d.tab, C.uintptr_t(e.h))
			}
		}); err != nil {
			return err
		}
	}
	if rc != 0 {
		return d.callErr(rc, e.dev, "cuEventSynchronize")
	}
	return nil
}

// ---- copies (allocation-free: pooled requests, package-level functions) ----------

func htodFn(r *request) {
	s := r.obj.(*Stream)
	if s.h == 0 {
		r.err = errStreamDestroyed
		return
	}
	r.rc = int32(C.b2b_htod((*C.b2b_tab)(r.p), C.uintptr_t(s.h), C.CUdeviceptr(r.a0), C.uintptr_t(r.a1), C.size_t(r.a2)))
}

func dtohFn(r *request) {
	s := r.obj.(*Stream)
	if s.h == 0 {
		r.err = errStreamDestroyed
		return
	}
	r.rc = int32(C.b2b_dtoh((*C.b2b_tab)(r.p), C.uintptr_t(s.h), C.uintptr_t(r.a0), C.CUdeviceptr(r.a1), C.size_t(r.a2)))
}

func (d *driver) copy1(fn func(*request), call string, s *Stream, dst, src uintptr, size uint64) error {
	ds, err := d.streamDev(s)
	if err != nil {
		return err
	}
	if size == 0 {
		return nil
	}
	r := getRequest()
	r.fn, r.p, r.obj = fn, unsafe.Pointer(d.tab), s
	r.a0, r.a1, r.a2 = uint64(dst), uint64(src), size
	err = ds.w.submit(r)
	rc, rerr := r.rc, r.err
	putRequest(r)
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return rerr
	case rc != 0:
		return d.callErr(C.CUresult(rc), s.dev, "%s(dst=%#x, src=%#x, size=%d)", call, dst, src, size)
	}
	return nil
}

func (d *driver) MemcpyHtoDAsync(s *Stream, dst, src uintptr, size uint64) error {
	return d.copy1(htodFn, "cuMemcpyHtoDAsync_v2", s, dst, src, size)
}

func (d *driver) MemcpyDtoHAsync(s *Stream, dst, src uintptr, size uint64) error {
	return d.copy1(dtohFn, "cuMemcpyDtoHAsync_v2", s, dst, src, size)
}

func batchFn(r *request) {
	s := r.obj.(*Stream)
	if s.h == 0 {
		r.err = errStreamDestroyed
		return
	}
	r.rc = int32(C.b2b_memcpy_batch((*C.b2b_tab)(r.p), C.uintptr_t(s.h),
		(*C.CUdeviceptr)(unsafe.Pointer(unsafe.SliceData(r.s0))),
		(*C.CUdeviceptr)(unsafe.Pointer(unsafe.SliceData(r.s1))),
		(*C.size_t)(unsafe.Pointer(unsafe.SliceData(r.s2))),
		C.size_t(len(r.s2)), C.int(r.a0),
		(*C.int)(unsafe.Pointer(&r.i0)), (*C.size_t)(unsafe.Pointer(&r.out0))))
}

func (d *driver) MemcpyBatchAsync(s *Stream, dsts, srcs, sizes []uint64) error {
	ds, err := d.streamDev(s)
	if err != nil {
		return err
	}
	if err := checkBatch(dsts, srcs, sizes); err != nil {
		return err
	}
	if len(sizes) == 0 {
		return nil
	}
	r := getRequest()
	r.fn, r.p, r.obj = batchFn, unsafe.Pointer(d.tab), s
	r.s0, r.s1, r.s2 = dsts, srcs, sizes
	if d.caps.MemcpyBatch {
		r.a0 = 1
	}
	err = ds.w.submit(r)
	rc, rerr, path, fail := r.rc, r.err, r.i0, r.out0
	putRequest(r)
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return rerr
	case rc != 0:
		call := [...]string{"cuMemcpyAsync", "cuMemcpyBatchAsync", "cuMemcpyBatchAsync_v2"}[min(max(int(path), 0), 2)]
		if fail < uint64(len(sizes)) {
			return d.callErr(C.CUresult(rc), s.dev, "%s(count=%d): copy %d (dst=%#x, src=%#x, size=%d)", call, len(sizes), fail, dsts[fail], srcs[fail], sizes[fail])
		}
		return d.callErr(C.CUresult(rc), s.dev, "%s(count=%d)", call, len(sizes))
	}
	return nil
}
