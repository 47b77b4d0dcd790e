package local

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

var _ transport.Prepared = (*prepared)(nil)

// prepareWarmTimeout bounds Prepare's warm-up (Prepare has no context): the
// receiver answers a begin at once, and mapping a destination of a few GiB
// takes well under a second.
const prepareWarmTimeout = 30 * time.Second

// prepared is a batch bound to one destination, warmed at Prepare: its
// first Write finds the destination mapped.
type prepared struct {
	c   *Conn
	src transport.Registration
	dst transport.RemoteRegion
	b   desc.Batch
	// closed: Write after Close is refused, as every transport's plan is.
	closed atomic.Bool
}

// Prepare is Conn.Prepare: it warms dst (Warm) and keeps a
// copy of b; each Write is Conn.Write of it.
func (c *Conn) Prepare(r *transport.Request) (transport.Prepared, error) {
	src, dst, b, err := transport.PreparedWrite(r)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), prepareWarmTimeout)
	defer cancel()
	if err := c.Warm(ctx, src, dst); err != nil {
		return nil, fmt.Errorf("samehost: prepare: map dst_region %q: %w", dst.Name, err)
	}
	return &prepared{c: c, src: src, dst: dst, b: desc.Batch{Src: slices.Clone(b.Src), Dst: slices.Clone(b.Dst), Len: slices.Clone(b.Len)}}, nil
}

func (p *prepared) Write(ctx context.Context) (transport.Stats, error) {
	if p.closed.Load() {
		return transport.Stats{}, fmt.Errorf("%w: samehost: prepared transfer to %q was released", errs.ErrFailedPrecondition, p.dst.Name)
	}
	return p.c.Write(ctx, p.src, p.dst, &p.b)
}

// Close frees nothing (the mapping belongs to the Conn's cache); it only
// stops later Writes.
func (p *prepared) Close() error {
	p.closed.Store(true)
	return nil
}
