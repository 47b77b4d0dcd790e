//go:build cgo && linux

package verbs

/*
#cgo noescape b2bv_post_send1
#cgo nocallback b2bv_post_send1
#include "b2bv.h"
*/
import "C"

import "fmt"

// QP is a reliable-connected queue pair.
type QP struct {
	q    *C.struct_ibv_qp
	pd   *PD
	scq  *CQ
	rcq  *CQ
	srq  *SRQ
	num  uint32
	caps QPCaps
}

// NewRCQP creates an RC QP in the RESET state.
func (pd *PD) NewRCQP(cfg QPConfig) (*QP, error) {
	p := pd.pd()
	if p == nil {
		return nil, errClosed("ibv_create_qp: PD")
	}
	if cfg.SendCQ.q() == nil || cfg.RecvCQ.q() == nil {
		return nil, fmt.Errorf("verbs: ibv_create_qp: send and receive CQs are required: %w", ErrInvalidArgument)
	}
	var srq *C.struct_ibv_srq
	if cfg.SRQ != nil {
		if srq = cfg.SRQ.s; srq == nil {
			return nil, errClosed("ibv_create_qp: SRQ")
		}
	}
	var caps [3]C.uint32_t
	var q *C.struct_ibv_qp
	if rc := C.b2bv_create_rc_qp(p, cfg.SendCQ.cq, cfg.RecvCQ.cq, srq,
		C.uint32_t(cfg.MaxSendWR), C.uint32_t(cfg.MaxSendSGE), C.uint32_t(cfg.MaxInline), &caps[0], &q); rc != 0 {
		return nil, callErr(rc, 0, fmt.Sprintf("ibv_create_qp(RC, max_send_wr=%d, max_send_sge=%d, max_inline=%d, srq=%t)",
			cfg.MaxSendWR, cfg.MaxSendSGE, cfg.MaxInline, srq != nil), "", nil)
	}
	pd.kids.n.Add(1)
	cfg.SendCQ.kids.n.Add(1)
	if cfg.RecvCQ != cfg.SendCQ {
		cfg.RecvCQ.kids.n.Add(1)
	}
	if cfg.SRQ != nil {
		cfg.SRQ.kids.n.Add(1)
	}
	return &QP{q: q, pd: pd, scq: cfg.SendCQ, rcq: cfg.RecvCQ, srq: cfg.SRQ, num: uint32(C.b2bv_qp_num(q)),
		caps: QPCaps{MaxSendWR: int(caps[0]), MaxSendSGE: int(caps[1]), MaxInline: int(caps[2])}}, nil
}

func (q *QP) qp() *C.struct_ibv_qp {
	if q == nil {
		return nil
	}
	return q.q
}

// Num is the QP number (it stays readable after Close; 0 for a nil QP).
func (q *QP) Num() uint32 {
	if q == nil {
		return 0
	}
	return q.num
}

// Caps is what the provider granted at creation.
func (q *QP) Caps() QPCaps {
	if q == nil {
		return QPCaps{}
	}
	return q.caps
}

// ToInit moves RESET → INIT.
func (q *QP) ToInit(port int, access Access) error {
	h := q.qp()
	if h == nil {
		return errClosed("QP RESET→INIT: QP")
	}
	var raw C.int
	if rc := C.b2bv_qp_to_init(h, C.uint8_t(port), C.int(access), &raw); rc != 0 {
		return callErr(rc, raw, fmt.Sprintf("QP %d RESET→INIT (port %d)", q.num, port), "", nil)
	}
	return nil
}

// ToRTR moves INIT → RTR.
func (q *QP) ToRTR(a RTRAttr) error {
	h := q.qp()
	if h == nil {
		return errClosed("QP INIT→RTR: QP")
	}
	var hi, lo uint64
	for k := 0; k < 8; k++ {
		hi = hi<<8 | uint64(a.RemoteGID[k])
		lo = lo<<8 | uint64(a.RemoteGID[8+k])
	}
	glob := C.int(0)
	if a.Global {
		glob = 1
	}
	var raw C.int
	if rc := C.b2bv_qp_to_rtr(h, C.uint8_t(a.Port), C.uint32_t(a.RemoteQPN), C.uint32_t(a.RemotePSN),
		C.int(a.MTU), glob, C.uint64_t(hi), C.uint64_t(lo), C.uint8_t(a.GIDIndex), C.uint16_t(a.RemoteLID),
		C.uint8_t(a.MinRNRTimer), C.uint8_t(clampInt(a.MaxDestRdAtomic, 0, 255)), &raw); rc != 0 {
		return callErr(rc, raw, fmt.Sprintf("QP %d INIT→RTR (remote QPN %d, remote PSN %d, path MTU %s, local GID index %d, remote GID %s, remote LID %d, global %t)",
			q.num, a.RemoteQPN, a.RemotePSN, a.MTU, a.GIDIndex, a.RemoteGID, a.RemoteLID, a.Global), "", nil)
	}
	return nil
}

// ToRTS moves RTR → RTS.
func (q *QP) ToRTS(a RTSAttr) error {
	h := q.qp()
	if h == nil {
		return errClosed("QP RTR→RTS: QP")
	}
	var raw C.int
	if rc := C.b2bv_qp_to_rts(h, C.uint32_t(a.PSN), C.uint8_t(a.Timeout), C.uint8_t(a.RetryCount), C.uint8_t(a.RNRRetry), C.uint8_t(clampInt(a.MaxRdAtomic, 0, 255)), &raw); rc != 0 {
		return callErr(rc, raw, fmt.Sprintf("QP %d RTR→RTS (PSN %d, timeout %d, retry %d, rnr_retry %d)",
			q.num, a.PSN, a.Timeout, a.RetryCount, a.RNRRetry), "", nil)
	}
	return nil
}

// ToError moves the QP to ERR, flushing outstanding WRs.
func (q *QP) ToError() error {
	h := q.qp()
	if h == nil {
		return errClosed("QP →ERR: QP")
	}
	var raw C.int
	if rc := C.b2bv_qp_to_err(h, &raw); rc != 0 {
		return callErr(rc, raw, fmt.Sprintf("QP %d →ERR", q.num), "", nil)
	}
	return nil
}

// State is the QP's current ibv_qp_state (QPStateReset .. QPStateErr).
func (q *QP) State() (int, error) {
	h := q.qp()
	if h == nil {
		return 0, errClosed("ibv_query_qp: QP")
	}
	var st C.int
	if rc := C.b2bv_qp_state(h, &st); rc != 0 {
		return 0, callErr(rc, 0, fmt.Sprintf("ibv_query_qp(%d)", q.num), "", nil)
	}
	return int(st), nil
}

// PostSend posts one WR (SEND, SEND_WITH_IMM or WRITE_WITH_IMM) of at most
// one SGE; length 0 means no SGE.
func (q *QP) PostSend(wrID uint64, op WROpcode, imm uint32, addr uint64, n, lkey uint32, signaled bool) error {
	h := q.qp()
	if h == nil {
		return errClosed("ibv_post_send: QP")
	}
	fl := C.int(0)
	if signaled {
		fl = C.IBV_SEND_SIGNALED
	}
	var raw C.int
	if rc := C.b2bv_post_send1(h, C.uint64_t(wrID), C.int(op), C.uint32_t(imm), C.uint64_t(addr), C.uint32_t(n), C.uint32_t(lkey), fl, &raw); rc != 0 {
		return callErr(rc, raw, fmt.Sprintf("ibv_post_send on QP %d", q.num), postHint, ErrAborted)
	}
	return nil
}

// postHint is why ibv_post_send usually fails.
const postHint = " (send queue full or QP not in RTS)"

// Close destroys the QP. Closing a closed or nil QP does nothing; every
// other method then returns an error wrapping ErrClosed.
func (q *QP) Close() error {
	h := q.qp()
	if h == nil {
		return nil
	}
	if rc := C.b2bv_destroy_qp(h); rc != 0 {
		return callErr(rc, 0, fmt.Sprintf("ibv_destroy_qp(%d)", q.num), "", nil)
	}
	q.q = nil
	q.pd.kids.n.Add(-1)
	q.scq.kids.n.Add(-1)
	if q.rcq != q.scq {
		q.rcq.kids.n.Add(-1)
	}
	if q.srq != nil {
		q.srq.kids.n.Add(-1)
	}
	return nil
}
