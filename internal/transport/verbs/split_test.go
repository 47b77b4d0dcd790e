package verbs

import (
	"errors"
	"testing"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	ibv "github.com/b2bd/b2bd/verbs"
)

// rangeBytes counts the bytes of [a, b) in a batch.
func rangeBytes(lens []uint64, a, b ibv.Pos) uint64 {
	var t uint64
	for i := a.I; i <= b.I && int(i) < len(lens); i++ {
		lo, hi := uint64(0), lens[i]
		if i == a.I {
			lo = a.Off
		}
		if i == b.I {
			hi = b.Off
		}
		if hi > lo {
			t += hi - lo
		}
	}
	return t
}

// checkCuts verifies the split's invariants: it starts at 0 and ends at
// the batch end, ranges are non-empty and ordered, cuts inside a block only
// happen in blocks of at least splitMin, and bytes add up.
func checkCuts(t *testing.T, lens []uint64, total uint64, nq, m int, cuts []ibv.Pos) {
	t.Helper()
	if total == 0 {
		if m != 0 {
			t.Fatalf("%d ranges for an empty batch", m)
		}
		return
	}
	if m < 1 || m > nq {
		t.Fatalf("%d ranges for nq=%d", m, nq)
	}
	if cuts[0] != (ibv.Pos{}) || cuts[m] != (ibv.Pos{I: uint32(len(lens))}) {
		t.Fatalf("cuts %v do not span the batch", cuts[:m+1])
	}
	var sum uint64
	for k := 0; k < m; k++ {
		a, b := cuts[k], cuts[k+1]
		if b.I < a.I || (b.I == a.I && b.Off <= a.Off) {
			t.Fatalf("range %d: %v..%v not increasing", k, a, b)
		}
		if b.Off != 0 && (int(b.I) >= len(lens) || lens[b.I] < splitMin || b.Off >= lens[b.I]) {
			t.Fatalf("cut %v inside a small block or past its end", b)
		}
		rb := rangeBytes(lens, a, b)
		if rb == 0 {
			t.Fatalf("range %d is empty", k)
		}
		sum += rb
	}
	if sum != total {
		t.Fatalf("ranges carry %d bytes of %d", sum, total)
	}
}

func TestSplitBatch(t *testing.T) {
	uniform := func(n int, sz uint64) []uint64 {
		l := make([]uint64, n)
		for i := range l {
			l[i] = sz
		}
		return l
	}
	tests := []struct {
		name   string
		lens   []uint64
		nq     int
		ranges int
		maxDev float64 // largest range vs ideal share, as a fraction
	}{
		{"10k small blocks over 4 QPs", uniform(10000, 128), 4, 4, 0.001},
		{"one huge block is cut", uniform(1, 2<<20), 4, 4, 0.01},
		{"few small blocks: fewer ranges", uniform(2, 128), 4, 2, 1},
		{"one small block", uniform(1, 128), 4, 1, 3},
		{"1 QP", uniform(100, 4096), 1, 1, 0},
		{"mixed sizes", []uint64{128, 2 << 20, 4096, 64, 1 << 20, 1, 0, 300000}, 3, 3, 0.1},
		{"zeros only", []uint64{0, 0}, 4, 0, 0},
		{"empty", nil, 4, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var total uint64
			for _, l := range tc.lens {
				total += l
			}
			cuts := make([]ibv.Pos, tc.nq+1)
			m := splitBatch(tc.lens, total, tc.nq, cuts)
			checkCuts(t, tc.lens, total, tc.nq, m, cuts)
			if m != tc.ranges {
				t.Fatalf("%d ranges, want %d (%v)", m, tc.ranges, cuts[:m+1])
			}
			if m > 0 {
				ideal := float64(total) / float64(m)
				for k := 0; k < m; k++ {
					dev := (float64(rangeBytes(tc.lens, cuts[k], cuts[k+1])) - ideal) / ideal
					if dev > tc.maxDev {
						t.Fatalf("range %d is %.3f over its share", k, dev)
					}
				}
			}
		})
	}
}

func FuzzSplitBatch(f *testing.F) {
	f.Add([]byte{1, 2, 3, 200, 0, 0, 9}, uint8(3))
	f.Add([]byte{255, 255, 255, 255}, uint8(64))
	f.Fuzz(func(t *testing.T, data []byte, nq uint8) {
		var lens []uint64
		var total uint64
		for k := 0; k+1 < len(data); k += 2 {
			// bytes pick a size class from 0 to 4 MiB
			l := uint64(data[k]) << (data[k+1] % 15)
			lens = append(lens, l)
			total += l
		}
		n := int(nq%64) + 1
		cuts := make([]ibv.Pos, n+1)
		m := splitBatch(lens, total, n, cuts)
		checkCuts(t, lens, total, n, m, cuts)
	})
}

func TestSplitAllocs(t *testing.T) {
	lens := make([]uint64, 10000)
	for i := range lens {
		lens[i] = 4096
	}
	cuts := make([]ibv.Pos, 5)
	if a := testing.AllocsPerRun(100, func() { splitBatch(lens, 4096*10000, 4, cuts) }); a != 0 {
		t.Fatalf("%v allocs", a)
	}
}

func TestCheckBatch(t *testing.T) {
	tests := []struct {
		name string
		b    desc.Batch
		ok   bool
	}{
		{"fits", desc.Batch{Src: []uint64{0, 100}, Dst: []uint64{900, 0}, Len: []uint64{100, 100}}, true},
		{"src past end", desc.Batch{Src: []uint64{950}, Dst: []uint64{0}, Len: []uint64{100}}, false},
		{"dst past end", desc.Batch{Src: []uint64{0}, Dst: []uint64{901}, Len: []uint64{100}}, false},
		{"overflow", desc.Batch{Src: []uint64{^uint64(0) - 5}, Dst: []uint64{0}, Len: []uint64{10}}, false},
		{"huge length", desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{^uint64(0)}}, false},
		{"ragged", desc.Batch{Src: []uint64{0}, Dst: []uint64{0, 1}, Len: []uint64{1}}, false},
		{"empty", desc.Batch{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := checkBatch(&tc.b, 1000, 1000)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, errs.ErrInvalidArgument)) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}
