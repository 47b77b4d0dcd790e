// Package layout holds block tables ("layouts") for KV-cache transfers by
// block id: a layout is a named, ordered list of segments, each a strided
// array of equal blocks in one region, and block id b means block b of every
// segment. The package validates layouts once (at registration), checks that
// two layouts are compatible, validates block-id requests in O(n) with a
// pooled bitmap, and expands a request into merged copy runs in a reusable
// buffer. It knows region names and sizes, not memory: the daemon resolves
// regions and the transports post the runs.
package layout

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/b2bd/b2bd/internal/errs"
)

// Limits bound layouts and requests. Zero fields take the defaults.
const (
	// MaxNameLen bounds layout names, as region export names are bounded.
	MaxNameLen = 128
	// DefaultMaxSegments bounds segments per layout: Llama-70B has 160
	// (80 layers × K, V), the largest dense models about 250.
	DefaultMaxSegments = 4096
	// DefaultMaxBlocks bounds num_blocks; a destination bitmap is
	// num_blocks/8 bytes (2 MiB at this limit), pooled.
	DefaultMaxBlocks = 1 << 24
	// DefaultMaxIDs bounds ids per request (and can never exceed 2^32-1:
	// a count must fit the uint32 indices that runs carry).
	DefaultMaxIDs = 1 << 24
	// DefaultMaxRequestBlocks bounds ids × segments: the runs one request
	// can expand to before merging (81,920 for the request).
	DefaultMaxRequestBlocks = 1 << 22
)

// Limits are the bounds a layout or a request is validated against.
type Limits struct {
	MaxSegments      int
	MaxBlocks        uint64
	MaxIDs           int
	MaxRequestBlocks int
}

func (l Limits) withDefaults() Limits {
	if l.MaxSegments <= 0 {
		l.MaxSegments = DefaultMaxSegments
	}
	if l.MaxBlocks == 0 {
		l.MaxBlocks = DefaultMaxBlocks
	}
	if l.MaxBlocks > 1<<32 {
		l.MaxBlocks = 1 << 32 // ids are uint32
	}
	if l.MaxIDs <= 0 || uint64(l.MaxIDs) > math.MaxUint32 {
		l.MaxIDs = DefaultMaxIDs
	}
	if l.MaxRequestBlocks <= 0 || uint64(l.MaxRequestBlocks) > math.MaxUint32 {
		l.MaxRequestBlocks = DefaultMaxRequestBlocks
	}
	return l
}

// Segment is one strided array of blocks in a region: block b is the
// BlockLen bytes at Offset + b*Stride.
type Segment struct {
	Region    string
	Offset    uint64
	BlockLen  uint64
	Stride    uint64
	NumBlocks uint64
}

// Region is a region a layout uses, with the size it had at construction.
type Region struct {
	Name string
	Size uint64
}

// Template is a segment resolved for expansion: block b is BlockLen bytes at
// Base + b*Stride in region Region (an index into Layout.Regions). Built once
// at construction, so that expansion is a multiply-add per block.
type Template struct {
	Region   uint32
	Base     uint64
	Stride   uint64
	BlockLen uint64
}

// Layout is a validated block table. It is immutable and safe to share.
type Layout struct {
	name      string
	numBlocks uint64
	segs      []Segment
	regions   []Region
	tmpl      []Template
}

// Name is the layout's name.
func (l *Layout) Name() string { return l.name }

// NumBlocks is the number of blocks of every segment: valid ids are below it.
func (l *Layout) NumBlocks() uint64 { return l.numBlocks }

// NumSegments is the number of segments.
func (l *Layout) NumSegments() int { return len(l.segs) }

// Segment returns segment i as given at construction.
func (l *Layout) Segment(i int) Segment { return l.segs[i] }

// Template returns segment i's expansion template.
func (l *Layout) Template(i int) Template { return l.tmpl[i] }

// Regions are the distinct regions of the layout, in order of first use;
// Template.Region and Run's region fields index this list.
func (l *Layout) Regions() []Region { return slices.Clone(l.regions) }

// NumRegions is len(Regions()), without the copy.
func (l *Layout) NumRegions() int { return len(l.regions) }

// New validates segs and builds a layout. regionSize resolves a region name
// to its size in bytes (the daemon passes its registry's lookup; its errors
// are wrapped with the segment index). Validation is O(segments), plus the
// overlap check among segments sharing a region, whose extents interleave.
//
// Every refusal wraps errs.ErrInvalidArgument (malformed), errs.ErrResourceExhausted
// (over a limit) or regionSize's error, and names the field, the index and the limit.
func New(name string, segs []Segment, regionSize func(region string) (uint64, error), lim Limits) (*Layout, error) {
	lim = lim.withDefaults()
	switch {
	case name == "":
		return nil, fmt.Errorf("%w: layout name is empty", errs.ErrInvalidArgument)
	case len(name) > MaxNameLen:
		return nil, fmt.Errorf("%w: layout name is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(name), MaxNameLen)
	case len(segs) == 0:
		return nil, fmt.Errorf("%w: layout %q: segments is empty: a layout needs at least one segment", errs.ErrInvalidArgument, name)
	case len(segs) > lim.MaxSegments:
		return nil, fmt.Errorf("%w: layout %q: segments has %d entries, over the limit of %d", errs.ErrResourceExhausted, name, len(segs), lim.MaxSegments)
	}
	n := segs[0].NumBlocks
	switch {
	case n == 0:
		return nil, fmt.Errorf("%w: layout %q: segments[0].num_blocks is 0: a segment needs at least one block", errs.ErrInvalidArgument, name)
	case n > lim.MaxBlocks:
		return nil, fmt.Errorf("%w: layout %q: segments[0].num_blocks = %d, over the limit of %d", errs.ErrResourceExhausted, name, n, lim.MaxBlocks)
	}
	l := &Layout{name: name, numBlocks: n, segs: slices.Clone(segs), tmpl: make([]Template, len(segs))}
	index := make(map[string]uint32, 4)
	ends := make([]uint64, len(segs)) // exclusive end of each segment's extent
	for i, s := range segs {
		switch {
		case s.NumBlocks != n:
			return nil, fmt.Errorf("%w: layout %q: segments[%d].num_blocks = %d differs from segments[0].num_blocks = %d: every segment of a layout has the same number of blocks",
				errs.ErrInvalidArgument, name, i, s.NumBlocks, n)
		case s.Region == "":
			return nil, fmt.Errorf("%w: layout %q: segments[%d].region is empty", errs.ErrInvalidArgument, name, i)
		case s.BlockLen == 0:
			return nil, fmt.Errorf("%w: layout %q: segments[%d].block_len is 0: a block needs at least one byte", errs.ErrInvalidArgument, name, i)
		case s.Stride < s.BlockLen:
			// Refused even for one block: a stride below the block would
			// make blocks b and b+1 overlap, so unique destination ids
			// would no longer mean disjoint destination bytes.
			return nil, fmt.Errorf("%w: layout %q: segments[%d].stride = %d is below block_len = %d: blocks of one segment would overlap",
				errs.ErrInvalidArgument, name, i, s.Stride, s.BlockLen)
		}
		ri, ok := index[s.Region]
		if !ok {
			size, err := regionSize(s.Region)
			if err != nil {
				return nil, fmt.Errorf("layout %q: segments[%d].region %q: %w", name, i, s.Region, err)
			}
			ri = uint32(len(l.regions))
			index[s.Region] = ri
			l.regions = append(l.regions, Region{Name: s.Region, Size: size})
		}
		size := l.regions[ri].Size
		end, ok := extentEnd(s)
		if !ok {
			return nil, fmt.Errorf("%w: layout %q: segments[%d].offset + (num_blocks-1)*stride + block_len = %d + %d*%d + %d overflows 64 bits (region %q size %d)",
				errs.ErrInvalidArgument, name, i, s.Offset, n-1, s.Stride, s.BlockLen, s.Region, size)
		}
		if end > size {
			return nil, fmt.Errorf("%w: layout %q: segments[%d].offset + (num_blocks-1)*stride + block_len = %d + %d*%d + %d = %d > region %q size %d",
				errs.ErrInvalidArgument, name, i, s.Offset, n-1, s.Stride, s.BlockLen, end, s.Region, size)
		}
		ends[i] = end
		l.tmpl[i] = Template{Region: ri, Base: s.Offset, Stride: s.Stride, BlockLen: s.BlockLen}
	}
	if err := l.checkDisjoint(ends); err != nil {
		return nil, err
	}
	return l, nil
}

// extentEnd is Offset + (NumBlocks-1)*Stride + BlockLen, or false when that
// overflows 64 bits.
func extentEnd(s Segment) (uint64, bool) {
	hi, span := bits.Mul64(s.NumBlocks-1, s.Stride)
	if hi != 0 {
		return 0, false
	}
	e, c1 := bits.Add64(s.Offset, span, 0)
	e, c2 := bits.Add64(e, s.BlockLen, 0)
	return e, c1 == 0 && c2 == 0
}

// checkDisjoint refuses segments that share bytes: a layout used as a
// destination would otherwise write some bytes twice, in an order nobody
// chose. Segments sorted by (region, offset) are compared only with earlier
// ones whose extent reaches them, so separate tensors cost O(s log s); only
// interleaved segments (one allocation holding every layer per block) are
// compared pairwise, each in O(1).
func (l *Layout) checkDisjoint(ends []uint64) error {
	order := make([]int, len(l.segs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := cmp.Compare(l.tmpl[a].Region, l.tmpl[b].Region); c != 0 {
			return c
		}
		return cmp.Compare(l.tmpl[a].Base, l.tmpl[b].Base)
	})
	var active []int // earlier segments of the current region whose extent may reach the next
	for k, i := range order {
		if k > 0 && l.tmpl[order[k-1]].Region != l.tmpl[i].Region {
			active = active[:0]
		}
		s := l.segs[i]
		w := 0
		for _, j := range active {
			if ends[j] <= s.Offset {
				continue // ends before i starts, so before every later one too
			}
			active[w] = j
			w++
			if err := l.checkPair(j, i, ends); err != nil {
				return err
			}
		}
		active = append(active[:w], i)
	}
	return nil
}

// checkPair reports whether segments a and b (a's offset <= b's, same
// region, overlapping extents) share a byte.
func (l *Layout) checkPair(a, b int, ends []uint64) error {
	sa, sb := l.segs[a], l.segs[b]
	lo, hi := min(a, b), max(a, b)
	n := l.numBlocks
	if n > 1 && sa.Stride != sb.Stride {
		return fmt.Errorf("%w: layout %q: segments[%d] and segments[%d] interleave in region %q with different strides (%d and %d): b2bd refuses segments it cannot prove disjoint",
			errs.ErrInvalidArgument, l.name, lo, hi, sa.Region, l.segs[lo].Stride, l.segs[hi].Stride)
	}
	overlap := true
	if n > 1 {
		// Same stride S: b's block j starts q slots and r bytes after a's
		// block 0 (d = q*S + r). It can only meet a's block q+j (when
		// r < a's length) or q+j+1 (when it runs past the slot's end).
		S := sa.Stride
		d := sb.Offset - sa.Offset
		q, r := d/S, d%S
		overlap = (q < n && r < sa.BlockLen) || (q+1 < n && sb.BlockLen > S-r)
	}
	if overlap {
		return fmt.Errorf("%w: layout %q: segments[%d] [%d,%d) and segments[%d] [%d,%d) overlap in region %q: a layout's segments must not share bytes",
			errs.ErrInvalidArgument, l.name, lo, l.segs[lo].Offset, ends[lo], hi, l.segs[hi].Offset, ends[hi], sa.Region)
	}
	return nil
}

// Compatible checks that blocks of src can be copied into blocks of dst:
// the same number of segments and equal block_len per segment. A refusal
// is a *GeometryError of both sides.
func Compatible(src, dst *Layout) error {
	if len(src.segs) != len(dst.segs) {
		return &GeometryError{Src: true, Dst: true, Err: fmt.Errorf("%w: layouts %q and %q are incompatible: %q has %d segments, %q has %d",
			errs.ErrInvalidArgument, src.name, dst.name, src.name, len(src.segs), dst.name, len(dst.segs))}
	}
	for i := range src.segs {
		if a, b := src.segs[i].BlockLen, dst.segs[i].BlockLen; a != b {
			return &GeometryError{Src: true, Dst: true, Err: fmt.Errorf("%w: layouts %q and %q are incompatible: segments[%d].block_len is %d in %q and %d in %q",
				errs.ErrInvalidArgument, src.name, dst.name, i, a, src.name, b, dst.name)}
		}
	}
	return nil
}
