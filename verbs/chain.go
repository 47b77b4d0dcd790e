//go:build cgo && linux

package verbs

/*
#cgo noescape b2bv_post_chain
#cgo nocallback b2bv_post_chain
#include "b2bv.h"
*/
import "C"

import (
	"fmt"
	"syscall"
	"unsafe"
)

// Chain is a preallocated C array of RDMA WRITE or READ WRs and their SGEs,
// plus the planner's request and cursor. One Chain serves one QP (it is not safe for
// concurrent use); planning and posting never allocate.
type Chain struct {
	c      *C.struct_b2bv_chain
	capWR  int
	capSGE int
	wrs    []C.struct_ibv_send_wr
}

// NewChain allocates room for capWR WRs of capSGE SGEs each. It needs no
// device (the planner is pure), so it works in tests on any host with cgo.
func NewChain(capWR, capSGE int) (*Chain, error) {
	if capWR <= 0 || capSGE <= 0 || capWR > 1<<16 || capSGE > 1<<10 {
		return nil, fmt.Errorf("verbs: chain of %d WRs x %d SGEs: %w", capWR, capSGE, ErrInvalidArgument)
	}
	var c *C.struct_b2bv_chain
	if rc := C.b2bv_chain_new(C.uint32_t(capWR), C.uint32_t(capSGE), &c); rc != 0 {
		return nil, callErr(rc, 0, fmt.Sprintf("chain of %d WRs x %d SGEs", capWR, capSGE), "", nil)
	}
	return &Chain{c: c, capWR: capWR, capSGE: capSGE, wrs: unsafe.Slice(c.wr, capWR)}, nil
}

func (ch *Chain) chain() *C.struct_b2bv_chain {
	if ch == nil {
		return nil
	}
	return ch.c
}

// Cap is the chain's capacity (0, 0 once closed).
func (ch *Chain) Cap() (wrs, sges int) {
	if ch.chain() == nil {
		return 0, 0
	}
	return ch.capWR, ch.capSGE
}

// Setup sets the per-batch parameters (regions, keys, limits). On a closed
// chain it does nothing (Plan and PostChain then report ErrClosed); so do
// SetMaxWR, Start and SetSeq.
func (ch *Chain) Setup(p *ChainParams) {
	c := ch.chain()
	if c == nil {
		return
	}
	setReq(&c.req, p, ch.capWR, ch.capSGE)
}

// setReq copies p into a planner request, its WR and SGE caps clamped to
// capWR and capSGE (what a chain holds; a prepared plan's builder takes
// MaxWR and MaxChainBytes at post time instead and ignores them here).
func setReq(r *C.struct_b2bv_plan, p *ChainParams, capWR, capSGE int) {
	r.op = C.uint32_t(p.Op)
	r.src_base = C.uint64_t(p.SrcBase)
	r.dst_base = C.uint64_t(p.DstBase)
	r.src_limit = C.uint64_t(p.SrcLimit)
	r.dst_limit = C.uint64_t(p.DstLimit)
	r.max_wr_bytes = C.uint64_t(p.MaxWRBytes)
	r.max_chain_bytes = C.uint64_t(p.MaxChainBytes)
	r.lkey = C.uint32_t(p.LKey)
	r.rkey = C.uint32_t(p.RKey)
	r.max_wr = C.uint32_t(clampInt(p.MaxWR, 0, capWR))
	r.max_sge = C.uint32_t(clampInt(p.MaxSGE, 0, capSGE))
	r.signal_every = C.uint32_t(clampInt(p.SignalEvery, 1, 1<<30))
	r.inline_max = C.uint32_t(clampInt(p.InlineMax, 0, 1<<30))
}

// SetMaxWR caps the next chain's length (e.g. to the SQ credits left).
func (ch *Chain) SetMaxWR(n int) {
	if c := ch.chain(); c != nil {
		c.req.max_wr = C.uint32_t(clampInt(n, 0, ch.capWR))
	}
}

func clampInt(v, lo, hi int) int {
	if v < lo {
		return lo
	}
	if v > hi {
		return hi
	}
	return v
}

// Start sets the range [from, to) of the batch the next chains cover. When
// immLast is set, the range's last WR is RDMA_WRITE_WITH_IMM carrying imm
// (WRITE only: planning a READ with immLast is refused).
func (ch *Chain) Start(from, to Pos, immLast bool, imm uint32) {
	c := ch.chain()
	if c == nil {
		return
	}
	r := &c.req
	r.i = C.uint32_t(from.I)
	r.off = C.uint64_t(from.Off)
	r.end_i = C.uint32_t(to.I)
	r.end_off = C.uint64_t(to.Off)
	r.imm = C.uint32_t(imm)
	r.flags = 0
	if immLast {
		r.flags = C.B2BV_PLAN_IMM_LAST
	}
}

// Cursor is where the next chain starts (zero once closed).
func (ch *Chain) Cursor() Pos {
	c := ch.chain()
	if c == nil {
		return Pos{}
	}
	return Pos{I: uint32(c.req.i), Off: uint64(c.req.off)}
}

// Seq is the QP WR sequence number the next chain continues from (0 once
// closed).
func (ch *Chain) Seq() uint32 {
	c := ch.chain()
	if c == nil {
		return 0
	}
	return uint32(c.req.seq)
}

// SetSeq sets the sequence number (the QP's posted count).
func (ch *Chain) SetSeq(s uint32) {
	if c := ch.chain(); c != nil {
		c.req.seq = C.uint32_t(s)
	}
}

func arrays(src, dst, lens []uint64) (*C.uint64_t, *C.uint64_t, *C.uint64_t, C.uint32_t, error) {
	n := len(src)
	if len(dst) != n || len(lens) != n {
		return nil, nil, nil, 0, fmt.Errorf("verbs: batch arrays differ in length (%d, %d, %d): %w", len(src), len(dst), len(lens), ErrInvalidArgument)
	}
	if n == 0 {
		return nil, nil, nil, 0, nil
	}
	if n > 1<<28 {
		return nil, nil, nil, 0, fmt.Errorf("verbs: batch of %d blocks: %w", n, ErrInvalidArgument)
	}
	return (*C.uint64_t)(unsafe.Pointer(&src[0])), (*C.uint64_t)(unsafe.Pointer(&dst[0])),
		(*C.uint64_t)(unsafe.Pointer(&lens[0])), C.uint32_t(n), nil
}

func (ch *Chain) result() ChainResult {
	r := &ch.c.res
	return ChainResult{WRs: int(r.n_wr), SGEs: int(r.n_sge), Signaled: int(r.n_signaled),
		Bytes: uint64(r.bytes), Done: r.done != 0, Seq: uint32(ch.c.req.seq),
		PlanNs: int64(r.plan_ns), PostNs: int64(r.post_ns)}
}

// planErr describes a failed b2bv_plan or b2bv_post_chain (see
// struct b2bv_plan_res for the out-parameters).
func (ch *Chain) planErr(rc C.int, qpn uint32) error {
	c := ch.c
	if c.res.post_failed != 0 {
		return postErr(rc, C.int(c.res.post_raw), fmt.Sprintf("ibv_post_send on QP %d accepted %d of %d WRs", qpn, uint32(c.res.bad_wr), uint32(c.res.n_wr)))
	}
	switch syscall.Errno(-rc) {
	case syscall.ERANGE:
		return fmt.Errorf("verbs: block %d lies outside the source (%d bytes) or destination (%d bytes) region; nothing posted: %w",
			uint32(c.res.bad_block), uint64(c.req.src_limit), uint64(c.req.dst_limit), ErrInvalidArgument)
	case syscall.EINVAL:
		return fmt.Errorf("verbs: chain request invalid (op %d, immediate %v, cursor %d+%d, end %d+%d, max_wr %d, max_sge %d; ops: WRITE %d or READ %d without immediate): %w",
			uint32(c.req.op), c.req.flags&C.B2BV_PLAN_IMM_LAST != 0,
			uint32(c.req.i), uint64(c.req.off), uint32(c.req.end_i), uint64(c.req.end_off),
			uint32(c.req.max_wr), uint32(c.req.max_sge), WRWrite, WRRead, ErrInvalidArgument)
	}
	return callErr(rc, 0, "chain planner", "", ErrInvalidArgument)
}

// postErr is a refused ibv_post_send (rc, raw: what it returned); what
// says on which QP and how many WRs the device accepted.
func postErr(rc, raw C.int, what string) error {
	return callErr(rc, raw, what, postHint, ErrAborted)
}

// failed is the result of a chain that was not planned or not wholly
// posted (b2bv_post_chain or b2bv_bpost_chain returned rc): after a refused
// post, the WRs the device accepted, which Seq counts; else nothing.
func (ch *Chain) failed(rc C.int, qpn uint32) (ChainResult, error) {
	c := ch.c
	if c.res.post_failed != 0 {
		res := ch.result()
		res.WRs = int(c.res.bad_wr)
		return res, ch.planErr(rc, qpn)
	}
	return ChainResult{Seq: uint32(c.req.seq)}, ch.planErr(rc, qpn)
}

// Plan builds the next chain without posting it and advances the cursor, as
// PostChain would. It is the production planner, exposed for tests,
// benchmarks and dry runs; inspect the result with WR.
func (ch *Chain) Plan(src, dst, lens []uint64) (ChainResult, error) {
	return postChain(nil, 0, ch, src, dst, lens)
}

// PostChain plans the next chain from the cursor and posts it with one
// ibv_post_send, in one cgo call. On a post failure the result's Seq still
// counts the WRs the device accepted.
func (q *QP) PostChain(ch *Chain, src, dst, lens []uint64) (ChainResult, error) {
	h := q.qp()
	if h == nil {
		return ChainResult{}, errClosed("post chain: QP")
	}
	return postChain(h, q.num, ch, src, dst, lens)
}

// postChain is PostChain on QP h (qpn), or Plan with h nil.
func postChain(h *C.struct_ibv_qp, qpn uint32, ch *Chain, src, dst, lens []uint64) (ChainResult, error) {
	c := ch.chain()
	if c == nil {
		return ChainResult{}, errClosed("post chain: chain")
	}
	s, d, l, n, err := arrays(src, dst, lens)
	if err != nil {
		return ChainResult{}, err
	}
	if rc := C.b2bv_post_chain(h, c, s, d, l, n); rc != 0 {
		return ch.failed(rc, qpn)
	}
	return ch.result(), nil
}

// WR copies planned WR j of the last chain out of C memory (it allocates;
// not for the data path).
func (ch *Chain) WR(j int) WRInfo {
	if ch.chain() == nil || j < 0 || j >= int(ch.c.res.n_wr) {
		return WRInfo{}
	}
	jj := C.uint32_t(j)
	return wrInfo(&ch.wrs[j], C.b2bv_wr_remote(ch.c, jj), C.b2bv_wr_rkey(ch.c, jj), C.b2bv_wr_imm(ch.c, jj))
}

// wrInfo copies w out of C memory; remote, rkey and imm come from the
// accessors (unions are awkward in cgo; imm is 0 unless a WRITE_WITH_IMM).
func wrInfo(w *C.struct_ibv_send_wr, remote C.uint64_t, rkey, imm C.uint32_t) WRInfo {
	info := WRInfo{
		WRID:       uint64(w.wr_id),
		Opcode:     WROpcode(w.opcode),
		Signaled:   w.send_flags&C.IBV_SEND_SIGNALED != 0,
		Inline:     w.send_flags&C.IBV_SEND_INLINE != 0,
		RemoteAddr: uint64(remote),
		RKey:       uint32(rkey),
		Imm:        uint32(imm),
	}
	for _, s := range unsafe.Slice(w.sg_list, int(w.num_sge)) {
		info.SGEs = append(info.SGEs, SGE{Addr: uint64(s.addr), Len: uint32(s.length), LKey: uint32(s.lkey)})
	}
	return info
}

// Close frees the chain; safe twice and on nil.
func (ch *Chain) Close() error {
	if ch != nil && ch.c != nil {
		C.b2bv_chain_free(ch.c)
		ch.c, ch.wrs = nil, nil
	}
	return nil
}
