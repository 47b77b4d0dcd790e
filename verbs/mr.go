//go:build cgo && linux

package verbs

/*
#include "b2bv.h"
*/
import "C"

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// PD is a protection domain.
type PD struct {
	p      *C.struct_ibv_pd
	parent *Context
	kids   children
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	cc := c.ctx()
	if cc == nil {
		return nil, errClosed("ibv_alloc_pd: context")
	}
	var p *C.struct_ibv_pd
	if rc := C.b2bv_alloc_pd(cc, &p); rc != 0 {
		return nil, callErr(rc, 0, fmt.Sprintf("ibv_alloc_pd(%s)", c.name), "", nil)
	}
	c.kids.n.Add(1)
	return &PD{p: p, parent: c}, nil
}

func (pd *PD) pd() *C.struct_ibv_pd {
	if pd == nil {
		return nil
	}
	return pd.p
}

// Close deallocates the PD; its MRs, SRQs and QPs must be closed first.
// Closing a closed or nil PD does nothing.
func (pd *PD) Close() error {
	p := pd.pd()
	if p == nil {
		return nil
	}
	if err := pd.kids.busy("PD"); err != nil {
		return err
	}
	if rc := C.b2bv_dealloc_pd(p); rc != 0 {
		return callErr(rc, 0, "ibv_dealloc_pd", "", nil)
	}
	pd.p = nil
	pd.parent.kids.n.Add(-1)
	return nil
}

// MR is a registered memory region.
type MR struct {
	m      *C.struct_ibv_mr
	parent *PD
	addr   uint64 // the address WRs use: VA for reg_mr, iova for dma-buf
	length uint64
	lkey   uint32
	rkey   uint32
}

// RegMR registers [addr, addr+n) of host (or peer-mapped GPU) memory. The
// memory must not be Go heap memory. EPERM/ENOMEM map to
// ErrResourceExhausted with a hint about the locked-memory limit.
func (pd *PD) RegMR(addr uintptr, n uint64, access Access) (*MR, error) {
	p := pd.pd()
	if p == nil {
		return nil, errClosed("ibv_reg_mr: PD")
	}
	what := fmt.Sprintf("ibv_reg_mr(addr=%#x, len=%d)", addr, n)
	if addr == 0 || n == 0 {
		return nil, fmt.Errorf("verbs: %s: empty range: %w", what, ErrInvalidArgument)
	}
	var m *C.struct_ibv_mr
	if rc := C.b2bv_reg_mr(p, C.uintptr_t(addr), C.size_t(n), C.int(access), &m); rc != 0 {
		return nil, regErr(what, rc)
	}
	pd.kids.n.Add(1)
	return &MR{m: m, parent: pd, addr: uint64(addr), length: n, lkey: uint32(m.lkey), rkey: uint32(m.rkey)}, nil
}

// RegDmabufMR registers n bytes at offset of a dma-buf (GPU memory exported
// by the CUDA driver); WRs address it by iova.
func (pd *PD) RegDmabufMR(fd int, offset, n, iova uint64, access Access) (*MR, error) {
	p := pd.pd()
	if p == nil {
		return nil, errClosed("ibv_reg_dmabuf_mr: PD")
	}
	if C.b2bv_have_dmabuf() == 0 {
		return nil, fmt.Errorf("verbs: ibv_reg_dmabuf_mr: this libibverbs lacks it (rdma-core >= 34 needed; alternatively nvidia-peermem lets ibv_reg_mr take GPU pointers): %w", ErrUnavailable)
	}
	if fd < 0 || n == 0 {
		return nil, fmt.Errorf("verbs: ibv_reg_dmabuf_mr(fd=%d, len=%d): %w", fd, n, ErrInvalidArgument)
	}
	what := fmt.Sprintf("ibv_reg_dmabuf_mr(fd=%d, offset=%d, len=%d)", fd, offset, n)
	var m *C.struct_ibv_mr
	if rc := C.b2bv_reg_dmabuf_mr(p, C.uint64_t(offset), C.size_t(n), C.uint64_t(iova), C.int(fd), C.int(access), &m); rc != 0 {
		if en := syscall.Errno(-rc); en == syscall.EOPNOTSUPP || en == syscall.ENOSYS || en == syscall.EPROTONOSUPPORT {
			return nil, callErr(rc, 0, what, ": the device/driver has no dma-buf support (needs a NIC such as ConnectX with a kernel >= 5.12 and the GPU driver's dma-buf export; nvidia-peermem is the other route)", ErrUnavailable)
		}
		return nil, regErr(what, rc)
	}
	pd.kids.n.Add(1)
	return &MR{m: m, parent: pd, addr: iova, length: n, lkey: uint32(m.lkey), rkey: uint32(m.rkey)}, nil
}

// regErr classifies a registration failure.
func regErr(what string, rc C.int) error {
	switch syscall.Errno(-rc) {
	case syscall.EPERM, syscall.ENOMEM, syscall.EAGAIN:
		var lim unix.Rlimit
		cur := "unknown"
		if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil {
			if lim.Cur == unix.RLIM_INFINITY {
				cur = "unlimited"
			} else {
				cur = fmt.Sprintf("%d KiB", lim.Cur/1024)
			}
		}
		return callErr(rc, 0, what, fmt.Sprintf(": cannot pin memory (locked-memory limit is %s; raise it with `ulimit -l unlimited`, LimitMEMLOCK=infinity in the systemd unit, or --ulimit memlock=-1 for containers)", cur), ErrResourceExhausted)
	case syscall.EFAULT:
		return callErr(rc, 0, what, ": the range is not mapped memory the kernel can pin (GPU memory needs dma-buf or nvidia-peermem)", ErrInvalidArgument)
	}
	return callErr(rc, 0, what, "", nil)
}

// Addr is the address WRs use for offset 0 of the region (it stays readable
// after Close; 0 for a nil MR).
func (m *MR) Addr() uint64 {
	if m == nil {
		return 0
	}
	return m.addr
}

// Len is the registered length.
func (m *MR) Len() uint64 {
	if m == nil {
		return 0
	}
	return m.length
}

// LKey is the local key.
func (m *MR) LKey() uint32 {
	if m == nil {
		return 0
	}
	return m.lkey
}

// RKey is the remote key.
func (m *MR) RKey() uint32 {
	if m == nil {
		return 0
	}
	return m.rkey
}

// Close deregisters the region. Closing a closed or nil MR does nothing.
func (m *MR) Close() error {
	if m == nil || m.m == nil {
		return nil
	}
	if rc := C.b2bv_dereg_mr(m.m); rc != 0 {
		return callErr(rc, 0, fmt.Sprintf("ibv_dereg_mr(len=%d)", m.length), "", nil)
	}
	m.m = nil
	m.parent.kids.n.Add(-1)
	return nil
}
