//go:build cgo && linux

package verbs

// TEMPORARY: Go entry points to the pre-merge planners of legacy.c, for the
// differential test in legacy_test.go only. Deleted in the next commit.

/*
#include "b2bv.h"
#include <errno.h>
int b2bv_plan_legacy(struct b2bv_chain *ch, const uint64_t *src, const uint64_t *dst,
		     const uint64_t *len, uint32_t n, int commit);
int b2bv_pplan_build_legacy(const struct b2bv_plan *r, const uint64_t *src, const uint64_t *dst,
			    const uint64_t *len, uint32_t n, const uint64_t *cuts, uint32_t nq,
			    struct b2bv_pplan **out, uint32_t *bad_block);
*/
import "C"

import (
	"fmt"
	"unsafe"
)

func (ch *Chain) planLegacy(src, dst, lens []uint64) (ChainResult, error) {
	c := ch.chain()
	if c == nil {
		return ChainResult{}, errClosed("plan: chain")
	}
	s, d, l, n, err := arrays(src, dst, lens)
	if err != nil {
		return ChainResult{}, err
	}
	if rc := C.b2bv_plan_legacy(c, s, d, l, n, 1); rc != 0 {
		return ChainResult{}, ch.planErr(rc, 0)
	}
	return ch.result(), nil
}

func newPlanLegacy(p *ChainParams, src, dst, lens []uint64, cuts []Pos) (*Plan, error) {
	s, d, l, n, err := arrays(src, dst, lens)
	if err != nil {
		return nil, err
	}
	nq := len(cuts) - 1
	cut := make([]uint64, 2*len(cuts))
	for k, c := range cuts {
		cut[2*k], cut[2*k+1] = uint64(c.I), c.Off
	}
	var r C.struct_b2bv_plan
	r.src_base = C.uint64_t(p.SrcBase)
	r.dst_base = C.uint64_t(p.DstBase)
	r.src_limit = C.uint64_t(p.SrcLimit)
	r.dst_limit = C.uint64_t(p.DstLimit)
	r.max_wr_bytes = C.uint64_t(p.MaxWRBytes)
	r.lkey = C.uint32_t(p.LKey)
	r.rkey = C.uint32_t(p.RKey)
	r.max_sge = C.uint32_t(p.MaxSGE)
	r.signal_every = C.uint32_t(clampInt(p.SignalEvery, 1, 1<<30))
	r.inline_max = C.uint32_t(clampInt(p.InlineMax, 0, 1<<30))
	var cp *C.uint64_t
	if len(cut) > 0 {
		cp = (*C.uint64_t)(unsafe.Pointer(&cut[0]))
	}
	var out *C.struct_b2bv_pplan
	var bad C.uint32_t
	if rc := C.b2bv_pplan_build_legacy(&r, s, d, l, n, cp, C.uint32_t(nq), &out, &bad); rc != 0 {
		if rc == -C.ERANGE {
			return nil, fmt.Errorf("legacy plan: block %d outside: %w", uint32(bad), ErrInvalidArgument)
		}
		return nil, fmt.Errorf("legacy plan: rc %d: %w", int(rc), ErrInvalidArgument)
	}
	pl := &Plan{p: out}
	if nq > 0 {
		pl.shares = unsafe.Slice(out.shares, nq)
	}
	return pl, nil
}
