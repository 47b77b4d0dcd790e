package batch

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
)

// A batch from this daemon to itself may name one memory on both sides:
// a region into its own export, or two registrations of one file. Where a
// block's source overlaps a block's destination there, the result depends
// on the order in which the kind copies (the same-host path copies
// forward in chunks, tcp through the socket, the copy engines in
// parallel): no kind can promise every byte, so such a batch is refused
// before it moves one (ad hoc, async, triggered and prepared batches, and
// block-id transfers). Batches between daemons never share memory this
// way, except through one file handed to both (the caller's to keep
// apart).

// checkSelfOverlap refuses b (Src offsets in the source, Dst in the
// destination) when peer is this daemon, the export dst is memory that
// local (this side's region: the source of a write, the destination of a
// read) shares, and a source range overlaps a destination range there.
func (s *Service) checkSelfOverlap(peer, dst string, local *region.Region, b *desc.Batch, op Op) error {
	if s.cfg.Self == 0 || b == nil || b.N() == 0 || s.paths.peers.Instance(peer) != s.cfg.Self {
		return nil
	}
	remote := s.cfg.Registry.Exported(dst)
	if remote == nil {
		return nil // the resolution refuses it
	}
	ls, ok := s.cfg.Registry.SpanOf(local)
	if !ok {
		return nil
	}
	rs, ok := s.cfg.Registry.SpanOf(remote)
	if !ok || !ls.Overlaps(rs) {
		return nil
	}
	src, dstSpan := ls, rs
	if op == OpRead {
		src, dstSpan = rs, ls
	}
	i, j, ok := overlap(b, src.Base, dstSpan.Base)
	if !ok {
		return nil
	}
	srcField, dstField := "src_offsets", "dst_offsets"
	if op == OpRead { // the request's src_offsets are the pull's destination
		srcField, dstField = "dst_offsets", "src_offsets"
	}
	return fmt.Errorf("%w: %s[%d] [%d, +%d) overlaps %s[%d] [%d, +%d) in the same memory (region %s and export %q on this daemon): a batch's source and destination must not overlap",
		errs.ErrInvalidArgument, srcField, i, b.Src[i], b.Len[i], dstField, j, b.Dst[j], b.Len[j], local.ID, dst)
}

// overlap finds a block i whose source range (srcBase+Src[i], Len[i])
// overlaps a block j's destination range (dstBase+Dst[j], Len[j]). Sources
// may overlap each other, and the destinations were checked apart (desc).
func overlap(b *desc.Batch, srcBase, dstBase uint64) (i, j int, found bool) {
	n := b.N()
	rs := make([]rng, 0, 2*n)
	for k := 0; k < n; k++ {
		rs = append(rs, rng{0, srcBase + b.Src[k], srcBase + b.Src[k] + b.Len[k], k, false},
			rng{0, dstBase + b.Dst[k], dstBase + b.Dst[k] + b.Len[k], k, true})
	}
	return firstOverlap(rs)
}

// rng is a byte range of one memory (space: an index the caller gives
// each region.SpaceID), a source's or a destination's (dst), of block idx.
type rng struct {
	space, start, end uint64
	idx               int
	dst               bool
}

// firstOverlap finds a source range and a destination range that share a
// byte, by a sweep over all of them by (space, start): it returns their
// idx. It reorders rs.
func firstOverlap(rs []rng) (srcIdx, dstIdx int, found bool) {
	slices.SortFunc(rs, func(a, b rng) int {
		if c := cmp.Compare(a.space, b.space); c != 0 {
			return c
		}
		return cmp.Compare(a.start, b.start)
	})
	// The range of each side that reaches furthest among those started in
	// this space.
	var far [2]rng
	var seen [2]bool
	for k, r := range rs {
		if k > 0 && r.space != rs[k-1].space {
			seen = [2]bool{}
		}
		side, other := 0, 1
		if r.dst {
			side, other = 1, 0
		}
		if seen[other] && far[other].end > r.start {
			if r.dst {
				return far[other].idx, r.idx, true
			}
			return r.idx, far[other].idx, true
		}
		if !seen[side] || r.end > far[side].end {
			far[side], seen[side] = r, true
		}
	}
	return 0, 0, false
}

// checkSelfBlocks is checkSelfOverlap for a block-id transfer of pair
// (source layout first) and ids, the remote layout resolved as rl: two
// entries' blocks (one id onto another, as a permutation does) or two
// layouts laid over one region overlap there too.
func (s *Service) checkSelfBlocks(r *BlocksRequest, local []*region.Region, rl *transport.LayoutResolution, pair *layout.Pair, ids layout.IDs) error {
	if s.cfg.Self == 0 || ids.N() == 0 || s.paths.peers.Instance(r.Peer) != s.cfg.Self {
		return nil
	}
	spaces := map[region.SpaceID]uint64{}
	spanOf := func(g *region.Region) (sp region.Span, space uint64, ok bool) {
		if g == nil {
			return sp, 0, false
		}
		if sp, ok = s.cfg.Registry.SpanOf(g); !ok {
			return sp, 0, false
		}
		space, seen := spaces[sp.Space]
		if !seen {
			space = uint64(len(spaces))
			spaces[sp.Space] = space
		}
		return sp, space, true
	}
	type placed struct {
		sp    region.Span
		space uint64
		ok    bool
	}
	mine := make([]placed, len(local))
	for i, g := range local {
		mine[i].sp, mine[i].space, mine[i].ok = spanOf(g)
	}
	theirs := make([]placed, len(rl.Regions))
	shared := false
	for i, rr := range rl.Regions {
		t := &theirs[i]
		t.sp, t.space, t.ok = spanOf(s.cfg.Registry.Exported(rr.Name))
		for _, m := range mine {
			shared = shared || (t.ok && m.ok && m.sp.Overlaps(t.sp))
		}
	}
	if !shared {
		return nil
	}
	src, dst := mine, theirs
	if r.Op == OpRead {
		src, dst = theirs, mine
	}
	runs := pair.Expand(nil, ids)
	rs := make([]rng, 0, 2*len(runs))
	for k, run := range runs {
		if int(run.SrcRegion) < len(src) && src[run.SrcRegion].ok {
			p := src[run.SrcRegion]
			rs = append(rs, rng{p.space, p.sp.Base + run.SrcOff, p.sp.Base + run.SrcOff + run.Len, k, false})
		}
		if int(run.DstRegion) < len(dst) && dst[run.DstRegion].ok {
			p := dst[run.DstRegion]
			rs = append(rs, rng{p.space, p.sp.Base + run.DstOff, p.sp.Base + run.DstOff + run.Len, k, true})
		}
	}
	i, j, ok := firstOverlap(rs)
	if !ok {
		return nil
	}
	ei, ej := runs[i].First, runs[j].First
	return fmt.Errorf("%w: entry %d (block %d to %d) overlaps entry %d (block %d to %d) in the same memory (local_layout %q and remote_layout %q on this daemon): a transfer's source and destination blocks must not overlap",
		errs.ErrInvalidArgument, ei, ids.Src[ei], ids.Dst[ei], ej, ids.Src[ej], ids.Dst[ej], r.Local, r.Remote)
}
