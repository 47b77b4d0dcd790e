//go:build cgo && linux

package verbs

/*
#cgo noescape b2bv_bexpand
#cgo nocallback b2bv_bexpand
#cgo noescape b2bv_bpost_chain
#cgo nocallback b2bv_bpost_chain
#include "b2bv.h"
*/
import "C"

import (
	"fmt"
	"syscall"
	"unsafe"
)

// BlockTable is a layout pair's fused segment groups and its regions in C
// memory (struct b2bv_btab): built once per pair, its regions' addresses,
// limits and keys refreshed in place when they change. Not safe for
// concurrent use.
type BlockTable struct {
	c        *C.struct_b2bv_btab
	g        []C.struct_b2bv_bgroup
	src, dst []C.struct_b2bv_bregion
}

// NewBlockTable copies groups into C memory, with room for nsrc source and
// ndst destination regions (zero until SetSrc/SetDst).
func NewBlockTable(groups []BlockGroup, nsrc, ndst int) (*BlockTable, error) {
	if len(groups) == 0 || nsrc <= 0 || ndst <= 0 || len(groups) > 1<<20 || nsrc > 1<<20 || ndst > 1<<20 {
		return nil, fmt.Errorf("verbs: block table of %d groups, %d source and %d destination regions: %w", len(groups), nsrc, ndst, ErrInvalidArgument)
	}
	for i, g := range groups {
		if int(g.SrcRegion) >= nsrc || int(g.DstRegion) >= ndst {
			return nil, fmt.Errorf("verbs: block table: group %d names regions %d, %d beyond %d, %d: %w", i, g.SrcRegion, g.DstRegion, nsrc, ndst, ErrInvalidArgument)
		}
	}
	var c *C.struct_b2bv_btab
	if rc := C.b2bv_btab_new(C.uint32_t(len(groups)), C.uint32_t(nsrc), C.uint32_t(ndst), &c); rc != 0 {
		return nil, callErr(rc, 0, "block table", "", nil)
	}
	t := &BlockTable{c: c, g: unsafe.Slice(c.g, len(groups)), src: unsafe.Slice(c.src, nsrc), dst: unsafe.Slice(c.dst, ndst)}
	for i, g := range groups {
		m := C.uint32_t(0)
		if g.Mergeable {
			m = 1
		}
		t.g[i] = C.struct_b2bv_bgroup{
			src_base: C.uint64_t(g.SrcBase), dst_base: C.uint64_t(g.DstBase),
			src_stride: C.uint64_t(g.SrcStride), dst_stride: C.uint64_t(g.DstStride),
			block_len: C.uint64_t(g.BlockLen), src_region: C.uint32_t(g.SrcRegion), dst_region: C.uint32_t(g.DstRegion),
			mergeable: m,
		}
	}
	return t, nil
}

// SetSrc sets source region i (WRITE: local, READ: remote).
func (t *BlockTable) SetSrc(i int, r BlockRegion) { setRegion(&t.src[i], r) }

// SetDst sets destination region i (WRITE: remote, READ: local).
func (t *BlockTable) SetDst(i int, r BlockRegion) { setRegion(&t.dst[i], r) }

// Src and Dst return region i as set.
func (t *BlockTable) Src(i int) BlockRegion { return getRegion(&t.src[i]) }
func (t *BlockTable) Dst(i int) BlockRegion { return getRegion(&t.dst[i]) }

func setRegion(c *C.struct_b2bv_bregion, r BlockRegion) {
	c.addr, c.limit, c.key = C.uint64_t(r.Addr), C.uint64_t(r.Limit), C.uint32_t(r.Key)
}

func getRegion(c *C.struct_b2bv_bregion) BlockRegion {
	return BlockRegion{Addr: uint64(c.addr), Limit: uint64(c.limit), Key: uint32(c.key)}
}

// Close frees the table; safe twice and on nil.
func (t *BlockTable) Close() error {
	if t != nil && t.c != nil {
		C.b2bv_btab_free(t.c)
		t.c, t.g, t.src, t.dst = nil, nil, nil, nil
	}
	return nil
}

// BlockCursor is one QP's share of a block request and its chunk of
// expanded runs (struct b2bv_bcur). Not safe for concurrent use.
type BlockCursor struct{ c *C.struct_b2bv_bcur }

// NewBlockCursor allocates a cursor whose chunks hold up to chunk runs.
func NewBlockCursor(chunk int) (*BlockCursor, error) {
	if chunk <= 0 || chunk > 1<<20 {
		return nil, fmt.Errorf("verbs: block cursor of %d runs: %w", chunk, ErrInvalidArgument)
	}
	var c *C.struct_b2bv_bcur
	if rc := C.b2bv_bcur_new(C.uint32_t(chunk), &c); rc != 0 {
		return nil, callErr(rc, 0, "block cursor", "", nil)
	}
	return &BlockCursor{c: c}, nil
}

// Start sets the range [from, to) of (group, entry) positions the next
// chains cover, and drops any chunk left.
func (c *BlockCursor) Start(from, to BlockPos) {
	if c == nil || c.c == nil {
		return
	}
	x := c.c
	x.g, x.e, x.end_g, x.end_e = C.uint32_t(from.Group), C.uint32_t(from.Entry), C.uint32_t(to.Group), C.uint32_t(to.Entry)
	x.n, x.i, x.off = 0, 0, 0
}

// Bad is the (group, entry) of the run a chain found outside its region.
func (c *BlockCursor) Bad() (group, entry uint32) {
	if c == nil || c.c == nil {
		return 0, 0
	}
	return uint32(c.c.bad_group), uint32(c.c.bad_entry)
}

// Close frees the cursor; safe twice and on nil.
func (c *BlockCursor) Close() error {
	if c != nil && c.c != nil {
		C.b2bv_bcur_free(c.c)
		c.c = nil
	}
	return nil
}

func ids(sid, did []uint32) (*C.uint32_t, *C.uint32_t, C.uint32_t, error) {
	if len(sid) != len(did) || len(sid) == 0 || len(sid) > 1<<28 {
		return nil, nil, 0, fmt.Errorf("verbs: block ids: %d source and %d destination ids: %w", len(sid), len(did), ErrInvalidArgument)
	}
	return (*C.uint32_t)(unsafe.Pointer(&sid[0])), (*C.uint32_t)(unsafe.Pointer(&did[0])), C.uint32_t(len(sid)), nil
}

// ExpandBlocks expands the next runs of c's range, all of one group, into
// src, dst, lens and first (at most their common length), and returns how
// many and their group: the C expansion that PostBlocks plans from,
// exposed for tests and benchmarks. 0 once the range is done.
func (c *BlockCursor) ExpandBlocks(t *BlockTable, sid, did []uint32, src, dst, lens []uint64, first []uint32) (n int, group uint32, err error) {
	if c == nil || c.c == nil || t == nil || t.c == nil {
		return 0, 0, errClosed("expand blocks")
	}
	s, d, nids, err := ids(sid, did)
	if err != nil {
		return 0, 0, err
	}
	max := min(len(src), len(dst), len(lens), len(first))
	if max == 0 {
		return 0, 0, nil
	}
	var g C.uint32_t
	k := C.b2bv_bexpand(t.c, s, d, nids, c.c, C.uint32_t(max), (*C.uint64_t)(unsafe.Pointer(&src[0])),
		(*C.uint64_t)(unsafe.Pointer(&dst[0])), (*C.uint64_t)(unsafe.Pointer(&lens[0])), (*C.uint32_t)(unsafe.Pointer(&first[0])), &g)
	return int(k), uint32(g), nil
}

// PlanBlocks plans the next chain of c's range without posting it (tests,
// benchmarks); see PostBlocks.
func (ch *Chain) PlanBlocks(t *BlockTable, c *BlockCursor, sid, did []uint32) (ChainResult, error) {
	return postBlocks(nil, 0, ch, t, c, sid, did)
}

// PostBlocks plans the next chain of c's range and posts it with one
// ibv_post_send, in one cgo call: ids are expanded in C from t's
// templates, chunk by chunk, and planned with the chain planner. The
// chain's Setup gives the opcode, caps and signalling (its bases, limits
// and keys are ignored: t's regions give them per group), Start's immLast
// and imm the immediate of the range's last WR (set the range with
// c.Start; Start's positions are ignored).
func (q *QP) PostBlocks(ch *Chain, t *BlockTable, c *BlockCursor, sid, did []uint32) (ChainResult, error) {
	h := q.qp()
	if h == nil {
		return ChainResult{}, errClosed("post blocks: QP")
	}
	return postBlocks(h, q.num, ch, t, c, sid, did)
}

func postBlocks(h *C.struct_ibv_qp, qpn uint32, ch *Chain, t *BlockTable, c *BlockCursor, sid, did []uint32) (ChainResult, error) {
	x := ch.chain()
	if x == nil || t == nil || t.c == nil || c == nil || c.c == nil {
		return ChainResult{}, errClosed("post blocks: chain, table or cursor")
	}
	s, d, n, err := ids(sid, did)
	if err != nil {
		return ChainResult{}, err
	}
	if rc := C.b2bv_bpost_chain(h, x, t.c, c.c, s, d, n); rc != 0 {
		res, err := ch.failed(rc, qpn)
		if x.res.post_failed == 0 && syscall.Errno(-rc) == syscall.ERANGE {
			g, e := c.Bad()
			err = fmt.Errorf("verbs: block request: group %d, entry %d: a block lies outside its source or destination region; nothing of this chain posted: %w", g, e, ErrInvalidArgument)
		}
		return res, err
	}
	return ch.result(), nil
}
