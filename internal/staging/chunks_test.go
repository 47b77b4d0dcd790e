package staging

import (
	"bytes"
	"testing"
)

// simulate runs a plan on byte slices (device memory of one GPU and the
// host buffer), hop by hop, and returns the destination.
func simulate(t testing.TB, p *ChunkPlan, dev []byte, host []byte, half uint64) {
	t.Helper()
	lo := 0
	for k, hi := range p.Ends {
		if hi <= lo {
			t.Fatalf("chunk %d is empty (ends %v)", k, p.Ends)
		}
		var bytesIn uint64
		for j := lo; j < hi; j++ {
			h := p.Host[j]
			if want := uint64(k%2) * half; h < want || h+p.Len[j] > want+half {
				t.Fatalf("chunk %d piece %d [%d,+%d) leaves its half [%d,+%d)", k, j, h, p.Len[j], want, half)
			}
			bytesIn += p.Len[j]
			copy(host[h:h+p.Len[j]], dev[p.Src[j]:p.Src[j]+p.Len[j]])
		}
		for j := lo; j < hi; j++ {
			copy(dev[p.Dst[j]:p.Dst[j]+p.Len[j]], host[p.Host[j]:p.Host[j]+p.Len[j]])
		}
		lo = hi
	}
	if lo != len(p.Len) {
		t.Fatalf("chunks cover %d pieces of %d", lo, len(p.Len))
	}
}

func TestPlanChunks(t *testing.T) {
	for _, tc := range []struct {
		name        string
		lens        []uint64
		half, chunk uint64
		chunks      int
	}{
		{"one block fits", []uint64{100}, 256, 256, 1},
		{"blocks fill chunks exactly", []uint64{64, 64, 64, 64}, 128, 128, 2},
		{"a block straddles chunks", []uint64{100, 100, 100}, 128, 128, 3},
		{"a block larger than a half", []uint64{1000}, 128, 128, 8},
		{"smaller chunks than halves", []uint64{50, 50, 50, 50}, 256, 100, 2},
		{"zero-length blocks", []uint64{0, 10, 0}, 64, 64, 1},
		{"nothing", nil, 64, 64, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var total uint64
			for _, n := range tc.lens {
				total += n
			}
			// Source blocks packed at the start, destinations after them in
			// reverse order with a gap, so a misplaced piece is seen.
			n := len(tc.lens)
			src, dst := make([]uint64, n), make([]uint64, n)
			var off uint64
			for i, l := range tc.lens {
				src[i] = off
				off += l
			}
			off += 7
			for i := n - 1; i >= 0; i-- {
				dst[i] = off
				off += tc.lens[i] + 3
			}
			dev := make([]byte, off)
			for i := range dev {
				dev[i] = byte(i*31 + 1)
			}
			want := append([]byte(nil), dev...)
			for i := range tc.lens {
				copy(want[dst[i]:dst[i]+tc.lens[i]], dev[src[i]:src[i]+tc.lens[i]])
			}
			var p ChunkPlan
			PlanChunks(&p, 0, 0, src, dst, tc.lens, 0, tc.half, tc.chunk)
			if len(p.Ends) != tc.chunks {
				t.Fatalf("%d chunks, want %d (ends %v)", len(p.Ends), tc.chunks, p.Ends)
			}
			var got uint64
			for _, l := range p.Len {
				got += l
			}
			if got != total {
				t.Fatalf("pieces carry %d bytes, want %d", got, total)
			}
			simulate(t, &p, dev, make([]byte, 2*tc.half), tc.half)
			if !bytes.Equal(dev, want) {
				t.Fatal("staged copy differs from a direct copy")
			}
		})
	}
}

func TestPlanChunksBases(t *testing.T) {
	var p ChunkPlan
	PlanChunks(&p, 1000, 5000, []uint64{0, 8}, []uint64{16, 0}, []uint64{8, 8}, 9000, 8, 8)
	want := ChunkPlan{Src: []uint64{1000, 1008}, Dst: []uint64{5016, 5000}, Host: []uint64{9000, 9008}, Len: []uint64{8, 8}, Ends: []int{1, 2}}
	for i := range want.Src {
		if p.Src[i] != want.Src[i] || p.Dst[i] != want.Dst[i] || p.Host[i] != want.Host[i] || p.Len[i] != want.Len[i] {
			t.Fatalf("piece %d: got %d->%d via %d (%d B), want %d->%d via %d (%d B)", i, p.Src[i], p.Dst[i], p.Host[i], p.Len[i], want.Src[i], want.Dst[i], want.Host[i], want.Len[i])
		}
	}
}

func TestChunkBytes(t *testing.T) {
	for _, tc := range []struct{ total, half, want uint64 }{
		{1 << 30, 32 << 20, 32 << 20},   // large: whole halves
		{40 << 20, 32 << 20, 10 << 20},  // four chunks
		{100, 32 << 20, MinStagedChunk}, // tiny: one chunk
		{100 << 10, 64 << 10, 64 << 10}, // never above a half
		{0, 0, 1},                       // degenerate
	} {
		if got := ChunkBytes(tc.total, tc.half); got != tc.want {
			t.Errorf("ChunkBytes(%d, %d) = %d, want %d", tc.total, tc.half, got, tc.want)
		}
	}
}

func FuzzPlanChunks(f *testing.F) {
	f.Add([]byte{10, 200, 3, 0, 90}, uint16(64), uint16(32))
	f.Add([]byte{255, 255}, uint16(1), uint16(1))
	f.Fuzz(func(t *testing.T, sizes []byte, half, chunk uint16) {
		if half == 0 || len(sizes) > 64 {
			return
		}
		n := len(sizes)
		lens, src, dst := make([]uint64, n), make([]uint64, n), make([]uint64, n)
		var off uint64
		for i, s := range sizes {
			lens[i], src[i] = uint64(s), off
			off += uint64(s)
		}
		for i := range lens {
			dst[i] = off
			off += lens[i]
		}
		dev := make([]byte, off)
		for i := range dev {
			dev[i] = byte(i*13 + 5)
		}
		want := append([]byte(nil), dev...)
		for i := range lens {
			copy(want[dst[i]:dst[i]+lens[i]], dev[src[i]:src[i]+lens[i]])
		}
		var p ChunkPlan
		PlanChunks(&p, 0, 0, src, dst, lens, 0, uint64(half), uint64(chunk))
		simulate(t, &p, dev, make([]byte, 2*uint64(half)), uint64(half))
		if !bytes.Equal(dev, want) {
			t.Fatal("staged copy differs from a direct copy")
		}
	})
}
