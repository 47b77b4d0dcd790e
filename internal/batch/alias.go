package batch

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/region"
)

// A batch from this daemon to itself may name one memory on both sides:
// a region into its own export, or two registrations of one file. Where a
// block's source overlaps a block's destination there, the result depends
// on the order in which the kind copies (the same-host path copies
// forward in chunks, tcp through the socket, the copy engines in
// parallel): no kind can promise every byte, so such a batch is refused
// before it moves one (ad hoc, async, triggered and prepared batches).
// Batches between daemons never share memory this way, except through one
// file handed to both (the caller's to keep apart); block-id transfers
// are not checked: a block onto itself copies its own bytes, and only two
// layouts laid over one region at different offsets could overlap.

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
// overlaps a block j's destination range (dstBase+Dst[j], Len[j]): a sweep
// over both sets of ranges by start. Sources may overlap each other, and
// the destinations were checked apart (desc).
func overlap(b *desc.Batch, srcBase, dstBase uint64) (i, j int, found bool) {
	n := b.N()
	type rng struct {
		start, end uint64
		idx        int
		dst        bool
	}
	rs := make([]rng, 0, 2*n)
	for k := 0; k < n; k++ {
		rs = append(rs, rng{srcBase + b.Src[k], srcBase + b.Src[k] + b.Len[k], k, false},
			rng{dstBase + b.Dst[k], dstBase + b.Dst[k] + b.Len[k], k, true})
	}
	slices.SortFunc(rs, func(a, b rng) int { return cmp.Compare(a.start, b.start) })
	// The range of each side that reaches furthest among those started.
	var far [2]rng
	var seen [2]bool
	for _, r := range rs {
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
