package local

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"path/filepath"

	"github.com/b2bd/b2bd/gpudirect/cudatest"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestCopyToHost: small GPU blocks into host memory go through the stage
// in a few covering device-to-host copies, land where they belong and
// leave every gap alone, in one chunk or many; blocks too far apart to
// share a copy are left to the direct path untouched; a fault on the
// destination (its file shrunk) and a deadline end the batch with an
// error, and the stage serves the next one.
func TestCopyToHost(t *testing.T) {
	const n = 2000
	spaced := func(bs, gap uint64) *desc.Batch {
		b := &desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
		perm := rand.New(rand.NewPCG(1, 2)).Perm(n)
		for i := range n {
			b.Src[i] = uint64(perm[i]) * gap // source order differs from the batch's
			b.Dst[i] = uint64(2*i) * bs
			b.Len[i] = bs
		}
		return b
	}
	for _, tc := range []struct {
		name      string
		bs        uint64 // block bytes (128 where 0)
		gap       uint64 // source slot, in blocks
		chunk     uint64 // 0: the stage's own
		truncated bool
		cancelled bool
		want      error // nil: lands
	}{
		{name: "128 B, one range", gap: 2},
		{name: "4 KiB, chunks of 1 MiB", bs: 4096, gap: 2, chunk: 1 << 20},
		{name: "4 KiB, one range, the CPU's copies in shares", bs: 4096, gap: 2},
		{name: "destination shrunk, one range in shares", bs: 4096, gap: 2, truncated: true},
		{name: "too far apart", gap: 512, want: errNotMerged},
		{name: "destination shrunk, one range", gap: 2, truncated: true},
		{name: "destination shrunk, chunks", bs: 4096, gap: 2, chunk: 1 << 20, truncated: true},
		{name: "deadline, one range", gap: 2, cancelled: true, want: context.Canceled},
		{name: "deadline, chunks", bs: 4096, gap: 2, chunk: 1 << 20, cancelled: true, want: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cu := cudatest.New()
			bs := max(tc.bs, 128)
			s, err := newStage(cu, 0, 16<<20)
			if err != nil {
				t.Fatal(err)
			}
			defer s.close(cu)
			s.chunk = tc.chunk
			pool := newHostPool(4)
			defer pool.close()
			b := spaced(bs, tc.gap*bs)
			srcLen := uint64(n) * tc.gap * bs
			p, err := cu.MemAlloc(0, srcLen)
			if err != nil {
				t.Fatal(err)
			}
			src, err := cu.DeviceBytes(p, srcLen)
			if err != nil {
				t.Fatal(err)
			}
			fill(src, 3)
			var dst, before []byte
			if tc.truncated {
				dst = truncatedMapping(t, int(2*n*bs)) // reading it past a page faults
			} else {
				dst = make([]byte, 2*n*bs)
				fill(dst, 5)
				before = append([]byte(nil), dst...)
			}
			ctx := context.Background()
			if tc.cancelled {
				c, cancel := context.WithCancel(ctx)
				cancel()
				ctx = c
			}
			_, d2h0 := cu.BatchStats()
			err = copyToHost(ctx, cu, s, uint64(p), dst, b, pool, 4)
			switch {
			case tc.truncated:
				if !memguard.IsFault(err) || memguard.SideOf(err) != memguard.Destination {
					t.Fatalf("copyToHost into a shrunk file: %v, want a fault on the destination", err)
				}
				dst = make([]byte, 2*n*bs)
				if err := copyToHost(context.Background(), cu, s, uint64(p), dst, b, pool, 4); err != nil {
					t.Fatalf("the batch after a fault: %v", err)
				}
				for i := range b.Len {
					if !bytes.Equal(dst[b.Dst[i]:b.Dst[i]+b.Len[i]], src[b.Src[i]:b.Src[i]+b.Len[i]]) {
						t.Fatalf("the batch after a fault: block %d did not land", i)
					}
				}
				return
			case tc.want != nil:
				if !errors.Is(err, tc.want) {
					t.Fatalf("copyToHost: %v, want %v", err, tc.want)
				}
				if tc.want == errNotMerged && !bytes.Equal(dst, before) {
					t.Fatal("a batch left to the direct path was partly copied")
				}
				if tc.cancelled && !strings.Contains(err.Error(), "cut off") {
					t.Fatalf("copyToHost after its deadline: %q does not say it was cut off", err)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			want := append([]byte(nil), before...)
			for i := range b.Len {
				copy(want[b.Dst[i]:b.Dst[i]+b.Len[i]], src[b.Src[i]:b.Src[i]+b.Len[i]])
			}
			if !bytes.Equal(dst, want) {
				t.Fatal("destination differs from the expected blocks and gaps")
			}
			// One covering copy (up to oneRangeBytes), or one a chunk (two
			// where a block straddles its end).
			_, d2h := cu.BatchStats()
			if one := b.Bytes() <= oneRangeBytes && tc.chunk == 0; one && d2h-d2h0 != 1 || !one && d2h-d2h0 > 2*len(s.plan.InEnds) {
				t.Fatalf("%d device-to-host copies for %d blocks (%d chunks planned)", d2h-d2h0, n, len(s.plan.InEnds))
			}
		})
	}
}

// TestGPUBatchParts: a GPU batch of many small blocks is queued in parts
// (one per MinPartCopies copies, at most gpudirect.ParallelParts, on the
// connection's streams), a host-to-device one too (gpudirect holds its
// parts' streams until all are queued), a small or a large-block one not;
// every block lands either way.
func TestGPUBatchParts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		hostSrc   bool // host -> GPU1; else GPU0 -> GPU1
		n         int
		bs        uint64
		streams   int
		wantParts int // MemcpyBatchAsyncParts calls
		wantCalls int // batched calls in all
	}{
		{"1000 blocks", false, 1000, 512, 4, 0, 1},
		{"4096 blocks", false, 4096, 512, 4, 1, 4},
		{"2 streams", false, 4096, 512, 2, 1, 2},
		{"1500 blocks", false, 1500, 512, 4, 1, 2},
		{"1 stream", false, 4096, 512, 1, 0, 1},
		{"64 KiB blocks", false, 1024, 64 << 10, 4, 0, 4},
		{"host to GPU", true, 4096, 512, 4, 1, 4},
		{"host to GPU, 1000 blocks", true, 1000, 512, 4, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cu := cudatest.New(cudatest.Device{}, cudatest.Device{})
			dir := t.TempDir()
			in := &fakeInbound{}
			recv, err := New(Config{Dir: filepath.Join(dir, "recv"), Node: "recv", CUDA: cu, Streams: tc.streams}, in, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer recv.Close()
			send, err := New(Config{Dir: filepath.Join(dir, "send"), Node: "send", CUDA: cu, Streams: tc.streams}, &fakeInbound{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer send.Close()
			region := 2 * uint64(tc.n) * tc.bs
			p, err := cu.MemAlloc(1, region)
			if err != nil {
				t.Fatal(err)
			}
			dst, err := recv.Register(memory.Memory{Kind: memory.CUDA, Device: 1, Addr: p, Len: region, DmabufFD: -1})
			if err != nil {
				t.Fatal(err)
			}
			in.add(dst)
			var srcMem memory.Memory
			var srcBytes []byte
			if tc.hostSrc {
				srcMem = shmRegion(t, dir, int(region))
				srcBytes = srcMem.Host
			} else {
				sp, err := cu.MemAlloc(0, region)
				if err != nil {
					t.Fatal(err)
				}
				srcMem = memory.Memory{Kind: memory.CUDA, Device: 0, Addr: sp, Len: region, DmabufFD: -1}
				if srcBytes, err = cu.DeviceBytes(sp, region); err != nil {
					t.Fatal(err)
				}
			}
			src, err := send.Register(srcMem)
			if err != nil {
				t.Fatal(err)
			}
			conn, err := send.Connect(context.Background(), transport.Peer{Address: "local", Node: "recv", Advert: MarshalEndpoint(recv.Endpoint())})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fill(srcBytes, 9)
			b := gapped(tc.n, tc.bs)
			parts0, calls0 := cu.Calls("MemcpyBatchAsyncParts"), cu.Calls("MemcpyBatchAsync")
			if _, err := transport.Write(context.Background(), conn, src, transport.RemoteRegion{Name: "d", Size: region, Key: dst.Key()}, b); err != nil {
				t.Fatal(err)
			}
			if got := cu.Calls("MemcpyBatchAsyncParts") - parts0; got != tc.wantParts {
				t.Errorf("%d calls in parts, want %d", got, tc.wantParts)
			}
			// Host-to-device batches go in primed chunks in the real
			// driver; the mock counts each part or share as one call.
			if got := cu.Calls("MemcpyBatchAsync") - calls0; got != tc.wantCalls {
				t.Errorf("%d batched calls, want %d", got, tc.wantCalls)
			}
			db, err := cu.DeviceBytes(p, region)
			if err != nil {
				t.Fatal(err)
			}
			for i := range b.Len {
				if !bytes.Equal(db[b.Dst[i]:b.Dst[i]+b.Len[i]], srcBytes[b.Src[i]:b.Src[i]+b.Len[i]]) {
					t.Fatalf("block %d did not land", i)
				}
			}
		})
	}
}

// TestOneRange: which batches copyToHost moves with one covering copy.
func TestOneRange(t *testing.T) {
	batch := func(src ...uint64) *desc.Batch {
		b := &desc.Batch{Src: src, Dst: make([]uint64, len(src)), Len: make([]uint64, len(src))}
		for i := range src {
			b.Len[i] = 128
		}
		return b
	}
	for _, tc := range []struct {
		name     string
		b        *desc.Batch
		size     uint64
		lo, span uint64
		ok       bool
	}{
		{"empty", batch(), 1 << 20, 0, 0, false},
		{"gapped, out of order", batch(512, 0, 256), 1 << 20, 0, 640, true},
		{"over the buffer", batch(0, 1<<20), 1 << 20, 0, 1<<20 + 128, false},
		{"sparser than toHostMerge", batch(0, 4096), 1 << 20, 0, 4096 + 128, false},
		{"over oneRangeBytes", &desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{oneRangeBytes + 1}}, 1 << 30, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, span, ok := oneRange(tc.b, tc.size)
			if ok != tc.ok || ok && (lo != tc.lo || span != tc.span) {
				t.Fatalf("oneRange = %d, %d, %v; want %d, %d, %v", lo, span, ok, tc.lo, tc.span, tc.ok)
			}
		})
	}
}
