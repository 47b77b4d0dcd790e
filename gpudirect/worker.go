package gpudirect

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// worker runs calls on one goroutine locked to one OS thread, the thread on
// which a device's CUDA context is current. It is plain Go (no cgo) so it can
// be tested without a GPU.
type worker struct {
	name     string
	reqs     chan *request // unbuffered: a send that succeeds is always run
	quit     chan struct{}
	exited   chan struct{}
	stopOnce sync.Once
	finiErr  error
}

// request is one call handed to a worker. Hot paths fill the scalar and slice
// fields and point fn at a package-level function (no closure, so nothing is
// allocated); cold paths set closure instead. Requests are pooled.
type request struct {
	fn      func(r *request)
	closure func()

	p          unsafe.Pointer // e.g. the driver's C function table
	obj, obj2  any            // e.g. the stream and the event
	a0, a1, a2 uint64
	a3, a4     uint64 // e.g. a batch part's hold flag and value
	s0, s1, s2 []uint64

	rc   int32  // CUresult
	i0   int32  // e.g. which batch path ran
	i1   int32  // e.g. whether a batch part's stream was held
	out0 uint64 // e.g. the failing index of a batch
	out1 uint64 // e.g. the primed chunks of a batch
	err  error

	done chan struct{}
}

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

func getRequest() *request { return requestPool.Get().(*request) }

func putRequest(r *request) {
	done := r.done
	*r = request{done: done}
	requestPool.Put(r)
}

func runClosure(r *request) { r.closure() }

// startWorker starts a worker whose thread first runs init; if init fails the
// worker (and its thread) exits and the error is returned. fini runs on the
// same thread when the worker stops.
func startWorker(name string, init func() error, fini func() error) (*worker, error) {
	w := &worker{
		name:   name,
		reqs:   make(chan *request),
		quit:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	ready := make(chan error, 1)
	go w.loop(init, fini, ready)
	if err := <-ready; err != nil {
		<-w.exited
		return nil, err
	}
	return w, nil
}

func (w *worker) loop(init func() error, fini func() error, ready chan<- error) {
	// The thread is never unlocked: it carries a CUDA context, and when this
	// goroutine returns while locked, the runtime ends the thread with it.
	runtime.LockOSThread()
	defer close(w.exited)
	if err := protect(init); err != nil {
		ready <- err
		return
	}
	ready <- nil
	for {
		select {
		case r := <-w.reqs:
			w.run(r)
			r.done <- struct{}{}
		case <-w.quit:
			w.finiErr = protect(fini)
			return
		}
	}
}

// run calls r.fn, turning a panic into r.err so that a bug in one call does
// not take the daemon down.
func (w *worker) run(r *request) {
	defer func() {
		if p := recover(); p != nil {
			r.err = fmt.Errorf("%w: gpudirect: %s: call panicked: %v", ErrAborted, w.name, p)
		}
	}()
	r.fn(r)
}

func protect(f func() error) (err error) {
	if f == nil {
		return nil
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: gpudirect: panicked: %v", ErrAborted, p)
		}
	}()
	return f()
}

// submit runs r on the worker and waits for it. It returns ErrClosed if the
// worker has stopped (r then did not run).
func (w *worker) submit(r *request) error {
	select {
	case w.reqs <- r:
	case <-w.quit:
		return ErrClosed
	}
	<-r.done
	return nil
}

// start hands r to the worker without waiting for it to run (wait with
// <-r.done). It returns ErrClosed if the worker has stopped.
func (w *worker) start(r *request) error {
	select {
	case w.reqs <- r:
		return nil
	case <-w.quit:
		return ErrClosed
	}
}

// do runs f on the worker (cold paths: f is a closure and allocates).
func (w *worker) do(f func()) error {
	r := getRequest()
	r.fn = runClosure
	r.closure = f
	err := w.submit(r)
	if err == nil {
		err = r.err
	}
	putRequest(r)
	return err
}

// stop stops the worker after the call in progress, runs fini on its thread
// and returns fini's error. Safe to call twice (fini runs once).
func (w *worker) stop() error {
	w.stopOnce.Do(func() { close(w.quit) })
	<-w.exited
	return w.finiErr
}
