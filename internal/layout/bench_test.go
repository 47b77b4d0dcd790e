package layout

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/b2bd/b2bd/internal/desc"
)

// The KV request: Llama-70B at TP=4 has 160 segments (80 layers ×
// K, V) of 8 KiB blocks; a pool of 1,024 blocks per segment; a request of
// 512 ids (an 8k-token prompt at 16 tokens per block) = 81,920 blocks.
const (
	kvSegments = 160
	kvBlock    = 8 << 10
	kvPool     = 1024
	kvRequest  = 512
)

// kvShape is one benchmark input: a layout pair and a rotation of requests
// (several, so that no single request's ids stay hot in cache).
type kvShape struct {
	name            string
	segs, pool, ids int
	stride          uint64 // per-block stride on both sides (block or more)
	sequential      bool   // ids consecutive on both sides: best-case merging
}

var kvShapes = []kvShape{
	{"81920/random", kvSegments, kvPool, kvRequest, kvBlock, false},
	{"81920/sequential", kvSegments, kvPool, kvRequest, kvBlock, true},
	{"81920/nomerge", kvSegments, kvPool, kvRequest, 2 * kvBlock, true},
	{"10000/random", 20, kvPool, 500, kvBlock, false},
}

func (s kvShape) requests(r *rand.Rand, n int) [][2][]uint32 {
	out := make([][2][]uint32, n)
	for k := range out {
		src, dst := make([]uint32, s.ids), make([]uint32, s.ids)
		if s.sequential {
			a, b := r.IntN(s.pool-s.ids+1), r.IntN(s.pool-s.ids+1)
			for i := range src {
				src[i], dst[i] = uint32(a+i), uint32(b+i)
			}
		} else {
			for i, v := range r.Perm(s.pool)[:s.ids] {
				src[i] = uint32(v)
			}
			for i, v := range r.Perm(s.pool)[:s.ids] {
				dst[i] = uint32(v)
			}
		}
		out[k] = [2][]uint32{src, dst}
	}
	return out
}

// BenchmarkKVBlocks: blocks mode's non-wire work per request: decode the
// packed ids, validate them, expand them to merged runs.
func BenchmarkKVBlocks(b *testing.B) {
	for _, s := range kvShapes {
		b.Run(s.name, func(b *testing.B) {
			p := NewPairT(b, stridedLayout(b, "prefill", s.segs, kvBlock, s.stride, uint64(s.pool)),
				stridedLayout(b, "decode", s.segs, kvBlock, s.stride, uint64(s.pool)), Limits{})
			var reqs []Request
			for _, r := range s.requests(rand.New(rand.NewPCG(1, 1)), 16) {
				reqs = append(reqs, Request{SrcIDs: PackIDs(r[0]), DstIDs: PackIDs(r[1])})
			}
			w := Planners.Get().(*Planner)
			defer Planners.Put(w)
			runs, err := w.Plan(nil, p, reqs[0])
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				runs, err = w.Plan(runs[:0], p, reqs[i%len(reqs)])
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(s.segs*s.ids), "blocks/op")
			b.ReportMetric(float64(len(runs)), "runs/op")
		})
	}
}

// BenchmarkKVBlocksChunked: as BenchmarkKVBlocks, expanding 256 runs at a
// time into one small buffer, as a poster that posts each chunk would: the
// runs stay in cache instead of streaming a 3 MB list to memory.
func BenchmarkKVBlocksChunked(b *testing.B) {
	for _, s := range kvShapes {
		b.Run(s.name, func(b *testing.B) {
			p := NewPairT(b, stridedLayout(b, "prefill", s.segs, kvBlock, s.stride, uint64(s.pool)),
				stridedLayout(b, "decode", s.segs, kvBlock, s.stride, uint64(s.pool)), Limits{})
			var reqs []Request
			for _, r := range s.requests(rand.New(rand.NewPCG(1, 1)), 16) {
				reqs = append(reqs, Request{SrcIDs: PackIDs(r[0]), DstIDs: PackIDs(r[1])})
			}
			w := Planners.Get().(*Planner)
			defer Planners.Put(w)
			buf := make([]Run, 0, 256)
			b.ReportAllocs()
			n := 0
			for i := 0; b.Loop(); i++ {
				ids, err := w.Validate(p, reqs[i%len(reqs)])
				if err != nil {
					b.Fatal(err)
				}
				n = 0
				var c Cursor
				for !c.Done(p) {
					buf = p.ExpandFrom(buf[:0], ids, &c, cap(buf))
					n += len(buf)
				}
			}
			b.ReportMetric(float64(s.segs*s.ids), "blocks/op")
			b.ReportMetric(float64(n), "runs/op")
		})
	}
}

// BenchmarkKVDescriptors: the same requests as descriptors mode sends them
// today: one BatchTransfer over one region spanning the pool (segment s at
// s*pool*stride), 8-byte offsets per block, through internal/desc's
// Decode (decode + validate, with its overlap sort when the destinations
// are not ascending) and Merge. "sorted" orders each request's entries by
// destination first, the descriptor path's best case (no sort).
func BenchmarkKVDescriptors(b *testing.B) {
	for _, s := range kvShapes {
		for _, sorted := range []bool{false, true} {
			name := s.name
			if sorted {
				name += "/sorted"
			}
			b.Run(name, func(b *testing.B) {
				segBytes := uint64(s.pool-1)*s.stride + kvBlock
				size := uint64(s.segs) * segBytes
				var reqs []desc.Packed
				for _, r := range s.requests(rand.New(rand.NewPCG(1, 1)), 16) {
					src, dst := r[0], r[1]
					if sorted {
						order := make([]int, len(src))
						for i := range order {
							order[i] = i
						}
						slices.SortFunc(order, func(x, y int) int { return int(dst[x]) - int(dst[y]) })
						s2, d2 := make([]uint32, len(src)), make([]uint32, len(src))
						for i, j := range order {
							s2[i], d2[i] = src[j], dst[j]
						}
						src, dst = s2, d2
					}
					so, do := make([]uint64, 0, s.segs*s.ids), make([]uint64, 0, s.segs*s.ids)
					for g := range s.segs {
						for i := range src {
							so = append(so, uint64(g)*segBytes+uint64(src[i])*s.stride)
							do = append(do, uint64(g)*segBytes+uint64(dst[i])*s.stride)
						}
					}
					reqs = append(reqs, desc.Packed{SrcOffsets: desc.Pack(so), DstOffsets: desc.Pack(do), BlockLength: kvBlock})
				}
				lim := desc.Limits{SrcSize: size, DstSize: size}
				d := desc.Pool.Get().(*desc.Decoder)
				defer desc.Pool.Put(d)
				var merged desc.Batch
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					batch, err := d.Decode(reqs[i%len(reqs)], lim)
					if err != nil {
						b.Fatal(err)
					}
					merged = d.Merge(batch)
				}
				b.ReportMetric(float64(s.segs*s.ids), "blocks/op")
				b.ReportMetric(float64(merged.N()), "runs/op")
			})
		}
	}
}

// BenchmarkKVValidate: validation alone (decode, range, unique), the Go
// side's whole per-request cost when the poster expands from the templates.
func BenchmarkKVValidate(b *testing.B) {
	s := kvShapes[0]
	p := NewPairT(b, stridedLayout(b, "prefill", s.segs, kvBlock, s.stride, uint64(s.pool)),
		stridedLayout(b, "decode", s.segs, kvBlock, s.stride, uint64(s.pool)), Limits{})
	var reqs []Request
	for _, r := range s.requests(rand.New(rand.NewPCG(1, 1)), 16) {
		reqs = append(reqs, Request{SrcIDs: PackIDs(r[0]), DstIDs: PackIDs(r[1])})
	}
	var w Planner
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := w.Validate(p, reqs[i%len(reqs)]); err != nil {
			b.Fatal(err)
		}
	}
}
