package gpudirect

import (
	"sync"
	"sync/atomic"
)

// Dmabuf is an exported dma-buf. The file descriptor belongs to the caller
// until Close; it may be closed once ibv_reg_dmabuf_mr has taken its reference.
type Dmabuf struct {
	FD     int
	Base   uintptr // the page-aligned start of the exported range
	Len    uint64  // the page-aligned length of the exported range
	Offset uint64  // the requested pointer's offset from Base

	closeOnce sync.Once
	closeErr  error
	closeFD   func(fd int) error
}

// NewDmabuf makes a Dmabuf whose Close calls closeFD(fd) once. It is for
// implementations of Interface (the real one passes syscall.Close).
func NewDmabuf(fd int, base uintptr, length, offset uint64, closeFD func(fd int) error) *Dmabuf {
	return &Dmabuf{FD: fd, Base: base, Len: length, Offset: offset, closeFD: closeFD}
}

// Close closes the file descriptor; safe to call twice (the second call
// returns the first one's result).
func (d *Dmabuf) Close() error {
	if d == nil {
		return nil
	}
	d.closeOnce.Do(func() {
		if d.closeFD != nil && d.FD >= 0 {
			d.closeErr = d.closeFD(d.FD)
		}
	})
	return d.closeErr
}

// handle is what streams and events share: the device, the Interface that
// made it, and the driver's handle (CUstream, CUevent; 0 once destroyed).
type handle struct {
	dev   int
	owner any
	id    uint64
	// mu is held shared while the handle is used off its device thread
	// (Synchronize, Query) and exclusively while it is destroyed.
	mu sync.RWMutex
	h  uintptr
}

var handleIDs atomic.Uint64

func newHandle(owner any, dev int) handle {
	return handle{dev: dev, owner: owner, id: handleIDs.Add(1)}
}

// Stream is a CUDA stream created by an Interface; use it only with the
// Interface that created it.
type Stream struct{ handle }

// Event is a CUDA event created by an Interface.
type Event struct{ handle }

// NewStream and NewEvent make handles for implementations of Interface
// other than this package's (gpudirect/cudatest): owner is the
// implementation, which recognises its handles by Owner.
func NewStream(owner any, dev int) *Stream { return &Stream{newHandle(owner, dev)} }

// NewEvent: see NewStream.
func NewEvent(owner any, dev int) *Event { return &Event{newHandle(owner, dev)} }

// Device is the ordinal the handle belongs to.
func (h *handle) Device() int { return h.dev }

// Owner is the Interface that made the handle.
func (h *handle) Owner() any { return h.owner }

// ID is unique among the process's streams and events.
func (h *handle) ID() uint64 { return h.id }
