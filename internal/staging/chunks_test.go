package staging

import (
	"bytes"
	"testing"
)

// simulate runs a plan on byte slices (device memory of one GPU and the
// host buffer), hop by hop, and returns the destination.
func simulate(t testing.TB, p *ChunkPlan, dev []byte, host []byte, half uint64) {
	t.Helper()
	if len(p.InEnds) != len(p.OutEnds) {
		t.Fatalf("%d first-hop chunks, %d second-hop chunks", len(p.InEnds), len(p.OutEnds))
	}
	inLo, outLo := 0, 0
	inHalf := func(k int, h, n uint64, what string) {
		if want := uint64(k%2) * half; h < want || h+n > want+half {
			t.Fatalf("chunk %d %s copy [%d,+%d) leaves its half [%d,+%d)", k, what, h, n, want, half)
		}
	}
	for k := range p.InEnds {
		inHi, outHi := p.InEnds[k], p.OutEnds[k]
		if inHi <= inLo || outHi <= outLo {
			t.Fatalf("chunk %d is empty (ends %v / %v)", k, p.InEnds, p.OutEnds)
		}
		for j := inLo; j < inHi; j++ {
			inHalf(k, p.InHost[j], p.InLen[j], "first-hop")
			copy(host[p.InHost[j]:p.InHost[j]+p.InLen[j]], dev[p.InSrc[j]:p.InSrc[j]+p.InLen[j]])
		}
		for j := outLo; j < outHi; j++ {
			inHalf(k, p.OutHost[j], p.OutLen[j], "second-hop")
			copy(dev[p.OutDst[j]:p.OutDst[j]+p.OutLen[j]], host[p.OutHost[j]:p.OutHost[j]+p.OutLen[j]])
		}
		inLo, outLo = inHi, outHi
	}
	if inLo != len(p.InLen) || outLo != len(p.OutLen) {
		t.Fatalf("chunks cover %d/%d first-hop and %d/%d second-hop copies", inLo, len(p.InLen), outLo, len(p.OutLen))
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
			for _, planner := range []struct {
				name string
				plan func(*ChunkPlan, uint64, uint64, []uint64, []uint64, []uint64, uint64, uint64, uint64)
			}{{"PlanChunks", PlanChunks}, {"PlanStaged", PlanStaged}} {
				dev := append([]byte(nil), dev...)
				var p ChunkPlan
				planner.plan(&p, 0, 0, src, dst, tc.lens, 0, tc.half, tc.chunk)
				if planner.name == "PlanChunks" && len(p.InEnds) != tc.chunks {
					t.Fatalf("%s: %d chunks, want %d (ends %v)", planner.name, len(p.InEnds), tc.chunks, p.InEnds)
				}
				var got uint64
				for _, l := range p.OutLen {
					got += l
				}
				if got != total {
					t.Fatalf("%s: second hop carries %d bytes, want %d", planner.name, got, total)
				}
				simulate(t, &p, dev, make([]byte, 2*tc.half), tc.half)
				if !bytes.Equal(dev, want) {
					t.Fatalf("%s: staged copy differs from a direct copy", planner.name)
				}
			}
		})
	}
}

func TestPlanChunksBases(t *testing.T) {
	var p ChunkPlan
	PlanChunks(&p, 1000, 5000, []uint64{0, 8}, []uint64{16, 0}, []uint64{8, 8}, 9000, 8, 8)
	wantSrc, wantDst, wantHost := []uint64{1000, 1008}, []uint64{5016, 5000}, []uint64{9000, 9008}
	for i := range wantSrc {
		if p.InSrc[i] != wantSrc[i] || p.OutDst[i] != wantDst[i] || p.InHost[i] != wantHost[i] || p.OutHost[i] != wantHost[i] || p.InLen[i] != 8 {
			t.Fatalf("piece %d: got %d->%d via %d/%d (%d B), want %d->%d via %d (8 B)", i, p.InSrc[i], p.OutDst[i], p.InHost[i], p.OutHost[i], p.InLen[i], wantSrc[i], wantDst[i], wantHost[i])
		}
	}
}

// TestPlanStagedCovers: dense small blocks take one covering first-hop copy
// per chunk (what makes staging no slower than TCP at 128 B), while the
// second hop stays per block.
func TestPlanStagedCovers(t *testing.T) {
	const n, size = 1000, 128
	src, dst, lens := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i := range lens {
		src[i], dst[i], lens[i] = uint64(2*i)*size, uint64(2*(n-1-i)+1)*size, size
	}
	var p ChunkPlan
	PlanStaged(&p, 0, 0, src, dst, lens, 0, 1<<20, 1<<20)
	if len(p.InLen) != 1 || len(p.OutLen) != n {
		t.Fatalf("%d first-hop and %d second-hop copies; want 1 covering copy and %d", len(p.InLen), len(p.OutLen), n)
	}
}

func TestChunkBytes(t *testing.T) {
	for _, tc := range []struct{ total, half, want uint64 }{
		{1 << 30, 32 << 20, 32 << 20},   // large: whole halves
		{40 << 20, 32 << 20, 10 << 20},  // four chunks
		{100, 32 << 20, OverlapChunk},   // tiny: one chunk
		{1 << 20, 2 << 20, 2 << 20},     // a small buffer: its half
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
		for _, plan := range []func(*ChunkPlan, uint64, uint64, []uint64, []uint64, []uint64, uint64, uint64, uint64){PlanChunks, PlanStaged} {
			dev := append([]byte(nil), dev...)
			var p ChunkPlan
			plan(&p, 0, 0, src, dst, lens, 0, uint64(half), uint64(chunk))
			simulate(t, &p, dev, make([]byte, 2*uint64(half)), uint64(half))
			if !bytes.Equal(dev, want) {
				t.Fatal("staged copy differs from a direct copy")
			}
		}
	})
}
