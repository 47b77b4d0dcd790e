package staging

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
)

// benchLayout is b2b-bench's layout: source and destination regions cut
// into slots of a block plus a gap (min(block, 4 KiB)), block i at the start
// of a random source slot and a random destination slot.
func benchLayout(n int, size uint64, seed uint64) (src, dst, lens []uint64, region uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	slot := size + min(size, 4096)
	region = uint64(n) * slot
	ps, pd := r.Perm(n), r.Perm(n)
	src, dst, lens = make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i := range lens {
		src[i], dst[i], lens[i] = uint64(ps[i])*slot, region+uint64(pd[i])*slot, size
	}
	return src, dst, lens, 2 * region
}

// checkStaged runs p over a patterned device image and checks every byte
// against a direct copy of each block (and that no other byte moved).
func checkStaged(t *testing.T, p *ChunkPlan, src, dst, lens []uint64, devBytes, half uint64) {
	t.Helper()
	dev := make([]byte, devBytes)
	for i := range dev {
		dev[i] = byte(i*131 + i>>8 + 7)
	}
	want := append([]byte(nil), dev...)
	for i := range lens {
		copy(want[dst[i]:dst[i]+lens[i]], dev[src[i]:src[i]+lens[i]])
	}
	simulate(t, p, dev, make([]byte, 2*half), half)
	if !bytes.Equal(dev, want) {
		for i := range dev {
			if dev[i] != want[i] {
				t.Fatalf("byte %d: got %d, want %d (first difference)", i, dev[i], want[i])
			}
		}
	}
}

// TestPlanStagedScattered: small blocks at random slots of a region (the
// bench's layout) are read by one or two covering copies per chunk (the
// second where a block fits the chunk but the gap before it does not),
// whatever their
// order in the batch, and land byte for byte. Planned in batch order, each
// chunk's blocks spanned the whole region and went one copy per block: the
// same-device path's 128 B batches cost about three times TCP's.
func TestPlanStagedScattered(t *testing.T) {
	for _, tc := range []struct {
		name         string
		n            int
		size         uint64
		half, chunk  uint64
		gap          uint64
		maxFirstHops int // first-hop copies at most
	}{
		{"128 B, one chunk", 1000, 128, 1 << 20, 1 << 20, MergeGap, 1},
		{"128 B, four chunks", 1000, 128, 1 << 20, 64000, MergeGap, 8},
		{"4 KiB, halves smaller than the span", 1000, 4096, 1 << 20, 1 << 20, MergeGap, 16},
		{"64 KiB, gaps read through", 64, 64 << 10, 1 << 20, 1 << 20, MergeGap, 5},
		{"64 KiB, gap 0: one copy per block", 64, 64 << 10, 1 << 20, 1 << 20, 0, 64},
		{"blocks larger than a chunk", 8, 300 << 10, 256 << 10, 256 << 10, MergeGap, 8 * 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst, lens, devBytes := benchLayout(tc.n, tc.size, 42)
			var p ChunkPlan
			PlanStagedGap(&p, 0, 0, src, dst, lens, 0, tc.half, tc.chunk, tc.gap)
			if len(p.InLen) > tc.maxFirstHops {
				t.Errorf("%d first-hop copies in %d chunks, want at most %d", len(p.InLen), len(p.InEnds), tc.maxFirstHops)
			}
			var moved uint64
			for _, l := range p.OutLen {
				moved += l
			}
			if want := uint64(tc.n) * tc.size; moved != want {
				t.Errorf("second hop carries %d bytes, want %d", moved, want)
			}
			checkStaged(t, &p, src, dst, lens, devBytes, tc.half)
		})
	}
}

// TestPlanStagedOdd: overlapping and repeated sources, zero-length blocks,
// blocks out of order and pieces of blocks still land byte for byte, under
// any gap and chunk.
func TestPlanStagedOdd(t *testing.T) {
	src := []uint64{500, 0, 100, 100, 130, 900, 40}
	lens := []uint64{60, 50, 80, 0, 200, 10, 30}
	dst := []uint64{2000, 2100, 2200, 2300, 2400, 2700, 2800}
	for _, half := range []uint64{64, 100, 512, 4096} {
		for _, chunk := range []uint64{1, 7, 64, 4096} {
			for _, gap := range []uint64{0, 16, 1000} {
				var p ChunkPlan
				PlanStagedGap(&p, 0, 0, src, dst, lens, 0, half, chunk, gap)
				checkStaged(t, &p, src, dst, lens, 4096, half)
			}
		}
	}
}

// TestPlanStagedBases: source, destination and host bases are added to
// every address.
func TestPlanStagedBases(t *testing.T) {
	var p ChunkPlan
	PlanStagedGap(&p, 1000, 5000, []uint64{8, 0}, []uint64{0, 16}, []uint64{8, 8}, 9000, 64, 64, MergeGap)
	if len(p.InLen) != 1 || p.InSrc[0] != 1000 || p.InHost[0] != 9000 || p.InLen[0] != 16 {
		t.Fatalf("first hop %v <- %v (%v B), want one copy 9000 <- 1000 (16 B)", p.InHost, p.InSrc, p.InLen)
	}
	// Source order: block 1 (source 0) first, then block 0 (source 8).
	if p.OutDst[0] != 5016 || p.OutHost[0] != 9000 || p.OutDst[1] != 5000 || p.OutHost[1] != 9008 {
		t.Fatalf("second hop %v <- %v, want [5016 5000] <- [9000 9008]", p.OutDst, p.OutHost)
	}
}

func BenchmarkPlanStaged(b *testing.B) {
	src, dst, lens, _ := benchLayout(10000, 128, 1)
	var p ChunkPlan
	for b.Loop() {
		PlanStaged(&p, 0, 0, src, dst, lens, 0, 32<<20, ChunkBytes(10000*128, 32<<20))
	}
}

func BenchmarkPlanStagedSorted(b *testing.B) {
	src, dst, lens, _ := benchLayout(10000, 128, 1)
	slices.Sort(src)
	var p ChunkPlan
	for b.Loop() {
		PlanStaged(&p, 0, 0, src, dst, lens, 0, 32<<20, ChunkBytes(10000*128, 32<<20))
	}
}

// FuzzPlanStaged: any block sizes, source order, chunk, half and gap land
// byte for byte.
func FuzzPlanStaged(f *testing.F) {
	f.Add([]byte{10, 200, 3, 0, 90}, uint64(7), uint16(64), uint16(32), uint16(8))
	f.Add([]byte{255, 255, 1}, uint64(1), uint16(1), uint16(1), uint16(0))
	f.Fuzz(func(t *testing.T, sizes []byte, seed uint64, half, chunk, gap uint16) {
		if half == 0 || len(sizes) > 64 {
			return
		}
		n := len(sizes)
		r := rand.New(rand.NewPCG(seed, 2))
		lens, src, dst := make([]uint64, n), make([]uint64, n), make([]uint64, n)
		var off uint64
		for _, i := range r.Perm(n) { // sources in a random order, gaps between
			lens[i], src[i] = uint64(sizes[i]), off
			off += uint64(sizes[i]) + uint64(r.IntN(5))
		}
		for i := range lens {
			dst[i] = off
			off += lens[i]
		}
		var p ChunkPlan
		PlanStagedGap(&p, 0, 0, src, dst, lens, 0, uint64(half), uint64(chunk), uint64(gap))
		checkStaged(t, &p, src, dst, lens, off, uint64(half))
	})
}
