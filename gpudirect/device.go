//go:build cgo && linux

package gpudirect

/*
#include "cuda_shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/b2bd/b2bd/internal/dl"
)

// The C and Go mirrors of the same constants must agree (a negative array
// length does not compile): the IPC handle size, and the CUresult the shim
// returns for a missing optional entry point.
var (
	_ [IPCHandleSize - C.B2B_IPC_HANDLE_SIZE]struct{}
	_ [C.B2B_IPC_HANDLE_SIZE - IPCHandleSize]struct{}
	_ [ErrorNotSupported - C.B2B_CUDA_ERROR_NOT_SUPPORTED]struct{}
	_ [C.B2B_CUDA_ERROR_NOT_SUPPORTED - ErrorNotSupported]struct{}
)

// noDevice is cuErr's dev for calls not bound to a device (cuInit...).
const noDevice = -1

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

// cuErr is the one place where the shim's return convention (0, -CUresult,
// or B2B_ERRNO(errno)) becomes an error: nil for 0, else "gpudirect: <call>
// on device N: <CUDA name>: <CUDA description>" wrapping *Error (and its
// class), or the errno. call may be a format for args; dev is noDevice for
// calls not bound to a device.
func cuErr(l *libcuda, dev int, rc C.int, call string, args ...any) error {
	if rc == 0 {
		return nil
	}
	if len(args) > 0 {
		call = fmt.Sprintf(call, args...)
	}
	where := ""
	if dev != noDevice {
		where = fmt.Sprintf(" on device %d", dev)
	}
	if -rc >= C.B2B_ERRNO_BASE {
		errno := syscall.Errno(-rc - C.B2B_ERRNO_BASE)
		class := ErrUnavailable
		if errno == syscall.ENOMEM {
			class = ErrOutOfMemory
		}
		return fmt.Errorf("gpudirect: %s%s: %w (%w)", call, where, errno, class)
	}
	e := &Error{Result: Result(-rc)}
	var name, desc *C.char
	C.b2b_error_text(l.tab, rc, &name, &desc)
	if name != nil {
		e.Name = C.GoString(name)
	}
	if desc != nil {
		e.Desc = C.GoString(desc)
	}
	return fmt.Errorf("gpudirect: %s%s: %w", call, where, e)
}

// resultCode and errnoCode encode as the shim does: -CUresult, and
// B2B_ERRNO(e).
func resultCode(r Result) C.int       { return C.int(-r) }
func errnoCode(e syscall.Errno) C.int { return -(C.B2B_ERRNO_BASE + C.int(e)) }

// is reports whether the shim's code rc is the CUresult r.
func is(rc C.int, r Result) bool { return rc == resultCode(r) }

// unavailable wraps a reason why there is no usable driver.
func unavailable(err error) error {
	return fmt.Errorf("%v; GPU memory is disabled, host memory is still served: %w", err, ErrNoDriver)
}

func openLibcuda(name string) (*libcuda, error) {
	libMu.Lock()
	defer libMu.Unlock()
	l, ok := libs[name]
	if !ok {
		lib, err := dl.Open(name)
		if err != nil {
			return nil, unavailable(fmt.Errorf("gpudirect: CUDA driver library not loadable: %v", err))
		}
		l = &libcuda{name: name, lib: lib}
		if err := cuErr(l, noDevice, C.b2b_tab_new(&l.tab), "the CUDA entry-point table"); err != nil {
			lib.Close()
			return nil, unavailable(err)
		}
		for i := 0; i < int(C.b2b_nsyms()); i++ {
			sym := C.GoString(C.b2b_sym_name(C.int(i)))
			p, err := lib.Sym(sym)
			if err != nil {
				if C.b2b_sym_optional(C.int(i)) != 0 {
					continue
				}
				C.b2b_tab_free(l.tab)
				lib.Close()
				return nil, unavailable(fmt.Errorf("gpudirect: %s lacks %s (driver too old?): %v", name, sym, err))
			}
			C.b2b_set(l.tab, C.int(i), p)
		}
		libs[name] = l
	}
	if !l.initialized {
		if err := cuErr(l, noDevice, C.b2b_init(l.tab), "cuInit(0) via %s", name); err != nil {
			return nil, unavailable(err)
		}
		l.initialized = true
	}
	return l, nil
}

// Load opens the CUDA driver, initialises it and returns the real
// implementation of Interface. Without a usable driver (library missing,
// cuInit failing, no device) the error wraps ErrNoDriver: the daemon then
// serves host memory only.
func Load(opts ...Option) (Interface, error) {
	o := buildOptions(opts)
	l, err := openLibcuda(o.library)
	if err != nil {
		return nil, err
	}
	d := &driver{l: l, tab: l.tab, opts: o, pageSize: uint64(os.Getpagesize())}
	var v C.int
	if err := cuErr(l, noDevice, C.b2b_driver_version(d.tab, &v), "cuDriverGetVersion"); err != nil {
		return nil, unavailable(err)
	}
	d.version = int(v)
	var n C.int
	if err := cuErr(l, noDevice, C.b2b_device_count(d.tab, &n), "cuDeviceGetCount"); err != nil {
		return nil, unavailable(err)
	}
	if n <= 0 {
		return nil, unavailable(fmt.Errorf("gpudirect: the CUDA driver (version %d) sees no devices", d.version))
	}
	d.count = int(n)
	d.infos = make([]DeviceInfo, d.count)
	for i := range d.infos {
		if d.infos[i], err = d.queryInfo(i); err != nil {
			return nil, fmt.Errorf("%w (%w)", err, ErrNoDriver)
		}
	}
	d.devs = make([]atomic.Pointer[devState], d.count)
	d.caps.DmabufExport = C.b2b_has(d.tab, C.B2B_SYM_cuMemGetHandleForAddressRange) != 0
	d.caps.PeerAccess = C.b2b_has(d.tab, C.B2B_SYM_cuDeviceCanAccessPeer) != 0 && C.b2b_has(d.tab, C.B2B_SYM_cuCtxEnablePeerAccess) != 0
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

	mu     sync.Mutex // guards starting workers and setting closed
	closed atomic.Bool
	devs   []atomic.Pointer[devState]

	stats batchStats

	// syncFallbacks counts synchronisations that had to be re-run on the
	// device thread because the driver wanted a current context.
	syncFallbacks atomic.Uint64
}

// devState is one device's worker and the resources made through it. The
// maps are touched only on the worker's thread.
type devState struct {
	ord int
	w   *worker
	// par are more threads with the device's context current, for the
	// parts of MemcpyBatchAsyncParts beside w (copy.go says why).
	par        []*worker
	allocs     map[uintptr]uint64
	hostAllocs map[uintptr]uint64
	hostRegs   map[uintptr]uint64
	ipcOpen    map[uintptr]int // CUDA returns the same pointer (refcounted) when a handle is opened again
	handles    map[*handle]*handleKind
	peers      map[int]bool // devices this context reaches directly (EnablePeerAccess)

	// The copy-engine primer's scratch (0: none, primerErr says why):
	// host-to-device batches queue their chunks behind it (cuda_shim.h).
	primerDev, primerHost uint64
	primerErr             error

	// The hold flag of host-to-device batches in parts (0: none, holdErr
	// says why; cuda_shim.h). holdMu is held from a batch's first part
	// queued to its release, so that one batch's release never lets
	// another's streams go early; holdSeq is the last value used.
	holdHost uintptr
	holdDev  uint64
	holdErr  error
	holdMu   sync.Mutex
	holdSeq  uint32
}

// callErr is cuErr for this driver's calls on dev.
func (d *driver) callErr(rc C.int, dev int, call string, args ...any) error {
	return cuErr(d.l, dev, rc, call, args...)
}

// live returns ErrClosed once Close has begun. Every method checks it
// first, so that no call reaches the driver, nor returns success, after Close.
func (d *driver) live() error {
	if d.closed.Load() {
		return ErrClosed
	}
	return nil
}

func (d *driver) checkDev(dev int) error {
	if err := d.live(); err != nil {
		return err
	}
	if dev < 0 || dev >= d.count {
		return fmt.Errorf("%w: gpudirect: CUDA device %d does not exist (this host has %d)", ErrInvalidValue, dev, d.count)
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
	if d.closed.Load() {
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
		handles:    map[*handle]*handleKind{},
		peers:      map[int]bool{},
	}
	open := func() error {
		var step C.int
		rc := C.b2b_ctx_open(d.tab, C.int(dev), &step)
		calls := [...]string{
			C.B2B_CTX_STEP_DEVICE_GET:  "cuDeviceGet",
			C.B2B_CTX_STEP_RETAIN:      "cuDevicePrimaryCtxRetain",
			C.B2B_CTX_STEP_SET_CURRENT: "cuCtxSetCurrent",
		}
		if err := d.callErr(rc, dev, calls[min(int(step), len(calls)-1)]); err != nil {
			return err
		}
		// Without its scratch, host-to-device batches go unprimed (one call).
		var pd C.CUdeviceptr
		var ph C.uintptr_t
		ds.primerErr = d.callErr(C.b2b_primer_alloc(d.tab, &pd, &ph), dev, "the copy-engine primer's scratch (%d bytes)", C.B2B_PRIMER_BYTES)
		ds.primerDev, ds.primerHost = uint64(pd), uint64(ph)
		// Without it, host-to-device batches in parts go in one part.
		var hh C.uintptr_t
		var hd C.CUdeviceptr
		ds.holdErr = d.callErr(C.b2b_hold_alloc(d.tab, &hh, &hd), dev, "the hold flag of host-to-device parts (cuStreamWaitValue32_v2 on device-mapped host memory)")
		ds.holdHost, ds.holdDev = uintptr(hh), uint64(hd)
		return nil
	}
	w, err := startWorker(fmt.Sprintf("device %d", dev), open, func() error { return d.releaseAll(ds) })
	if err != nil {
		return nil, err
	}
	ds.w = w
	for i := 1; i < ParallelParts; i++ {
		pw, err := startWorker(fmt.Sprintf("device %d, thread %d", dev, i), func() error {
			var step C.int
			return d.callErr(C.b2b_ctx_open(d.tab, C.int(dev), &step), dev, "cuDevicePrimaryCtxRetain (a copy thread)")
		}, func() error {
			return d.callErr(C.b2b_ctx_close(d.tab, C.int(dev)), dev, "cuDevicePrimaryCtxRelease_v2 (a copy thread)")
		})
		if err != nil {
			break // the parts go on the threads there are
		}
		ds.par = append(ds.par, pw)
	}
	d.devs[dev].Store(ds)
	return ds, nil
}

func (d *driver) EnablePeerAccess(dev, peer int) error {
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	if dev == peer {
		return nil
	}
	// The peer's worker holds its primary context, which the access needs.
	if _, err := d.device(peer); err != nil {
		return err
	}
	if !d.caps.PeerAccess {
		return fmt.Errorf("%w: gpudirect: this driver lacks cuDeviceCanAccessPeer or cuCtxEnablePeerAccess, so device %d cannot reach device %d's memory directly", ErrNotSupported, dev, peer)
	}
	var rc, can C.int
	if err := ds.w.do(func() {
		if ds.peers[peer] {
			can = 1
			return
		}
		if rc = C.b2b_peer_enable(d.tab, C.int(dev), C.int(peer), &can); rc == 0 && can != 0 {
			ds.peers[peer] = true
		}
	}); err != nil {
		return err
	}
	if err := d.callErr(rc, dev, "cuCtxEnablePeerAccess(the primary context of device %d)", peer); err != nil {
		return err
	}
	if can == 0 {
		return fmt.Errorf("%w: gpudirect: device %d cannot reach device %d's memory directly (cuDeviceCanAccessPeer says 0)", ErrNotSupported, dev, peer)
	}
	return nil
}

// releaseAll runs on ds's worker thread when the driver closes.
func (d *driver) releaseAll(ds *devState) error {
	var all []error
	note := func(rc C.int, call string, args ...any) {
		if err := d.callErr(rc, ds.ord, call, args...); err != nil {
			all = append(all, err)
		}
	}
	// Events before streams, as they were recorded on them.
	for _, k := range []*handleKind{&eventKind, &streamKind} {
		for h, hk := range ds.handles {
			if hk == k {
				note(d.destroyLocked(ds, h, k), k.destroy)
			}
		}
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
	note(C.b2b_primer_free(d.tab, C.CUdeviceptr(ds.primerDev), C.uintptr_t(ds.primerHost)), "freeing the copy-engine primer's scratch")
	ds.primerDev, ds.primerHost = 0, 0
	note(C.b2b_hold_free(d.tab, C.uintptr_t(ds.holdHost)), "freeing the hold flag of host-to-device parts")
	ds.holdHost, ds.holdDev = 0, 0
	clear(ds.handles)
	clear(ds.ipcOpen)
	clear(ds.peers)
	clear(ds.hostRegs)
	clear(ds.hostAllocs)
	clear(ds.allocs)
	note(C.b2b_ctx_close(d.tab, C.int(ds.ord)), "cuDevicePrimaryCtxRelease_v2")
	return errors.Join(all...)
}

// Close releases everything; safe twice (the second call does nothing).
func (d *driver) Close() error {
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		return nil
	}
	d.closed.Store(true)
	d.mu.Unlock()
	var all []error
	for i := range d.devs {
		if ds := d.devs[i].Load(); ds != nil {
			// The copy threads' retains go before the owner's release.
			for _, pw := range ds.par {
				if err := pw.stop(); err != nil {
					all = append(all, err)
				}
			}
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

func (d *driver) DeviceNotes(dev int) []string {
	if dev < 0 || dev >= d.count {
		return nil
	}
	ds := d.devs[dev].Load()
	if ds == nil {
		return nil
	}
	var out []string
	if ds.primerErr != nil {
		out = append(out, fmt.Sprintf("host-to-device batches unprimed, and some of their copies may run on SMs: %v", ds.primerErr))
	}
	if ds.holdErr != nil && ds.primerErr == nil {
		out = append(out, fmt.Sprintf("host-to-device batches queued by one thread, not in parts: %v", ds.holdErr))
	}
	return out
}

func (d *driver) DeviceInfo(dev int) (DeviceInfo, error) {
	if err := d.checkDev(dev); err != nil {
		return DeviceInfo{}, err
	}
	return d.infos[dev], nil
}

// nameLen and busIDLen size the buffers for cuDeviceGetName (names are
// short; 256 is what nvidia-smi uses) and cuDeviceGetPCIBusId (13 bytes
// plus NUL as "0000:3b:00.0", 64 leaves room for NVML's 8-digit domains).
const (
	nameLen  = 256
	busIDLen = 64
)

func (d *driver) queryInfo(ord int) (DeviceInfo, error) {
	var (
		cudev C.CUdevice
		name  [nameLen]C.char
		bus   [busIDLen]C.char
		total C.size_t
		step  C.int
	)
	if rc := C.b2b_device_info(d.tab, C.int(ord), &cudev, &name[0], C.int(len(name)), &bus[0], C.int(len(bus)), &total, &step); rc != 0 {
		calls := [...]string{
			C.B2B_STEP_DEVICE_GET:  "cuDeviceGet",
			C.B2B_STEP_DEVICE_NAME: "cuDeviceGetName",
			C.B2B_STEP_PCI_BUS_ID:  "cuDeviceGetPCIBusId",
			C.B2B_STEP_TOTAL_MEM:   "cuDeviceTotalMem_v2",
		}
		return DeviceInfo{}, d.callErr(rc, ord, calls[min(int(step), len(calls)-1)])
	}
	info := DeviceInfo{
		Ordinal:  ord,
		Name:     C.GoString(&name[0]),
		PCIBusID: NormalizePCIBusID(C.GoString(&bus[0])),
		TotalMem: uint64(total),
	}
	attr := func(a C.int, what string) (int, error) {
		var v C.int
		rc := C.b2b_device_attr(d.tab, cudev, a, &v)
		if is(rc, ErrorInvalidValue) {
			return 0, nil // an attribute this driver predates
		}
		return int(v), d.callErr(rc, ord, "cuDeviceGetAttribute(%s)", what)
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
