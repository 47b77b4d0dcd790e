package desc

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/b2bd/b2bd/internal/errs"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

func TestDecodeRejects(t *testing.T) {
	lim := Limits{SrcSize: 1 << 20, DstSize: 1 << 16, MaxBlocks: 4}
	u := func(v ...uint64) []byte { return Pack(v) }
	cases := []struct {
		name string
		p    Packed
		lim  Limits
		want error
		msg  string
	}{
		{"empty", Packed{BlockLength: 8}, lim, errs.ErrInvalidArgument, "src_offsets is empty"},
		{"ragged src", Packed{SrcOffsets: []byte{1, 2, 3}, DstOffsets: u(0), BlockLength: 8}, lim, errs.ErrInvalidArgument, "src_offsets is 3 bytes"},
		{"ragged dst", Packed{SrcOffsets: u(0), DstOffsets: make([]byte, 9), BlockLength: 8}, lim, errs.ErrInvalidArgument, "dst_offsets is 9 bytes"},
		{"ragged lengths", Packed{SrcOffsets: u(0), DstOffsets: u(0), Lengths: make([]byte, 7)}, lim, errs.ErrInvalidArgument, "lengths is 7 bytes"},
		{"count mismatch", Packed{SrcOffsets: u(0, 8), DstOffsets: u(0), BlockLength: 8}, lim, errs.ErrInvalidArgument, "dst_offsets has 1 entries, src_offsets has 2"},
		{"lengths mismatch", Packed{SrcOffsets: u(0, 8), DstOffsets: u(0, 8), Lengths: u(8)}, lim, errs.ErrInvalidArgument, "lengths has 1 entries"},
		{"both lengths", Packed{SrcOffsets: u(0), DstOffsets: u(0), Lengths: u(8), BlockLength: 8}, lim, errs.ErrInvalidArgument, "both set"},
		{"no lengths", Packed{SrcOffsets: u(0), DstOffsets: u(0)}, lim, errs.ErrInvalidArgument, "neither lengths nor block_length"},
		{"zero length", Packed{SrcOffsets: u(0, 8), DstOffsets: u(0, 8), Lengths: u(8, 0)}, lim, errs.ErrInvalidArgument, "lengths[1] is 0"},
		{"too many", Packed{SrcOffsets: u(0, 1, 2, 3, 4), DstOffsets: u(0, 1, 2, 3, 4), BlockLength: 1}, lim, errs.ErrResourceExhausted, "5 blocks exceeds the limit of 4"},
		{"src past end", Packed{SrcOffsets: u(1 << 20), DstOffsets: u(0), BlockLength: 1}, lim, errs.ErrInvalidArgument, "src_offsets[0] = 1048576 with length 1 runs past the source region's 1048576 bytes"},
		{"dst past end", Packed{SrcOffsets: u(0, 0), DstOffsets: u(0, 65535), BlockLength: 2}, lim, errs.ErrInvalidArgument, "dst_offsets[1] = 65535 with length 2 runs past the destination region's 65536 bytes"},
		{"src overflow", Packed{SrcOffsets: u(math.MaxUint64 - 3), DstOffsets: u(0), BlockLength: 8}, lim, errs.ErrInvalidArgument, "src_offsets[0]"},
		{"dst overflow", Packed{SrcOffsets: u(0), DstOffsets: u(8), Lengths: u(math.MaxUint64)}, lim, errs.ErrInvalidArgument, "src_offsets[0] = 0 with length 18446744073709551615"},
		{"dst overflow wrap", Packed{SrcOffsets: u(0), DstOffsets: u(math.MaxUint64), Lengths: u(2)}, lim, errs.ErrInvalidArgument, "dst_offsets[0]"},
		{"overlap unsorted", Packed{SrcOffsets: u(0, 0, 0), DstOffsets: u(100, 0, 96), BlockLength: 8}, lim, errs.ErrInvalidArgument, "[96,104) and [100,108) overlap (blocks 2 and 0)"},
		{"duplicate dst", Packed{SrcOffsets: u(0, 8), DstOffsets: u(16, 16), BlockLength: 8}, lim, errs.ErrInvalidArgument, "[16,24) and [16,24) overlap (blocks 0 and 1)"},
		{"duplicate dst unsorted", Packed{SrcOffsets: u(0, 8, 16), DstOffsets: u(40, 8, 40), BlockLength: 8}, lim, errs.ErrInvalidArgument, "[40,48) and [40,48) overlap (blocks 0 and 2)"},
		{"duplicate dst among many", Packed{SrcOffsets: u(0, 0, 0, 0), DstOffsets: u(24, 0, 24, 8), BlockLength: 8}, Limits{SrcSize: 64, DstSize: 64}, errs.ErrInvalidArgument, "(blocks 0 and 2)"},
		{"dst size unknown, overflow", Packed{SrcOffsets: u(0), DstOffsets: u(math.MaxUint64 - 1), Lengths: u(4)}, Limits{SrcSize: 64, DstSize: UnknownSize}, errs.ErrInvalidArgument, "dst_offsets[0] = 18446744073709551614 with length 4 overflows 64 bits (the destination region's size is not known yet)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var d Decoder
			_, err := d.Decode(c.p, c.lim)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("err = %q, want it to contain %q", err, c.msg)
			}
		})
	}
}

// TestDstSizeNeverPrintedUnknown: a bound checked before the peer told the
// destination's size must not print the placeholder as a size.
func TestDstSizeNeverPrintedUnknown(t *testing.T) {
	cases := []struct {
		name string
		p    Packed
		msg  string
	}{
		{"wrap", Packed{SrcOffsets: Pack([]uint64{0}), DstOffsets: Pack([]uint64{math.MaxUint64}), Lengths: Pack([]uint64{2})}, "size is not known yet"},
		{"max offset", Packed{SrcOffsets: Pack([]uint64{0}), DstOffsets: Pack([]uint64{math.MaxUint64 - 7}), BlockLength: 8}, "size is not known yet"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var d Decoder
			_, err := d.Decode(c.p, Limits{SrcSize: 64, DstSize: UnknownSize})
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			if strings.Contains(err.Error(), "region's 18446744073709551615") || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("err = %q, want it to contain %q and no placeholder size", err, c.msg)
			}
		})
	}
	// Once the size is known, CheckDst names it.
	err := CheckDst(Batch{Src: []uint64{0}, Dst: []uint64{60}, Len: []uint64{8}}, 64)
	if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), "dst_offsets[0] = 60 with length 8 runs past the destination region's 64 bytes") {
		t.Fatalf("CheckDst: %v", err)
	}
}

func TestDecodeAccepts(t *testing.T) {
	var d Decoder
	b, err := d.Decode(Packed{
		SrcOffsets:  Pack([]uint64{0, 100, 50}),
		DstOffsets:  Pack([]uint64{40, 0, 20}), // unsorted, touching but not overlapping
		BlockLength: 20,
	}, Limits{SrcSize: 200, DstSize: 60})
	if err != nil {
		t.Fatal(err)
	}
	if b.N() != 3 || b.Bytes() != 60 || b.Dst[0] != 40 || b.Len[2] != 20 {
		t.Fatalf("batch = %+v", b)
	}
}

func TestMerge(t *testing.T) {
	cases := []struct {
		name          string
		src, dst, len []uint64
		want          [][3]uint64
	}{
		{"both adjacent", []uint64{0, 8, 16}, []uint64{100, 108, 116}, []uint64{8, 8, 8}, [][3]uint64{{0, 100, 24}}},
		{"src only", []uint64{0, 8}, []uint64{100, 200}, []uint64{8, 8}, [][3]uint64{{0, 100, 8}, {8, 200, 8}}},
		{"dst only", []uint64{0, 50}, []uint64{100, 108}, []uint64{8, 8}, [][3]uint64{{0, 100, 8}, {50, 108, 8}}},
		{"runs", []uint64{0, 8, 40, 48, 56}, []uint64{0, 8, 100, 108, 300}, []uint64{8, 8, 8, 8, 8}, [][3]uint64{{0, 0, 16}, {40, 100, 16}, {56, 300, 8}}},
		{"single", []uint64{4}, []uint64{4}, []uint64{4}, [][3]uint64{{4, 4, 4}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := Merge(Batch{Src: c.src, Dst: c.dst, Len: c.len})
			if m.N() != len(c.want) {
				t.Fatalf("got %d segments, want %d: %+v", m.N(), len(c.want), m)
			}
			for i, w := range c.want {
				if m.Src[i] != w[0] || m.Dst[i] != w[1] || m.Len[i] != w[2] {
					t.Fatalf("segment %d = (%d,%d,%d), want %v", i, m.Src[i], m.Dst[i], m.Len[i], w)
				}
			}
		})
	}
}

// randomBatch places n blocks at random non-adjacent slots on both sides.
func randomBatch(n int, size uint64, r *rand.Rand) (Packed, Limits) {
	slot := size + 64
	src := make([]uint64, n)
	dst := make([]uint64, n)
	ps, pd := r.Perm(n), r.Perm(n)
	for i := range n {
		src[i] = uint64(ps[i]) * slot
		dst[i] = uint64(pd[i]) * slot
	}
	return Packed{SrcOffsets: Pack(src), DstOffsets: Pack(dst), BlockLength: size},
		Limits{SrcSize: uint64(n) * slot, DstSize: uint64(n) * slot}
}

// BenchmarkDecode10K decodes and validates 10,000 descriptors whose
// destinations are in random order (the overlap check must sort).
func BenchmarkDecode10K(b *testing.B) {
	for _, sorted := range []bool{false, true} {
		name := "random-order"
		if sorted {
			name = "ascending"
		}
		b.Run(name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			p, lim := randomBatch(10000, 128, r)
			if sorted {
				var s []uint64
				for i := range 10000 {
					s = append(s, uint64(i)*192)
				}
				p.DstOffsets = Pack(s)
			}
			var d Decoder
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.Decode(p, lim); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Pack([]uint64{0, 64}), Pack([]uint64{64, 0}), []byte(nil), uint64(64), uint64(128), uint64(128))
	f.Add(Pack([]uint64{0}), Pack([]uint64{math.MaxUint64}), Pack([]uint64{2}), uint64(0), uint64(10), uint64(10))
	f.Add(Pack([]uint64{0, 8}), Pack([]uint64{16, 20}), Pack([]uint64{8, 8}), uint64(0), uint64(100), uint64(100))
	f.Add([]byte{1, 2, 3}, []byte{}, []byte{}, uint64(1), uint64(1), uint64(1))
	f.Fuzz(func(t *testing.T, src, dst, lens []byte, blockLen, srcSize, dstSize uint64) {
		var d Decoder
		p := Packed{SrcOffsets: src, DstOffsets: dst, Lengths: lens, BlockLength: blockLen}
		lim := Limits{SrcSize: srcSize, DstSize: dstSize, MaxBlocks: 4096}
		b, err := d.Decode(p, lim)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) && !errors.Is(err, errs.ErrResourceExhausted) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		// Every accepted block lies inside both regions and no two
		// destinations overlap: check by brute force.
		for i := range b.N() {
			if b.Len[i] == 0 || b.Src[i]+b.Len[i] > srcSize || b.Src[i]+b.Len[i] < b.Src[i] ||
				b.Dst[i]+b.Len[i] > dstSize || b.Dst[i]+b.Len[i] < b.Dst[i] {
				t.Fatalf("accepted out-of-range block %d: %d %d %d", i, b.Src[i], b.Dst[i], b.Len[i])
			}
			for j := i + 1; j < b.N() && j < 256; j++ {
				if b.Dst[i] < b.Dst[j]+b.Len[j] && b.Dst[j] < b.Dst[i]+b.Len[i] {
					t.Fatalf("accepted overlapping blocks %d and %d", i, j)
				}
			}
		}
		total := b.Bytes()
		m := Merge(b)
		if m.Bytes() != total {
			t.Fatalf("merge changed the byte count: %d -> %d", total, m.Bytes())
		}
	})
}

// BenchmarkUnmarshalDecode10K is the whole cost the daemon pays per batch
// before any byte moves: protobuf decoding of the request plus validation.
func BenchmarkUnmarshalDecode10K(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	p, lim := randomBatch(10000, 4096, r)
	wire, err := proto.Marshal(&b2bv1.BatchTransferRequest{SrcRegionId: "r1", Peer: "h:1", DstRegion: "d",
		Descriptors: &b2bv1.Descriptors{SrcOffsets: p.SrcOffsets, DstOffsets: p.DstOffsets, BlockLength: p.BlockLength}})
	if err != nil {
		b.Fatal(err)
	}
	var d Decoder
	b.ReportAllocs()
	for b.Loop() {
		var req b2bv1.BatchTransferRequest
		if err := proto.Unmarshal(wire, &req); err != nil {
			b.Fatal(err)
		}
		ds := req.GetDescriptors()
		if _, err := d.Decode(Packed{SrcOffsets: ds.SrcOffsets, DstOffsets: ds.DstOffsets, BlockLength: ds.BlockLength}, lim); err != nil {
			b.Fatal(err)
		}
	}
}
