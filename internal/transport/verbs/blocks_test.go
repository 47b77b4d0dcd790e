package verbs

import (
	"fmt"
	"testing"

	kvlayout "github.com/b2bd/b2bd/internal/layout"
	ibv "github.com/b2bd/b2bd/verbs"
)

// TestBlockCuts: a block request's QP ranges start at (0, 0), end at
// (groups, 0), go strictly up (so no range is empty and each sends its
// immediate), stay below n entries per group, number at most nq, and
// split the bytes about evenly when there are enough of them.
func TestBlockCuts(t *testing.T) {
	for _, tc := range []struct {
		segs, n, nq int
		blk         uint64
	}{
		{1, 1, 4, 64}, {1, 100, 4, 64}, {16, 64, 4, 8192}, {160, 512, 8, 8192}, {3, 2, 8, 512}, {5, 7, 3, 100}, {2, 1000, 64, 16},
	} {
		t.Run(fmt.Sprintf("%dx%d/nq%d", tc.segs, tc.n, tc.nq), func(t *testing.T) {
			var segs []kvlayout.Segment
			for i := 0; i < tc.segs; i++ {
				segs = append(segs, kvlayout.Segment{Region: fmt.Sprintf("r%d", i), BlockLen: tc.blk, Stride: tc.blk * 2, NumBlocks: 4096})
			}
			l, err := kvlayout.New("l", segs, func(string) (uint64, error) { return 1 << 40, nil }, kvlayout.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			p, err := kvlayout.NewPair(l, l, kvlayout.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			s := &qpSet{}
			total, _ := blockTotals(p, tc.n)
			nr := s.blockCuts(p, tc.n, total, tc.nq)
			c := s.blk.cuts
			if nr != len(c)-1 || nr < 1 || nr > tc.nq {
				t.Fatalf("%d ranges (cuts %v), want 1..%d", nr, c, tc.nq)
			}
			if c[0] != (ibv.BlockPos{}) || c[nr] != (ibv.BlockPos{Group: uint32(p.NumGroups())}) {
				t.Fatalf("cuts %v do not span the request", c)
			}
			bytesTo := func(x ibv.BlockPos) uint64 { return uint64(x.Group)*uint64(tc.n)*tc.blk + uint64(x.Entry)*tc.blk }
			for k := 1; k <= nr; k++ {
				a, b := c[k-1], c[k]
				if b.Group < a.Group || (b.Group == a.Group && b.Entry <= a.Entry) || int(b.Entry) >= tc.n {
					t.Fatalf("cut %d: %v after %v", k, b, a)
				}
				if share := bytesTo(b) - bytesTo(a); tc.n*tc.segs >= tc.nq*4 && share > 2*total/uint64(nr)+tc.blk {
					t.Fatalf("range %d carries %d of %d bytes over %d ranges", k, share, total, nr)
				}
			}
		})
	}
}
