package layout

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// contiguousPair is a pair of layouts of segs segments of blockLen-byte
// blocks, each segment its own region with stride == block_len, nSrc and
// nDst blocks per segment.
func contiguousPair(t testing.TB, segs int, blockLen, nSrc, nDst uint64, lim Limits) *Pair {
	t.Helper()
	return NewPairT(t, stridedLayout(t, "src", segs, blockLen, blockLen, nSrc), stridedLayout(t, "dst", segs, blockLen, blockLen, nDst), lim)
}

func stridedLayout(t testing.TB, name string, segs int, blockLen, stride, n uint64) *Layout {
	t.Helper()
	ss := make([]Segment, segs)
	sz := map[string]uint64{}
	for i := range ss {
		r := name + "-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		ss[i] = seg(r, 0, blockLen, stride, n)
		sz[r] = (n-1)*stride + blockLen
	}
	l, err := New(name, ss, sizes(sz), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func NewPairT(t testing.TB, src, dst *Layout, lim Limits) *Pair {
	t.Helper()
	p, err := NewPair(src, dst, lim)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ids(v ...uint32) []byte { return PackIDs(v) }

func TestValidateRejects(t *testing.T) {
	p := contiguousPair(t, 2, 8, 16, 8, Limits{MaxIDs: 6, MaxRequestBlocks: 10})
	cases := []struct {
		name string
		req  Request
		want error
		msg  string
	}{
		{"ragged src", Request{SrcIDs: []byte{1, 0, 0}, DstIDs: ids(0)}, errs.ErrInvalidArgument, "src_ids is 3 bytes, not a whole number of little-endian uint32s"},
		{"ragged dst", Request{SrcIDs: ids(0), DstIDs: make([]byte, 5)}, errs.ErrInvalidArgument, "dst_ids is 5 bytes"},
		{"empty", Request{}, errs.ErrInvalidArgument, "src_ids is empty: a request needs at least one block id"},
		{"empty, named fields", Request{SrcField: "local_block_ids", DstField: "remote_block_ids"}, errs.ErrInvalidArgument, "local_block_ids is empty"},
		{"counts differ", Request{SrcIDs: ids(0, 1), DstIDs: ids(0)}, errs.ErrInvalidArgument, "dst_ids has 1 ids, src_ids has 2: they must be equal"},
		{"dst empty", Request{SrcIDs: ids(0, 1), DstIDs: nil}, errs.ErrInvalidArgument, "dst_ids has 0 ids, src_ids has 2"},
		{"over id limit", Request{SrcIDs: ids(0, 1, 2, 3, 4, 5, 6), DstIDs: ids(0, 1, 2, 3, 4, 5, 6)}, errs.ErrResourceExhausted, "src_ids has 7 ids, over the limit of 6 per request"},
		{"over block limit", Request{SrcIDs: ids(0, 1, 2, 3, 4, 5), DstIDs: ids(0, 1, 2, 3, 4, 5)}, errs.ErrResourceExhausted, "6 ids × 2 segments = 12 blocks, over the limit of 10 per request"},
		{"src out of range", Request{SrcIDs: ids(0, 16), DstIDs: ids(0, 1)}, errs.ErrInvalidArgument, `src_ids[1] = 16 is not below layout "src"'s num_blocks 16`},
		{"dst out of range", Request{SrcIDs: ids(0, 1, 2), DstIDs: ids(0, 7, 8)}, errs.ErrInvalidArgument, `dst_ids[2] = 8 is not below layout "dst"'s num_blocks 8`},
		{"dst out of range, huge", Request{SrcIDs: ids(0), DstIDs: ids(1<<32 - 1)}, errs.ErrInvalidArgument, "dst_ids[0] = 4294967295 is not below"},
		{"duplicate dst", Request{SrcIDs: ids(0, 1, 2, 3), DstIDs: ids(5, 1, 2, 5)}, errs.ErrInvalidArgument, "dst_ids[3] = 5 repeats dst_ids[0]: destination ids must be unique"},
		{"duplicate dst, adjacent", Request{SrcIDs: ids(0, 1), DstIDs: ids(3, 3), DstField: "remote_block_ids"}, errs.ErrInvalidArgument, "remote_block_ids[1] = 3 repeats remote_block_ids[0]"},
	}
	var w Planner
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := w.Validate(p, c.req)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("err = %q, want it to contain %q", err, c.msg)
			}
			// A refusal leaves the pooled bitmap clean: every id is free again.
			assertBitmapClear(t, &w)
			if _, err := w.Validate(p, Request{SrcIDs: ids(0, 1, 2, 3, 4), DstIDs: ids(0, 1, 3, 5, 7)}); err != nil {
				t.Fatalf("valid request after a refusal: %v", err)
			}
		})
	}
}

func assertBitmapClear(t *testing.T, w *Planner) {
	t.Helper()
	for i, x := range w.bitmap {
		if x != 0 {
			t.Fatalf("bitmap word %d = %#x after a request: ids would leak into the next one", i, x)
		}
	}
}

// TestCountLimit: 2^32 ids can't be materialised in a test, so the count
// rule is checked directly with that count, under the default limits too.
func TestCountLimit(t *testing.T) {
	for _, lim := range []Limits{{}, {MaxIDs: 1 << 40, MaxRequestBlocks: 1 << 40}} {
		err := checkCount("local_block_ids", 1<<32, 1, lim.withDefaults())
		if !errors.Is(err, errs.ErrResourceExhausted) || !strings.Contains(err.Error(), "local_block_ids has 4294967296 ids, over the limit of") {
			t.Fatalf("limits %+v: err = %v", lim, err)
		}
	}
}

func TestValidateAccepts(t *testing.T) {
	p := contiguousPair(t, 3, 8, 16, 8, Limits{})
	var w Planner
	// Source ids may repeat; destination ids are unique.
	got, err := w.Validate(p, Request{SrcIDs: ids(4, 4, 4, 15), DstIDs: ids(7, 0, 3, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Src, []uint32{4, 4, 4, 15}) || !slices.Equal(got.Dst, []uint32{7, 0, 3, 1}) {
		t.Fatalf("ids = %v -> %v", got.Src, got.Dst)
	}
	assertBitmapClear(t, &w)
	// Unaligned wire bytes decode through the scratch.
	buf := append([]byte{0xff}, ids(1, 2, 3)...)
	got, err = w.Validate(p, Request{SrcIDs: buf[1:], DstIDs: ids(5, 6, 7)})
	if err != nil || !slices.Equal(got.Src, []uint32{1, 2, 3}) {
		t.Fatalf("unaligned: %v %v", got.Src, err)
	}
}

// TestMergeConsecutive: ids 5,6,7 -> 8,9,10 with stride == block_len on
// both sides make one run of three blocks per segment; a break on either
// side starts a new run; strides above the block never merge.
func TestMergeConsecutive(t *testing.T) {
	const bl = 8192
	p := contiguousPair(t, 4, bl, 32, 32, Limits{})
	var w Planner
	runs, err := w.Plan(nil, p, Request{SrcIDs: ids(5, 6, 7, 1, 2, 20), DstIDs: ids(8, 9, 10, 11, 13, 14)})
	if err != nil {
		t.Fatal(err)
	}
	want := []Run{}
	for g := range 4 {
		r := uint32(g)
		want = append(want,
			Run{SrcOff: 5 * bl, DstOff: 8 * bl, Len: 3 * bl, SrcRegion: r, DstRegion: r, Group: r, First: 0},
			Run{SrcOff: 1 * bl, DstOff: 11 * bl, Len: bl, SrcRegion: r, DstRegion: r, Group: r, First: 3},
			Run{SrcOff: 2 * bl, DstOff: 13 * bl, Len: bl, SrcRegion: r, DstRegion: r, Group: r, First: 4},
			Run{SrcOff: 20 * bl, DstOff: 14 * bl, Len: bl, SrcRegion: r, DstRegion: r, Group: r, First: 5},
		)
	}
	if !slices.Equal(runs, want) {
		t.Fatalf("runs =\n%v\nwant\n%v", runs, want)
	}

	gapped := NewPairT(t, stridedLayout(t, "src", 2, bl, 2*bl, 32), stridedLayout(t, "dst", 2, bl, bl, 32), Limits{})
	runs, err = w.Plan(runs[:0], gapped, Request{SrcIDs: ids(5, 6, 7), DstIDs: ids(8, 9, 10)})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 6 {
		t.Fatalf("stride 2*block on the source: %d runs, want 6 (no merge): %v", len(runs), runs)
	}
}

// TestFusedSegments: segments that follow each other inside every block
// (one allocation holding all layers per block) on both sides make one run
// per block, and one run per id run when the blocks are back to back.
func TestFusedSegments(t *testing.T) {
	const segs, bl, nb = 6, 16, 10
	mk := func(name string, pad uint64) *Layout {
		ss := make([]Segment, segs)
		stride := segs*bl + pad
		for i := range ss {
			ss[i] = seg(name, uint64(i)*bl, bl, stride, nb)
		}
		l, err := New(name, ss, sizes(map[string]uint64{name: nb * stride}), Limits{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	var w Planner
	req := Request{SrcIDs: ids(1, 2, 3, 7), DstIDs: ids(4, 5, 6, 0)}
	for _, c := range []struct {
		name     string
		src, dst *Layout
		groups   int
		runs     int
	}{
		{"packed both sides", mk("a", 0), mk("b", 0), 1, 2},
		{"padded source", mk("a", 8), mk("b", 0), 1, 4},
		{"one side per-segment regions", stridedLayout(t, "s", segs, bl, bl, nb), mk("b", 0), segs, 4 * segs},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := NewPairT(t, c.src, c.dst, Limits{})
			runs, err := w.Plan(nil, p, req)
			if err != nil {
				t.Fatal(err)
			}
			if p.NumGroups() != c.groups || len(runs) != c.runs {
				t.Fatalf("%d groups, %d runs; want %d, %d: %v", p.NumGroups(), len(runs), c.groups, c.runs, runs)
			}
			checkAgainstNaive(t, p, req, runs, rand.New(rand.NewPCG(1, 2)))
		})
	}
}

// TestHalfHeads: the decode side runs twice the prefill's tensor
// parallelism, so each decode rank takes one half of every prefill block.
// The prefill exports two layouts over the same region (offset moves inside
// the block, block_len is the half, stride stays the block's); each decode
// rank has a layout of half-size blocks. Every byte is checked, both ways:
// prefill -> decode ranks, and decode ranks -> a prefill-shaped region,
// where the other half of each block must stay untouched.
func TestHalfHeads(t *testing.T) {
	const (
		layers = 4 // segments, all in one region
		block  = 256
		half   = block / 2
		nb     = 16
	)
	prefillSize := uint64(layers * nb * block)
	decodeSize := uint64(layers * nb * half)
	reg := sizes(map[string]uint64{"prefill": prefillSize, "decode0": decodeSize, "decode1": decodeSize})
	prefillHalf := func(h int) *Layout {
		ss := make([]Segment, layers)
		for i := range ss {
			ss[i] = seg("prefill", uint64(i*nb*block+h*half), half, block, nb)
		}
		l, err := New("prefill-half"+string(rune('0'+h)), ss, reg, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	decode := func(h int) *Layout {
		ss := make([]Segment, layers)
		for i := range ss {
			ss[i] = seg("decode"+string(rune('0'+h)), uint64(i*nb*half), half, half, nb)
		}
		l, err := New("decode"+string(rune('0'+h)), ss, reg, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	r := rand.New(rand.NewPCG(7, 7))
	fill := func(n uint64) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	srcIDs := []uint32{3, 4, 5, 9, 0}
	dstIDs := []uint32{10, 11, 12, 1, 15}
	req := Request{SrcIDs: PackIDs(srcIDs), DstIDs: PackIDs(dstIDs)}
	var w Planner

	t.Run("prefill to decode ranks", func(t *testing.T) {
		prefill := fill(prefillSize)
		for h := range 2 {
			dec := fill(decodeSize)
			before := bytes.Clone(dec)
			p := NewPairT(t, prefillHalf(h), decode(h), Limits{})
			runs, err := w.Plan(nil, p, req)
			if err != nil {
				t.Fatal(err)
			}
			apply(runs, [][]byte{prefill}, [][]byte{dec})
			moved := map[uint32]uint32{}
			for i, d := range dstIDs {
				moved[d] = srcIDs[i]
			}
			for l := range layers {
				for b := range uint32(nb) {
					got := dec[l*nb*half+int(b)*half:][:half]
					want := before[l*nb*half+int(b)*half:][:half]
					if s, ok := moved[b]; ok {
						want = prefill[l*nb*block+int(s)*block+h*half:][:half]
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("rank %d layer %d block %d: wrong bytes", h, l, b)
					}
				}
			}
		}
	})

	t.Run("decode ranks to prefill halves", func(t *testing.T) {
		prefill := fill(prefillSize)
		before := bytes.Clone(prefill)
		decs := [][]byte{fill(decodeSize), fill(decodeSize)}
		back := Request{SrcIDs: req.DstIDs, DstIDs: req.SrcIDs}
		for h := range 2 {
			p := NewPairT(t, decode(h), prefillHalf(h), Limits{})
			runs, err := w.Plan(nil, p, back)
			if err != nil {
				t.Fatal(err)
			}
			apply(runs, [][]byte{decs[h]}, [][]byte{prefill})
			for l := range layers {
				for b := range uint32(nb) {
					i := slices.Index(srcIDs, b)
					for hh := range 2 {
						got := prefill[l*nb*block+int(b)*block+hh*half:][:half]
						want := before[l*nb*block+int(b)*block+hh*half:][:half]
						if i >= 0 && hh <= h {
							want = decs[hh][l*nb*half+int(dstIDs[i])*half:][:half]
						}
						if !bytes.Equal(got, want) {
							t.Fatalf("after rank %d: layer %d block %d half %d: wrong bytes", h, l, b, hh)
						}
					}
				}
			}
		}
	})
}

// apply performs runs as copies between byte slices standing for regions.
func apply(runs []Run, src, dst [][]byte) {
	for _, r := range runs {
		copy(dst[r.DstRegion][r.DstOff:r.DstOff+r.Len], src[r.SrcRegion][r.SrcOff:r.SrcOff+r.Len])
	}
}

// checkAgainstNaive fills regions with random bytes, applies runs, and
// compares with a per-block, per-segment copy straight from the segments.
func checkAgainstNaive(t *testing.T, p *Pair, req Request, runs []Run, r *rand.Rand) {
	t.Helper()
	mk := func(l *Layout) [][]byte {
		out := make([][]byte, len(l.regions))
		for i, reg := range l.regions {
			out[i] = make([]byte, reg.Size)
			for j := range out[i] {
				out[i][j] = byte(r.Uint32())
			}
		}
		return out
	}
	src, dst := mk(p.src), mk(p.dst)
	want := make([][]byte, len(dst))
	for i := range dst {
		want[i] = bytes.Clone(dst[i])
	}
	s, d := unpack(req.SrcIDs), unpack(req.DstIDs)
	for k := range p.src.segs {
		a, b := p.src.segs[k], p.dst.segs[k]
		ra, rb := p.src.tmpl[k].Region, p.dst.tmpl[k].Region
		for i := range s {
			so, do := a.Offset+uint64(s[i])*a.Stride, b.Offset+uint64(d[i])*b.Stride
			copy(want[rb][do:do+b.BlockLen], src[ra][so:so+a.BlockLen])
		}
	}
	apply(runs, src, dst)
	for i := range dst {
		if !bytes.Equal(dst[i], want[i]) {
			t.Fatalf("region %d differs from the naive per-block copy", i)
		}
	}
	// Runs cover each (segment, entry) once: their lengths add up.
	var total, blocks uint64
	for _, r := range runs {
		total += r.Len
	}
	for k := range p.src.segs {
		blocks += uint64(len(s)) * p.src.segs[k].BlockLen
	}
	if total != blocks {
		t.Fatalf("runs move %d bytes, the request %d", total, blocks)
	}
}

func unpack(b []byte) []uint32 {
	var s []uint32
	return slices.Clone(view(b, &s))
}

// randomLayout places segments of the given lengths in one of three shapes:
// a region per segment, one region segment after segment, or one region
// holding every segment of a block together (cross-layer); with or without
// padding, so that merges and fusion both happen and don't.
func randomLayout(t *testing.T, r *rand.Rand, name string, lens []uint64, nb uint64) *Layout {
	t.Helper()
	segs := make([]Segment, len(lens))
	sz := map[string]uint64{}
	pad := func() uint64 {
		if r.IntN(2) == 0 {
			return 0
		}
		return uint64(r.IntN(9))
	}
	switch r.IntN(3) {
	case 0:
		for i, l := range lens {
			reg := name + string(rune('a'+i))
			stride, off := l+pad(), pad()
			segs[i] = seg(reg, off, l, stride, nb)
			sz[reg] = off + (nb-1)*stride + l + pad()
		}
	case 1:
		off := pad()
		for i, l := range lens {
			stride := l + pad()
			segs[i] = seg(name, off, l, stride, nb)
			off += (nb-1)*stride + l + pad()
		}
		sz[name] = off
	default:
		var sum uint64
		for _, l := range lens {
			sum += l
		}
		stride := sum + pad()
		off := pad()
		base := off
		for i, l := range lens {
			segs[i] = seg(name, off, l, stride, nb)
			off += l
		}
		sz[name] = base + nb*stride
	}
	l, err := New(name, segs, sizes(sz), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestExpandMatchesNaive: for random layouts and random id sets (distinct,
// repeating and sequential sources), applying the runs as copies equals the
// naive per-block copy.
func TestExpandMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 13))
	var w Planner
	var runs []Run
	merged := 0
	for iter := range 400 {
		nseg := 1 + r.IntN(6)
		lens := make([]uint64, nseg)
		for i := range lens {
			lens[i] = 1 + uint64(r.IntN(16))
		}
		nbSrc, nbDst := 1+uint64(r.IntN(40)), 1+uint64(r.IntN(40))
		p := NewPairT(t, randomLayout(t, r, "s", lens, nbSrc), randomLayout(t, r, "d", lens, nbDst), Limits{})
		n := 1 + r.IntN(int(min(nbSrc, nbDst)))
		dst := r.Perm(int(nbDst))[:n]
		src := make([]uint32, n)
		switch iter % 3 {
		case 0: // distinct
			for i, v := range r.Perm(int(nbSrc))[:n] {
				src[i] = uint32(v)
			}
		case 1: // repeating
			for i := range src {
				src[i] = uint32(r.IntN(int(nbSrc)))
			}
		default: // sequential on both sides where they fit
			s0, d0 := r.IntN(int(nbSrc)-n+1), r.IntN(int(nbDst)-n+1)
			for i := range src {
				src[i] = uint32(s0 + i)
				dst[i] = d0 + i
			}
		}
		dst32 := make([]uint32, n)
		for i, v := range dst {
			dst32[i] = uint32(v)
		}
		req := Request{SrcIDs: PackIDs(src), DstIDs: PackIDs(dst32)}
		var err error
		runs, err = w.Plan(runs[:0], p, req)
		if err != nil {
			t.Fatalf("iteration %d: %v", iter, err)
		}
		if len(runs) < n*nseg {
			merged++
		}
		checkAgainstNaive(t, p, req, runs, r)
		// Expanded chunk by chunk, the runs are the same.
		ids, _ := w.Validate(p, req)
		var c Cursor
		chunk := 1 + r.IntN(7)
		var chunked []Run
		for !c.Done(p) {
			before := len(chunked)
			chunked = p.ExpandFrom(chunked, ids, &c, chunk)
			if n := len(chunked) - before; n == 0 || n > chunk {
				t.Fatalf("iteration %d: a chunk of %d gave %d runs", iter, chunk, n)
			}
		}
		if !slices.Equal(chunked, runs) {
			t.Fatalf("iteration %d: chunks of %d give other runs than Expand", iter, chunk)
		}
	}
	if merged < 50 {
		t.Fatalf("only %d of 400 requests merged anything: the generator does not exercise merging", merged)
	}
}

// TestPlanSteadyStateAllocs: once the buffers have grown, validation and
// expansion allocate nothing.
func TestPlanSteadyStateAllocs(t *testing.T) {
	p := contiguousPair(t, 16, 64, 256, 256, Limits{})
	r := rand.New(rand.NewPCG(3, 4))
	reqs := make([]Request, 8)
	for i := range reqs {
		reqs[i] = randomRequest(r, 64, 256, 256)
	}
	w := Planners.Get().(*Planner)
	defer Planners.Put(w)
	runs, _ := w.Plan(nil, p, reqs[0])
	i := 0
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		runs, err = w.Plan(runs[:0], p, reqs[i%len(reqs)])
		if err != nil {
			t.Fatal(err)
		}
		i++
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per request in steady state, want 0", allocs)
	}
}

// randomRequest draws n distinct source and n distinct destination ids.
func randomRequest(r *rand.Rand, n, nbSrc, nbDst int) Request {
	s, d := make([]uint32, n), make([]uint32, n)
	for i, v := range r.Perm(nbSrc)[:n] {
		s[i] = uint32(v)
	}
	for i, v := range r.Perm(nbDst)[:n] {
		d[i] = uint32(v)
	}
	return Request{SrcIDs: PackIDs(s), DstIDs: PackIDs(d)}
}

// TestSeekAndGroupHelpers: expanding from Seek(g, k) yields the runs of
// Expand from the k-th run of group g on, and every run lies below its
// group's ends, for merging and non-merging groups alike.
func TestSeekAndGroupHelpers(t *testing.T) {
	size := func(string) (uint64, error) { return 1 << 20, nil }
	mk := func(name string, stride uint64) *Layout {
		segs := []Segment{
			{Region: "a", Offset: 0, BlockLen: 64, Stride: stride, NumBlocks: 32},
			{Region: "b", Offset: 4096, BlockLen: 64, Stride: 64, NumBlocks: 32},
			{Region: "b", Offset: 8192, BlockLen: 32, Stride: 32, NumBlocks: 32},
		}
		l, err := New(name, segs, size, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for _, stride := range []uint64{64, 128} {
		p, err := NewPair(mk("s", stride), mk("d", 64), Limits{})
		if err != nil {
			t.Fatal(err)
		}
		var w Planner
		src := []uint32{3, 4, 5, 9, 10, 31, 0}
		dst := []uint32{7, 8, 9, 1, 2, 30, 31}
		ids, err := w.Validate(p, Request{SrcIDs: PackIDs(src), DstIDs: PackIDs(dst)})
		if err != nil {
			t.Fatal(err)
		}
		all := p.Expand(nil, ids)
		total := 0
		for g := 0; g < p.NumGroups(); g++ {
			total += p.GroupRuns(ids, g)
		}
		if total != len(all) {
			t.Fatalf("stride %d: GroupRuns sum %d, Expand made %d runs", stride, total, len(all))
		}
		for i, r := range all {
			se, de := p.GroupEnds(int(r.Group))
			sr, dr := p.GroupRegions(int(r.Group))
			if r.SrcOff+r.Len > se || r.DstOff+r.Len > de || sr != r.SrcRegion || dr != r.DstRegion {
				t.Fatalf("stride %d: run %d %+v outside its group's ends (%d, %d) or regions (%d, %d)", stride, i, r, se, de, sr, dr)
			}
		}
		for g, base := 0, 0; g < p.NumGroups(); g++ {
			for k := 0; k <= len(all)-base; k++ {
				c := p.Seek(ids, g, k)
				got := p.ExpandFrom(nil, ids, &c, len(all))
				if !slices.Equal(got, all[base+k:]) {
					t.Fatalf("stride %d: Seek(%d, %d) expands %v, want %v", stride, g, k, got, all[base+k:])
				}
			}
			base += p.GroupRuns(ids, g)
		}
	}
}
