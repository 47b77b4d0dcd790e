//go:build cgo && linux

package verbs

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

func TestPlanBounds(t *testing.T) {
	tests := []struct {
		name string
		src  uint64
		dst  uint64
		n    uint64
	}{
		{"src past end", 1<<20 - 10, 0, 64},
		{"dst past end", 0, 1<<20 - 10, 64},
		{"offset overflow", ^uint64(0) - 10, 0, 64},
		{"length overflow", 0, 0, ^uint64(0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := baseParams()
			p.SrcLimit, p.DstLimit = 1<<20, 1<<20
			ch := mustChain(t, 8, 4)
			src := []uint64{0, tc.src}
			dst := []uint64{4096, tc.dst}
			lens := []uint64{64, tc.n}
			ch.Setup(&p)
			ch.Start(Pos{}, Pos{I: 2}, false, 0)
			_, err := ch.Plan(src, dst, lens)
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("got %v, want ErrInvalidArgument", err)
			}
			if cur := ch.Cursor(); cur != (Pos{}) {
				t.Fatalf("cursor moved to %+v on error", cur)
			}
		})
	}
	t.Run("bad range", func(t *testing.T) {
		ch := mustChain(t, 8, 4)
		p := baseParams()
		ch.Setup(&p)
		ch.Start(Pos{}, Pos{I: 5}, false, 0)
		if _, err := ch.Plan([]uint64{0}, []uint64{0}, []uint64{8}); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Fatalf("got %v", err)
		}
		if _, err := ch.Plan([]uint64{0}, []uint64{0, 1}, []uint64{8}); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Fatalf("got %v", err)
		}
	})
}

// FuzzPlan: for arbitrary block lists, planner limits and either op, the
// chain planner never leaves either region, never exceeds
// max_sge/max_wr/max_wr_bytes, and maps exactly the bytes of the range, in
// order, once.
func FuzzPlan(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, uint8(4), uint8(8), uint16(0), uint8(3), uint16(0), uint8(0))
	f.Add([]byte{0, 0, 0, 0, 255, 255, 0, 1}, uint8(1), uint8(1), uint16(7), uint8(1), uint16(100), uint8(3))
	f.Add(make([]byte, 64), uint8(30), uint8(64), uint16(300), uint8(16), uint16(1), uint8(9))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, uint8(4), uint8(8), uint16(0), uint8(3), uint16(0), uint8(0xC2))
	f.Fuzz(func(t *testing.T, data []byte, maxSGE, maxWR uint8, maxWRBytes uint16, sig uint8, chainBytes uint16, cut uint8) {
		// Each 3 bytes make a block: length, a src step, a dst step. Steps
		// of 0 make blocks adjacent, so merging and gathering both happen.
		const limit = 1 << 16
		var src, dst, lens []uint64
		var s, d uint64
		for k := 0; k+2 < len(data) && len(src) < 400; k += 3 {
			n := uint64(data[k] % 97)
			ss := uint64(data[k+1]&0x7) * uint64(data[k+1]>>3)
			ds := uint64(data[k+2]&0x7) * uint64(data[k+2]>>3)
			if data[k+1]&0x80 != 0 && s >= 200 {
				s -= 200 // backwards: sources out of order
			}
			s += ss
			d += ds
			src, dst, lens = append(src, s), append(dst, d), append(lens, n)
			s += n
			d += n
		}
		p := baseParams()
		p.SrcBase, p.DstBase = 0x1000, 0x2000
		p.SrcLimit, p.DstLimit = limit, limit
		p.MaxSGE = int(maxSGE%8) + 1
		p.MaxWR = int(maxWR%32) + 1
		p.MaxWRBytes = uint64(maxWRBytes % 512)
		p.SignalEvery = int(sig%8) + 1
		p.MaxChainBytes = uint64(chainBytes % 1024)
		p.InlineMax = int(cut % 4 * 16)
		if cut&0x40 != 0 {
			p.Op = WRRead
		}
		ch := mustChain(t, 32, 8)
		n := uint32(len(src))
		to := Pos{I: n}
		// Optionally end mid-block, as a QP's share may.
		if n > 0 && cut&0x80 != 0 {
			i := uint32(cut) % n
			to = Pos{I: i, Off: lens[i] / 2}
		}
		_, got, err := planAll(t, ch, planCase{p: p, to: to, immLast: cut&1 == 1 && p.Op == WRWrite, imm: 77}, src, dst, lens)
		outOfRange := false
		for i := range src {
			if src[i]+lens[i] > limit || dst[i]+lens[i] > limit {
				outOfRange = true
			}
		}
		if err != nil {
			if !outOfRange || !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		want := expected(src, dst, lens, Pos{}, to)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("mapping\n got %v\nwant %v", got, want)
		}
	})
}

// randomBatch places n blocks of sz bytes at random distinct slots of a
// region, the worst case for merging (every block its own WR).
func randomBatch(n int, sz uint64, seed int64) (src, dst, lens []uint64, size uint64) {
	r := rand.New(rand.NewSource(seed))
	size = uint64(n) * sz * 2
	ps, pd := r.Perm(2*n), r.Perm(2*n)
	for i := 0; i < n; i++ {
		src = append(src, uint64(ps[i])*sz)
		dst = append(dst, uint64(pd[i])*sz)
		lens = append(lens, sz)
	}
	return
}

// BenchmarkPlanChain measures the pure C planner (what PostChain runs
// before ibv_post_send) on 10,000 random 128 B blocks; ns/WR is reported.
func BenchmarkPlanChain(b *testing.B) {
	for _, chainLen := range []int{16, 64, 256} {
		b.Run(fmt.Sprintf("chain=%d", chainLen), func(b *testing.B) {
			src, dst, lens, size := randomBatch(10000, 128, 1)
			ch := mustChain(b, chainLen, 8)
			p := baseParams()
			p.SrcLimit, p.DstLimit = size, size
			p.MaxWR = chainLen
			ch.Setup(&p)
			end := Pos{I: uint32(len(src))}
			ch.Start(Pos{}, end, true, 1)
			b.ReportAllocs()
			b.ResetTimer()
			wrs := 0
			for k := 0; k < b.N; k++ {
				res, err := ch.Plan(src, dst, lens)
				if err != nil {
					b.Fatal(err)
				}
				wrs += res.WRs
				if res.Done {
					ch.Start(Pos{}, end, true, 1)
				}
			}
			b.StopTimer()
			if wrs > 0 {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(wrs), "ns/WR")
			}
		})
	}
}

// TestPlanAllocs pins "zero allocations per chain" in the regular test run.
func TestPlanAllocs(t *testing.T) {
	src, dst, lens, size := randomBatch(1000, 128, 2)
	ch := mustChain(t, 64, 8)
	p := baseParams()
	p.SrcLimit, p.DstLimit = size, size
	ch.Setup(&p)
	end := Pos{I: uint32(len(src))}
	ch.Start(Pos{}, end, true, 1)
	allocs := testing.AllocsPerRun(200, func() {
		res, _ := ch.Plan(src, dst, lens)
		if res.Done {
			ch.Start(Pos{}, end, true, 1)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per chain", allocs)
	}
}

func TestWRID(t *testing.T) {
	for _, c := range []struct {
		seq  uint32
		kind int
		blk  uint32
	}{{0, KindData, 0}, {^uint32(0), KindPing, 0x0FFFFFFF}, {12345, KindMeta, 99}} {
		s, k, b := SplitWRID(WRID(c.seq, c.kind, c.blk))
		if s != c.seq || k != c.kind || b != c.blk {
			t.Fatalf("%+v round-trips to %d %d %d", c, s, k, b)
		}
	}
}
