//go:build cgo && linux

package gpudirect

/*
#include "cuda_shim.h"

// Off the device thread: neither keeps Go pointers nor calls back into Go.
#cgo nocallback b2b_handle_sync
#cgo nocallback b2b_event_query
#cgo nocallback b2b_event_record
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Streams and events share everything but their C calls: creating,
// destroying (also at Close), checking, and waiting on the caller's thread.

// handleKind describes streams or events to the code they share.
type handleKind struct {
	kind      C.int  // B2B_KIND_STREAM or B2B_KIND_EVENT
	create    string // the calls, as errors name them
	destroy   string
	sync      string
	isNil     error
	foreign   error
	destroyed error
}

var (
	streamKind = handleKind{
		kind:      C.B2B_KIND_STREAM,
		create:    "cuStreamCreate(CU_STREAM_NON_BLOCKING)",
		destroy:   "cuStreamDestroy_v2",
		sync:      "cuStreamSynchronize",
		isNil:     fmt.Errorf("%w: gpudirect: nil stream", ErrInvalidValue),
		foreign:   fmt.Errorf("%w: gpudirect: stream was created by another Interface", ErrInvalidValue),
		destroyed: ErrStreamDestroyed,
	}
	eventKind = handleKind{
		kind:      C.B2B_KIND_EVENT,
		create:    "cuEventCreate(CU_EVENT_DISABLE_TIMING)",
		destroy:   "cuEventDestroy_v2",
		sync:      "cuEventSynchronize",
		isNil:     fmt.Errorf("%w: gpudirect: nil event", ErrInvalidValue),
		foreign:   fmt.Errorf("%w: gpudirect: event was created by another Interface", ErrInvalidValue),
		destroyed: ErrEventDestroyed,
	}
)

// hd returns the handle inside a stream or event, nil for nil.
func (s *Stream) hd() *handle {
	if s == nil {
		return nil
	}
	return &s.handle
}

func (e *Event) hd() *handle {
	if e == nil {
		return nil
	}
	return &e.handle
}

// handleDev checks h and returns its device.
func (d *driver) handleDev(h *handle, k *handleKind) (*devState, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	if h == nil {
		return nil, k.isNil
	}
	if h.owner != any(d) {
		return nil, k.foreign
	}
	return d.device(h.dev)
}

func (d *driver) create(h *handle, k *handleKind) error {
	ds, err := d.device(h.dev)
	if err != nil {
		return err
	}
	var v C.uintptr_t
	var rc C.int
	if err := ds.w.do(func() {
		if rc = C.b2b_handle_create(d.tab, k.kind, &v); rc == 0 {
			h.h = uintptr(v)
			ds.handles[h] = k
		}
	}); err != nil {
		return err
	}
	return d.callErr(rc, h.dev, k.create)
}

// destroyLocked destroys h on ds's worker thread; a destroyed handle is
// left alone.
func (d *driver) destroyLocked(ds *devState, h *handle, k *handleKind) C.int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.h == 0 {
		return 0
	}
	rc := C.b2b_handle_destroy(d.tab, k.kind, C.uintptr_t(h.h))
	h.h = 0
	delete(ds.handles, h)
	return rc
}

func (d *driver) destroy(h *handle, k *handleKind) error {
	ds, err := d.handleDev(h, k)
	if err != nil {
		return err
	}
	var rc C.int
	if err := ds.w.do(func() { rc = d.destroyLocked(ds, h, k) }); err != nil {
		return err
	}
	return d.callErr(rc, h.dev, k.destroy)
}

// wait synchronises with (or, with query, polls) a stream or event on the
// caller's thread: a handle names its context, so no context need be
// current, and a long wait does not hold up the device's other calls.
// Should a driver still want a current context, the call is repeated on the
// device thread. It returns the shim's code.
func (d *driver) wait(h *handle, k *handleKind, query bool) (C.int, error) {
	ds, err := d.handleDev(h, k)
	if err != nil {
		return 0, err
	}
	h.mu.RLock()
	v := h.h
	var rc C.int
	if v != 0 {
		rc = d.waitCall(k, query, v)
	}
	h.mu.RUnlock()
	if v == 0 {
		return 0, k.destroyed
	}
	if is(rc, ErrorInvalidContext) {
		return d.waitOnThread(ds, h, k, query)
	}
	return rc, nil
}

func (d *driver) waitCall(k *handleKind, query bool, v uintptr) C.int {
	if query {
		return C.b2b_event_query(d.tab, C.uintptr_t(v))
	}
	return C.b2b_handle_sync(d.tab, k.kind, C.uintptr_t(v))
}

// waitOnThread is wait on the device's thread, for a driver that wants a
// context current. Apart from wait, so that the closure's captures do not
// make every wait allocate (a synchronisation ends every GPU batch).
func (d *driver) waitOnThread(ds *devState, h *handle, k *handleKind, query bool) (C.int, error) {
	d.syncFallbacks.Add(1)
	var rc C.int
	gone := false
	if err := ds.w.do(func() {
		if gone = h.h == 0; !gone {
			rc = d.waitCall(k, query, h.h)
		}
	}); err != nil {
		return 0, err
	}
	if gone {
		return 0, k.destroyed
	}
	return rc, nil
}

// ---- streams -------------------------------------------------------------------

func (d *driver) StreamCreate(dev int) (*Stream, error) {
	if err := d.checkDev(dev); err != nil {
		return nil, err
	}
	s := NewStream(d, dev)
	if err := d.create(&s.handle, &streamKind); err != nil {
		return nil, err
	}
	return s, nil
}

func (d *driver) StreamDestroy(s *Stream) error { return d.destroy(s.hd(), &streamKind) }

func (d *driver) StreamSynchronize(s *Stream) error {
	rc, err := d.wait(s.hd(), &streamKind, false)
	if err != nil {
		return err
	}
	return d.callErr(rc, s.dev, streamKind.sync)
}

// ---- events --------------------------------------------------------------------

func (d *driver) EventCreate(dev int) (*Event, error) {
	if err := d.checkDev(dev); err != nil {
		return nil, err
	}
	e := NewEvent(d, dev)
	if err := d.create(&e.handle, &eventKind); err != nil {
		return nil, err
	}
	return e, nil
}

func (d *driver) EventDestroy(e *Event) error { return d.destroy(e.hd(), &eventKind) }

func (d *driver) EventSynchronize(e *Event) error {
	rc, err := d.wait(e.hd(), &eventKind, false)
	if err != nil {
		return err
	}
	return d.callErr(rc, e.dev, eventKind.sync)
}

func (d *driver) EventQuery(e *Event) (bool, error) {
	rc, err := d.wait(e.hd(), &eventKind, true)
	switch {
	case err != nil:
		return false, err
	case rc == 0:
		return true, nil
	case is(rc, ErrorNotReady):
		return false, nil
	}
	return false, d.callErr(rc, e.dev, "cuEventQuery")
}

func eventRecordFn(r *request) {
	e, s := r.obj.(*Event), r.obj2.(*Stream)
	switch {
	case e.h == 0:
		r.err = eventKind.destroyed
	case s.h == 0:
		r.err = streamKind.destroyed
	default:
		r.rc = int32(C.b2b_event_record((*C.b2b_tab)(r.p), C.uintptr_t(e.h), C.uintptr_t(s.h)))
	}
}

func (d *driver) EventRecord(e *Event, s *Stream) error {
	ds, err := d.handleDev(e.hd(), &eventKind)
	if err != nil {
		return err
	}
	if _, err := d.handleDev(s.hd(), &streamKind); err != nil {
		return err
	}
	if s.dev != e.dev {
		return fmt.Errorf("%w: gpudirect: cuEventRecord: event is on device %d, stream on device %d", ErrInvalidValue, e.dev, s.dev)
	}
	r := getRequest()
	r.fn, r.p, r.obj, r.obj2 = eventRecordFn, unsafe.Pointer(d.tab), e, s
	err = ds.w.submit(r)
	rc, rerr := r.rc, r.err
	putRequest(r)
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return rerr
	}
	return d.callErr(C.int(rc), e.dev, "cuEventRecord")
}
