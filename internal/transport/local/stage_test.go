package local

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/b2bd/b2bd/gpudirect/cudatest"
	"github.com/b2bd/b2bd/internal/desc"
)

// scattered is b2b-bench's layout on one device: blocks at random slots of
// a block plus a gap (min(block, 4 KiB)), in random source and destination
// order; src and dst are region offsets.
func scattered(n int, size uint64) (*desc.Batch, uint64) {
	r := rand.New(rand.NewPCG(uint64(n), size))
	slot := size + min(size, 4096)
	ps, pd := r.Perm(n), r.Perm(n)
	b := &desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
	for i := range n {
		b.Src[i], b.Dst[i], b.Len[i] = uint64(ps[i])*slot, uint64(pd[i])*slot, size
	}
	return b, uint64(n) * slot
}

// TestCopyStaged runs the staged same-device copy over the in-memory driver:
// every block lands byte for byte (and nothing else moves) for small and
// large blocks, ChunkBytes' chunks and small ones, the second hop on one
// stream or split over two; the split doubles the second hop's calls only
// where a chunk has the copies for it.
func TestCopyStaged(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		size  uint64
		chunk uint64
		split int
	}{
		{"128 B, one chunk", 3000, 128, 0, 1},
		{"128 B, one chunk, 2 streams", 3000, 128, 0, 2},
		{"128 B, 64 KiB chunks, 2 streams", 3000, 128, 64 << 10, 2},
		{"4 KiB, 2 streams", 2000, 4096, 0, 2},
		{"4 KiB, 4 streams", 2000, 4096, 0, 4},
		{"128 B, 64 KiB chunks, 4 streams", 3000, 128, 64 << 10, 4},
		{"64 KiB", 300, 64 << 10, 0, 1},
		{"blocks larger than a chunk, 2 streams", 20, 3 << 20, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cu := cudatest.New(cudatest.Device{TotalMem: 1 << 30})
			s, err := newStage(cu, 0, 8<<20)
			if err != nil {
				t.Fatal(err)
			}
			s.chunk, s.split = tc.chunk, tc.split
			b, region := scattered(tc.n, tc.size)
			src, _ := cu.MemAlloc(0, region)
			dst, _ := cu.MemAlloc(0, region)
			hs, _ := cu.HostAlloc(0, int(region))
			r := rand.New(rand.NewPCG(7, 7))
			for i := range hs {
				hs[i] = byte(r.Uint32())
			}
			if err := cu.MemcpyHtoDAsync(s.d2h, src, uintptrOf(hs), region); err != nil {
				t.Fatal(err)
			}
			before, _ := cu.DeviceBytes(dst, region)
			before = bytes.Clone(before)
			batches0, _ := cu.BatchStats()
			if err := copyStaged(context.Background(), cu, s, uint64(src), uint64(dst), b); err != nil {
				t.Fatal(err)
			}
			batches, _ := cu.BatchStats()
			got, _ := cu.DeviceBytes(dst, region)
			want := before
			for i := range b.Len {
				copy(want[b.Dst[i]:b.Dst[i]+b.Len[i]], hs[b.Src[i]:b.Src[i]+b.Len[i]])
			}
			if !bytes.Equal(got, want) {
				for i := range b.Len {
					if !bytes.Equal(got[b.Dst[i]:b.Dst[i]+b.Len[i]], want[b.Dst[i]:b.Dst[i]+b.Len[i]]) {
						t.Fatalf("block %d (%d B at %d <- %d) differs", i, b.Len[i], b.Dst[i], b.Src[i])
					}
				}
				t.Fatal("bytes outside the blocks changed")
			}
			p := &s.plan
			wantCalls, lo := len(p.InEnds), 0 // one first-hop call a chunk
			for _, hi := range p.OutEnds {
				wantCalls += s.parts(hi - lo)
				lo = hi
			}
			if got := batches - batches0; got != wantCalls {
				t.Errorf("%d batched calls for %d chunks, want %d", got, len(p.InEnds), wantCalls)
			}
			if err := s.close(cu); err != nil {
				t.Fatal(err)
			}
			_ = cu.MemFree(0, src)
			_ = cu.MemFree(0, dst)
			_ = cu.HostFree(0, hs)
			if l := cu.Leaks(); len(l) > 0 {
				t.Fatalf("left behind: %v", l)
			}
		})
	}
}

// TestCopyStagedFailure: a failed call fails the batch with its cause, and
// the streams are waited for before copyStaged returns.
func TestCopyStagedFailure(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name, method string
		nth          int // fail the nth call of method (1-based)
	}{
		{"first hop", "MemcpyBatchAsync", 1},
		{"second hop", "MemcpyBatchAsync", 2},
		{"event", "EventRecord", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cu := cudatest.New(cudatest.Device{TotalMem: 1 << 30})
			s, err := newStage(cu, 0, 8<<20)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.close(cu) }()
			s.split = 4
			b, region := scattered(2000, 128)
			src, _ := cu.MemAlloc(0, region)
			dst, _ := cu.MemAlloc(0, region)
			for range tc.nth - 1 { // let the earlier calls through
				cu.FailNext(tc.method, nil)
			}
			cu.FailNext(tc.method, boom)
			syncs := cu.Calls("StreamSynchronize")
			err = copyStaged(context.Background(), cu, s, uint64(src), uint64(dst), b)
			if !errors.Is(err, boom) {
				t.Fatalf("copyStaged: %v, want %v", err, boom)
			}
			if n := cu.Calls("StreamSynchronize") - syncs; n < 3 {
				t.Errorf("%d stream waits after the failure, want the three streams waited for", n)
			}
		})
	}
}
