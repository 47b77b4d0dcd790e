package local

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
)

// copy moves the blocks: host to host with the CPU (contained faults),
// anything touching a GPU with one batched copy-engine call. post is the
// time spent queueing direct GPU copies (the hand-over to the copy
// engines, as a NIC's post); 0 where the CPU or the stage moves the bytes.
func (c *Conn) copy(ctx context.Context, sm memory.Memory, rm *remote, b *desc.Batch, read bool) (post time.Duration, err error) {
	if sm.Kind == memory.Host && rm.kind == kindHost {
		dst, src := rm.host, sm.Host
		if read { // a pull: the copy runs the other way
			dst, src = sm.Host, rm.host
		}
		k := c.t.cfg.Streams
		if total := b.Bytes(); total/MinSplit < uint64(k) {
			k = max(1, int(total/MinSplit))
		}
		if k <= 1 || b.N() < 2 {
			return 0, copyHost(ctx, dst, src, b, 0, b.N())
		}
		if c.hostPool == nil {
			c.hostPool = newHostPool(c.t.cfg.Streams)
		}
		return 0, c.hostPool.run(ctx, dst, src, b, k)
	}
	cu := c.t.cfg.CUDA
	if cu == nil {
		return 0, fmt.Errorf("%w: samehost: GPU copy without a CUDA driver", errs.ErrFailedPrecondition)
	}
	if sm.Kind == memory.CUDA && rm.kind == kindCUDA && rm.home == sm.Device && !c.t.cfg.SameDeviceDirect {
		// One GPU: its device-to-device copies would run on SMs (stage.go).
		s, err := c.t.stageFor(sm.Device)
		if err != nil {
			return 0, fmt.Errorf("%w: %v", errs.ErrFailedPrecondition, err)
		}
		if read {
			return 0, copyStaged(ctx, cu, s, uint64(rm.dptr), uint64(sm.Addr), b)
		}
		return 0, copyStaged(ctx, cu, s, uint64(sm.Addr), uint64(rm.dptr), b)
	}
	if b.N() > 0 && b.Bytes()/uint64(b.N()) <= toHostMaxBlock {
		// Device memory into host memory: small blocks through the
		// source GPU's stage (tohost.go), where it has one.
		var from uint64
		var to []byte
		var fromDev int
		switch {
		case !read && sm.Kind == memory.CUDA && rm.kind == kindHost:
			from, to, fromDev = uint64(sm.Addr), rm.host, sm.Device
		case read && sm.Kind == memory.Host && rm.kind == kindCUDA:
			from, to, fromDev = uint64(rm.dptr), sm.Host, rm.dev
		}
		if to != nil {
			if s, err := c.t.stageFor(fromDev); err == nil {
				if c.hostPool == nil && c.t.cfg.Streams > 1 {
					c.hostPool = newHostPool(c.t.cfg.Streams)
				}
				if err := copyToHost(ctx, cu, s, from, to, b, c.hostPool, c.t.cfg.Streams); !errors.Is(err, errNotMerged) {
					return 0, err
				}
			}
		}
	}
	dev := rm.dev
	if rm.kind == kindHost {
		dev = sm.Device
	}
	ss, err := c.deviceStreams(dev)
	if err != nil {
		return 0, err
	}
	var srcBase, dstBase uint64
	if sm.Kind == memory.Host {
		srcBase = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(sm.Host))))
	} else {
		srcBase = uint64(sm.Addr)
	}
	if rm.kind == kindHost {
		dstBase = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(rm.host))))
	} else {
		dstBase = uint64(rm.dptr)
	}
	if read { // a pull: the peer's region is the source
		srcBase, dstBase = dstBase, srcBase
	}
	n := b.N()
	if cap(c.dsts) < n {
		c.dsts, c.srcs, c.sizes = make([]uint64, n), make([]uint64, n), make([]uint64, n)
	}
	dsts, srcs, sizes := c.dsts[:n], c.srcs[:n], c.sizes[:n]
	for i := 0; i < n; i++ {
		dsts[i] = dstBase + b.Dst[i]
		srcs[i] = srcBase + b.Src[i]
		sizes[i] = b.Len[i]
	}
	// Shares of about equal bytes, one per stream, each one batched call;
	// many small copies in parts of about equal count, queued at once by
	// the device's threads (the driver's enqueue is CPU time per copy, and
	// one thread can land on a slow core: gpudirect.ParallelParts). Host
	// to device too: gpudirect holds those parts' streams until all are
	// queued, so that every primed chunk meets a pending primer.
	k := gpuShares(n, b.Bytes(), len(ss))
	var qerr error
	queued := 0
	t0 := time.Now()
	if p := gpuParts(n, len(ss)); k == 1 && p > 1 {
		if err := cu.MemcpyBatchAsyncParts(ss[:p], dsts, srcs, sizes); err != nil {
			qerr = fmt.Errorf("samehost: copy %d blocks in %d parts on device %d: %w", n, p, dev, staging.DomainError(err))
		}
		queued = p // after a failure, other parts may be queued
	} else {
		lo := 0
		for j := 0; j < k && lo < n; j++ {
			hi := n
			if j < k-1 {
				hi = shareEnd(sizes, lo, b.Bytes()/uint64(k))
			}
			if err := cu.MemcpyBatchAsync(ss[j], dsts[lo:hi], srcs[lo:hi], sizes[lo:hi]); err != nil {
				qerr = fmt.Errorf("samehost: copy blocks %d..%d on device %d: %w", lo, hi-1, dev, staging.DomainError(err))
				break
			}
			queued++
			lo = hi
		}
	}
	post = time.Since(t0)
	// Wait for every stream that took work, even after a failure: the
	// destination must not be let go with copies still in flight.
	for j := 0; j < queued; j++ {
		if err := cu.StreamSynchronize(ss[j]); err != nil && qerr == nil {
			qerr = fmt.Errorf("samehost: wait for %d block copies on device %d: %w", n, dev, staging.DomainError(err))
		}
	}
	return post, qerr
}

// deviceStreams returns the connection's copy streams on dev, made on first
// use (or by Warm). c.mu is held.
func (c *Conn) deviceStreams(dev int) ([]*gpudirect.Stream, error) {
	cu := c.t.cfg.CUDA
	if cu == nil {
		return nil, fmt.Errorf("%w: samehost: GPU copy without a CUDA driver", errs.ErrFailedPrecondition)
	}
	ss := c.streams[dev]
	if len(ss) > 0 {
		return ss, nil
	}
	for i := 0; i < c.t.cfg.Streams; i++ {
		s, err := cu.StreamCreate(dev)
		if err != nil {
			for _, s := range ss {
				_ = cu.StreamDestroy(s)
			}
			return nil, fmt.Errorf("samehost: stream on device %d: %w", dev, staging.DomainError(err))
		}
		ss = append(ss, s)
	}
	c.streams[dev] = ss
	return ss, nil
}
