//go:build cgo && linux

package gpudirect

import (
	"errors"
	"syscall"
	"testing"
)

// handleCall is one method of one handle type, called after its handle was
// closed (the driver closed, or the stream/event destroyed).
type handleCall struct {
	name string
	call func(f *closedFixture) error
	// noop: the call must succeed (Close twice is a no-op).
	noop bool
}

// closedFixture holds handles made before Close.
type closedFixture struct {
	c      Interface
	dev    uintptr
	host   []byte
	reg    []byte
	s      *Stream
	e      *Event
	db     *Dmabuf
	ipc    IPCHandle
	mapped uintptr
}

func newClosedFixture(t *testing.T, c Interface, use bool) *closedFixture {
	f := &closedFixture{c: c}
	copy(f.ipc[:], "not-a-real-handle")
	if !use { // the device worker was never started
		return f
	}
	f.dev = must(c.MemAlloc(0, 1<<20))(t)
	f.host = must(c.HostAlloc(0, 1<<16))(t)
	// Registered memory must not be pinned already: an mmap'd page.
	reg, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(reg) })
	f.reg = reg
	ok(t, c.HostRegister(0, addr(f.reg), 4096))
	f.s = must(c.StreamCreate(0))(t)
	f.e = must(c.EventCreate(0))(t)
	ok(t, c.EventRecord(f.e, f.s))
	f.db = must(c.ExportDmabuf(0, f.dev, 4096, 0))(t)
	f.mapped = f.dev
	return f
}

// driverCalls lists every Interface method that can fail, after Close.
var driverCalls = []handleCall{
	{"Close", func(f *closedFixture) error { return f.c.Close() }, true},
	{"DeviceInfo", func(f *closedFixture) error { _, err := f.c.DeviceInfo(0); return err }, false},
	{"MemAlloc", func(f *closedFixture) error { _, err := f.c.MemAlloc(0, 4096); return err }, false},
	{"MemAlloc(0 bytes)", func(f *closedFixture) error { _, err := f.c.MemAlloc(0, 0); return err }, false},
	{"MemFree", func(f *closedFixture) error { return f.c.MemFree(0, f.dev) }, false},
	{"PointerInfo", func(f *closedFixture) error { _, err := f.c.PointerInfo(0, f.dev); return err }, false},
	{"SetSyncMemops", func(f *closedFixture) error { return f.c.SetSyncMemops(0, f.dev) }, false},
	{"ExportDmabuf", func(f *closedFixture) error { _, err := f.c.ExportDmabuf(0, f.dev, 4096, 0); return err }, false},
	{"IPCGetMemHandle", func(f *closedFixture) error { _, err := f.c.IPCGetMemHandle(0, f.dev); return err }, false},
	{"IPCOpenMemHandle", func(f *closedFixture) error { _, err := f.c.IPCOpenMemHandle(0, f.ipc); return err }, false},
	{"IPCOpenMemHandle(zeros)", func(f *closedFixture) error { _, err := f.c.IPCOpenMemHandle(0, IPCHandle{}); return err }, false},
	{"IPCCloseMemHandle", func(f *closedFixture) error { return f.c.IPCCloseMemHandle(0, f.mapped) }, false},
	{"HostAlloc", func(f *closedFixture) error { _, err := f.c.HostAlloc(0, 4096); return err }, false},
	{"HostFree", func(f *closedFixture) error { return f.c.HostFree(0, f.host) }, false},
	{"HostFree(empty)", func(f *closedFixture) error { return f.c.HostFree(0, nil) }, false},
	{"HostRegister", func(f *closedFixture) error { return f.c.HostRegister(0, 0x10000, 4096) }, false},
	{"HostUnregister", func(f *closedFixture) error { return f.c.HostUnregister(0, addr(f.reg)) }, false},
	{"StreamCreate", func(f *closedFixture) error { _, err := f.c.StreamCreate(0); return err }, false},
	{"EventCreate", func(f *closedFixture) error { _, err := f.c.EventCreate(0); return err }, false},
}

// streamCalls and eventCalls list every method taking a stream or an event;
// they must fail with ErrClosed after the driver closed, and after the
// handle was destroyed (destroying it again excepted).
var streamCalls = []handleCall{
	{"StreamDestroy", func(f *closedFixture) error { return f.c.StreamDestroy(f.s) }, true},
	{"StreamSynchronize", func(f *closedFixture) error { return f.c.StreamSynchronize(f.s) }, false},
	{"EventRecord(stream)", func(f *closedFixture) error { return f.c.EventRecord(f.e, f.s) }, false},
	{"MemcpyHtoDAsync", func(f *closedFixture) error { return f.c.MemcpyHtoDAsync(f.s, f.dev, addr(f.host), 64) }, false},
	{"MemcpyHtoDAsync(0 bytes)", func(f *closedFixture) error { return f.c.MemcpyHtoDAsync(f.s, f.dev, addr(f.host), 0) }, false},
	{"MemcpyDtoHAsync", func(f *closedFixture) error { return f.c.MemcpyDtoHAsync(f.s, addr(f.host), f.dev, 64) }, false},
	{"MemcpyBatchAsync", func(f *closedFixture) error {
		return f.c.MemcpyBatchAsync(f.s, []uint64{uint64(addr(f.host))}, []uint64{uint64(f.dev)}, []uint64{64})
	}, false},
	{"MemcpyBatchAsync(empty)", func(f *closedFixture) error { return f.c.MemcpyBatchAsync(f.s, nil, nil, nil) }, false},
}

var eventCalls = []handleCall{
	{"EventDestroy", func(f *closedFixture) error { return f.c.EventDestroy(f.e) }, true},
	{"EventRecord(event)", func(f *closedFixture) error { return f.c.EventRecord(f.e, f.s) }, false},
	{"EventQuery", func(f *closedFixture) error { _, err := f.c.EventQuery(f.e); return err }, false},
	{"EventSynchronize", func(f *closedFixture) error { return f.c.EventSynchronize(f.e) }, false},
}

func checkClosedCall(t *testing.T, f *closedFixture, hc handleCall) {
	t.Helper()
	err := hc.call(f)
	switch {
	case hc.noop && err != nil:
		t.Errorf("%s after close = %v; want a no-op", hc.name, err)
	case !hc.noop && !errors.Is(err, ErrClosed):
		t.Errorf("%s after close = %v; want ErrClosed", hc.name, err)
	case !hc.noop && !errors.Is(err, ErrInvalidState):
		t.Errorf("%s after close = %v; ErrClosed must be an ErrInvalidState", hc.name, err)
	}
}

// TestClosedHandles calls every method of every handle type (driver,
// stream, event, dma-buf) after the handle was closed, over the fake
// libcuda: each returns ErrClosed (or, for a second Close/Destroy, nothing)
// and none reaches the driver with a stale handle.
func TestClosedHandles(t *testing.T) {
	lib := buildFake(t)

	for _, used := range []bool{true, false} {
		name := map[bool]string{true: "driver in use", false: "driver never used"}[used]
		t.Run(name, func(t *testing.T) {
			c := must(Load(WithLibrary(lib)))(t)
			f := newClosedFixture(t, c, used)
			ok(t, c.Close())
			// Methods without an error must not crash either.
			_, _, _ = c.DriverVersion(), c.DeviceCount(), c.Capabilities()
			for _, hc := range driverCalls {
				t.Run(hc.name, func(t *testing.T) { checkClosedCall(t, f, hc) })
			}
			if !used {
				// Handles of another driver's making: nil handles.
				return
			}
			for _, hc := range append(append([]handleCall{}, streamCalls...), eventCalls...) {
				t.Run(hc.name, func(t *testing.T) {
					if hc.noop {
						// Destroying after the driver closed is a call on a
						// closed driver, not a second destroy.
						hc.noop = false
					}
					checkClosedCall(t, f, hc)
				})
			}
			t.Run("Dmabuf.Close", func(t *testing.T) {
				ok(t, f.db.Close())
				ok(t, f.db.Close())
			})
		})
	}

	t.Run("stream destroyed", func(t *testing.T) {
		c := must(Load(WithLibrary(lib)))(t)
		defer c.Close()
		f := newClosedFixture(t, c, true)
		ok(t, c.StreamDestroy(f.s))
		for _, hc := range streamCalls {
			t.Run(hc.name, func(t *testing.T) { checkClosedCall(t, f, hc) })
		}
		if err := c.StreamSynchronize(f.s); !errors.Is(err, ErrStreamDestroyed) {
			t.Errorf("StreamSynchronize = %v; want ErrStreamDestroyed", err)
		}
		ok(t, f.db.Close())
	})

	t.Run("event destroyed", func(t *testing.T) {
		c := must(Load(WithLibrary(lib)))(t)
		defer c.Close()
		f := newClosedFixture(t, c, true)
		ok(t, c.EventDestroy(f.e))
		for _, hc := range eventCalls {
			t.Run(hc.name, func(t *testing.T) { checkClosedCall(t, f, hc) })
		}
		if err := c.EventSynchronize(f.e); !errors.Is(err, ErrEventDestroyed) {
			t.Errorf("EventSynchronize = %v; want ErrEventDestroyed", err)
		}
		ok(t, f.db.Close())
	})

	t.Run("dma-buf closed", func(t *testing.T) {
		c := must(Load(WithLibrary(lib)))(t)
		defer c.Close()
		f := newClosedFixture(t, c, true)
		ok(t, f.db.Close())
		ok(t, f.db.Close())
		var nilBuf *Dmabuf
		ok(t, nilBuf.Close())
	})
}
