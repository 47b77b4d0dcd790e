package rails

import (
	"context"
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// blockState is a forwarded block write's translated regions (pooled).
type blockState struct {
	w   transport.Blocks
	req transport.Request
	src []transport.Registration
	dst []transport.RemoteRegion
}

// blockRail is the pair a block request can go to whole: the conn's one
// paired rail, when it is up; nil with several rails.
func (c *conn) blockRail() (*pair, transport.Conn) {
	var only *pair
	for _, p := range c.pairs {
		if p == nil {
			continue
		}
		if only != nil {
			return nil, nil
		}
		only = p
	}
	if only == nil {
		return nil, nil
	}
	return only, only.up()
}

// writeBlocks forwards a block request whole to the rail's connection
// (verbs posts it in one go) when the conn has one rail. With several
// rails it takes transport.WriteStretches: each stretch is one striped
// Write (a block request is not split across rails yet).
func (c *conn) writeBlocks(ctx context.Context, w *transport.Blocks, sc *transport.BlockScratch) (transport.Stats, error) {
	p, pc := c.blockRail()
	if p == nil || pc == nil {
		return transport.WriteStretches(ctx, c.Write, w, sc)
	}
	bs := c.t.blocks.Get().(*blockState)
	defer func() {
		clear(bs.src)
		clear(bs.dst)
		bs.w, bs.req = transport.Blocks{}, transport.Request{}
		c.t.blocks.Put(bs)
	}()
	bs.src, bs.dst = bs.src[:0], bs.dst[:0]
	for i, r := range w.Local {
		reg, ok := r.(*registration)
		if !ok || reg.t != c.t || p.r.idx >= len(reg.regs) {
			return transport.Stats{}, fmt.Errorf("rails: block write: source region %d was not registered with this transport: %w", i, errs.ErrInvalidArgument)
		}
		bs.src = append(bs.src, reg.regs[p.r.idx])
	}
	for _, d := range w.Remote {
		switch {
		case d.Devices != nil && p.remote < len(d.Devices):
			d.Key, d.Devices = d.Devices[p.remote], nil
		case d.Devices == nil && p.remote == 0:
		default:
			return transport.Stats{}, fmt.Errorf("rails: block write: destination %q has no key for peer rail %d: %w", d.Name, p.remote, errs.ErrFailedPrecondition)
		}
		bs.dst = append(bs.dst, d)
	}
	bs.w = transport.Blocks{Pair: w.Pair, IDs: w.IDs, Local: bs.src, Remote: bs.dst}
	bs.req = transport.Request{Op: transport.OpWrite, Blocks: &bs.w, Scratch: sc}
	st, err := pc.Post(ctx, &bs.req)
	if err != nil && ctx.Err() == nil && railFault(pc, err) {
		// The only rail broke: take it down (it reconnects); the caller's
		// retry goes out on the fresh connection.
		c.down(p, pc, err)
		p.r.failovers.Add(1)
	}
	if err == nil {
		var total uint64
		for g := 0; g < w.Pair.NumGroups(); g++ {
			_, _, bl := w.Pair.Group(g)
			total += bl * uint64(w.IDs.N())
		}
		p.r.sent.Add(total)
	}
	return st, err
}
