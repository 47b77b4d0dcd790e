//go:build cgo && linux

package gpudirect

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// buildFake compiles testdata/fakecuda/fakecuda.c (a stand-in for
// libcuda.so.1) with the given defines, or skips when no C compiler works.
func buildFake(t *testing.T, defines ...string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	out := filepath.Join(t.TempDir(), "libfakecuda.so")
	args := append([]string{"-shared", "-fPIC", "-o", out, filepath.Join("testdata", "fakecuda", "fakecuda.c")}, defines...)
	if msg, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Skipf("cannot build the fake CUDA driver with %s: %v\n%s", cc, err, msg)
	}
	return out
}

// TestFakeDriver runs the GPU suite over a fake libcuda: it checks the cgo
// half (symbol table, wrappers, worker threads, errors, Close) on machines
// without a GPU. The fake fails context-bound calls made off a thread with a
// current context, as CUDA does.
func TestFakeDriver(t *testing.T) {
	driverSuite(t, buildFake(t), false)
}

func TestFakeDriverVariants(t *testing.T) {
	tests := []struct {
		name       string
		defines    []string
		env        string
		loadErr    string // substring of Load's error; "" means Load succeeds
		batchSym   string
		dmabuf     bool
		failCopyAt string // how a bad batch copy is reported
	}{
		{"cuda13", nil, "", "", "cuMemcpyBatchAsync_v2", true, "cuMemcpyBatchAsync_v2(count=8) on device 0"},
		{"cuda12.8", []string{"-DFAKE_CUDA_12080"}, "", "", "cuMemcpyBatchAsync", true, "cuMemcpyBatchAsync(count=8): copy 5"},
		{"old driver", []string{"-DFAKE_OLD"}, "", "", "", false, "cuMemcpyAsync(count=8): copy 5"},
		{"missing symbol", []string{"-DFAKE_BROKEN"}, "", "lacks cuMemAlloc_v2", "", false, ""},
		{"cuInit fails", nil, "FAKE_CUDA_INIT_FAIL", "cuInit(0) via", "", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lib := buildFake(t, tt.defines...)
			if tt.env != "" {
				t.Setenv(tt.env, "1")
			}
			c, err := Load(WithLibrary(lib))
			if tt.loadErr != "" {
				if err == nil {
					c.Close()
					t.Fatal("Load succeeded")
				}
				if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), tt.loadErr) {
					t.Fatalf("Load = %v; want ErrNoDriver mentioning %q", err, tt.loadErr)
				}
				t.Logf("Load: %v", err)
				if tt.env != "" { // the driver comes up once cuInit works
					os.Unsetenv(tt.env)
					c, err := Load(WithLibrary(lib))
					if err != nil {
						t.Fatalf("Load after cuInit recovers: %v", err)
					}
					c.Close()
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			caps := c.Capabilities()
			if caps.MemcpyBatchSymbol != tt.batchSym || caps.DmabufExport != tt.dmabuf {
				t.Fatalf("Capabilities = %+v", caps)
			}
			if !tt.dmabuf {
				if _, err := c.ExportDmabuf(0, 0x200000, 4096, 0); !errors.Is(err, ErrNotSupported) {
					t.Fatalf("ExportDmabuf = %v; want ErrUnimplemented", err)
				}
			}
			testBatch(t, c, 0, 1000, 64)
			// A copy from an address the driver rejects.
			s := must(c.StreamCreate(0))(t)
			d := must(c.MemAlloc(0, 1<<20))(t)
			var dsts, srcs, lens []uint64
			for i := 0; i < 8; i++ {
				dsts = append(dsts, uint64(d)+uint64(i)*64)
				srcs = append(srcs, uint64(d)+512+uint64(i)*64)
				lens = append(lens, 64)
			}
			srcs[5] = 0x1000
			err = c.MemcpyBatchAsync(s, dsts, srcs, lens)
			if !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), tt.failCopyAt) || !strings.Contains(err.Error(), "CUDA_ERROR_INVALID_VALUE") {
				t.Fatalf("bad batch = %v; want INVALID_VALUE mentioning %q", err, tt.failCopyAt)
			}
			t.Logf("bad batch: %v", err)
		})
	}
}

// TestBatchPathByDirection: which path MemcpyBatchAsync takes, by direction
// and block size, on the fake driver (the real C path selection). A
// host-to-device batch goes in chunks of H2DChunk copies, each behind a
// copy-engine primer, at every block size: an H100 runs small host-to-device
// copies queued on an idle stream on its compute engine (cuda_shim.h). The
// other directions, and copies from pageable host memory, stay one call;
// without cuMemcpyBatchAsync, the loop.
func TestBatchPathByDirection(t *testing.T) {
	tests := []struct {
		name       string
		defines    []string
		opts       []Option
		from, to   string // "host", "reg" (registered), "pageable" (unknown to the driver) or "dev"
		n, bs      int
		wantPath   string // "primed", "one call" or "loop"
		wantChunks uint64
	}{
		{"HtoD 128 B", nil, nil, "host", "dev", 1000, 128, "primed", 4},
		{"HtoD 4 KiB", nil, nil, "host", "dev", 256, 4096, "primed", 1},
		{"HtoD 64 KiB", nil, nil, "host", "dev", 257, 65536, "primed", 2},
		{"HtoD one block", nil, nil, "host", "dev", 1, 128, "primed", 1},
		{"HtoD registered host memory", nil, nil, "reg", "dev", 600, 512, "primed", 3},
		{"HtoD pageable host memory", []string{"-DFAKE_PAGEABLE"}, nil, "pageable", "dev", 1000, 128, "one call", 0},
		{"HtoD CUDA 12.8 ABI", []string{"-DFAKE_CUDA_12080"}, nil, "host", "dev", 1000, 128, "primed", 4},
		{"DtoH 128 B", nil, nil, "dev", "host", 1000, 128, "one call", 0},
		{"DtoH 64 KiB", nil, nil, "dev", "host", 100, 65536, "one call", 0},
		{"DtoD 4 KiB", nil, nil, "dev", "dev", 1000, 4096, "one call", 0},
		{"HtoH 128 B", nil, nil, "host", "host", 1000, 128, "one call", 0},
		{"HtoD without cuMemcpyBatchAsync", nil, []Option{WithoutMemcpyBatch()}, "host", "dev", 1000, 128, "loop", 0},
		{"HtoD old driver", []string{"-DFAKE_OLD"}, nil, "host", "dev", 1000, 128, "loop", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(append([]Option{WithLibrary(buildFake(t, tt.defines...))}, tt.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			d := c.(*driver)
			size := tt.n * tt.bs
			s := must(c.StreamCreate(0))(t)
			// buf returns a buffer of kind and, for host memory, its bytes.
			buf := func(kind string) (uint64, []byte) {
				switch kind {
				case "dev":
					return uint64(must(c.MemAlloc(0, uint64(2*size)))(t)), nil
				case "reg", "pageable":
					b := make([]byte, 2*size)
					if kind == "reg" {
						ok(t, c.HostRegister(0, addr(b), uint64(len(b))))
					}
					t.Cleanup(func() { runtime.KeepAlive(b) })
					return uint64(addr(b)), b
				}
				b := must(c.HostAlloc(0, 2*size))(t)
				return uint64(addr(b)), b
			}
			src, srcBytes := buf(tt.from)
			dst, dstBytes := buf(tt.to)
			pattern := make([]byte, 2*size)
			for i := range pattern {
				pattern[i] = byte(i*7 + 1)
			}
			if srcBytes != nil {
				copy(srcBytes, pattern)
			} else {
				pinned := must(c.HostAlloc(0, len(pattern)))(t)
				copy(pinned, pattern)
				ok(t, c.MemcpyHtoDAsync(s, uintptr(src), addr(pinned), uint64(len(pinned))))
				ok(t, c.StreamSynchronize(s))
			}
			// Blocks at even source slots go to odd destination slots, reversed.
			dsts, srcs, lens := make([]uint64, tt.n), make([]uint64, tt.n), make([]uint64, tt.n)
			for i := range lens {
				srcs[i] = src + uint64(2*i*tt.bs)
				dsts[i] = dst + uint64((2*(tt.n-1-i)+1)*tt.bs)
				lens[i] = uint64(tt.bs)
			}
			before := d.stats.snapshot()
			ok(t, c.MemcpyBatchAsync(s, dsts, srcs, lens))
			ok(t, c.StreamSynchronize(s))
			got := d.stats.snapshot().minus(before)
			want := pathCounts{}
			switch tt.wantPath {
			case "primed":
				want.primed, want.primedChunks = 1, tt.wantChunks
			case "one call":
				want.oneCall = 1
			case "loop":
				want.loop = 1
			}
			if got != want {
				t.Fatalf("%s %d x %d B: paths %+v; want %+v", tt.name, tt.n, tt.bs, got, want)
			}
			out := dstBytes
			if out == nil {
				out = must(c.HostAlloc(0, 2*size))(t)
				ok(t, c.MemcpyDtoHAsync(s, addr(out), uintptr(dst), uint64(len(out))))
				ok(t, c.StreamSynchronize(s))
			}
			for i := 0; i < tt.n; i++ {
				so, do := 2*i*tt.bs, (2*(tt.n-1-i)+1)*tt.bs
				if !bytes.Equal(out[do:do+tt.bs], pattern[so:so+tt.bs]) {
					t.Fatalf("block %d: destination differs from the source", i)
				}
			}
		})
	}
}

// TestPrimedBatchFailIndex: a bad copy in a later chunk is named by its
// index in the whole batch (CUDA 12.8 ABI, which reports it).
func TestPrimedBatchFailIndex(t *testing.T) {
	c, err := Load(WithLibrary(buildFake(t, "-DFAKE_CUDA_12080")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := must(c.StreamCreate(0))(t)
	h := must(c.HostAlloc(0, 1<<20))(t)
	d := must(c.MemAlloc(0, 1<<20))(t)
	n := 3*H2DChunk + 10
	dsts, srcs, lens := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i := range lens {
		dsts[i], srcs[i], lens[i] = uint64(d)+uint64(i)*64, uint64(addr(h))+uint64(i)*64, 64
	}
	bad := 2*H2DChunk + 7
	srcs[bad] = 0x1000
	err = c.MemcpyBatchAsync(s, dsts, srcs, lens)
	if want := fmt.Sprintf("cuMemcpyBatchAsync(count=%d): copy %d", n, bad); !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), want) {
		t.Fatalf("bad batch = %v; want INVALID_VALUE mentioning %q", err, want)
	}
}

// TestHeldParts: a host-to-device batch in parts holds every part's stream
// until all are queued (the fake runs nothing on a held stream before a
// synchronisation sees the release, and fails one that waits 5 s for it);
// other directions are not held; without cuStreamWaitValue32_v2 such a
// batch goes in one part, as one thread keeps every primer pending.
func TestHeldParts(t *testing.T) {
	tests := []struct {
		name              string
		defines           []string
		wantHeld, wantPri uint64 // parts held, primed calls of the host-to-device batch
	}{
		{"held", nil, ParallelParts, ParallelParts},
		{"no cuStreamWaitValue32", []string{"-DFAKE_NO_WAIT"}, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(WithLibrary(buildFake(t, tt.defines...)))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			d := c.(*driver)
			var ss []*Stream
			for range ParallelParts {
				ss = append(ss, must(c.StreamCreate(0))(t))
			}
			const bs = 64
			n := 3*ParallelParts*H2DChunk + 7
			h := must(c.HostAlloc(0, n*bs))(t)
			back := must(c.HostAlloc(0, n*bs))(t)
			dev := must(c.MemAlloc(0, uint64(n*bs)))(t)
			for i := range h {
				h[i] = byte(i*13 + 5)
			}
			probe := must(c.StreamCreate(0))(t) // never held: its copies run at once
			devBytes := func() []byte {
				ok(t, c.MemcpyDtoHAsync(probe, addr(back), dev, uint64(n*bs)))
				ok(t, c.StreamSynchronize(probe))
				return back
			}
			zero := must(c.HostAlloc(0, n*bs))(t)
			dsts, srcs, lens := make([]uint64, n), make([]uint64, n), make([]uint64, n)
			for i := range lens { // block i to slot n-1-i
				dsts[i], srcs[i], lens[i] = uint64(dev)+uint64((n-1-i)*bs), uint64(addr(h))+uint64(i*bs), bs
			}
			for round := range 3 { // the hold's value moves on each batch
				ok(t, c.MemcpyHtoDAsync(probe, dev, addr(zero), uint64(n*bs)))
				ok(t, c.StreamSynchronize(probe))
				before := d.stats.snapshot()
				ok(t, c.MemcpyBatchAsyncParts(ss, dsts, srcs, lens))
				got := d.stats.snapshot().minus(before)
				if got.held != tt.wantHeld || got.primed != tt.wantPri {
					t.Fatalf("round %d: %d parts held, %d primed calls; want %d, %d", round, got.held, got.primed, tt.wantHeld, tt.wantPri)
				}
				if tt.wantHeld > 0 && !bytes.Equal(devBytes(), zero) {
					t.Fatalf("round %d: copies ran on a held stream before a synchronisation", round)
				}
				for _, s := range ss {
					ok(t, c.StreamSynchronize(s))
				}
				devBytes()
				for i := range n {
					if !bytes.Equal(back[(n-1-i)*bs:(n-i)*bs], h[i*bs:(i+1)*bs]) {
						t.Fatalf("round %d: block %d did not land", round, i)
					}
				}
			}
			// Without the hold the device says why its batches go in one part.
			if notes := c.DeviceNotes(0); (tt.wantHeld == 0) != (len(notes) == 1 && strings.Contains(notes[0], "cuStreamWaitValue32_v2")) {
				t.Fatalf("DeviceNotes(0) = %q", notes)
			}
			// Device to host: in parts, not held.
			for i := range lens {
				dsts[i], srcs[i] = uint64(addr(back))+uint64(i*bs), uint64(dev)+uint64((n-1-i)*bs)
			}
			before := d.stats.snapshot()
			ok(t, c.MemcpyBatchAsyncParts(ss, dsts, srcs, lens))
			if got := d.stats.snapshot().minus(before); got.held != 0 || got.oneCall != ParallelParts {
				t.Fatalf("device to host in parts: %+v; want %d one-call parts, none held", got, ParallelParts)
			}
			for _, s := range ss {
				ok(t, c.StreamSynchronize(s))
			}
			if !bytes.Equal(back, h) {
				t.Fatal("device to host in parts: blocks did not come back")
			}
		})
	}
}

// TestHeldPartsAllocs: a host-to-device batch in held parts, and the
// synchronisations that end it, allocate nothing (the data path). make
// test runs it without the race detector too, under which sync.Pool drops
// requests on purpose.
func TestHeldPartsAllocs(t *testing.T) {
	if raceOn {
		t.Skip("allocation counts are not the program's under the race detector (make test-go runs this without it)")
	}
	c, err := Load(WithLibrary(buildFake(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ss []*Stream
	for range ParallelParts {
		ss = append(ss, must(c.StreamCreate(0))(t))
	}
	n := 4 * ParallelParts * H2DChunk
	h := must(c.HostAlloc(0, n*64))(t)
	dev := must(c.MemAlloc(0, uint64(n*64)))(t)
	dsts, srcs, lens := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i := range lens {
		dsts[i], srcs[i], lens[i] = uint64(dev)+uint64(i*64), uint64(addr(h))+uint64(i*64), 64
	}
	before := c.(*driver).stats.snapshot()
	if a := testing.AllocsPerRun(20, func() {
		ok(t, c.MemcpyBatchAsyncParts(ss, dsts, srcs, lens))
		for _, s := range ss {
			ok(t, c.StreamSynchronize(s))
		}
	}); a != 0 {
		t.Fatalf("a held batch in parts: %.1f allocations", a)
	}
	if got := c.(*driver).stats.snapshot().minus(before); got.held == 0 {
		t.Fatalf("paths %+v: the batches were not held", got)
	}
}
