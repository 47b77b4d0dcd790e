package verbs

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	kvlayout "github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	ibv "github.com/b2bd/b2bd/verbs"
)

// Block-id requests (docs/kv.md, Posting): a request is expanded from the
// pair's templates in C, chain by chain, and posted over the set's QPs in
// one go. A WRITE is one batch over every destination region: its rkeys go
// ahead of the meta in msgKeys messages, so the receiver pins them all, and
// one acknowledgement covers the whole request. A READ needs no message:
// it is done once every QP completed what it posted.

const (
	// maxBlockTables bounds the pairs whose C templates a conn keeps (a
	// daemon caches a pair per local layout and remote resolution).
	maxBlockTables = 16
	// blockChunk is the runs a QP's cursor expands at a time: a chunk of
	// offsets stays in the first-level cache.
	blockChunk = 256
)

// blockTab is a pair's templates in C, for one direction.
type blockTab struct {
	pair *kvlayout.Pair
	read bool
	tab  *ibv.BlockTable
	used uint64
}

// blockState is a sending set's block-request scratch, used under sem.
type blockState struct {
	tabs  []blockTab
	clock uint64
	curs  []*ibv.BlockCursor // per QP, made on first use
	regs  []*registration
	refs  []*mrRef
	cuts  []ibv.BlockPos
	keys  []uint32
}

// table returns the C templates of (p, read), built on first use; the
// least recently used is freed beyond maxBlockTables.
func (s *qpSet) blockTable(p *kvlayout.Pair, read bool) (*ibv.BlockTable, error) {
	b := &s.blk
	b.clock++
	for i := range b.tabs {
		if b.tabs[i].pair == p && b.tabs[i].read == read {
			b.tabs[i].used = b.clock
			return b.tabs[i].tab, nil
		}
	}
	gs := make([]ibv.BlockGroup, p.NumGroups())
	for g := range gs {
		x := p.GroupTemplate(g)
		gs[g] = ibv.BlockGroup{SrcBase: x.SrcBase, DstBase: x.DstBase, SrcStride: x.SrcStride, DstStride: x.DstStride,
			BlockLen: x.BlockLen, SrcRegion: x.SrcRegion, DstRegion: x.DstRegion, Mergeable: x.Mergeable}
	}
	tab, err := ibv.NewBlockTable(gs, p.Src().NumRegions(), p.Dst().NumRegions())
	if err != nil {
		return nil, err
	}
	if len(b.tabs) >= maxBlockTables {
		old := 0
		for i := range b.tabs {
			if b.tabs[i].used < b.tabs[old].used {
				old = i
			}
		}
		b.tabs[old].tab.Close()
		b.tabs = append(b.tabs[:old], b.tabs[old+1:]...)
	}
	b.tabs = append(b.tabs, blockTab{pair: p, read: read, tab: tab, used: b.clock})
	return tab, nil
}

// freeBlocks frees the C templates and cursors (destroy).
func (s *qpSet) freeBlocks() {
	for _, x := range s.blk.tabs {
		x.tab.Close()
	}
	for _, c := range s.blk.curs {
		c.Close()
	}
	s.blk.tabs, s.blk.curs = nil, nil
}

// cursors returns a cursor per QP, made on first use.
func (s *qpSet) cursors() ([]*ibv.BlockCursor, error) {
	if len(s.blk.curs) == len(s.qps) {
		return s.blk.curs, nil
	}
	for len(s.blk.curs) < len(s.qps) {
		c, err := ibv.NewBlockCursor(blockChunk)
		if err != nil {
			return nil, err
		}
		s.blk.curs = append(s.blk.curs, c)
	}
	return s.blk.curs, nil
}

// holdLocal checks the local registrations and holds each one's MR (a
// Rekey retires it only once the request stopped using it); releaseLocal
// lets them go.
func (s *qpSet) holdLocal(op string, regs []transport.Registration) error {
	b := &s.blk
	b.regs, b.refs = b.regs[:0], b.refs[:0]
	for i, r := range regs {
		reg, ok := r.(*registration)
		if !ok || reg.t != s.t {
			s.releaseLocal()
			return &transport.StretchError{Err: fmt.Errorf("verbs: %s: local region %d was not registered with this verbs transport: %w", op, i, errs.ErrInvalidArgument)}
		}
		ref := reg.use()
		if ref == nil {
			s.releaseLocal()
			return fmt.Errorf("verbs: %s: local region %d: registration %s: %w", op, i, reg.unusable(), errs.ErrFailedPrecondition)
		}
		b.regs, b.refs = append(b.regs, reg), append(b.refs, ref)
	}
	return nil
}

func (s *qpSet) releaseLocal() {
	b := &s.blk
	for i, ref := range b.refs {
		b.regs[i].done(ref)
		b.regs[i], b.refs[i] = nil, nil
	}
	b.regs, b.refs = b.regs[:0], b.refs[:0]
}

// setRegions fills tab's regions: the local side from the held MRs, the
// remote side from the keys; every group's whole extent (every block any
// valid id names) must lie inside both regions, or nothing is posted. It
// reports whether every local region is host memory (inline data).
func (s *qpSet) setRegions(op string, tab *ibv.BlockTable, p *kvlayout.Pair, remote []transport.RemoteRegion, read bool) (bool, error) {
	b := &s.blk
	host := true
	local := func(i int) ibv.BlockRegion {
		m := b.refs[i].mr
		if b.regs[i].mem.Kind != memory.Host {
			host = false
		}
		return ibv.BlockRegion{Addr: m.Addr(), Limit: b.regs[i].mem.Len, Key: m.LKey()}
	}
	for i, rr := range remote {
		if rr.Key.Key > 0xFFFFFFFF {
			return false, &transport.StretchError{Err: fmt.Errorf("verbs: %s: remote region %d (%q): bad rkey %#x: %w", op, i, rr.Name, rr.Key.Key, errs.ErrInvalidArgument)}
		}
		r := ibv.BlockRegion{Addr: rr.Key.Addr, Limit: rr.Size, Key: uint32(rr.Key.Key)}
		if read {
			tab.SetSrc(i, r)
		} else {
			tab.SetDst(i, r)
		}
	}
	for i := range b.refs {
		if read {
			tab.SetDst(i, local(i))
		} else {
			tab.SetSrc(i, local(i))
		}
	}
	sn, dn := p.Src().NumBlocks(), p.Dst().NumBlocks()
	for g := 0; g < p.NumGroups(); g++ {
		x := p.GroupTemplate(g)
		se, sok := extent(x.SrcBase, x.SrcStride, x.BlockLen, sn)
		de, dok := extent(x.DstBase, x.DstStride, x.BlockLen, dn)
		sl, dl := tab.Src(int(x.SrcRegion)).Limit, tab.Dst(int(x.DstRegion)).Limit
		if !sok || !dok || se > sl || de > dl {
			return false, &transport.StretchError{Group: uint32(g), SrcRegion: x.SrcRegion, DstRegion: x.DstRegion,
				Err: fmt.Errorf("verbs: %s: segment group %d reaches byte %d of its source region (%d bytes) and %d of its destination region (%d bytes); nothing posted: %w",
					op, g, se, sl, de, dl, errs.ErrInvalidArgument)}
		}
	}
	return host, nil
}

// extent is base + (n-1)*stride + blockLen, false on overflow.
func extent(base, stride, blockLen, n uint64) (uint64, bool) {
	hi, span := bits.Mul64(n-1, stride)
	e, c1 := bits.Add64(base, span, 0)
	e, c2 := bits.Add64(e, blockLen, 0)
	return e, hi == 0 && c1 == 0 && c2 == 0
}

// blockCuts cuts the request into at most nq ranges of about equal bytes
// at (group, entry) positions, into s.blk.cuts; it returns the ranges.
func (s *qpSet) blockCuts(p *kvlayout.Pair, n int, total uint64, nq int) int {
	cuts := append(s.blk.cuts[:0], ibv.BlockPos{})
	end := ibv.BlockPos{Group: uint32(p.NumGroups())}
	var acc uint64
	k := 1
	for g := 0; g < p.NumGroups() && k < nq; g++ {
		_, _, bl := p.Group(g)
		gb := bl * uint64(n)
		for k < nq {
			hi, lo := bits.Mul64(total, uint64(k))
			target, _ := bits.Div64(hi, lo, uint64(nq))
			if target >= acc+gb {
				break
			}
			pos := ibv.BlockPos{Group: uint32(g)}
			if target > acc {
				pos.Entry = uint32((target - acc) / bl)
			}
			if int(pos.Entry) >= n {
				pos = ibv.BlockPos{Group: uint32(g + 1)}
			}
			if last := cuts[len(cuts)-1]; pos.Group > last.Group || (pos.Group == last.Group && pos.Entry > last.Entry) {
				if pos != end {
					cuts = append(cuts, pos)
				}
			}
			k++
		}
		acc += gb
	}
	cuts = append(cuts, end)
	s.blk.cuts = cuts
	return len(cuts) - 1
}

// blockTotals are a request's payload bytes and blocks (segments × ids).
func blockTotals(p *kvlayout.Pair, n int) (total, blocks uint64) {
	for g := 0; g < p.NumGroups(); g++ {
		_, nseg, bl := p.Group(g)
		total += bl * uint64(n)
		blocks += uint64(nseg) * uint64(n)
	}
	return total, blocks
}

// writeBlocks pushes a whole block request as one batch; see
// Handlers.WriteBlocks. Requests over more destination regions than one
// batch can name take transport.WriteStretches.
func (s *qpSet) writeBlocks(ctx context.Context, w *transport.Blocks, sc *transport.BlockScratch) (st transport.Stats, err error) {
	if err := s.Err(); err != nil {
		return st, fmt.Errorf("%w: %w", transport.ErrNotSent, err)
	}
	p := w.Pair
	if len(w.Local) != p.Src().NumRegions() || len(w.Remote) != p.Dst().NumRegions() || w.IDs.N() == 0 || len(w.IDs.Dst) != w.IDs.N() {
		return st, fmt.Errorf("verbs: block write: %d sources and %d destinations for layouts of %d and %d regions, %d ids: %w",
			len(w.Local), len(w.Remote), p.Src().NumRegions(), p.Dst().NumRegions(), w.IDs.N(), errs.ErrInvalidArgument)
	}
	if len(w.Remote) > maxBatchKeys {
		return transport.WriteStretches(ctx, s.Write, w, sc)
	}
	waited, err := s.acquireWrite(ctx, "block write")
	if err != nil {
		return st, err
	}
	defer s.releaseWrite()
	defer func() { st.Post += waited }()
	t0 := time.Now()
	if err := s.holdLocal("block write", w.Local); err != nil {
		return st, err
	}
	defer s.releaseLocal()
	tab, err := s.blockTable(p, false)
	if err != nil {
		return st, err
	}
	curs, err := s.cursors()
	if err != nil {
		return st, err
	}
	host, err := s.setRegions("block write", tab, p, w.Remote, false)
	if err != nil {
		return st, err
	}
	keys := s.blk.keys[:0]
	for _, d := range w.Remote {
		keys = append(keys, uint32(d.Key.Key))
	}
	s.blk.keys = keys
	t := s.t
	cfg := &t.cfg
	n := w.IDs.N()
	total, blocks := blockTotals(p, n)
	want := int((total + uint64(cfg.MinQPBytes) - 1) / uint64(cfg.MinQPBytes))
	nq := s.blockCuts(p, n, total, min(len(s.qps), max(want, 1)))
	st.Plan += time.Since(t0)

	s.tag = nextTag(s.tag)
	tag := s.tag
	s.batchBytes = total
	first := s.rot % len(s.qps)
	s.rot++
	if err := s.postKeys(ctx, &st, first, tag, keys); err != nil {
		return st, err
	}
	// The meta says how many keys went ahead in msgKeys.
	if err := s.postMeta(ctx, &st, first, message{tag: tag, nqp: uint32(nq), nkeys: uint32(len(keys)), blocks: blocks, bytes: total}); err != nil {
		return st, err
	}
	params := ibv.ChainParams{Op: ibv.WRWrite, MaxWR: cfg.MaxChain, MaxSGE: t.maxSGE, MaxWRBytes: t.wrBytes,
		MaxChainBytes: uint64(cfg.ChainBytes), SignalEvery: cfg.SignalEvery}
	if host {
		params.InlineMax = t.inline // the CPU reads inline data: never GPU memory
	}
	if err := s.postChains(ctx, &st, tag, first, nq, &params, &chainSource{tab: tab, curs: curs, ids: w.IDs}); err != nil {
		return st, err
	}
	if err := s.awaitAck(ctx, tag, &w.Remote[0]); err != nil {
		if errors.Is(err, errs.ErrNotFound) {
			return st, fmt.Errorf("verbs: block write to %s: one of the %d destination regions (%q first) is no longer registered or exported there: %w",
				s.peer, len(w.Remote), w.Remote[0].Name, err)
		}
		return st, err
	}
	return st, nil
}

// readBlocks pulls a whole block request (Handlers.ReadBlocks). No
// message goes out: the request is in place once every QP completed all
// it posted.
func (s *qpSet) readBlocks(ctx context.Context, r *transport.Blocks, sc *transport.BlockScratch) (st transport.Stats, err error) {
	if err := s.Err(); err != nil {
		return st, fmt.Errorf("%w: %w", transport.ErrNotSent, err)
	}
	p := r.Pair
	if len(r.Remote) != p.Src().NumRegions() || len(r.Local) != p.Dst().NumRegions() || r.IDs.N() == 0 || len(r.IDs.Dst) != r.IDs.N() {
		return st, fmt.Errorf("verbs: block read: %d sources and %d destinations for layouts of %d and %d regions, %d ids: %w",
			len(r.Remote), len(r.Local), p.Src().NumRegions(), p.Dst().NumRegions(), r.IDs.N(), errs.ErrInvalidArgument)
	}
	waited, err := s.acquireWrite(ctx, "block read")
	if err != nil {
		return st, err
	}
	defer s.releaseWrite()
	defer func() { st.Post += waited }()
	t0 := time.Now()
	if err := s.holdLocal("block read", r.Local); err != nil {
		return st, err
	}
	defer s.releaseLocal()
	tab, err := s.blockTable(p, true)
	if err != nil {
		return st, err
	}
	curs, err := s.cursors()
	if err != nil {
		return st, err
	}
	if _, err := s.setRegions("block read", tab, p, r.Remote, true); err != nil {
		return st, err
	}
	t := s.t
	cfg := &t.cfg
	n := r.IDs.N()
	total, _ := blockTotals(p, n)
	want := int((total + uint64(cfg.MinQPBytes) - 1) / uint64(cfg.MinQPBytes))
	nq := s.blockCuts(p, n, total, min(len(s.qps), max(want, 1)))
	st.Plan += time.Since(t0)

	s.tag = nextTag(s.tag) // names the request in errors only
	tag := s.tag
	s.batchBytes = total
	s.readTag = tag
	defer func() { s.readTag = 0 }()
	first := s.rot % len(s.qps)
	s.rot++
	params := ibv.ChainParams{Op: ibv.WRRead, MaxWR: cfg.MaxChain, MaxSGE: t.maxSGERd,
		MaxWRBytes: min(t.wrBytes, uint64(cfg.ReadWRBytes)), MaxChainBytes: uint64(cfg.ChainBytes), SignalEvery: cfg.SignalEvery}
	if err := s.postChains(ctx, &st, tag, first, nq, &params, &chainSource{tab: tab, curs: curs, ids: r.IDs}); err != nil {
		return st, err
	}
	return st, s.awaitReads(ctx, tag, first, nq)
}

// postKeys sends a multi-region batch's destination rkeys on QP first,
// ahead of its meta, keysPerMsg a message, unsignaled (the meta's
// completion returns their credits). Each message has its own slot of the
// control buffer after the meta's: none is reused before the ack.
func (s *qpSet) postKeys(ctx context.Context, st *transport.Stats, first int, tag uint32, keys []uint32) error {
	q0 := s.qps[first]
	nmsg := (len(keys) + keysPerMsg - 1) / keysPerMsg
	for q0.avail() < nmsg+1 {
		if err := s.waitCredit(ctx, tag); err != nil {
			return err
		}
	}
	t0 := time.Now()
	buf := s.ctlMem.Bytes()
	for j := 0; j < nmsg; j++ {
		lo := j * keysPerMsg
		hi := min(lo+keysPerMsg, len(keys))
		off := (j + 1) * recvBufLen
		encodeKeys(buf[off:off+recvBufLen], tag, uint32(lo), keys[lo:hi])
		if err := s.sendCtl(q0, ibv.KindMeta, uint32(off), recvBufLen, false); err != nil {
			s.fail(err, true)
			return err
		}
		st.WorkRequests++
	}
	st.Post += time.Since(t0)
	return nil
}
