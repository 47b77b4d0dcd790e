package local

import (
	"context"
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// Warm (used by Prepare) is warm for a write.
func (c *Conn) Warm(ctx context.Context, src transport.Registration, dst transport.RemoteRegion) error {
	return c.warm(ctx, src, dst, false)
}

// warm serves Request.Warm: it maps dst into this process (host: the mmap
// with every page-table entry, read-only for a pull; GPU: the IPC handle
// opened on src's device) and makes the copy streams, so that the first
// batch with dst costs what the later ones do. The pin it takes is let go
// at once.
func (c *Conn) warm(ctx context.Context, src transport.Registration, dst transport.RemoteRegion, read bool) error {
	sm := src.Memory()
	if _, err := c.lockCtx(ctx); err != nil {
		return err
	}
	defer c.unlock()
	// Bound like a batch: a stopped peer holds Warm no longer than the
	// caller's deadline or cancel.
	bound, err := c.bind(ctx)
	if err != nil {
		return err
	}
	defer bound.release()
	rm, err := c.begin(ctx, dst, sm, read)
	if err != nil {
		return err
	}
	c.pinHostSide(src, sm, rm)
	switch {
	case sm.Kind == memory.Host && rm.kind == kindHost:
		if c.hostPool == nil && c.t.cfg.Streams > 1 {
			c.hostPool = newHostPool(c.t.cfg.Streams)
		}
	case sm.Kind == memory.CUDA && rm.kind == kindCUDA && rm.home == sm.Device && !c.t.cfg.SameDeviceDirect:
		// One GPU: copies go through the device's stage (copy), made
		// and calibrated once.
		if _, err := c.t.stageFor(sm.Device); err != nil {
			_ = c.abort()
			return fmt.Errorf("%w: %v", errs.ErrFailedPrecondition, err)
		}
	default:
		dev := rm.dev
		if rm.kind == kindHost {
			dev = sm.Device
		}
		if _, err := c.deviceStreams(dev); err != nil {
			_ = c.abort()
			return err
		}
	}
	return c.ctxErr(ctx, c.abort())
}
