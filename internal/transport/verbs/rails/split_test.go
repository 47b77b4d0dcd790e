package rails

import (
	"testing"

	"github.com/b2bd/b2bd/internal/desc"
)

// covers checks that shares hold exactly b's bytes, in order, at the same
// source and destination offsets, with only blocks over WholeBlock cut and
// only at CutAlign boundaries of the block.
func covers(t *testing.T, b *desc.Batch, shares []desc.Batch, bytes []uint64) {
	t.Helper()
	i := 0
	var off uint64
	for k, sh := range shares {
		var sum uint64
		if sh.N() == 0 {
			t.Fatalf("share %d is empty", k)
		}
		for j := range sh.Src {
			if i >= b.N() {
				t.Fatalf("share %d entry %d beyond the batch", k, j)
			}
			if sh.Src[j] != b.Src[i]+off || sh.Dst[j] != b.Dst[i]+off || sh.Len[j] == 0 || off+sh.Len[j] > b.Len[i] {
				t.Fatalf("share %d entry %d = (%d,%d,%d), block %d is (%d,%d,%d) at offset %d", k, j, sh.Src[j], sh.Dst[j], sh.Len[j], i, b.Src[i], b.Dst[i], b.Len[i], off)
			}
			if off%CutAlign != 0 || (sh.Len[j] != b.Len[i] && b.Len[i] <= WholeBlock) {
				t.Fatalf("block %d (%d bytes) cut at %d", i, b.Len[i], off)
			}
			sum += sh.Len[j]
			off += sh.Len[j]
			if off == b.Len[i] {
				i, off = i+1, 0
			}
		}
		if sum != bytes[k] {
			t.Fatalf("share %d holds %d bytes, reported %d", k, sum, bytes[k])
		}
	}
	if i != b.N() || off != 0 {
		t.Fatalf("shares end at block %d offset %d of %d blocks", i, off, b.N())
	}
}

func uniform(n int, l uint64) *desc.Batch {
	b := &desc.Batch{}
	for i := 0; i < n; i++ {
		b.Src = append(b.Src, uint64(i)*l*2)
		b.Dst = append(b.Dst, uint64(i)*l*3)
		b.Len = append(b.Len, l)
	}
	return b
}

func TestSplit(t *testing.T) {
	cases := []struct {
		name   string
		b      *desc.Batch
		n      int
		shares []uint64 // bytes per share
	}{
		{"10000 x 128 B over 2", uniform(10000, 128), 2, []uint64{640000, 640000}},
		{"3 x 128 B over 2: whole blocks", uniform(3, 128), 2, []uint64{256, 128}},
		{"one 2 MiB block over 2: cut in the middle", uniform(1, 2<<20), 2, []uint64{1 << 20, 1 << 20}},
		{"one 2 MiB block over 3: cut at 4 KiB", uniform(1, 2<<20), 3, []uint64{700416, 700416, 696320}},
		{"one 64 KiB block over 2: whole", uniform(1, 64<<10), 2, []uint64{64 << 10}},
		{"8 x 2 MiB over 2", uniform(8, 2<<20), 2, []uint64{8 << 20, 8 << 20}},
		{"one block over 1", uniform(1, 100), 1, []uint64{100}},
		{"5 x 100 KiB over 4", uniform(5, 100<<10), 4, []uint64{131072, 126976, 126976, 126976}},
	}
	var sc scratch
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			total := c.b.Bytes()
			sc.reset()
			shares, bytes := sc.split(c.b, total, c.n)
			covers(t, c.b, shares, bytes)
			if len(bytes) != len(c.shares) {
				t.Fatalf("%d shares %v, want %v", len(bytes), bytes, c.shares)
			}
			for k := range bytes {
				if bytes[k] != c.shares[k] {
					t.Fatalf("shares %v, want %v", bytes, c.shares)
				}
			}
		})
	}
}

func BenchmarkSplit10K(b *testing.B) {
	bt := uniform(10000, 4096)
	total := bt.Bytes()
	var sc scratch
	b.ReportAllocs()
	for b.Loop() {
		sc.reset()
		sc.split(bt, total, 2)
	}
}

func FuzzSplit(f *testing.F) {
	f.Add([]byte{1, 2, 3}, uint8(2), uint32(128))
	f.Add([]byte{200, 0, 17}, uint8(3), uint32(3<<20))
	f.Fuzz(func(t *testing.T, lens []byte, n uint8, unit uint32) {
		if len(lens) == 0 || len(lens) > 512 || n == 0 || n > 16 || unit == 0 || unit > 4<<20 {
			return
		}
		b := &desc.Batch{}
		var at uint64
		for _, l := range lens {
			ln := uint64(l%64+1) * uint64(unit) / 64
			if ln == 0 {
				ln = 1
			}
			b.Src = append(b.Src, at)
			b.Dst = append(b.Dst, at+7)
			b.Len = append(b.Len, ln)
			at += ln
		}
		var sc scratch
		shares, bytes := sc.split(b, b.Bytes(), int(n))
		if len(shares) > int(n) {
			t.Fatalf("%d shares for %d rails", len(shares), n)
		}
		covers(t, b, shares, bytes)
	})
}
