//go:build cgo && linux

package verbs

/*
#cgo noescape b2bv_pplan_build
#cgo nocallback b2bv_pplan_build
#cgo noescape b2bv_pplan_post
#cgo nocallback b2bv_pplan_post
#cgo nocallback b2bv_pplan_restamp
#include "b2bv.h"
*/
import "C"

import (
	"fmt"
	"syscall"
	"unsafe"
)

// Plan is a batch planned once for several QPs (a prepared transfer): each
// share's WRs and SGEs live in C memory, chained and ready to post. Posting
// patches only the wr_id sequence numbers, the signaled flag of each
// sub-range's last WR (restored afterwards) and the share's immediate.
//
// A Plan is not safe for concurrent use, except that different shares may
// be posted (PostPlan, Patch) from different goroutines at once.
type Plan struct {
	p      *C.struct_b2bv_pplan
	shares []C.struct_b2bv_pshare
}

// MaxPlanShares is the most shares (QPs) a Plan may have.
const MaxPlanShares = C.B2BV_PPLAN_MAX_SHARES

// NewPlan plans blocks src/dst/lens, cut into len(cuts)-1 shares at cuts
// (from Pos{} to Pos{I: len(src)}), with p's op, regions, keys, SGE and WR
// limits, SignalEvery and InlineMax (MaxWR and MaxChainBytes apply at post
// time instead, see PostPlan). It is the same planner as Chain's: each
// share's WRs are those one unbounded chain over the share would carry.
// One cgo call; it needs no device.
func NewPlan(p *ChainParams, src, dst, lens []uint64, cuts []Pos) (*Plan, error) {
	s, d, l, n, err := arrays(src, dst, lens)
	if err != nil {
		return nil, err
	}
	nq := len(cuts) - 1
	if nq < 0 || nq > MaxPlanShares {
		return nil, fmt.Errorf("verbs: plan of %d shares (max %d): %w", nq, MaxPlanShares, ErrInvalidArgument)
	}
	if p.Op != WRWrite && p.Op != WRRead {
		return nil, fmt.Errorf("verbs: plan with op %d (want WRWrite %d or WRRead %d): %w", p.Op, WRWrite, WRRead, ErrInvalidArgument)
	}
	if p.MaxSGE < 1 || p.MaxSGE > 1<<10 {
		return nil, fmt.Errorf("verbs: plan with MaxSGE %d (want 1..1024): %w", p.MaxSGE, ErrInvalidArgument)
	}
	cut := make([]uint64, 2*len(cuts))
	for k, c := range cuts {
		cut[2*k], cut[2*k+1] = uint64(c.I), c.Off
	}
	var r C.struct_b2bv_plan
	setReq(&r, p, 0, 1<<10)
	var cp *C.uint64_t
	if len(cut) > 0 {
		cp = (*C.uint64_t)(unsafe.Pointer(&cut[0]))
	}
	var out *C.struct_b2bv_pplan
	var bad C.uint32_t
	if rc := C.b2bv_pplan_build(&r, s, d, l, n, cp, C.uint32_t(nq), &out, &bad); rc != 0 {
		switch syscall.Errno(-rc) {
		case syscall.ERANGE:
			return nil, fmt.Errorf("verbs: plan: block %d lies outside the source (%d bytes) or destination (%d bytes) region: %w",
				uint32(bad), p.SrcLimit, p.DstLimit, ErrInvalidArgument)
		case syscall.EINVAL:
			return nil, fmt.Errorf("verbs: plan: cuts %v of %d blocks invalid (must run from the start to the end, in order): %w", cuts, len(src), ErrInvalidArgument)
		}
		return nil, callErr(rc, 0, "plan builder", "", ErrInvalidArgument)
	}
	pl := &Plan{p: out}
	if nq > 0 {
		pl.shares = unsafe.Slice(out.shares, nq)
	}
	return pl, nil
}

// Shares is the number of shares (0 once closed).
func (pl *Plan) Shares() int {
	if pl == nil || pl.p == nil {
		return 0
	}
	return len(pl.shares)
}

// Totals are the plan's WRs, SGEs and payload bytes over all shares.
func (pl *Plan) Totals() (wrs, sges int, bytes uint64) {
	if pl == nil || pl.p == nil {
		return 0, 0, 0
	}
	return int(pl.p.n_wr), int(pl.p.n_sge), uint64(pl.p.bytes)
}

// ShareSize is share k's WRs, SGEs and payload bytes.
func (pl *Plan) ShareSize(k int) (wrs, sges int, bytes uint64) {
	if pl.Shares() <= k || k < 0 {
		return 0, 0, 0
	}
	sh := &pl.shares[k]
	return int(sh.n_wr), int(sh.n_sge), uint64(sh.bytes)
}

// Start rewinds share k for a submit on a QP whose WR sequence number is
// seq. It writes C memory directly (no cgo call).
func (pl *Plan) Start(k int, seq uint32) {
	if pl.Shares() <= k || k < 0 {
		return
	}
	sh := &pl.shares[k]
	sh.next = 0
	sh.seq = C.uint32_t(seq)
}

// Left is how many WRs of share k are still to post.
func (pl *Plan) Left(k int) int {
	if pl.Shares() <= k || k < 0 {
		return 0
	}
	sh := &pl.shares[k]
	return int(sh.n_wr - sh.next)
}

// Seq is share k's QP sequence number after the WRs posted so far.
func (pl *Plan) Seq(k int) uint32 {
	if pl.Shares() <= k || k < 0 {
		return 0
	}
	return uint32(pl.shares[k].seq)
}

// Restamp rewrites every SGE for a new local MR (the source of a WRITE
// plan, the destination of a READ plan): its lkey, and the base address the
// local offsets are relative to, in one cgo call.
func (pl *Plan) Restamp(lkey uint32, localBase uint64) {
	if pl == nil || pl.p == nil {
		return
	}
	C.b2bv_pplan_restamp(pl.p, C.uint32_t(lkey), C.uint64_t(localBase))
}

// LKey is the lkey the plan's SGEs carry.
func (pl *Plan) LKey() uint32 {
	if pl == nil || pl.p == nil {
		return 0
	}
	return uint32(pl.p.lkey)
}

// PostPlan posts share k of pl from its cursor with one ibv_post_send: at
// most maxWR WRs, ending once maxBytes (0: no cap) are carried; the last
// WR posted is signaled, and when it is a WRITE share's last, carries tag as
// its immediate. It returns the WRs the device accepted and their bytes;
// the cursor and sequence number advance by those.
func (q *QP) PostPlan(pl *Plan, k int, maxWR int, maxBytes uint64, tag uint32) (int, uint64, error) {
	h := q.qp()
	if h == nil {
		return 0, 0, errClosed("post plan: QP")
	}
	return pl.post(h, q.num, k, maxWR, maxBytes, tag)
}

// Patch does what PostPlan does without a QP: the WRs are patched and the
// cursor advances, nothing is posted (benchmarks, dry runs).
func (pl *Plan) Patch(k int, maxWR int, maxBytes uint64, tag uint32) (int, uint64, error) {
	return pl.post(nil, 0, k, maxWR, maxBytes, tag)
}

func (pl *Plan) post(h *C.struct_ibv_qp, qpn uint32, k int, maxWR int, maxBytes uint64, tag uint32) (int, uint64, error) {
	if pl == nil || pl.p == nil {
		return 0, 0, errClosed("post plan: plan")
	}
	if k < 0 || k >= len(pl.shares) {
		return 0, 0, fmt.Errorf("verbs: post plan: share %d of %d: %w", k, len(pl.shares), ErrInvalidArgument)
	}
	rc := C.b2bv_pplan_post(h, pl.p, C.uint32_t(k), C.uint32_t(clampInt(maxWR, 0, 1<<30)), C.uint64_t(maxBytes), C.uint32_t(tag))
	sh := &pl.shares[k]
	if rc != 0 {
		return int(sh.posted), uint64(sh.bytes_posted), postErr(rc, C.int(sh.post_raw),
			fmt.Sprintf("ibv_post_send on QP %d accepted %d WRs of a prepared chain", qpn, uint32(sh.posted)))
	}
	return int(sh.posted), uint64(sh.bytes_posted), nil
}

// WR copies WR j of share k out of C memory (it allocates; tests only).
// wr_id carries the sequence number of the last post that covered it.
func (pl *Plan) WR(k, j int) WRInfo {
	if pl.Shares() <= k || k < 0 || j < 0 || j >= int(pl.shares[k].n_wr) {
		return WRInfo{}
	}
	w := (*C.struct_ibv_send_wr)(unsafe.Add(unsafe.Pointer(pl.shares[k].wr), uintptr(j)*unsafe.Sizeof(C.struct_ibv_send_wr{})))
	kk, jj := C.uint32_t(k), C.uint32_t(j)
	return wrInfo(w, C.b2bv_pwr_remote(pl.p, kk, jj), C.b2bv_pwr_rkey(pl.p, kk, jj), C.b2bv_pwr_imm(pl.p, kk, jj))
}

// WRNext reports whether WR j of share k links to WR j+1 (the list is
// whole between posts; tests only).
func (pl *Plan) WRNext(k, j int) bool {
	if pl.Shares() <= k || k < 0 || j < 0 || j >= int(pl.shares[k].n_wr) {
		return false
	}
	base := unsafe.Pointer(pl.shares[k].wr)
	sz := unsafe.Sizeof(C.struct_ibv_send_wr{})
	w := (*C.struct_ibv_send_wr)(unsafe.Add(base, uintptr(j)*sz))
	return unsafe.Pointer(w.next) == unsafe.Add(base, uintptr(j+1)*sz)
}

// Close frees the plan's C memory; safe twice and on nil. The caller makes
// sure no post is running.
func (pl *Plan) Close() error {
	if pl != nil && pl.p != nil {
		C.b2bv_pplan_free(pl.p)
		pl.p, pl.shares = nil, nil
	}
	return nil
}
