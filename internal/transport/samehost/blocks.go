package samehost

import (
	"context"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/transport"
)

var (
	_ transport.BlockWriter = (*Conn)(nil)
	_ transport.BlockReader = (*Conn)(nil)
)

// blockChunk is how many runs WriteBlocks and ReadBlocks expand at a time
// (16 MiB of 8 KiB blocks: enough to spread over the copy streams).
const blockChunk = 2048

// WriteBlocks implements transport.BlockWriter: under one hold of the
// connection, each (source region, destination region) stretch is begun
// (the receiver pins it; the mapping is cached), expanded and copied chunk
// by chunk (nothing is expanded before the first copy), and ended. The
// receiver holds one pin per connection, so stretches go one after the
// other, but a stretch's end and the next one's begin travel together (one
// round trip per stretch, not two), and nothing per stretch is allocated.
// On a failure or a cut-off the current stretch is aborted before
// WriteBlocks returns: no copy runs after the answer.
func (c *Conn) WriteBlocks(ctx context.Context, w *transport.BlockWrite, sc *transport.BlockScratch) (transport.Stats, error) {
	return c.blocks(ctx, w.Pair, w.IDs, len(w.Src), len(w.Dst), false, sc, func(sr, dr uint32) (transport.Registration, transport.RemoteRegion) {
		return w.Src[sr], w.Dst[dr]
	})
}

// ReadBlocks implements transport.BlockReader: WriteBlocks with the copy
// running the other way, from the peer's regions into ours.
func (c *Conn) ReadBlocks(ctx context.Context, r *transport.BlockRead, sc *transport.BlockScratch) (transport.Stats, error) {
	return c.blocks(ctx, r.Pair, r.IDs, len(r.Src), len(r.Dst), true, sc, func(sr, dr uint32) (transport.Registration, transport.RemoteRegion) {
		return r.Dst[dr], r.Src[sr]
	})
}

// blocks moves a block request: local(sr, dr) is our registration and the
// peer's region of a stretch (a write's source and destination, a pull's
// destination and source).
func (c *Conn) blocks(ctx context.Context, p *layout.Pair, ids layout.IDs, nsrc, ndst int, read bool, sc *transport.BlockScratch,
	regions func(sr, dr uint32) (transport.Registration, transport.RemoteRegion)) (transport.Stats, error) {
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
	var endFlags uint32
	if read {
		endFlags = flagRead
	}
	t0 := time.Now()
	planned := false
	for g0 := 0; g0 < p.NumGroups(); {
		sr, dr := p.GroupRegions(g0)
		g1, runs := g0, 0
		for ; g1 < p.NumGroups(); g1++ {
			if s, d := p.GroupRegions(g1); s != sr || d != dr {
				break
			}
			runs += p.GroupRuns(ids, g1)
		}
		fail := func(err error) (transport.Stats, error) {
			return st, &transport.StretchError{Group: uint32(g0), SrcRegion: sr, DstRegion: dr, Err: err}
		}
		if int(sr) >= nsrc || int(dr) >= ndst {
			return fail(fmt.Errorf("%w: samehost: segment group %d names region (source %d, destination %d) beyond the %d sources and %d destinations given", errs.ErrInvalidArgument, g0, sr, dr, nsrc, ndst))
		}
		local, remote := regions(sr, dr)
		sm := local.Memory()
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		if !planned {
			st.Plan, planned = time.Since(t0), true
		}
		rm, err := c.begin(ctx, remote, sm, read) // reads the previous stretch's end reply first
		if err != nil {
			return fail(err)
		}
		srcLen, dstLen := sm.Len, rm.size
		if read {
			srcLen, dstLen = rm.size, sm.Len
		}
		// Every group inside both regions: no run can fall outside, and
		// the stretch is copied chunk by chunk. Else (a region smaller
		// than its layout says) the whole stretch is checked run by run
		// before its first byte.
		limit := blockChunk
		for g := g0; g < g1; g++ {
			if se, de := p.GroupEnds(g); se > srcLen || de > dstLen {
				limit = runs
				break
			}
		}
		c.pinHostSide(local, sm, rm)
		var segs, bytes uint64
		cur := p.Seek(ids, g0, 0)
		for left := runs; left > 0; {
			t1 := time.Now()
			c.chunk = sc.ExpandChunk(p, ids, &cur, min(left, limit))
			b := &c.chunk
			if b.N() == 0 {
				_ = c.abort()
				return fail(fmt.Errorf("samehost: expansion ended %d runs early", left))
			}
			left -= b.N()
			if err := checkBounds(b, srcLen, dstLen); err != nil {
				_ = c.abort()
				return fail(err)
			}
			err = c.copy(ctx, sm, rm, b, read)
			st.Post += time.Since(t1)
			segs, bytes = segs+uint64(b.N()), bytes+b.Bytes()
			if err != nil {
				_ = c.abort()
				return fail(err)
			}
		}
		st.Segments += segs
		st.WorkRequests++
		if err := c.send(opEnd, endFlags, remote.Key.Key, segs, bytes); err != nil {
			return fail(c.ctxErr(ctx, err))
		}
		c.pendingEnd = true
		g0 = g1
	}
	if !planned {
		st.Plan = time.Since(t0)
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
