package cudatest_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/gpudirect"
	. "github.com/b2bd/b2bd/gpudirect/cudatest"
)

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func TestDevices(t *testing.T) {
	m := New(
		Device{Name: "A", PCIBusID: "00000000:3B:00.0", DmabufSupported: true},
		Device{Name: "B"},
	)
	defer m.Close()
	if m.DeviceCount() != 2 || m.DriverVersion() != 13000 {
		t.Fatalf("count %d version %d", m.DeviceCount(), m.DriverVersion())
	}
	tests := []struct {
		dev     int
		name    string
		bus     string
		dmabuf  bool
		wantErr error
	}{
		{0, "A", "0000:3b:00.0", true, nil},
		{1, "B", "0000:11:00.0", false, nil},
		{2, "", "", false, gpudirect.ErrInvalidValue},
		{-1, "", "", false, gpudirect.ErrInvalidValue},
	}
	for _, tt := range tests {
		info, err := m.DeviceInfo(tt.dev)
		if !errors.Is(err, tt.wantErr) {
			t.Fatalf("DeviceInfo(%d) error %v, want %v", tt.dev, err, tt.wantErr)
		}
		if err == nil && (info.Name != tt.name || info.PCIBusID != tt.bus || info.DmabufSupported != tt.dmabuf) {
			t.Errorf("DeviceInfo(%d) = %+v", tt.dev, info)
		}
	}
}

func TestDriverMemoryAndCopies(t *testing.T) {
	m := New(Device{TotalMem: 1 << 20, DmabufSupported: true})
	d0, err := m.MemAlloc(0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.MemAlloc(0, 2<<20); !errors.Is(err, gpudirect.ErrOutOfMemory) || gpudirect.ResultOf(err) != gpudirect.ErrorOutOfMemory {
		t.Fatalf("over-allocation = %v; want CUDA_ERROR_OUT_OF_MEMORY", err)
	}
	host, err := m.HostAlloc(0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	for i := range host {
		host[i] = byte(i * 7)
	}
	s, err := m.StreamCreate(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.MemcpyHtoDAsync(s, d0, addr(host), uint64(len(host))); err != nil {
		t.Fatal(err)
	}
	dev, _ := m.DeviceBytes(d0, uint64(len(host)))
	if !bytes.Equal(dev, host) {
		t.Fatal("HtoD did not copy")
	}
	// Batch: reverse 16 blocks of 4 KiB from device to host.
	back, _ := m.HostAlloc(0, 64<<10)
	var dsts, srcs, lens []uint64
	for i := 0; i < 16; i++ {
		dsts = append(dsts, uint64(addr(back))+uint64(15-i)*4096)
		srcs = append(srcs, uint64(d0)+uint64(i)*4096)
		lens = append(lens, 4096)
	}
	if err := m.MemcpyBatchAsync(s, dsts, srcs, lens); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 16; i++ {
		if !bytes.Equal(back[(15-i)*4096:(16-i)*4096], host[i*4096:(i+1)*4096]) {
			t.Fatalf("block %d not copied", i)
		}
	}
	if b, c := m.BatchStats(); b != 1 || c != 16 {
		t.Fatalf("BatchStats = %d, %d", b, c)
	}
	// Copies that leave known memory fail.
	if err := m.MemcpyDtoHAsync(s, addr(back), d0+60<<10, 8<<10); err == nil {
		t.Fatal("copy past the allocation succeeded")
	}
	if err := m.MemcpyBatchAsync(s, dsts[:1], srcs, lens); !errors.Is(err, gpudirect.ErrInvalidValue) {
		t.Fatalf("ragged batch = %v", err)
	}
	// Pointer attributes.
	pi, err := m.PointerInfo(0, d0+100)
	if err != nil || pi.MemoryType != gpudirect.MemoryTypeDevice || pi.RangeStart != d0 || pi.RangeSize != 64<<10 || pi.SyncMemops {
		t.Fatalf("PointerInfo = %+v, %v", pi, err)
	}
	if err := m.SetSyncMemops(0, d0); err != nil {
		t.Fatal(err)
	}
	if pi, _ := m.PointerInfo(0, d0); !pi.SyncMemops {
		t.Fatal("SYNC_MEMOPS not set")
	}
	if pi, err := m.PointerInfo(0, addr(host)); err != nil || pi.MemoryType != gpudirect.MemoryTypeHost {
		t.Fatalf("host PointerInfo = %+v, %v", pi, err)
	}
	var local [8]byte
	if _, err := m.PointerInfo(0, uintptr(unsafe.Pointer(&local))); !errors.Is(err, gpudirect.ErrInvalidValue) {
		t.Fatalf("unknown pointer = %v", err)
	}
	if err := gpudirect.CheckDeviceMemory(m, 0, addr(host), 10); !errors.Is(err, gpudirect.ErrInvalidValue) {
		t.Fatalf("gpudirect.CheckDeviceMemory(host) = %v", err)
	}
	if err := gpudirect.CheckDeviceMemory(m, 0, d0+4096, 64<<10); !errors.Is(err, gpudirect.ErrInvalidValue) {
		t.Fatalf("gpudirect.CheckDeviceMemory(past end) = %v", err)
	}
	if err := gpudirect.CheckDeviceMemory(m, 0, d0+4096, 4096); err != nil {
		t.Fatal(err)
	}
	// dma-buf: unaligned range, offset returned.
	db, err := m.ExportDmabuf(0, d0+100, 5000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if db.Base != d0 || db.Offset != 100 || db.Len != 8192 {
		t.Fatalf("dmabuf %+v", db)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	// Free everything; nothing leaks.
	if err := m.StreamDestroy(s); err != nil {
		t.Fatal(err)
	}
	if err := m.StreamDestroy(s); err != nil {
		t.Fatal("second StreamDestroy:", err)
	}
	if err := m.MemcpyHtoDAsync(s, d0, addr(host), 1); !errors.Is(err, gpudirect.ErrInvalidState) {
		t.Fatalf("copy on destroyed stream = %v", err)
	}
	for _, b := range [][]byte{host, back} {
		if err := m.HostFree(0, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.MemFree(0, d0); err != nil {
		t.Fatal(err)
	}
	if err := m.MemFree(0, d0); !errors.Is(err, gpudirect.ErrInvalidValue) {
		t.Fatalf("double free = %v", err)
	}
	if l := m.Leaks(); len(l) != 0 {
		t.Fatalf("leaks: %v", l)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.MemAlloc(0, 1); !errors.Is(err, gpudirect.ErrClosed) {
		t.Fatalf("MemAlloc after Close = %v", err)
	}
}

func TestDriverHostRegisterAndEvents(t *testing.T) {
	m := New()
	defer m.Close()
	// Registered memory must be live; a HostAlloc buffer stands in for mmap'd memory.
	backing, _ := m.HostAlloc(0, 8192)
	region := backing[4096:]
	copy(region, "hello")
	if err := m.HostRegister(0, addr(region), uint64(len(region))); err != nil {
		t.Fatal(err)
	}
	if err := m.HostRegister(0, addr(region), 1); !errors.Is(err, gpudirect.ErrAlreadyExists) {
		t.Fatalf("double register = %v", err)
	}
	d, _ := m.MemAlloc(0, 4096)
	s, _ := m.StreamCreate(0)
	e, _ := m.EventCreate(0)
	if err := m.MemcpyHtoDAsync(s, d, addr(region), 5); err != nil {
		t.Fatal(err)
	}
	if err := m.EventRecord(e, s); err != nil {
		t.Fatal(err)
	}
	if done, err := m.EventQuery(e); !done || err != nil {
		t.Fatalf("EventQuery = %v, %v", done, err)
	}
	if err := m.EventSynchronize(e); err != nil {
		t.Fatal(err)
	}
	got, _ := m.DeviceBytes(d, 5)
	if string(got) != "hello" {
		t.Fatalf("device has %q", got)
	}
	if err := m.HostUnregister(0, addr(region)); err != nil {
		t.Fatal(err)
	}
	if err := m.HostUnregister(0, addr(region)); !errors.Is(err, gpudirect.ErrNotFound) {
		t.Fatalf("double unregister = %v", err)
	}
	if err := m.EventDestroy(e); err != nil {
		t.Fatal(err)
	}
	if err := m.EventDestroy(e); err != nil {
		t.Fatal("second EventDestroy:", err)
	}
	other := New()
	defer other.Close()
	s2, _ := other.StreamCreate(0)
	if err := m.MemcpyHtoDAsync(s2, d, addr(region), 1); !errors.Is(err, gpudirect.ErrInvalidValue) {
		t.Fatalf("foreign stream = %v", err)
	}
}

func TestDriverFailNext(t *testing.T) {
	m := New()
	defer m.Close()
	m.FailNextResult("MemAlloc", gpudirect.ErrorOutOfMemory)
	_, err := m.MemAlloc(0, 10)
	if !errors.Is(err, gpudirect.ErrOutOfMemory) || !strings.Contains(err.Error(), "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Fatalf("injected error = %v", err)
	}
	if _, err := m.MemAlloc(0, 10); err != nil {
		t.Fatalf("second MemAlloc = %v; injection should be used up", err)
	}
	if m.Calls("MemAlloc") != 2 {
		t.Fatalf("Calls = %d", m.Calls("MemAlloc"))
	}
}

func TestRegionsAdapter(t *testing.T) {
	tests := []struct {
		name   string
		dev    Device
		dmabuf bool
	}{
		{"dma-buf", Device{DmabufSupported: true}, true},
		{"no dma-buf", Device{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New(tt.dev)
			defer m.Close()
			r := gpudirect.Regions{CUDA: m}
			mem, h, free, err := r.Alloc(0, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if mem.Len != 1<<20 || len(h) != gpudirect.IPCHandleSize || (mem.DmabufFD >= 0) != tt.dmabuf {
				t.Fatalf("Alloc = %+v, handle %d bytes", mem, len(h))
			}
			if pi, _ := m.PointerInfo(0, mem.Addr); !pi.SyncMemops {
				t.Fatal("SYNC_MEMOPS not set on allocation")
			}
			// Import a sub-range through the handle (the mock allows same-process opens).
			imp, release, err := r.Import(0, h, 4096+10, 100)
			if err != nil {
				t.Fatal(err)
			}
			if (imp.DmabufFD >= 0) != tt.dmabuf || (tt.dmabuf && imp.DmabufOffset != 10) {
				t.Fatalf("Import = %+v", imp)
			}
			src, _ := m.DeviceBytes(mem.Addr+4096+10, 100)
			copy(src, "through the mapping")
			dst, _ := m.DeviceBytes(imp.Addr, 100)
			if !bytes.Equal(src, dst) {
				t.Fatal("imported range does not alias the allocation")
			}
			for _, bad := range []struct {
				h         []byte
				off, size uint64
				want      string
			}{
				{h[:10], 0, 1, "cuda_ipc.handle: a CUDA IPC handle is 64 bytes, got 10"},
				{h, 1 << 20, 1, "exceeds the 1048576-byte allocation"},
				{h, 0, 0, "cuda_ipc.size is 0"},
			} {
				if _, _, err := r.Import(0, bad.h, bad.off, bad.size); !errors.Is(err, gpudirect.ErrInvalidValue) || !strings.Contains(err.Error(), bad.want) {
					t.Errorf("Import(%d bytes, %d, %d) = %v; want %q", len(bad.h), bad.off, bad.size, err, bad.want)
				}
			}
			for _, f := range []func() error{release, release, free, free} {
				if err := f(); err != nil {
					t.Fatal(err)
				}
			}
			if l := m.Leaks(); len(l) != 0 {
				t.Fatalf("leaks: %v", l)
			}
		})
	}
}

func TestRegionsAllocUndoesPartialWork(t *testing.T) {
	m := New(Device{DmabufSupported: true})
	defer m.Close()
	m.FailNextResult("IPCGetMemHandle", gpudirect.ErrorNotSupported)
	if _, _, _, err := (gpudirect.Regions{CUDA: m}).Alloc(0, 4096); !errors.Is(err, gpudirect.ErrNotSupported) {
		t.Fatalf("Alloc = %v", err)
	}
	if l := m.Leaks(); len(l) != 0 {
		t.Fatalf("partial Alloc leaked: %v", l)
	}
}

// The driver refuses dma-buf export of IPC mappings (seen on H100, CUDA 13):
// Import then returns the memory without a dma-buf; Alloc still fails.
func TestRegionsImportWithoutDmabuf(t *testing.T) {
	m := New(Device{DmabufSupported: true})
	defer m.Close()
	r := gpudirect.Regions{CUDA: m}
	mem, h, free, err := r.Alloc(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer free()
	m.FailNextResult("ExportDmabuf", gpudirect.ErrorInvalidValue)
	m.FailNextResult("SetSyncMemops", gpudirect.ErrorInvalidValue)
	imp, release, err := r.Import(0, h, 0, 4096)
	if err != nil {
		t.Fatalf("Import = %v", err)
	}
	if imp.DmabufFD != -1 || imp.Len != 4096 {
		t.Fatalf("Import = %+v; want no dma-buf", imp)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	m.FailNextResult("ExportDmabuf", gpudirect.ErrorInvalidValue)
	if _, _, _, err := r.Alloc(0, 4096); !errors.Is(err, gpudirect.ErrInvalidValue) {
		t.Fatalf("Alloc with a failing export = %v", err)
	}
	_ = mem
	if err := free(); err != nil {
		t.Fatal(err)
	}
	if l := m.Leaks(); len(l) != 0 {
		t.Fatalf("leaks: %v", l)
	}
}

// TestDriverAfterClose: as the real implementation, every method of the
// test double fails with gpudirect.ErrClosed after Close, and Close twice is
// a no-op.
func TestDriverAfterClose(t *testing.T) {
	m := New()
	d, _ := m.MemAlloc(0, 4096)
	host, _ := m.HostAlloc(0, 4096)
	s, _ := m.StreamCreate(0)
	e, _ := m.EventCreate(0)
	db, err := m.ExportDmabuf(0, d, 4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"DeviceInfo":        func() error { _, err := m.DeviceInfo(0); return err },
		"MemAlloc":          func() error { _, err := m.MemAlloc(0, 1); return err },
		"MemFree":           func() error { return m.MemFree(0, d) },
		"PointerInfo":       func() error { _, err := m.PointerInfo(0, d); return err },
		"SetSyncMemops":     func() error { return m.SetSyncMemops(0, d) },
		"ExportDmabuf":      func() error { _, err := m.ExportDmabuf(0, d, 4096, 0); return err },
		"IPCGetMemHandle":   func() error { _, err := m.IPCGetMemHandle(0, d); return err },
		"IPCOpenMemHandle":  func() error { _, err := m.IPCOpenMemHandle(0, gpudirect.IPCHandle{1}); return err },
		"IPCCloseMemHandle": func() error { return m.IPCCloseMemHandle(0, d) },
		"HostAlloc":         func() error { _, err := m.HostAlloc(0, 1); return err },
		"HostFree":          func() error { return m.HostFree(0, host) },
		"HostRegister":      func() error { return m.HostRegister(0, addr(host), 1) },
		"HostUnregister":    func() error { return m.HostUnregister(0, addr(host)) },
		"StreamCreate":      func() error { _, err := m.StreamCreate(0); return err },
		"StreamSynchronize": func() error { return m.StreamSynchronize(s) },
		"StreamDestroy":     func() error { return m.StreamDestroy(s) },
		"EventCreate":       func() error { _, err := m.EventCreate(0); return err },
		"EventRecord":       func() error { return m.EventRecord(e, s) },
		"EventQuery":        func() error { _, err := m.EventQuery(e); return err },
		"EventSynchronize":  func() error { return m.EventSynchronize(e) },
		"EventDestroy":      func() error { return m.EventDestroy(e) },
		"MemcpyHtoDAsync":   func() error { return m.MemcpyHtoDAsync(s, d, addr(host), 0) },
		"MemcpyDtoHAsync":   func() error { return m.MemcpyDtoHAsync(s, addr(host), d, 1) },
		"MemcpyBatchAsync":  func() error { return m.MemcpyBatchAsync(s, nil, nil, nil) },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, gpudirect.ErrClosed) {
			t.Errorf("%s after Close = %v; want ErrClosed", name, err)
		}
	}
	for _, f := range []func() error{m.Close, db.Close, db.Close} {
		if err := f(); err != nil {
			t.Errorf("second close = %v", err)
		}
	}
}

// TestHostSideCounted: a batch copy's host end is counted pinned when it is
// HostRegister'd (or HostAlloc'd) and pageable otherwise; pageable memory
// is refused unless SetPageableHost allows it.
func TestHostSideCounted(t *testing.T) {
	tests := []struct {
		name         string
		register     bool
		pageable     bool
		wantErr      bool
		wantPinned   int
		wantPageable int
	}{
		{"registered", true, false, false, 2, 0},
		{"pageable refused", false, false, true, 0, 1}, // counted, then refused
		{"pageable allowed", false, true, false, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New()
			defer m.Close()
			m.SetPageableHost(tt.pageable)
			// Host memory outside the Go heap, as the mock's contract asks.
			hb, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(hb)
			if tt.register {
				if err := m.HostRegister(0, addr(hb), uint64(len(hb))); err != nil {
					t.Fatal(err)
				}
				if !m.HostRegistered(addr(hb), 128) {
					t.Fatal("HostRegistered = false after HostRegister")
				}
				defer m.HostUnregister(0, addr(hb))
			} else if m.HostRegistered(addr(hb), 128) {
				t.Fatal("HostRegistered = true without HostRegister")
			}
			d, err := m.MemAlloc(0, 4096)
			if err != nil {
				t.Fatal(err)
			}
			s, err := m.StreamCreate(0)
			if err != nil {
				t.Fatal(err)
			}
			copy(hb, "pinned?")
			err = m.MemcpyBatchAsync(s, []uint64{uint64(d), uint64(addr(hb)) + 256}, []uint64{uint64(addr(hb)), uint64(d)}, []uint64{128, 128})
			if (err != nil) != tt.wantErr {
				t.Fatalf("MemcpyBatchAsync = %v; want error %v", err, tt.wantErr)
			}
			k := m.Copies()
			if k.PinnedHostSide != tt.wantPinned || k.PageableHostSide != tt.wantPageable {
				t.Fatalf("copies %+v: want %d pinned and %d pageable host ends", k, tt.wantPinned, tt.wantPageable)
			}
			if !tt.wantErr && string(hb[256:263]) != "pinned?" {
				t.Fatalf("round trip through the device gave %q", hb[256:263])
			}
		})
	}
}
