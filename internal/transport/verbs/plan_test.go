//go:build cgo && linux

package verbs

import (
	"math/rand"
	"testing"

	ibv "github.com/b2bd/b2bd/verbs"
)

// planBatch runs the production path of Write minus the device: split the
// batch over nq QPs, then plan every range with the C planner, and returns
// every (dst, src, len) piece the WRs carry, per WR, plus WR/SGE counts.
func planBatch(t testing.TB, src, dst, lens []uint64, nq int, p ibv.ChainParams) (pieces map[uint64][2]uint64, wrs, sges int) {
	var total uint64
	for _, l := range lens {
		total += l
	}
	cuts := make([]ibv.Pos, nq+1)
	m := splitBatch(lens, total, nq, cuts)
	pieces = map[uint64][2]uint64{}
	for k := 0; k < m; k++ {
		ch, err := ibv.NewChain(p.MaxWR, p.MaxSGE)
		if err != nil {
			t.Fatal(err)
		}
		ch.Setup(&p)
		ch.Start(cuts[k], cuts[k+1], true, 9)
		for done := false; !done; {
			res, err := ch.Plan(src, dst, lens)
			if err != nil {
				t.Fatal(err)
			}
			for j := 0; j < res.WRs; j++ {
				w := ch.WR(j)
				if len(w.SGEs) > p.MaxSGE {
					t.Fatalf("WR with %d SGEs", len(w.SGEs))
				}
				r := w.RemoteAddr - p.DstBase
				for _, s := range w.SGEs {
					// byte-granular map: every destination byte exactly once
					for x := uint64(0); x < uint64(s.Len); x++ {
						if _, dup := pieces[r+x]; dup {
							t.Fatalf("destination byte %d written twice", r+x)
						}
						pieces[r+x] = [2]uint64{s.Addr - p.SrcBase + x, 1}
					}
					r += uint64(s.Len)
				}
				if r > p.DstLimit {
					t.Fatalf("WR ends at %d past %d", r, p.DstLimit)
				}
			}
			wrs += res.WRs
			sges += res.SGEs
			done = res.Done
		}
		ch.Close()
	}
	return pieces, wrs, sges
}

// FuzzSplitAndPlan: over arbitrary non-overlapping batches, splitting over
// QPs and planning each range writes every destination byte exactly once,
// from the right source byte, and never outside the regions.
func FuzzSplitAndPlan(f *testing.F) {
	f.Add(int64(1), uint8(4), uint8(20), uint8(4))
	f.Add(int64(2), uint8(1), uint8(200), uint8(1))
	f.Fuzz(func(t *testing.T, seed int64, nq, nblocks, maxSGE uint8) {
		r := rand.New(rand.NewSource(seed))
		n := int(nblocks%64) + 1
		// Non-overlapping destination slots, some adjacent, in random order;
		// sources either adjacent too or scattered.
		const slot = 300
		perm := r.Perm(2 * n)
		var src, dst, lens []uint64
		for i := 0; i < n; i++ {
			l := uint64(r.Intn(slot))
			d := uint64(perm[i]) * slot
			if i > 0 && r.Intn(3) == 0 { // follow the previous block on the destination side
				d = dst[i-1] + lens[i-1]
				if d+l > uint64(2*n)*slot || overlaps(dst, lens, d, l) {
					d = uint64(perm[i]) * slot
				}
			}
			if overlaps(dst, lens, d, l) {
				l = 0
			}
			s := uint64(r.Intn(2*n*slot - slot))
			if i > 0 && r.Intn(2) == 0 && src[i-1]+lens[i-1]+l <= uint64(2*n*slot) {
				s = src[i-1] + lens[i-1]
			}
			src, dst, lens = append(src, s), append(dst, d), append(lens, l)
		}
		p := ibv.ChainParams{SrcBase: 1 << 20, DstBase: 1 << 30, SrcLimit: uint64(2 * n * slot), DstLimit: uint64(2 * n * slot),
			LKey: 1, RKey: 2, MaxWR: 8, MaxSGE: int(maxSGE%6) + 1, MaxWRBytes: 512, SignalEvery: 3, MaxChainBytes: 1000}
		pieces, _, _ := planBatch(t, src, dst, lens, int(nq%8)+1, p)
		want := 0
		for i := range src {
			for x := uint64(0); x < lens[i]; x++ {
				got, ok := pieces[dst[i]+x]
				if !ok || got[0] != src[i]+x {
					t.Fatalf("block %d byte %d: got %v ok=%v", i, x, got, ok)
				}
				want++
			}
		}
		if len(pieces) != want {
			t.Fatalf("%d bytes written, %d expected", len(pieces), want)
		}
	})
}

func overlaps(dst, lens []uint64, d, l uint64) bool {
	for i := range dst {
		if d < dst[i]+lens[i] && dst[i] < d+l {
			return true
		}
	}
	return false
}

func TestPlanBatchShapes(t *testing.T) {
	p := ibv.ChainParams{SrcBase: 0, DstBase: 0, SrcLimit: 1 << 40, DstLimit: 1 << 40, MaxWR: 64, MaxSGE: 16,
		MaxWRBytes: 1 << 20, SignalEvery: 16, MaxChainBytes: 1 << 20}
	tests := []struct {
		name      string
		n         int
		sz        uint64
		srcStride uint64
		dstStride uint64
		nq        int
		wantWRs   int
	}{
		{"contiguous 128B x 1000 over 4 QPs: 4 WRs", 1000, 128, 128, 128, 4, 4},
		{"gather 128B x 1000 into contiguous dst: /16 per WR", 1000, 128, 4096, 128, 1, 63},
		{"scattered 4KiB x 1000: one WR each", 1000, 4096, 8192, 8192, 2, 1000},
		{"2MiB x 4 contiguous: cut at 1MiB WRs", 4, 2 << 20, 2 << 20, 2 << 20, 2, 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var src, dst, lens []uint64
			for i := 0; i < tc.n; i++ {
				src = append(src, uint64(i)*tc.srcStride)
				dst = append(dst, uint64(i)*tc.dstStride)
				lens = append(lens, tc.sz)
			}
			if tc.sz*uint64(tc.n) > 1<<18 {
				// the byte map would be too big: count WRs only
				_, wrs := countWRs(t, src, dst, lens, tc.nq, p)
				if wrs != tc.wantWRs {
					t.Fatalf("%d WRs, want %d", wrs, tc.wantWRs)
				}
				return
			}
			_, wrs, _ := planBatch(t, src, dst, lens, tc.nq, p)
			if wrs != tc.wantWRs {
				t.Fatalf("%d WRs, want %d", wrs, tc.wantWRs)
			}
		})
	}
}

func countWRs(t *testing.T, src, dst, lens []uint64, nq int, p ibv.ChainParams) (int, int) {
	var total uint64
	for _, l := range lens {
		total += l
	}
	cuts := make([]ibv.Pos, nq+1)
	m := splitBatch(lens, total, nq, cuts)
	wrs := 0
	ch, err := ibv.NewChain(p.MaxWR, p.MaxSGE)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for k := 0; k < m; k++ {
		ch.Setup(&p)
		ch.Start(cuts[k], cuts[k+1], true, 1)
		for done := false; !done; {
			res, err := ch.Plan(src, dst, lens)
			if err != nil {
				t.Fatal(err)
			}
			wrs += res.WRs
			done = res.Done
		}
	}
	return m, wrs
}
