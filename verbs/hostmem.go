//go:build cgo && linux

package verbs

/*
#include "b2bv.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// HostMem is C-allocated, page-aligned memory (never the Go heap), for
// control buffers and tests.
type HostMem struct {
	p unsafe.Pointer
	n int
}

// AllocHost allocates n zeroed bytes.
func AllocHost(n int) (*HostMem, error) {
	if n <= 0 {
		return nil, fmt.Errorf("verbs: alloc %d bytes: %w", n, ErrInvalidArgument)
	}
	var p unsafe.Pointer
	if rc := C.b2bv_alloc(C.size_t(n), &p); rc != 0 {
		return nil, callErr(rc, 0, fmt.Sprintf("alloc %d bytes", n), "", nil)
	}
	return &HostMem{p: p, n: n}, nil
}

// Addr is the base address (0 once freed).
func (h *HostMem) Addr() uintptr {
	if h == nil {
		return 0
	}
	return uintptr(h.p)
}

// Bytes views the memory (nil once freed).
func (h *HostMem) Bytes() []byte {
	if h == nil || h.p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(h.p), h.n)
}

// Free releases it; safe twice and on nil.
func (h *HostMem) Free() {
	if h != nil && h.p != nil {
		C.b2bv_free(h.p)
		h.p = nil
	}
}
