package samehost

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/transport"
)

var (
	_ transport.Preparer = (*Conn)(nil)
	_ transport.Warmer   = (*Conn)(nil)
)

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
}

// Prepare implements transport.Preparer: it warms dst (Warm) and keeps a
// copy of b; each Write is Conn.Write of it.
func (c *Conn) Prepare(src transport.Registration, dst transport.RemoteRegion, b *desc.Batch) (transport.Prepared, error) {
	ctx, cancel := context.WithTimeout(context.Background(), prepareWarmTimeout)
	defer cancel()
	if err := c.Warm(ctx, src, dst); err != nil {
		return nil, fmt.Errorf("samehost: prepare: map dst_region %q: %w", dst.Name, err)
	}
	return &prepared{c: c, src: src, dst: dst, b: desc.Batch{Src: slices.Clone(b.Src), Dst: slices.Clone(b.Dst), Len: slices.Clone(b.Len)}}, nil
}

func (p *prepared) Write(ctx context.Context) (transport.Stats, error) {
	return p.c.Write(ctx, p.src, p.dst, &p.b)
}

// Close has nothing to free: the mapping belongs to the Conn's cache.
func (p *prepared) Close() error { return nil }
