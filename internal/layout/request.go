package layout

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/b2bd/b2bd/internal/errs"
)

// Run is one contiguous copy: Len bytes from SrcOff in source region
// SrcRegion to DstOff in destination region DstRegion (indices into the
// layouts' Regions). It covers Len / Pair.GroupBlockLen(Group) consecutive
// entries of the request starting at index First, in segment group Group.
// Its fields are plain integers in a fixed order (40 bytes, no padding), so
// C code can walk a []Run as an array of structs.
type Run struct {
	SrcOff    uint64
	DstOff    uint64
	Len       uint64
	SrcRegion uint32
	DstRegion uint32
	Group     uint32
	First     uint32
}

// group is one or more consecutive segments fused on both sides: when
// segment k+1 starts right where segment k's block ends, in the same region
// with the same stride, on the source and on the destination alike, block b
// of both is one contiguous range (an allocation holding every layer of a
// block, vLLM's cross-layer layout, makes one run per block instead of 160).
type group struct {
	firstSeg, numSegs    uint32
	srcRegion, dstRegion uint32
	srcBase, dstBase     uint64
	srcStride, dstStride uint64
	blockLen             uint64
	mergeable            bool // stride == block on both sides: consecutive ids merge
}

// Pair is a compatible (source, destination) pair of layouts, with the
// expansion templates fused once. A daemon builds it per transfer, or caches
// it per layout pair; it is immutable and safe to share.
type Pair struct {
	src, dst *Layout
	lim      Limits
	groups   []group
}

// NewPair checks that src and dst are compatible and builds the templates.
// lim bounds the requests the pair will validate.
func NewPair(src, dst *Layout, lim Limits) (*Pair, error) {
	if err := Compatible(src, dst); err != nil {
		return nil, err
	}
	p := &Pair{src: src, dst: dst, lim: lim.withDefaults()}
	for i := range src.tmpl {
		s, d := src.tmpl[i], dst.tmpl[i]
		if k := len(p.groups) - 1; k >= 0 {
			g := &p.groups[k]
			if g.srcRegion == s.Region && g.dstRegion == d.Region && g.srcStride == s.Stride && g.dstStride == d.Stride &&
				g.srcBase+g.blockLen == s.Base && g.dstBase+g.blockLen == d.Base {
				g.numSegs++
				g.blockLen += s.BlockLen
				g.mergeable = g.srcStride == g.blockLen && g.dstStride == g.blockLen
				continue
			}
		}
		p.groups = append(p.groups, group{
			firstSeg: uint32(i), numSegs: 1,
			srcRegion: s.Region, dstRegion: d.Region,
			srcBase: s.Base, dstBase: d.Base,
			srcStride: s.Stride, dstStride: d.Stride,
			blockLen: s.BlockLen, mergeable: s.Stride == s.BlockLen && d.Stride == d.BlockLen,
		})
	}
	return p, nil
}

// Src and Dst are the pair's layouts.
func (p *Pair) Src() *Layout { return p.src }
func (p *Pair) Dst() *Layout { return p.dst }

// NumGroups is the number of fused segment groups (Run.Group indexes them).
func (p *Pair) NumGroups() int { return len(p.groups) }

// Group returns the segments group g covers: segments first .. first+n-1,
// whose blocks, together, are blockLen bytes.
func (p *Pair) Group(g int) (first, n int, blockLen uint64) {
	gr := p.groups[g]
	return int(gr.firstSeg), int(gr.numSegs), gr.blockLen
}

// GroupTemplate is a fused group's expansion template, for transports that
// expand ids themselves (verbs copies these into C once per pair): block b
// of the group is BlockLen bytes at SrcBase + b*SrcStride in source region
// SrcRegion and DstBase + b*DstStride in destination region DstRegion
// (indices into the layouts' Regions). Mergeable says consecutive ids
// merge into one run (stride == BlockLen on both sides), as Expand does.
type GroupTemplate struct {
	SrcRegion, DstRegion uint32
	SrcBase, DstBase     uint64
	SrcStride, DstStride uint64
	BlockLen             uint64
	Mergeable            bool
}

// GroupTemplate returns group g's template.
func (p *Pair) GroupTemplate(g int) GroupTemplate {
	gr := &p.groups[g]
	return GroupTemplate{SrcRegion: gr.srcRegion, DstRegion: gr.dstRegion, SrcBase: gr.srcBase, DstBase: gr.dstBase,
		SrcStride: gr.srcStride, DstStride: gr.dstStride, BlockLen: gr.blockLen, Mergeable: gr.mergeable}
}

// Request is a block-id request as it arrives on the wire: packed
// little-endian uint32 arrays. Entry i moves block SrcIDs[i] of every source
// segment to block DstIDs[i] of the matching destination segment.
// SrcField and DstField name the fields in error messages (default "src_ids"
// and "dst_ids"; the RPC passes its own, e.g. "local_block_ids").
type Request struct {
	SrcIDs, DstIDs     []byte
	SrcField, DstField string
}

// IDs is a validated request: the ids (aliasing the request's bytes, or the
// Planner's scratch) and the request's runs of consecutive ids. It is valid
// until the Planner's next Validate, and the request's bytes must not change
// meanwhile.
type IDs struct {
	Src, Dst []uint32
	runs     []idRun
}

// N is the number of ids.
func (ids IDs) N() int { return len(ids.Src) }

// idRun is a maximal range of entries whose source and destination ids both
// go up by one: entries first .. first+count-1.
type idRun struct{ first, count uint32 }

// Planner holds the scratch of request validation: the destination bitmap,
// decode buffers and id runs. Steady-state validation allocates nothing. A
// Planner is not safe for concurrent use: take one from Planners.
type Planner struct {
	bitmap   []uint64 // all zero between calls
	src, dst []uint32
	runs     []idRun
}

// Planners hands out Planners, so that bitmaps are reused across requests.
var Planners = sync.Pool{New: func() any { return new(Planner) }}

// Validate decodes and validates req for p in O(n): equal, non-zero counts
// under the limits, every id below its layout's num_blocks, destination ids
// unique (source ids may repeat). Every error wraps errs.ErrInvalidArgument or
// errs.ErrResourceExhausted and names the field, the index, the value and the limit;
// an id not below its layout's num_blocks is a *GeometryError of its side.
func (w *Planner) Validate(p *Pair, req Request) (IDs, error) {
	sf, df := req.SrcField, req.DstField
	if sf == "" {
		sf = "src_ids"
	}
	if df == "" {
		df = "dst_ids"
	}
	if len(req.SrcIDs)%4 != 0 {
		return IDs{}, fmt.Errorf("%w: %s is %d bytes, not a whole number of little-endian uint32s", errs.ErrInvalidArgument, sf, len(req.SrcIDs))
	}
	if len(req.DstIDs)%4 != 0 {
		return IDs{}, fmt.Errorf("%w: %s is %d bytes, not a whole number of little-endian uint32s", errs.ErrInvalidArgument, df, len(req.DstIDs))
	}
	n := len(req.SrcIDs) / 4
	if n == 0 {
		return IDs{}, fmt.Errorf("%w: %s is empty: a request needs at least one block id", errs.ErrInvalidArgument, sf)
	}
	if m := len(req.DstIDs) / 4; m != n {
		return IDs{}, fmt.Errorf("%w: %s has %d ids, %s has %d: they must be equal", errs.ErrInvalidArgument, df, m, sf, n)
	}
	if err := checkCount(sf, uint64(n), p.src.NumSegments(), p.lim); err != nil {
		return IDs{}, err
	}
	src, dst := view(req.SrcIDs, &w.src), view(req.DstIDs, &w.dst)
	srcN, dstN := p.src.numBlocks, p.dst.numBlocks
	words := int((dstN + 63) / 64)
	if len(w.bitmap) < words {
		w.bitmap = make([]uint64, words) // zeroed; kept zero between calls
	}
	bm := w.bitmap[:words]
	runs := w.runs[:0]
	for i, s := range src {
		d := dst[i]
		if uint64(s) >= srcN || uint64(d) >= dstN {
			w.clear(dst[:i])
			if uint64(s) >= srcN {
				return IDs{}, &GeometryError{Src: true, Err: fmt.Errorf("%w: %s[%d] = %d is not below layout %q's num_blocks %d", errs.ErrInvalidArgument, sf, i, s, p.src.name, srcN)}
			}
			return IDs{}, &GeometryError{Dst: true, Err: fmt.Errorf("%w: %s[%d] = %d is not below layout %q's num_blocks %d", errs.ErrInvalidArgument, df, i, d, p.dst.name, dstN)}
		}
		word, bit := &bm[d>>6], uint64(1)<<(d&63)
		if *word&bit != 0 {
			w.clear(dst[:i])
			first := slices.Index(dst[:i], d)
			return IDs{}, fmt.Errorf("%w: %s[%d] = %d repeats %s[%d]: destination ids must be unique", errs.ErrInvalidArgument, df, i, d, df, first)
		}
		*word |= bit
		if i > 0 && s == src[i-1]+1 && d == dst[i-1]+1 {
			runs[len(runs)-1].count++
			continue
		}
		runs = append(runs, idRun{uint32(i), 1})
	}
	w.clear(dst)
	w.runs = runs
	return IDs{Src: src, Dst: dst, runs: runs}, nil
}

// checkCount applies the count limits; n is uint64 so that 2^32 ids, which
// no uint32 index could name, are refused by the same words.
func checkCount(field string, n uint64, segments int, lim Limits) error {
	if n > uint64(lim.MaxIDs) {
		return fmt.Errorf("%w: %s has %d ids, over the limit of %d per request", errs.ErrResourceExhausted, field, n, lim.MaxIDs)
	}
	if total := n * uint64(segments); total > uint64(lim.MaxRequestBlocks) {
		return fmt.Errorf("%w: %s: %d ids × %d segments = %d blocks, over the limit of %d per request", errs.ErrResourceExhausted, field, n, segments, total, lim.MaxRequestBlocks)
	}
	return nil
}

// clear zeroes the bits ids set: per id when they are few, the whole bitmap
// when that is fewer words.
func (w *Planner) clear(ids []uint32) {
	if len(ids) > len(w.bitmap) {
		clear(w.bitmap)
		return
	}
	for _, d := range ids {
		w.bitmap[d>>6] = 0
	}
}

// Expand appends every run of ids, validated for p, to runs and returns
// the extended slice; once runs has grown to a request's size it allocates
// nothing. Runs come segment-major: every run of segment group 0, then
// group 1, and so on. That order keeps one (source region, destination
// region) pair, and so one key pair, per stretch of work requests; lets
// rails split the work into contiguous stretches; and maps a failed stretch
// back to ids of one group. Within a group, runs follow the request's order.
func (p *Pair) Expand(runs []Run, ids IDs) []Run {
	var c Cursor
	return p.ExpandFrom(runs, ids, &c, p.NumRuns(ids))
}

// NumRuns is the number of runs ids expand to.
func (p *Pair) NumRuns(ids IDs) int {
	total := 0
	for g := range p.groups {
		if p.groups[g].mergeable {
			total += len(ids.runs)
		} else {
			total += len(ids.Src)
		}
	}
	return total
}

// Cursor is a position in a request's expansion (the zero Cursor is its
// start), so that a transport can expand a chunk, post it, and go on: a
// chunk of a few hundred runs stays in the first-level cache instead of
// writing a 3 MB list per request.
type Cursor struct{ group, entry int }

// Done says whether c has passed the last run of p's groups.
func (c *Cursor) Done(p *Pair) bool { return c.group >= len(p.groups) }

// ExpandFrom appends at most limit runs of ids, from c on, in Expand's order,
// and advances c past them.
func (p *Pair) ExpandFrom(runs []Run, ids IDs, c *Cursor, limit int) []Run {
	base := len(runs)
	runs = slices.Grow(runs, limit)
	out := runs[base : base+limit]
	k := 0
	src := ids.Src
	dst := ids.Dst[:len(src)]
	for k < limit && c.group < len(p.groups) {
		g := c.group
		gr := &p.groups[g]
		if gr.mergeable {
			idr := ids.runs[c.entry:min(len(ids.runs), c.entry+limit-k)]
			o := out[k : k+len(idr)]
			o = o[:len(idr)]
			sb, ss, db, ds, bl := gr.srcBase, gr.srcStride, gr.dstBase, gr.dstStride, gr.blockLen
			sr, dr, gi := gr.srcRegion, gr.dstRegion, uint32(g)
			for i, x := range idr {
				r := &o[i]
				r.SrcOff = sb + uint64(src[x.first])*ss
				r.DstOff = db + uint64(dst[x.first])*ds
				r.Len = uint64(x.count) * bl
				r.SrcRegion, r.DstRegion = sr, dr
				r.Group, r.First = gi, x.first
			}
			k += len(idr)
			c.entry += len(idr)
			if c.entry == len(ids.runs) {
				c.group, c.entry = g+1, 0
			}
			continue
		}
		j0 := c.entry
		j1 := min(len(src), j0+limit-k)
		o := out[k : k+j1-j0]
		s, d := src[j0:j1], dst[j0:j1]
		d = d[:len(s)]
		o = o[:len(s)]
		// The group's fields in locals and stores field by field: the
		// compiler keeps them in registers and writes each run once.
		sb, ss, db, ds, bl := gr.srcBase, gr.srcStride, gr.dstBase, gr.dstStride, gr.blockLen
		sr, dr, gi := gr.srcRegion, gr.dstRegion, uint32(g)
		for i := range s {
			r := &o[i]
			r.SrcOff = sb + uint64(s[i])*ss
			r.DstOff = db + uint64(d[i])*ds
			r.Len = bl
			r.SrcRegion, r.DstRegion = sr, dr
			r.Group, r.First = gi, uint32(j0+i)
		}
		k += j1 - j0
		c.entry = j1
		if c.entry == len(src) {
			c.group, c.entry = g+1, 0
		}
	}
	return runs[:base+k]
}

// Plan validates req and appends its runs: Validate, then Expand.
func (w *Planner) Plan(runs []Run, p *Pair, req Request) ([]Run, error) {
	ids, err := w.Validate(p, req)
	if err != nil {
		return runs, err
	}
	return p.Expand(runs, ids), nil
}

// view reinterprets packed little-endian bytes as []uint32 without copying
// when the host is little-endian and b is 4-byte aligned; else it decodes
// into scratch.
func view(b []byte, scratch *[]uint32) []uint32 {
	n := len(b) / 4
	if hostLittleEndian && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 == 0 {
		return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(b))), n)
	}
	if cap(*scratch) < n {
		*scratch = make([]uint32, n)
	}
	s := (*scratch)[:n]
	for i := range s {
		s[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return s
}

var hostLittleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// PackIDs encodes ids as packed little-endian uint32s (for clients and tests).
func PackIDs(ids []uint32) []byte {
	out := make([]byte, 4*len(ids))
	for i, x := range ids {
		binary.LittleEndian.PutUint32(out[4*i:], x)
	}
	return out
}

// GroupRuns is the number of runs group g expands to for ids: one per
// run of consecutive ids when its blocks merge, else one per id.
func (p *Pair) GroupRuns(ids IDs, g int) int {
	if p.groups[g].mergeable {
		return len(ids.runs)
	}
	return len(ids.Src)
}

// GroupRegions are group g's source and destination regions (indices
// into the layouts' Regions).
func (p *Pair) GroupRegions(g int) (src, dst uint32) {
	gr := &p.groups[g]
	return gr.srcRegion, gr.dstRegion
}

// GroupEnds bound group g's runs for any validated request: every run of
// it lies below srcEnd in its source region and below dstEnd in its
// destination region (the extents of its last blocks). A transport checks
// these against its memory once per group, not once per run.
func (p *Pair) GroupEnds(g int) (srcEnd, dstEnd uint64) {
	gr := &p.groups[g]
	return gr.srcBase + (p.src.numBlocks-1)*gr.srcStride + gr.blockLen,
		gr.dstBase + (p.dst.numBlocks-1)*gr.dstStride + gr.blockLen
}

// GroupBytes is the bytes group g moves for ids.
func (p *Pair) GroupBytes(ids IDs, g int) uint64 {
	return uint64(len(ids.Src)) * p.groups[g].blockLen
}

// Seek is the cursor at run `run` of the expansion counted from the start
// of group g (run may reach into later groups).
func (p *Pair) Seek(ids IDs, g, run int) Cursor {
	for g < len(p.groups) {
		n := p.GroupRuns(ids, g)
		if run < n {
			return Cursor{group: g, entry: run}
		}
		run -= n
		g++
	}
	return Cursor{group: g}
}
