package samehost

import (
	"context"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

var _ transport.BlockWriter = (*Conn)(nil)

// WriteBlocks implements transport.BlockWriter: under one hold of the
// connection, each (source region, destination region) stretch is begun
// (the receiver pins it; the mapping is cached), copied straight from the
// expanded runs, and ended. The receiver holds one pin per connection, so
// stretches go one after the other, but a stretch's end and the next one's
// begin travel together (one round trip per stretch, not two), and nothing
// per stretch is allocated. On a failure or a cut-off the current stretch
// is aborted before WriteBlocks returns: no copy runs after the answer.
func (c *Conn) WriteBlocks(ctx context.Context, w *transport.BlockWrite, sc *transport.BlockScratch) (transport.Stats, error) {
	var st transport.Stats
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return st, fmt.Errorf("%w: samehost connection is closed", errs.ErrUnavailable)
	}
	if c.broken != nil {
		return st, c.broken
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.c.SetDeadline(dl)
		defer c.c.SetDeadline(time.Time{})
	}
	if ctx.Done() != nil {
		cut := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			_ = c.c.SetDeadline(time.Unix(1, 0))
			close(cut)
		})
		defer func() {
			if !stop() {
				<-cut
				_ = c.c.SetDeadline(time.Time{})
			}
		}()
	}
	defer func() {
		// An end sent ahead whose reply is unread (an early return): read
		// it, or the connection is out of step and goes.
		if c.pendingEnd {
			if err := c.endReply(); err != nil {
				_ = c.fail(err)
			}
		}
	}()
	t0 := time.Now()
	sc.Expand(w)
	st.Plan = time.Since(t0)
	for from := 0; from < len(sc.Runs); {
		to := sc.StretchEnd(from)
		r := &sc.Runs[from]
		fail := func(err error) (transport.Stats, error) {
			return st, &transport.StretchError{Group: r.Group, SrcRegion: r.SrcRegion, DstRegion: r.DstRegion, Err: err}
		}
		if int(r.SrcRegion) >= len(w.Src) || int(r.DstRegion) >= len(w.Dst) {
			return fail(fmt.Errorf("%w: samehost: run %d names region (source %d, destination %d) beyond those given", errs.ErrInvalidArgument, from, r.SrcRegion, r.DstRegion))
		}
		src, dst := w.Src[r.SrcRegion], w.Dst[r.DstRegion]
		sm := src.Memory()
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		rm, err := c.begin(ctx, dst, sm, false) // reads the previous stretch's end reply first
		if err != nil {
			return fail(err)
		}
		b := desc.Batch{Src: sc.Src[from:to], Dst: sc.Dst[from:to], Len: sc.Len[from:to]}
		if err := checkBounds(&b, sm.Len, rm.size); err != nil {
			_ = c.abort()
			return fail(err)
		}
		c.pinHostSide(src, sm, rm)
		t1 := time.Now()
		err = c.copy(ctx, sm, rm, &b, false)
		st.Post += time.Since(t1)
		st.Segments += uint64(b.N())
		st.WorkRequests++
		if err != nil {
			_ = c.abort()
			return fail(err)
		}
		if err := c.send(opEnd, 0, dst.Key.Key, uint64(b.N()), b.Bytes()); err != nil {
			return fail(c.ctxErr(ctx, err))
		}
		c.pendingEnd = true
		from = to
	}
	if c.pendingEnd {
		if err := c.endReply(); err != nil {
			return st, c.ctxErr(ctx, err)
		}
	}
	return st, nil
}

// endReply reads the reply to an end sent ahead (WriteBlocks); c.mu is held.
func (c *Conn) endReply() error {
	c.pendingEnd = false
	r, msg, _, err := c.readReply(false)
	if err != nil {
		return err
	}
	if r.status != statusOK {
		return c.fail(fmt.Errorf("end refused: %s", msg))
	}
	return nil
}
