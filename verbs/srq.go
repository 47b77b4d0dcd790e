//go:build cgo && linux

package verbs

/*
#cgo noescape b2bv_srq_post
#cgo nocallback b2bv_srq_post
#include "b2bv.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// SRQ is a shared receive queue.
type SRQ struct {
	s      *C.struct_ibv_srq
	parent *PD
	maxWR  int
	kids   children
}

// NewSRQ creates an SRQ of maxWR receives with maxSGE SGEs each.
func (pd *PD) NewSRQ(maxWR, maxSGE int) (*SRQ, error) {
	p := pd.pd()
	if p == nil {
		return nil, errClosed("ibv_create_srq: PD")
	}
	var s *C.struct_ibv_srq
	if rc := C.b2bv_create_srq(p, C.uint32_t(maxWR), C.uint32_t(maxSGE), &s); rc != 0 {
		return nil, callErr(rc, 0, fmt.Sprintf("ibv_create_srq(max_wr=%d, max_sge=%d)", maxWR, maxSGE), "", nil)
	}
	pd.kids.n.Add(1)
	return &SRQ{s: s, parent: pd, maxWR: maxWR}, nil
}

func (s *SRQ) srq() *C.struct_ibv_srq {
	if s == nil {
		return nil
	}
	return s.s
}

// PostRecv posts one receive per idx entry: buffer x is
// [base + x*bufLen, +bufLen) under lkey and its wr_id is x. idx must not
// be Go-pointer-bearing (a []uint32 is fine); an empty idx posts nothing.
func (s *SRQ) PostRecv(idx []uint32, base uint64, bufLen, lkey uint32) error {
	q := s.srq()
	if q == nil {
		return errClosed("ibv_post_srq_recv: SRQ")
	}
	if len(idx) == 0 {
		return nil
	}
	var raw C.int
	if rc := C.b2bv_srq_post(q, (*C.uint32_t)(unsafe.Pointer(&idx[0])), C.int(len(idx)), C.uint64_t(base), C.uint32_t(bufLen), C.uint32_t(lkey), &raw); rc != 0 {
		return callErr(rc, raw, fmt.Sprintf("ibv_post_srq_recv(%d receives)", len(idx)), "", nil)
	}
	return nil
}

// Close destroys the SRQ; its QPs must be closed first. Closing a closed or
// nil SRQ does nothing.
func (s *SRQ) Close() error {
	q := s.srq()
	if q == nil {
		return nil
	}
	if err := s.kids.busy("SRQ"); err != nil {
		return err
	}
	if rc := C.b2bv_destroy_srq(q); rc != 0 {
		return callErr(rc, 0, "ibv_destroy_srq", "", nil)
	}
	s.s = nil
	s.parent.kids.n.Add(-1)
	return nil
}
