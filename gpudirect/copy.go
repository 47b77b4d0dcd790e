//go:build cgo && linux

package gpudirect

/*
#include "cuda_shim.h"

// The copy-path wrappers neither keep Go pointers nor call back into Go.
#cgo noescape b2b_htod
#cgo nocallback b2b_htod
#cgo noescape b2b_dtoh
#cgo nocallback b2b_dtoh
#cgo noescape b2b_memcpy_batch
#cgo nocallback b2b_memcpy_batch
*/
import "C"

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Copies are allocation-free: pooled requests and package-level functions
// run on the device's worker thread.

func htodFn(r *request) {
	s := r.obj.(*Stream)
	if s.h == 0 {
		r.err = streamKind.destroyed
		return
	}
	r.rc = int32(C.b2b_htod((*C.b2b_tab)(r.p), C.uintptr_t(s.h), C.CUdeviceptr(r.a0), C.uintptr_t(r.a1), C.size_t(r.a2)))
}

func dtohFn(r *request) {
	s := r.obj.(*Stream)
	if s.h == 0 {
		r.err = streamKind.destroyed
		return
	}
	r.rc = int32(C.b2b_dtoh((*C.b2b_tab)(r.p), C.uintptr_t(s.h), C.uintptr_t(r.a0), C.CUdeviceptr(r.a1), C.size_t(r.a2)))
}

func (d *driver) copy1(fn func(*request), call string, s *Stream, dst, src uintptr, size uint64) error {
	ds, err := d.handleDev(s.hd(), &streamKind)
	if err != nil {
		return err
	}
	if size == 0 {
		return s.destroyedErr()
	}
	r := getRequest()
	r.fn, r.p, r.obj = fn, unsafe.Pointer(d.tab), s
	r.a0, r.a1, r.a2 = uint64(dst), uint64(src), size
	err = ds.w.submit(r)
	rc, rerr := r.rc, r.err
	putRequest(r)
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return rerr
	case rc != 0:
		return d.callErr(C.int(rc), s.dev, "%s(dst=%#x, src=%#x, size=%d)", call, dst, src, size)
	}
	return nil
}

// destroyedErr is ErrStreamDestroyed once s was destroyed: a copy of
// nothing queues nothing, but must not succeed on a destroyed stream.
func (s *Stream) destroyedErr() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.h == 0 {
		return ErrStreamDestroyed
	}
	return nil
}

func (d *driver) MemcpyHtoDAsync(s *Stream, dst, src uintptr, size uint64) error {
	return d.copy1(htodFn, "cuMemcpyHtoDAsync_v2", s, dst, src, size)
}

func (d *driver) MemcpyDtoHAsync(s *Stream, dst, src uintptr, size uint64) error {
	return d.copy1(dtohFn, "cuMemcpyDtoHAsync_v2", s, dst, src, size)
}

func batchFn(r *request) {
	s := r.obj.(*Stream)
	if s.h == 0 {
		r.err = streamKind.destroyed
		return
	}
	r.rc = int32(C.b2b_memcpy_batch((*C.b2b_tab)(r.p), C.uintptr_t(s.h),
		(*C.CUdeviceptr)(unsafe.Pointer(unsafe.SliceData(r.s0))),
		(*C.CUdeviceptr)(unsafe.Pointer(unsafe.SliceData(r.s1))),
		(*C.size_t)(unsafe.Pointer(unsafe.SliceData(r.s2))),
		C.size_t(len(r.s2)), C.int(r.a0), C.CUdeviceptr(r.a1), C.uintptr_t(r.a2), C.CUdeviceptr(r.a3), C.uint(r.a4),
		(*C.int)(unsafe.Pointer(&r.i0)), (*C.size_t)(unsafe.Pointer(&r.out0)), (*C.size_t)(unsafe.Pointer(&r.out1)),
		(*C.int)(unsafe.Pointer(&r.i1))))
}

// batchCalls names b2b_memcpy_batch's paths (B2B_PATH_*).
var batchCalls = [...]string{
	C.B2B_PATH_LOOP:       "cuMemcpyAsync",
	C.B2B_PATH_BATCH_12_8: "cuMemcpyBatchAsync",
	C.B2B_PATH_BATCH_V2:   "cuMemcpyBatchAsync_v2",
	C.B2B_PATH_PRIMER:     "cuMemcpyHtoDAsync_v2 (the copy-engine primer of a host-to-device chunk)",
	C.B2B_PATH_HOLD:       "cuStreamWaitValue32_v2 (holding a part's stream until every part is queued)",
}

// H2DChunk is how many copies of a host-to-device batch go behind one
// copy-engine primer (cuda_shim.h says why).
const H2DChunk = C.B2B_H2D_CHUNK

// batchStats counts MemcpyBatchAsync calls by the path they took.
type batchStats struct {
	oneCall, primed, primedChunks, loop atomic.Uint64
	// held counts the parts of host-to-device batches whose stream was
	// held until every part was queued.
	held atomic.Uint64
}

func (d *driver) MemcpyBatchAsync(s *Stream, dsts, srcs, sizes []uint64) error {
	ds, err := d.handleDev(s.hd(), &streamKind)
	if err != nil {
		return err
	}
	if err := CheckBatch(dsts, srcs, sizes); err != nil {
		return err
	}
	if len(sizes) == 0 {
		return s.destroyedErr()
	}
	r := d.batchRequest(ds, s, dsts, srcs, sizes)
	if err := ds.w.submit(r); err != nil {
		putRequest(r)
		return err
	}
	err = d.batchDone(r, s.dev, dsts, srcs, sizes, 0, 0, 1)
	putRequest(r)
	return err
}

// batchRequest is a pooled request for one batched call on s.
func (d *driver) batchRequest(ds *devState, s *Stream, dsts, srcs, sizes []uint64) *request {
	r := getRequest()
	r.fn, r.p, r.obj = batchFn, unsafe.Pointer(d.tab), s
	r.s0, r.s1, r.s2 = dsts, srcs, sizes
	r.a0, r.a1, r.a2 = 0, ds.primerDev, ds.primerHost
	if d.caps.MemcpyBatch {
		r.a0 = 1
	}
	return r
}

// batchDone is the outcome of a batch request that ran, part j of parts
// (lo: where its copies start in dsts, srcs and sizes), and counts its
// path.
func (d *driver) batchDone(r *request, dev int, dsts, srcs, sizes []uint64, lo, j, parts int) error {
	rc, path, fail, chunks := r.rc, r.i0, r.out0, r.out1
	switch {
	case r.err != nil:
		return r.err
	case rc != 0:
		call := batchCalls[min(max(int(path), 0), len(batchCalls)-1)]
		part := ""
		if parts > 1 {
			part = fmt.Sprintf(", part %d of %d", j+1, parts)
		}
		if f := uint64(lo) + fail; fail < uint64(len(sizes)) && f < uint64(len(sizes)) {
			return d.callErr(C.int(rc), dev, "%s(count=%d%s): copy %d (dst=%#x, src=%#x, size=%d)", call, len(sizes), part, f, dsts[f], srcs[f], sizes[f])
		}
		return d.callErr(C.int(rc), dev, "%s(count=%d%s)", call, len(sizes), part)
	}
	if r.i1 != 0 {
		d.stats.held.Add(1)
	}
	switch {
	case chunks > 0:
		d.stats.primed.Add(1)
		d.stats.primedChunks.Add(chunks)
	case path == C.B2B_PATH_LOOP:
		d.stats.loop.Add(1)
	default:
		d.stats.oneCall.Add(1)
	}
	return nil
}

func (d *driver) MemcpyBatchAsyncParts(ss []*Stream, dsts, srcs, sizes []uint64) error {
	if len(ss) == 0 {
		return fmt.Errorf("%w: gpudirect: batch copy in parts on no stream", ErrInvalidValue)
	}
	if err := CheckBatch(dsts, srcs, sizes); err != nil {
		return err
	}
	k := min(len(ss), len(sizes), ParallelParts)
	if k <= 1 {
		return d.MemcpyBatchAsync(ss[0], dsts, srcs, sizes)
	}
	ds, err := d.handleDev(ss[0].hd(), &streamKind)
	if err != nil {
		return err
	}
	for j := 1; j < k; j++ {
		if _, err := d.handleDev(ss[j].hd(), &streamKind); err != nil {
			return err
		}
		if ss[j].dev != ss[0].dev {
			return fmt.Errorf("%w: gpudirect: batch copy in parts on streams of devices %d and %d", ErrInvalidValue, ss[0].dev, ss[j].dev)
		}
	}
	k = min(k, 1+len(ds.par))
	// A host-to-device batch's parts hold their streams until all are
	// queued (cuda_shim.h: b2b_hold_alloc says why); the C side holds only
	// such batches. Without the flag, one thread queues it, which keeps
	// every primer pending.
	var holdVal uint32
	if ds.holdDev != 0 {
		ds.holdMu.Lock()
		ds.holdSeq++
		holdVal = ds.holdSeq
		defer func() {
			// After every started part is queued (or failed): a part that
			// never started queued no wait, and one that failed may have.
			C.b2b_hold_release(C.uintptr_t(ds.holdHost), C.uint(holdVal))
			ds.holdMu.Unlock()
		}()
	} else if d.hostToDevice(ds, dsts[0], srcs[0]) {
		return d.MemcpyBatchAsync(ss[0], dsts, srcs, sizes)
	}
	n := len(sizes)
	var reqs [ParallelParts]*request
	var started [ParallelParts]bool
	var qerr error
	for j := 0; j < k; j++ {
		lo, hi := n*j/k, n*(j+1)/k
		r := d.batchRequest(ds, ss[j], dsts[lo:hi], srcs[lo:hi], sizes[lo:hi])
		r.a3, r.a4 = ds.holdDev, uint64(holdVal)
		reqs[j] = r
		w := ds.w
		if j > 0 {
			w = ds.par[j-1]
			// Off the stream's own thread: hold it against a destroy.
			ss[j].mu.RLock()
		}
		if err := w.start(r); err != nil {
			if j > 0 {
				ss[j].mu.RUnlock()
			}
			qerr = err
			break
		}
		started[j] = true
	}
	for j := 0; j < k; j++ {
		r := reqs[j]
		if r == nil {
			continue
		}
		if started[j] {
			<-r.done
			if j > 0 {
				ss[j].mu.RUnlock()
			}
			if err := d.batchDone(r, ss[j].dev, dsts, srcs, sizes, n*j/k, j, k); err != nil && qerr == nil {
				qerr = err
			}
		}
		putRequest(r)
	}
	return qerr
}

// hostToDevice says whether a batch whose first copy is dst <- src goes
// from pinned host to device memory, as b2b_memcpy_batch tells it (on the
// device's thread: the driver wants a context current).
func (d *driver) hostToDevice(ds *devState, dst, src uint64) bool {
	if ds.primerDev == 0 || !d.caps.MemcpyBatch {
		return false // unprimed batches need no pending primer
	}
	r := getRequest()
	r.fn, r.p, r.a0, r.a1 = hostToDeviceFn, unsafe.Pointer(d.tab), dst, src
	err := ds.w.submit(r)
	h2d := err == nil && r.err == nil && r.i0 != 0
	putRequest(r)
	return h2d
}

func hostToDeviceFn(r *request) {
	t := (*C.b2b_tab)(r.p)
	if C.b2b_mem_type(t, C.CUdeviceptr(r.a0)) == C.B2B_CU_MEMORYTYPE_DEVICE && C.b2b_mem_type(t, C.CUdeviceptr(r.a1)) == C.B2B_CU_MEMORYTYPE_HOST {
		r.i0 = 1
	}
}

// pathCounts is a snapshot of batchStats (tests).
type pathCounts struct{ oneCall, primed, primedChunks, loop, held uint64 }

func (b *batchStats) snapshot() pathCounts {
	return pathCounts{b.oneCall.Load(), b.primed.Load(), b.primedChunks.Load(), b.loop.Load(), b.held.Load()}
}

func (p pathCounts) minus(q pathCounts) pathCounts {
	return pathCounts{p.oneCall - q.oneCall, p.primed - q.primed, p.primedChunks - q.primedChunks, p.loop - q.loop, p.held - q.held}
}
