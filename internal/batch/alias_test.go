package batch

import (
	"slices"
	"testing"

	"github.com/b2bd/b2bd/internal/desc"
)

// bruteOverlap is overlap by every pair.
func bruteOverlap(b *desc.Batch, sb, db uint64) bool {
	for i := range b.Src {
		for j := range b.Dst {
			if sb+b.Src[i] < db+b.Dst[j]+b.Len[j] && db+b.Dst[j] < sb+b.Src[i]+b.Len[i] {
				return true
			}
		}
	}
	return false
}

func TestOverlap(t *testing.T) {
	for _, c := range []struct {
		name             string
		src, dst, length []uint64
		srcBase, dstBase uint64
		want             bool
	}{
		{"apart", []uint64{0, 100}, []uint64{200, 300}, []uint64{50, 50}, 0, 0, false},
		{"touching ends do not overlap", []uint64{0}, []uint64{50}, []uint64{50}, 0, 0, false},
		{"forward by one", []uint64{0}, []uint64{1}, []uint64{50}, 0, 0, true},
		{"a block onto itself", []uint64{64}, []uint64{64}, []uint64{8}, 0, 0, true},
		{"another block's destination", []uint64{0, 1000}, []uint64{990, 2000}, []uint64{20, 20}, 0, 0, true},
		{"sources overlap each other only", []uint64{0, 10}, []uint64{100, 200}, []uint64{50, 50}, 0, 0, false},
		{"apart by the bases", []uint64{0}, []uint64{0}, []uint64{4096}, 0, 4096, false},
		{"overlap by the bases", []uint64{4000}, []uint64{0}, []uint64{4096}, 0, 4096, true},
		{"a long source over a later short destination", []uint64{0, 5000}, []uint64{9000, 100}, []uint64{1000, 10}, 0, 0, true},
	} {
		b := &desc.Batch{Src: c.src, Dst: c.dst, Len: c.length}
		i, j, got := overlap(b, c.srcBase, c.dstBase)
		if got != c.want {
			t.Errorf("%s: overlap %v, want %v", c.name, got, c.want)
			continue
		}
		if got {
			s0, d0 := c.srcBase+c.src[i], c.dstBase+c.dst[j]
			if !(s0 < d0+c.length[j] && d0 < s0+c.length[i]) {
				t.Errorf("%s: named src %d and dst %d, which do not overlap", c.name, i, j)
			}
		}
	}
}

// FuzzOverlap: overlap agrees with every pair, and the pair it names overlaps.
func FuzzOverlap(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, uint16(0), uint16(0))
	f.Add([]byte{10, 0, 5, 3, 1, 200, 7, 7, 7}, uint16(3), uint16(9))
	f.Fuzz(func(t *testing.T, data []byte, sb, db uint16) {
		n := len(data) / 3
		if n > 64 {
			n = 64
		}
		b := &desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
		for k := 0; k < n; k++ {
			b.Src[k], b.Dst[k], b.Len[k] = uint64(data[3*k]), uint64(data[3*k+1]), uint64(data[3*k+2]%16)+1
		}
		i, j, got := overlap(b, uint64(sb), uint64(db))
		if want := bruteOverlap(b, uint64(sb), uint64(db)); got != want {
			t.Fatalf("overlap %v, every pair says %v (batch %v, bases %d %d)", got, want, b, sb, db)
		}
		if got {
			s0, d0 := uint64(sb)+b.Src[i], uint64(db)+b.Dst[j]
			if !(s0 < d0+b.Len[j] && d0 < s0+b.Len[i]) {
				t.Fatalf("named src %d and dst %d, which do not overlap", i, j)
			}
		}
	})
}

// FuzzFirstOverlap: over ranges in two memories, firstOverlap agrees with
// every pair of one memory, and the pair it names overlaps.
func FuzzFirstOverlap(f *testing.F) {
	f.Add([]byte{0, 1, 10, 0, 1, 0, 5, 3, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		var rs []rng
		for k := 0; k+2 < len(data) && k < 3*64; k += 3 {
			rs = append(rs, rng{space: uint64(data[k] & 1), start: uint64(data[k+1]), end: uint64(data[k+1]) + uint64(data[k+2]%16) + 1,
				idx: k / 3, dst: data[k]&2 != 0})
		}
		want := false
		for _, a := range rs {
			for _, b := range rs {
				want = want || (!a.dst && b.dst && a.space == b.space && a.start < b.end && b.start < a.end)
			}
		}
		byIdx := map[int]rng{}
		for _, r := range rs {
			byIdx[r.idx] = r
		}
		i, j, got := firstOverlap(slices.Clone(rs))
		if got != want {
			t.Fatalf("firstOverlap %v, every pair says %v: %v", got, want, rs)
		}
		if got {
			a, b := byIdx[i], byIdx[j]
			if a.dst || !b.dst || a.space != b.space || !(a.start < b.end && b.start < a.end) {
				t.Fatalf("named %+v and %+v, which do not overlap", a, b)
			}
		}
	})
}
