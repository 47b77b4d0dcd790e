//go:build cgo && linux

package gpudirect

/*
#include "cuda_shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// untrack runs release on the device's thread if key is one of the
// allocations or registrations in m, then forgets it; known is false (and
// nothing is released) for a key m does not hold, so a caller's double free
// or stray pointer never reaches the driver.
func (ds *devState) untrack(m map[uintptr]uint64, key uintptr, release func() C.int) (rc C.int, known bool, err error) {
	err = ds.w.do(func() {
		if _, known = m[key]; known {
			rc = release()
			delete(m, key)
		}
	})
	return rc, known, err
}

// Pinned host memory: allocated by the driver (HostAlloc, the staging
// buffers) or registered (HostRegister, e.g. an mmap'd region), so that the
// copy engines reach it without a bounce.

func (d *driver) HostAlloc(dev int, size int) ([]byte, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("%w: gpudirect: cuMemHostAlloc on device %d: size %d", ErrInvalidValue, dev, size)
	}
	ds, err := d.device(dev)
	if err != nil {
		return nil, err
	}
	var p unsafe.Pointer
	var rc C.int
	if err := ds.w.do(func() {
		if rc = C.b2b_host_alloc(d.tab, C.size_t(size), &p); rc == 0 {
			ds.hostAllocs[uintptr(p)] = uint64(size)
		}
	}); err != nil {
		return nil, err
	}
	if err := d.callErr(rc, dev, "cuMemHostAlloc(size=%d, CU_MEMHOSTALLOC_PORTABLE)", size); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), size), nil
}

func (d *driver) HostFree(dev int, b []byte) error {
	if err := d.live(); err != nil {
		return err
	}
	if len(b) == 0 {
		return fmt.Errorf("%w: gpudirect: cuMemFreeHost on device %d: empty slice", ErrInvalidValue, dev)
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	rc, known, err := ds.untrack(ds.hostAllocs, p, func() C.int { return C.b2b_host_free(d.tab, C.uintptr_t(p)) })
	if err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("%w: gpudirect: cuMemFreeHost(%#x) on device %d: not memory from HostAlloc", ErrInvalidValue, p, dev)
	}
	return d.callErr(rc, dev, "cuMemFreeHost(%#x)", p)
}

func (d *driver) HostRegister(dev int, addr uintptr, size uint64) error {
	if err := d.live(); err != nil {
		return err
	}
	if size == 0 || addr == 0 {
		return fmt.Errorf("%w: gpudirect: cuMemHostRegister_v2(%#x, %d) on device %d: empty range", ErrInvalidValue, addr, size, dev)
	}
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	var rc C.int
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
		return fmt.Errorf("%w: gpudirect: cuMemHostRegister_v2(%#x) on device %d: already registered", ErrAlreadyExists, addr, dev)
	}
	return d.callErr(rc, dev, "cuMemHostRegister_v2(%#x, size=%d, CU_MEMHOSTREGISTER_PORTABLE)", addr, size)
}

func (d *driver) HostUnregister(dev int, addr uintptr) error {
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	rc, known, err := ds.untrack(ds.hostRegs, addr, func() C.int { return C.b2b_host_unregister(d.tab, C.uintptr_t(addr)) })
	if err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("%w: gpudirect: cuMemHostUnregister(%#x) on device %d: not registered with HostRegister", ErrNotFound, addr, dev)
	}
	return d.callErr(rc, dev, "cuMemHostUnregister(%#x)", addr)
}
