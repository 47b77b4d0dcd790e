//go:build cgo && linux

package gpudirect

// Tests against a real CUDA driver. They skip when Load fails (no driver, no
// GPU, or a CGO_ENABLED=0 build), so they are safe to run anywhere. On a GPU
// machine without Go, cross-build the test binary and run it there:
//
//	go test -c -o .gpubin/gpudirect.test ./gpudirect/
//	.gpubin/gpudirect.test -test.v -test.run 'TestGPU'

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

const (
	envIPCHandle = "B2BD_GPUDIRECT_TEST_IPC_HANDLE"
	envIPCSize   = "B2BD_GPUDIRECT_TEST_IPC_SIZE"
	ipcChildSize = 64 << 10 // bytes the child overwrites
)

func loadGPU(t testing.TB, opts ...Option) Interface {
	t.Helper()
	c, err := Load(opts...)
	if err != nil {
		t.Skipf("no usable CUDA driver: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// must(f())(t) returns f's value, or fails the test with f's error.
func must[T any](v T, err error) func(testing.TB) T {
	return func(t testing.TB) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func ok(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pattern is the byte at offset i of the IPC test allocation; the child
// process checks it and writes its complement.
func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func pattern(i int) byte { return byte((uint32(i) * 2654435761) >> 13) }

func TestGPU(t *testing.T) { driverSuite(t, DefaultLibrary, true) }

// driverSuite exercises the real implementation over the driver library lib:
// libcuda.so.1 on a GPU machine (real), or the fake driver of fake_test.go.
func driverSuite(t *testing.T, lib string, real bool) {
	c := loadGPU(t, WithLibrary(lib))
	const dev = 0
	info := must(c.DeviceInfo(dev))(t)
	t.Logf("driver %d, %d device(s); device 0: %+v; capabilities: %+v", c.DriverVersion(), c.DeviceCount(), info, c.Capabilities())
	if info.Name == "" || !regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`).MatchString(info.PCIBusID) {
		t.Errorf("device info %+v: empty name or malformed PCI bus id", info)
	}
	if _, err := c.DeviceInfo(c.DeviceCount()); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("DeviceInfo(out of range) = %v", err)
	}

	t.Run("PointerAttributes", func(t *testing.T) {
		const n = 4 << 20
		p := must(c.MemAlloc(dev, n))(t)
		defer func() { ok(t, c.MemFree(dev, p)) }()
		pi := must(c.PointerInfo(dev, p+100))(t)
		t.Logf("PointerInfo(%#x+100) = %+v", p, pi)
		if pi.MemoryType != MemoryTypeDevice || pi.Device != dev || pi.RangeStart != p || pi.RangeSize < n {
			t.Fatalf("PointerInfo = %+v", pi)
		}
		ok(t, c.SetSyncMemops(dev, p))
		if pi := must(c.PointerInfo(dev, p))(t); !pi.SyncMemops {
			t.Fatalf("SYNC_MEMOPS not set: %+v", pi)
		}
		ok(t, CheckDeviceMemory(c, dev, p+4096, n-4096))
		if err := CheckDeviceMemory(c, dev, p+4096, n); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("CheckDeviceMemory(past the end) = %v", err)
		}
		host := must(c.HostAlloc(dev, 4096))(t)
		defer func() { ok(t, c.HostFree(dev, host)) }()
		if pi := must(c.PointerInfo(dev, addr(host)))(t); pi.MemoryType != MemoryTypeHost {
			t.Errorf("PointerInfo(pinned host) = %+v", pi)
		}
		if err := CheckDeviceMemory(c, dev, addr(host), 4096); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("CheckDeviceMemory(host) = %v", err)
		}
		unknown := make([]byte, 64) // pageable Go memory CUDA never saw
		upi, err := c.PointerInfo(dev, addr(unknown))
		t.Logf("PointerInfo(pageable Go memory) = %+v, %v", upi, err)
		if err != nil && !errors.Is(err, ErrInvalidValue) || err == nil && upi.MemoryType == MemoryTypeDevice {
			t.Errorf("PointerInfo(pageable Go memory) = %+v, %v; want ErrInvalidArgument or host memory", upi, err)
		}
		if err := CheckDeviceMemory(c, dev, addr(unknown), 64); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("CheckDeviceMemory(pageable Go memory) = %v", err)
		}
		if err := c.MemFree(dev, p+1); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("MemFree(not a base) = %v", err)
		}
	})

	t.Run("Dmabuf", func(t *testing.T) {
		if !c.Capabilities().DmabufExport || !info.DmabufSupported {
			_, err := c.ExportDmabuf(dev, 0x1000, 1, 0)
			t.Skipf("dma-buf export unsupported here (attribute %v, symbol %v); ExportDmabuf says: %v", info.DmabufSupported, c.Capabilities().DmabufExport, err)
		}
		const n = 8 << 20
		p := must(c.MemAlloc(dev, n))(t)
		defer func() { ok(t, c.MemFree(dev, p)) }()
		page := uint64(os.Getpagesize())
		db := must(c.ExportDmabuf(dev, p+uintptr(page)+123, 1<<20, 0))(t)
		t.Logf("ExportDmabuf(p+%d+123, 1 MiB) = fd %d base %#x len %d offset %d", page, db.FD, db.Base, db.Len, db.Offset)
		if db.FD < 0 || uint64(db.Base)+db.Offset != uint64(p)+page+123 || db.Len < 1<<20+page || db.Len%page != 0 {
			t.Fatalf("dma-buf %+v", db)
		}
		if db.Base != p+uintptr(page) || db.Offset != 123 || db.Len != 1<<20+page {
			t.Logf("the driver refused the sub-range; the whole allocation was exported")
		}
		var st syscall.Stat_t
		ok(t, syscall.Fstat(db.FD, &st))
		ok(t, db.Close())
		ok(t, db.Close())
		if c.DriverVersion() >= 12080 {
			db2, err := c.ExportDmabuf(dev, p, n, DmabufMappingPCIe)
			t.Logf("ExportDmabuf(whole, DmabufMappingPCIe) error: %v", err)
			if err == nil {
				ok(t, db2.Close())
			}
		}
		m, release, err := DeviceMemory(c, dev, p+10, 4096)
		ok(t, err)
		if m.DmabufFD < 0 || m.DmabufOffset != 10 {
			t.Fatalf("DeviceMemory = %+v", m)
		}
		ok(t, release())
		ok(t, release())
	})

	t.Run("BatchInParts", func(t *testing.T) {
		const n, bs = 10000, 128
		var ss []*Stream
		for range ParallelParts + 1 {
			s := must(c.StreamCreate(dev))(t)
			defer func() { ok(t, c.StreamDestroy(s)) }()
			ss = append(ss, s)
		}
		d := must(c.MemAlloc(dev, 2*n*bs))(t)
		defer func() { ok(t, c.MemFree(dev, d)) }()
		src := must(c.HostAlloc(dev, n*bs))(t)
		defer func() { ok(t, c.HostFree(dev, src)) }()
		back := must(c.HostAlloc(dev, n*bs))(t)
		defer func() { ok(t, c.HostFree(dev, back)) }()
		rng := rand.New(rand.NewPCG(5, 6))
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		// Block i to slot perm[i] of the device buffer, and back in order.
		perm := rng.Perm(2 * n)
		dsts, srcs, sizes := make([]uint64, n), make([]uint64, n), make([]uint64, n)
		for i := range n {
			dsts[i], srcs[i], sizes[i] = uint64(d)+uint64(perm[i])*bs, uint64(addr(src))+uint64(i)*bs, bs
		}
		ok(t, c.MemcpyBatchAsyncParts(ss, dsts, srcs, sizes))
		for _, s := range ss {
			ok(t, c.StreamSynchronize(s))
		}
		for i := range n {
			dsts[i], srcs[i] = uint64(addr(back))+uint64(i)*bs, uint64(d)+uint64(perm[i])*bs
		}
		ok(t, c.MemcpyBatchAsyncParts(ss[:2], dsts, srcs, sizes))
		for _, s := range ss[:2] {
			ok(t, c.StreamSynchronize(s))
		}
		if !bytes.Equal(back, src) {
			t.Fatal("blocks copied in parts did not come back")
		}
		if err := c.MemcpyBatchAsyncParts(nil, dsts, srcs, sizes); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("MemcpyBatchAsyncParts(no stream) = %v", err)
		}
		gone := must(c.StreamCreate(dev))(t)
		ok(t, c.StreamDestroy(gone))
		if err := c.MemcpyBatchAsyncParts([]*Stream{ss[0], gone}, dsts, srcs, sizes); !errors.Is(err, ErrStreamDestroyed) {
			t.Errorf("MemcpyBatchAsyncParts(a destroyed stream) = %v", err)
		}
	})

	t.Run("PeerAccess", func(t *testing.T) {
		ok(t, c.EnablePeerAccess(dev, dev))
		if err := c.EnablePeerAccess(dev, c.DeviceCount()); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("EnablePeerAccess(a device that does not exist) = %v", err)
		}
		if c.DeviceCount() < 2 {
			t.Skipf("one device: no peer to reach")
		}
		const peer, n = 1, 1 << 20
		if err := c.EnablePeerAccess(dev, peer); err != nil {
			if errors.Is(err, ErrNotSupported) {
				t.Skipf("devices %d and %d: %v", dev, peer, err)
			}
			t.Fatal(err)
		}
		ok(t, c.EnablePeerAccess(dev, peer)) // again: not an error
		src := must(c.MemAlloc(dev, n))(t)
		defer func() { ok(t, c.MemFree(dev, src)) }()
		dst := must(c.MemAlloc(peer, n))(t)
		defer func() { ok(t, c.MemFree(peer, dst)) }()
		h := must(c.HostAlloc(dev, n))(t)
		defer func() { ok(t, c.HostFree(dev, h)) }()
		rng := rand.New(rand.NewPCG(3, 4))
		for i := range h {
			h[i] = byte(rng.Uint32())
		}
		want := append([]byte(nil), h...)
		s := must(c.StreamCreate(dev))(t)
		defer func() { ok(t, c.StreamDestroy(s)) }()
		ok(t, c.MemcpyHtoDAsync(s, src, addr(h), n))
		// 256 blocks of 4 KiB, reversed: peer copies queued on dev's stream.
		var dsts, srcs, sizes []uint64
		for i := uint64(0); i < n/4096; i++ {
			dsts, srcs, sizes = append(dsts, uint64(dst)+n-4096*(i+1)), append(srcs, uint64(src)+4096*i), append(sizes, 4096)
		}
		ok(t, c.MemcpyBatchAsync(s, dsts, srcs, sizes))
		clear(h)
		ok(t, c.MemcpyDtoHAsync(s, addr(h), dst, n))
		ok(t, c.StreamSynchronize(s))
		for i := 0; i < n/4096; i++ {
			if !bytes.Equal(h[n-4096*(i+1):n-4096*i], want[4096*i:4096*(i+1)]) {
				t.Fatalf("block %d did not land on device %d", i, peer)
			}
		}
	})

	t.Run("Copies", func(t *testing.T) {
		const n = 8 << 20
		s := must(c.StreamCreate(dev))(t)
		defer func() { ok(t, c.StreamDestroy(s)); ok(t, c.StreamDestroy(s)) }()
		e := must(c.EventCreate(dev))(t)
		defer func() { ok(t, c.EventDestroy(e)); ok(t, c.EventDestroy(e)) }()
		h1 := must(c.HostAlloc(dev, n))(t)
		defer func() { ok(t, c.HostFree(dev, h1)) }()
		h2 := must(c.HostAlloc(dev, n))(t)
		defer func() { ok(t, c.HostFree(dev, h2)) }()
		d := must(c.MemAlloc(dev, n))(t)
		defer func() { ok(t, c.MemFree(dev, d)) }()
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range h1 {
			h1[i] = byte(rng.Uint32())
		}
		ok(t, c.MemcpyHtoDAsync(s, d, addr(h1), n))
		ok(t, c.MemcpyDtoHAsync(s, addr(h2), d, n))
		ok(t, c.EventRecord(e, s))
		ok(t, c.EventSynchronize(e))
		if done := must(c.EventQuery(e))(t); !done {
			t.Fatal("EventQuery false after EventSynchronize")
		}
		if !bytes.Equal(h1, h2) {
			t.Fatal("HtoD/DtoH round trip corrupted data")
		}

		// Registered (not CUDA-allocated) host memory, as the daemon's
		// mmap'd shared-memory regions are.
		mm := must(syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE))(t)
		defer syscall.Munmap(mm)
		copy(mm, "registered host memory")
		ok(t, c.HostRegister(dev, addr(mm), uint64(len(mm))))
		if err := c.HostRegister(dev, addr(mm), uint64(len(mm))); !errors.Is(err, ErrAlreadyExists) {
			t.Errorf("second HostRegister = %v", err)
		}
		clear(h2[:64])
		ok(t, c.MemcpyHtoDAsync(s, d, addr(mm), 64))
		ok(t, c.MemcpyDtoHAsync(s, addr(h2), d, 64))
		ok(t, c.StreamSynchronize(s))
		if !bytes.Equal(h2[:64], mm[:64]) {
			t.Fatal("copy from registered memory corrupted data")
		}
		ok(t, c.HostUnregister(dev, addr(mm)))

		// The copy paths allocate nothing.
		small := func() { _ = c.MemcpyHtoDAsync(s, d, addr(h1), 128) }
		ds, ss, ls := []uint64{uint64(d), uint64(d) + 4096}, []uint64{uint64(addr(h1)), uint64(addr(h1)) + 4096}, []uint64{128, 128}
		batch := func() { _ = c.MemcpyBatchAsync(s, ds, ss, ls) }
		record := func() { _ = c.EventRecord(e, s) }
		for name, f := range map[string]func(){"MemcpyHtoDAsync": small, "MemcpyBatchAsync": batch, "EventRecord": record} {
			f()
			if a := testing.AllocsPerRun(200, f); a != 0 {
				t.Errorf("%s allocates %.1f times per call", name, a)
			}
		}
		const calls = 2000
		start := time.Now()
		for i := 0; i < calls; i++ {
			small()
		}
		t.Logf("MemcpyHtoDAsync(128 B): %v per call including the hand-off to the device thread", time.Since(start)/calls)
		ok(t, c.StreamSynchronize(s))
		if drv, isDrv := c.(*driver); isDrv {
			t.Logf("synchronisations repeated on the device thread: %d", drv.syncFallbacks.Load())
		}
	})

	batchModes := []struct {
		name string
		c    Interface
	}{{"driver-default", c}, {"cuMemcpyAsync-loop", loadGPU(t, WithLibrary(lib), WithoutMemcpyBatch())}}
	for _, mode := range batchModes {
		for _, bs := range []int{128, 4096} {
			t.Run("Batch10000x"+strconv.Itoa(bs)+"/"+mode.name, func(t *testing.T) {
				testBatch(t, mode.c, dev, 10000, bs)
			})
		}
	}

	t.Run("IPC", func(t *testing.T) {
		const n = 2 << 20
		p := must(c.MemAlloc(dev, n))(t)
		defer func() { ok(t, c.MemFree(dev, p)) }()
		s := must(c.StreamCreate(dev))(t)
		defer func() { ok(t, c.StreamDestroy(s)) }()
		h := must(c.HostAlloc(dev, n))(t)
		defer func() { ok(t, c.HostFree(dev, h)) }()
		for i := range h {
			h[i] = pattern(i)
		}
		ok(t, c.MemcpyHtoDAsync(s, p, addr(h), n))
		ok(t, c.StreamSynchronize(s))
		handle := must(c.IPCGetMemHandle(dev, p))(t)
		if _, err := ParseIPCHandle("cuda_ipc.handle", handle[:]); err != nil {
			t.Fatalf("driver's handle fails validation: %v", err)
		}
		if _, err := ParseIPCHandle("cuda_ipc.handle", handle[:63]); !errors.Is(err, ErrInvalidValue) {
			t.Fatalf("truncated handle accepted: %v", err)
		}
		// CUDA does not let a process open its own handle.
		if q, err := c.IPCOpenMemHandle(dev, handle); err != nil {
			t.Logf("same-process IPCOpenMemHandle fails as CUDA documents: %v", err)
		} else {
			t.Logf("same-process IPCOpenMemHandle unexpectedly succeeded (%#x)", q)
			ok(t, c.IPCCloseMemHandle(dev, q))
		}

		// The region adapter on the real implementation.
		m, ipc, free, err := Regions{CUDA: c}.Alloc(dev, 1<<20)
		ok(t, err)
		t.Logf("Regions.Alloc = %+v (IPC handle %d bytes)", m, len(ipc))
		if pi := must(c.PointerInfo(dev, m.Addr))(t); !pi.SyncMemops || len(ipc) != IPCHandleSize {
			t.Fatalf("Regions.Alloc: %+v, handle %d bytes", pi, len(ipc))
		}
		ok(t, free())
		ok(t, free())

		if !real {
			return // the fake driver cannot share memory between processes
		}
		// A child process opens the handle, checks the data, and writes
		// the complement of the first ipcChildSize bytes.
		cmd := exec.Command(os.Args[0], "-test.run=^TestGPUIPCChild$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), envIPCHandle+"="+hex.EncodeToString(handle[:]), envIPCSize+"="+strconv.Itoa(n))
		out, err := cmd.CombinedOutput()
		t.Logf("child process output:\n%s", indent(string(out)))
		if err != nil {
			t.Fatalf("child process: %v", err)
		}
		if !strings.Contains(string(out), "--- PASS: TestGPUIPCChild") {
			t.Fatal("child did not run TestGPUIPCChild")
		}
		clear(h)
		ok(t, c.MemcpyDtoHAsync(s, addr(h), p, n))
		ok(t, c.StreamSynchronize(s))
		for i := range h {
			want := pattern(i)
			if i < ipcChildSize {
				want = ^want
			}
			if h[i] != want {
				t.Fatalf("byte %d after the child wrote = %#x, want %#x", i, h[i], want)
			}
		}
	})

	t.Run("Close", func(t *testing.T) {
		c2, err := Load(WithLibrary(lib))
		ok(t, err)
		p := must(c2.MemAlloc(dev, 1<<20))(t)
		_ = must(c2.StreamCreate(dev))(t)
		_ = must(c2.HostAlloc(dev, 4096))(t)
		e := must(c2.EventCreate(dev))(t)
		t.Logf("left allocated before Close: %#x", p)
		ok(t, c2.Close()) // releases everything left
		ok(t, c2.Close())
		if _, err := c2.MemAlloc(dev, 1); !errors.Is(err, ErrClosed) {
			t.Fatalf("MemAlloc after Close = %v", err)
		}
		if err := c2.EventSynchronize(e); err == nil {
			t.Fatal("EventSynchronize on an event freed by Close succeeded")
		}
		if _, err := c.PointerInfo(dev, p); err == nil {
			t.Errorf("memory left allocated was not freed by Close")
		}
	})
}

// testBatch moves n blocks of bs bytes through three batches, each one cgo
// call: host -> device (scattered), device -> device (gathered), device ->
// host (scattered again), then checks every byte.
func testBatch(t *testing.T, c Interface, dev, n, bs int) {
	size := n * bs
	s := must(c.StreamCreate(dev))(t)
	defer func() { ok(t, c.StreamDestroy(s)) }()
	hsrc := must(c.HostAlloc(dev, size))(t)
	defer func() { ok(t, c.HostFree(dev, hsrc)) }()
	hdst := must(c.HostAlloc(dev, size))(t)
	defer func() { ok(t, c.HostFree(dev, hdst)) }()
	dA := must(c.MemAlloc(dev, uint64(size)))(t)
	defer func() { ok(t, c.MemFree(dev, dA)) }()
	dB := must(c.MemAlloc(dev, uint64(size)))(t)
	defer func() { ok(t, c.MemFree(dev, dB)) }()
	rng := rand.New(rand.NewPCG(uint64(n), uint64(bs)))
	for i := range hsrc {
		hsrc[i] = byte(rng.Uint32())
	}
	perm1, perm2 := rng.Perm(n), rng.Perm(n)
	dsts, srcs, lens := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	run := func(name string, dst func(i int) uint64, src func(i int) uint64) {
		for i := 0; i < n; i++ {
			dsts[i], srcs[i], lens[i] = dst(i), src(i), uint64(bs)
		}
		start := time.Now()
		ok(t, c.MemcpyBatchAsync(s, dsts, srcs, lens))
		queued := time.Since(start)
		ok(t, c.StreamSynchronize(s))
		t.Logf("%s: %d x %d B queued in %v, done in %v (%v)", name, n, bs, queued, time.Since(start), c.Capabilities().MemcpyBatchSymbol)
	}
	hs, hd := uint64(addr(hsrc)), uint64(addr(hdst))
	b := uint64(bs)
	run("HtoD scatter", func(i int) uint64 { return uint64(dA) + uint64(perm1[i])*b }, func(i int) uint64 { return hs + uint64(i)*b })
	run("DtoD gather", func(i int) uint64 { return uint64(dB) + uint64(i)*b }, func(i int) uint64 { return uint64(dA) + uint64(perm1[i])*b })
	run("DtoH scatter", func(i int) uint64 { return hd + uint64(perm2[i])*b }, func(i int) uint64 { return uint64(dB) + uint64(i)*b })
	for i := 0; i < n; i++ {
		j := perm2[i]
		if !bytes.Equal(hdst[j*bs:(j+1)*bs], hsrc[i*bs:(i+1)*bs]) {
			t.Fatalf("block %d (landed at slot %d) differs", i, j)
		}
	}
}

// TestGPUIPCChild is the child side of TestGPU/IPC; it skips unless run by it.
func TestGPUIPCChild(t *testing.T) {
	hexHandle := os.Getenv(envIPCHandle)
	if hexHandle == "" {
		t.Skip("helper for TestGPU/IPC")
	}
	n := must(strconv.Atoi(os.Getenv(envIPCSize)))(t)
	raw := must(hex.DecodeString(hexHandle))(t)
	handle := must(ParseIPCHandle("cuda_ipc.handle", raw))(t)
	c := loadGPU(t)
	const dev = 0
	p := must(c.IPCOpenMemHandle(dev, handle))(t)
	pi := must(c.PointerInfo(dev, p))(t)
	t.Logf("opened IPC handle at %#x: %+v", p, pi)
	if pi.MemoryType != MemoryTypeDevice || pi.RangeSize < uint64(n) {
		t.Fatalf("PointerInfo = %+v", pi)
	}
	s := must(c.StreamCreate(dev))(t)
	h := must(c.HostAlloc(dev, n))(t)
	ok(t, c.MemcpyDtoHAsync(s, addr(h), p, uint64(n)))
	ok(t, c.StreamSynchronize(s))
	for i := range h {
		if h[i] != pattern(i) {
			t.Fatalf("byte %d = %#x, want %#x", i, h[i], pattern(i))
		}
	}
	for i := 0; i < ipcChildSize; i++ {
		h[i] = ^pattern(i)
	}
	ok(t, c.MemcpyHtoDAsync(s, p, addr(h), ipcChildSize))
	ok(t, c.StreamSynchronize(s))
	t.Logf("SetSyncMemops on IPC-opened memory: %v", c.SetSyncMemops(dev, p))
	if db, err := c.ExportDmabuf(dev, p, uint64(n), 0); err == nil {
		t.Logf("dma-buf export of the IPC mapping: fd %d", db.FD)
		ok(t, db.Close())
	} else {
		t.Logf("dma-buf export of the IPC mapping fails: %v", err)
	}
	// Opening the handle again: CUDA refcounts and returns the same pointer.
	p2, err := c.IPCOpenMemHandle(dev, handle)
	t.Logf("second IPCOpenMemHandle = %#x, %v", p2, err)
	if err == nil {
		ok(t, c.IPCCloseMemHandle(dev, p2))
	}
	ok(t, c.IPCCloseMemHandle(dev, p))
	if err := c.IPCCloseMemHandle(dev, p); !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("second IPCCloseMemHandle = %v", err)
	}
	// The import path of the region adapter: a sub-range of the handle.
	m, release, err := Regions{CUDA: c}.Import(dev, raw, 4096+7, 8192)
	if err != nil {
		t.Fatalf("Regions.Import: %v", err)
	}
	t.Logf("Regions.Import = %+v", m)
	t.Logf("imported memory's pointer attributes: %+v", must(c.PointerInfo(dev, m.Addr))(t))
	ok(t, release())
	ok(t, release())
}

func indent(s string) string {
	return "\t" + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n\t")
}
