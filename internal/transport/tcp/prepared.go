package tcp

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// prepared is a batch built once for one conn: for host memory its plan
// (split, frame headers and segment tables encoded, write lists laid out),
// so that a Write only patches the batch number, stages the small blocks,
// writes and waits for the acks. GPU sources keep a copy of the batch and
// take the staged path on every Write (the staging copy is the work).
type prepared struct {
	c      *conn
	src    []byte // host source
	p      plan
	closed atomic.Bool

	// GPU source: the batch, copied, and what writeStaged needs.
	mem memory.Memory
	dst transport.RemoteRegion
	b   desc.Batch
}

var (
	_ transport.Prepared = (*prepared)(nil)
)

// Prepare builds b's work from src into dst for this conn; b is not retained.
func (c *conn) Prepare(r *transport.Request) (transport.Prepared, error) {
	src, dst, b, err := transport.PreparedWrite(r)
	if err != nil {
		return nil, err
	}
	if err := c.Err(); err != nil {
		return nil, c.brokenBefore(err)
	}
	mem := src.Memory()
	pr := &prepared{c: c}
	switch {
	case mem.Kind == memory.CUDA:
		if c.t.cfg.Staging == nil {
			return nil, fmt.Errorf("%w: tcp: source is %s memory and this daemon has no CUDA driver", errs.ErrFailedPrecondition, mem.Kind)
		}
		if err := checkBounds(b, mem.Len, dst.Size); err != nil {
			return nil, err
		}
		pr.mem, pr.dst = mem, dst
		pr.b = desc.Batch{Src: append([]uint64(nil), b.Src...), Dst: append([]uint64(nil), b.Dst...), Len: append([]uint64(nil), b.Len...)}
	case mem.Host != nil:
		if err := checkBounds(b, uint64(len(mem.Host)), dst.Size); err != nil {
			return nil, err
		}
		pr.src = mem.Host
		pr.p.build(b, dst.Key.Key, c.limits())
		pr.p.used = desc.Batch{} // b is not retained (a write's frames do not need it)
	default:
		return nil, fmt.Errorf("%w: tcp: source is %s memory without a host mapping", errs.ErrFailedPrecondition, mem.Kind)
	}
	return pr, nil
}

// Write sends the prepared batch with Conn.Write's contract. Writes are
// serialised on the conn; a Write allocates nothing.
func (pr *prepared) Write(ctx context.Context) (st transport.Stats, err error) {
	start := time.Now()
	if pr.closed.Load() {
		return transport.Stats{}, fmt.Errorf("%w: tcp: the prepared batch was released", errs.ErrFailedPrecondition)
	}
	c := pr.c
	waited, err := c.lockCtx(ctx)
	if err != nil {
		return transport.Stats{}, err
	}
	defer c.unlock()
	defer func() { st.Post += waited }()
	if err := c.Err(); err != nil {
		// The cause is an earlier batch's (a cut-off batch's "writev: i/o
		// timeout", say): named, not wrapped, so that it does not classify
		// this one, which sent nothing (ErrNotSent: its caller runs it
		// again on a fresh conn at no cost to its one retry, as it does an
		// ad hoc Write's). The plan is bound to this conn.
		return transport.Stats{}, fmt.Errorf("%w (prepare again on a fresh one)", c.brokenBefore(err))
	}
	if pr.mem.Kind == memory.CUDA {
		return c.writeStaged(ctx, pr.mem, pr.dst, &pr.b)
	}
	st, err = c.run(ctx, &pr.p, pr.src, start)
	// A prepared Write plans nothing: the time before posting is the wait
	// for the conn, not planning.
	st.Plan = 0
	return st, err
}

// Close releases the plan; a Write in flight finishes with it (the garbage
// collector frees it after). Safe to call twice.
func (pr *prepared) Close() error {
	pr.closed.Store(true)
	return nil
}
