//go:build cgo && linux

package verbs

/*
#cgo nocallback b2bv_poll
#cgo noescape b2bv_drain_cq_events
#cgo nocallback b2bv_drain_cq_events
#cgo noescape b2bv_arm
#cgo nocallback b2bv_arm
#include "b2bv.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// CompChannel is a completion channel; its fd is non-blocking.
type CompChannel struct {
	ch     *C.struct_ibv_comp_channel
	parent *Context
	kids   children
}

// NewCompChannel creates a completion channel.
func (c *Context) NewCompChannel() (*CompChannel, error) {
	cc := c.ctx()
	if cc == nil {
		return nil, errClosed("ibv_create_comp_channel: context")
	}
	var ch *C.struct_ibv_comp_channel
	if rc := C.b2bv_create_comp_channel(cc, &ch); rc != 0 {
		return nil, callErr(rc, 0, fmt.Sprintf("ibv_create_comp_channel(%s)", c.name), "", nil)
	}
	if err := setNonblock(C.b2bv_comp_fd(ch), "completion channel"); err != nil {
		C.b2bv_destroy_comp_channel(ch)
		return nil, err
	}
	c.kids.n.Add(1)
	return &CompChannel{ch: ch, parent: c}, nil
}

func (ch *CompChannel) channel() *C.struct_ibv_comp_channel {
	if ch == nil {
		return nil
	}
	return ch.ch
}

// FD is the channel's fd, readable when an armed CQ has a completion (-1
// once closed).
func (ch *CompChannel) FD() int {
	c := ch.channel()
	if c == nil {
		return -1
	}
	return int(C.b2bv_comp_fd(c))
}

// DrainEvents reads and acknowledges every pending CQ event (0 once closed).
func (ch *CompChannel) DrainEvents() int {
	c := ch.channel()
	if c == nil {
		return 0
	}
	var n C.int
	C.b2bv_drain_cq_events(c, &n)
	return int(n)
}

// Close destroys the channel; its CQs must be closed first. Closing a
// closed or nil channel does nothing.
func (ch *CompChannel) Close() error {
	c := ch.channel()
	if c == nil {
		return nil
	}
	if err := ch.kids.busy("completion channel"); err != nil {
		return err
	}
	if rc := C.b2bv_destroy_comp_channel(c); rc != 0 {
		return callErr(rc, 0, "ibv_destroy_comp_channel", "", nil)
	}
	ch.ch = nil
	ch.parent.kids.n.Add(-1)
	return nil
}

// CQ is a completion queue.
type CQ struct {
	cq      *C.struct_ibv_cq
	parent  *Context
	channel *CompChannel
	depth   int
	kids    children
}

// NewCQ creates a CQ of at least cqe entries, bound to ch (may be nil).
func (c *Context) NewCQ(cqe int, ch *CompChannel) (*CQ, error) {
	cc := c.ctx()
	if cc == nil {
		return nil, errClosed("ibv_create_cq: context")
	}
	if cqe <= 0 || (c.attr.MaxCQE > 0 && cqe > c.attr.MaxCQE) {
		return nil, fmt.Errorf("verbs: ibv_create_cq(cqe=%d): device allows 1..%d: %w", cqe, c.attr.MaxCQE, ErrInvalidArgument)
	}
	var cch *C.struct_ibv_comp_channel
	if ch != nil {
		if cch = ch.ch; cch == nil {
			return nil, errClosed(fmt.Sprintf("ibv_create_cq(cqe=%d): completion channel", cqe))
		}
	}
	var cq *C.struct_ibv_cq
	if rc := C.b2bv_create_cq(cc, C.int(cqe), cch, &cq); rc != 0 {
		return nil, callErr(rc, 0, fmt.Sprintf("ibv_create_cq(cqe=%d)", cqe), "", nil)
	}
	c.kids.n.Add(1)
	if ch != nil {
		ch.kids.n.Add(1)
	}
	return &CQ{cq: cq, parent: c, channel: ch, depth: int(cq.cqe)}, nil
}

func (cq *CQ) q() *C.struct_ibv_cq {
	if cq == nil {
		return nil
	}
	return cq.cq
}

// Depth is the CQ's real size (0 for a nil CQ).
func (cq *CQ) Depth() int {
	if cq == nil {
		return 0
	}
	return cq.depth
}

// Arm requests an event for the next completion (ibv_req_notify_cq).
func (cq *CQ) Arm() error {
	q := cq.q()
	if q == nil {
		return errClosed("ibv_req_notify_cq: CQ")
	}
	var raw C.int
	if rc := C.b2bv_arm(q, &raw); rc != 0 {
		return callErr(rc, raw, "ibv_req_notify_cq", "", nil)
	}
	return nil
}

// Poll moves up to b's capacity of completions into b; it returns how many.
// One cgo call per batch; the count travels in b's C memory, so a poll
// allocates nothing.
func (cq *CQ) Poll(b *WCBuf) (int, error) {
	q := cq.q()
	if q == nil {
		return 0, errClosed("ibv_poll_cq: CQ")
	}
	wb := b.buf()
	if wb == nil {
		return 0, errClosed("ibv_poll_cq: WC buffer")
	}
	if rc := C.b2bv_poll(q, wb); rc != 0 {
		return 0, callErr(rc, wb.rc_raw, "ibv_poll_cq", "", nil)
	}
	return int(wb.n), nil
}

// Close destroys the CQ; its QPs must be closed first. Closing a closed or
// nil CQ does nothing.
func (cq *CQ) Close() error {
	q := cq.q()
	if q == nil {
		return nil
	}
	if err := cq.kids.busy("CQ"); err != nil {
		return err
	}
	if rc := C.b2bv_destroy_cq(q); rc != 0 {
		return callErr(rc, 0, "ibv_destroy_cq", "", nil)
	}
	cq.cq = nil
	cq.parent.kids.n.Add(-1)
	if cq.channel != nil {
		cq.channel.kids.n.Add(-1)
	}
	return nil
}

// WCBuf is a reusable, C-allocated poll buffer.
type WCBuf struct {
	b   *C.struct_b2bv_wcbuf
	wcs []C.struct_b2bv_wc
}

// NewWCBuf allocates room for n completions per poll.
func NewWCBuf(n int) (*WCBuf, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("verbs: WC buffer of %d: %w", n, ErrInvalidArgument)
	}
	var b *C.struct_b2bv_wcbuf
	if rc := C.b2bv_wcbuf_new(C.int(n), &b); rc != 0 {
		return nil, callErr(rc, 0, fmt.Sprintf("WC buffer of %d", n), "", nil)
	}
	return &WCBuf{b: b, wcs: unsafe.Slice(b.wc, n)}, nil
}

func (b *WCBuf) buf() *C.struct_b2bv_wcbuf {
	if b == nil {
		return nil
	}
	return b.b
}

// At returns completion i of the last poll (a zero WC when i is out of
// range or the buffer is closed).
func (b *WCBuf) At(i int) WC {
	if b == nil || i < 0 || i >= len(b.wcs) {
		return WC{}
	}
	w := &b.wcs[i]
	return WC{
		WRID: uint64(w.wr_id), Status: WCStatus(w.status), Opcode: WCOpcode(w.opcode),
		QPNum: uint32(w.qp_num), Imm: uint32(w.imm), ByteLen: uint32(w.byte_len),
		VendorErr: uint32(w.vendor_err), Flags: uint32(w.flags),
	}
}

// Close frees the buffer; safe twice and on nil.
func (b *WCBuf) Close() error {
	if b != nil && b.b != nil {
		C.b2bv_wcbuf_free(b.b)
		b.b, b.wcs = nil, nil
	}
	return nil
}
