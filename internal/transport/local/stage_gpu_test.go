package local

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/gpudirect/cudatest"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/staging"
)

// TestGPUStagedSameDevice measures the staged same-device path in one
// process on a real GPU (it skips without one), variant by variant, over
// b2b-bench's layout (blocks at random slots of a block plus a gap), every
// block of every timed batch checked. It logs one line per size and variant:
// the median batch, the first-hop copies and chunks, and each hop alone.
// Cross-build it and run it on a GPU host:
//
//	go test -c -o .gpubin/local.test ./internal/transport/local
//	.gpubin/local.test -test.run TestGPUStagedSameDevice -test.v
//
// B2B_STAGE_SIZES (comma-separated bytes) and B2B_STAGE_ITERS change the sweep.
func TestGPUStagedSameDevice(t *testing.T) {
	cu, err := gpudirect.Load()
	if err != nil {
		if os.Getenv("B2B_STAGE_FAKE") == "" {
			t.Skipf("no usable CUDA driver: %v", err)
		}
		cu = cudatest.New(cudatest.Device{TotalMem: 8 << 30}) // the test's own check, without a GPU
	}
	defer func() { _ = cu.Close() }()
	sizes := []uint64{128, 4096, 65536, 2 << 20}
	if v := os.Getenv("B2B_STAGE_SIZES"); v != "" {
		sizes = sizes[:0]
		for _, f := range bytes.Split([]byte(v), []byte(",")) {
			n, err := strconv.ParseUint(string(f), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			sizes = append(sizes, n)
		}
	}
	iters := 7
	if v, err := strconv.Atoi(os.Getenv("B2B_STAGE_ITERS")); err == nil && v > 0 {
		iters = v
	}
	s, err := newStage(cu, 0, DefaultStageBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.close(cu) }()
	if err := s.calibrate(cu); err != nil {
		t.Fatal(err)
	}
	t.Logf("calibration: %s", s.note)
	for _, size := range sizes {
		n := 10000
		if size >= 1<<20 {
			n = 1000 // 2 GiB a region
		}
		slot := size + min(size, 4096)
		region := uint64(n) * slot
		r := rand.New(rand.NewPCG(uint64(size), 3))
		ps, pd := r.Perm(n), r.Perm(n)
		b := &desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
		for i := range n {
			b.Src[i], b.Dst[i], b.Len[i] = uint64(ps[i])*slot, uint64(pd[i])*slot, size
		}
		src, err1 := cu.MemAlloc(0, region)
		dst, err2 := cu.MemAlloc(0, region)
		hsrc, err3 := cu.HostAlloc(0, int(region))
		hdst, err4 := cu.HostAlloc(0, int(region))
		for _, err := range []error{err1, err2, err3, err4} {
			if err != nil {
				t.Fatalf("%d B blocks: %v", size, err)
			}
		}
		for i := 0; i+8 <= len(hsrc); i += 8 {
			binary.LittleEndian.PutUint64(hsrc[i:], r.Uint64())
		}
		st, err := cu.StreamCreate(0)
		if err != nil {
			t.Fatal(err)
		}
		sync := func(err error) {
			t.Helper()
			if err == nil {
				err = cu.StreamSynchronize(st)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		seq := uint64(0)
		for _, v := range []struct {
			name       string
			gap, chunk uint64
			split      int
		}{
			{"default (gap 8000, ChunkBytes, 1 stream)", staging.MergeGap, 0, 1},
			{"default, second hop over 2 streams", staging.MergeGap, 0, 2},
			{"gap 0 (a copy per block)", 0, 0, 1},
			{"one chunk a half", staging.MergeGap, uint64(len(s.buf) / 2), 1},
			{"one chunk a half, 2 streams", staging.MergeGap, uint64(len(s.buf) / 2), 2},
			{"default, second hop over 4 streams", staging.MergeGap, 0, 4},
			{"256 KiB chunks", staging.MergeGap, 256 << 10, 1},
		} {
			s.gap, s.chunk, s.split = v.gap, v.chunk, v.split
			var times, d2h, h2d []time.Duration
			for it := 0; it < iters; it++ {
				// A fresh stamp in every block, so a block not copied is seen.
				seq++
				var stamp [8]byte
				for i := range n {
					binary.LittleEndian.PutUint64(stamp[:], seq<<32|uint64(i))
					copy(hsrc[b.Src[i]:b.Src[i]+size], stamp[:])
				}
				sync(cu.MemcpyHtoDAsync(st, src, uintptrOf(hsrc), region))
				start := time.Now()
				if err := copyStaged(context.Background(), cu, s, uint64(src), uint64(dst), b); err != nil {
					t.Fatalf("%d B, %s: %v", size, v.name, err)
				}
				times = append(times, time.Since(start))
				sync(cu.MemcpyDtoHAsync(st, uintptrOf(hdst), dst, region))
				for i := range n {
					if !bytes.Equal(hdst[b.Dst[i]:b.Dst[i]+size], hsrc[b.Src[i]:b.Src[i]+size]) {
						t.Fatalf("%d B, %s, batch %d: block %d differs", size, v.name, it, i)
					}
				}
				// Each hop of the same plan alone.
				p := &s.plan
				lo, at := 0, time.Now()
				for _, hi := range p.InEnds {
					sync(cu.MemcpyBatchAsync(s.d2h, p.InHost[lo:hi], p.InSrc[lo:hi], p.InLen[lo:hi]))
					lo = hi
				}
				d2h = append(d2h, time.Since(at))
				lo, at = 0, time.Now()
				for _, hi := range p.OutEnds {
					sync(cu.MemcpyBatchAsync(s.h2d[0], p.OutDst[lo:hi], p.OutHost[lo:hi], p.OutLen[lo:hi]))
					lo = hi
				}
				h2d = append(h2d, time.Since(at))
			}
			med := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2].Microseconds()) / 1e3
			}
			median := med(times)
			t.Logf("stage %8d B x %5d: %-42s median %8.3f ms (min %8.3f) | %5d first-hop copies in %4d chunks | hops alone, synchronised per chunk: d2h %8.3f ms, h2d %8.3f ms | verified",
				size, n, v.name, median, float64(times[0].Microseconds())/1e3, len(s.plan.InLen), len(s.plan.InEnds), med(d2h), med(h2d))
		}
		_ = cu.StreamDestroy(st)
		for _, err := range []error{cu.MemFree(0, src), cu.MemFree(0, dst), cu.HostFree(0, hsrc), cu.HostFree(0, hdst)} {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}
