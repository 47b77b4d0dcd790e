package client

import (
	"context"
	"errors"
	"time"

	"github.com/b2bd/b2bd/internal/ring"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Route is a bound block route (BindBlockRoute): a Blocks request without
// its ids. The ring's block records name it by Handle and carry up to
// ring.MaxInlineIDs id pairs; it belongs to the connection that bound it
// and goes with it.
type Route struct {
	c      *Client
	Handle uint64
	b      Blocks // ids and notification empty
}

// BindRoute binds b's layouts, peer, transport and op (its ids and
// notification are not part of a route). The daemon checks them as
// TransferBlocks does.
func (c *Client) BindRoute(ctx context.Context, b Blocks) (*Route, error) {
	b.LocalIDs, b.RemoteIDs, b.Notification = nil, nil, nil
	resp, err := c.api.BindBlockRoute(ctx, &b2bv1.BindBlockRouteRequest{LocalLayout: b.LocalLayout, Peer: b.Peer,
		RemoteLayout: b.RemoteLayout, Transport: b.Transport, TransportName: b.TransportName, Op: b.Op})
	if err != nil {
		return nil, err // the daemon's status, as TransferBlocks returns it
	}
	return &Route{c: c, Handle: resp.GetHandle(), b: b}, nil
}

// Release frees the route on the daemon.
func (rt *Route) Release(ctx context.Context) error {
	_, err := rt.c.api.ReleaseBlockRoute(ctx, &b2bv1.ReleaseBlockRouteRequest{Handle: rt.Handle})
	return err
}

// Transfer moves block local[i] to block remote[i] on the route: through
// r when r is not nil and the ids fit one record (1 to ring.MaxInlineIDs
// pairs), else through TransferBlocks over gRPC. Either way a refusal is
// the gRPC status TransferBlocks gives; ctx's deadline is the transfer's.
func (rt *Route) Transfer(ctx context.Context, r *Ring, local, remote []uint32) (RawResult, error) {
	if r != nil && inline(local, remote) {
		return r.BlocksContext(ctx, rt, local, remote)
	}
	b := rt.b
	b.LocalIDs, b.RemoteIDs = local, remote
	resp, err := rt.c.TransferBlocks(ctx, b)
	if err != nil {
		return RawResult{}, err
	}
	ph := resp.GetPhases()
	return RawResult{Blocks: resp.GetBlocks(), Bytes: resp.GetBytes(), Wire: time.Duration(ph.GetWireNs()), Total: time.Duration(ph.GetTotalNs())}, nil
}

// inline says whether the ids ride in one ring record.
func inline(local, remote []uint32) bool {
	return len(local) == len(remote) && len(local) >= 1 && len(local) <= ring.MaxInlineIDs
}

// errNotInline refuses ids that a ring record cannot carry.
var errNotInline = errors.New("b2b client: a ring block record carries 1 to 4 (local, remote) id pairs of equal count: use Route.Transfer, which sends larger requests over gRPC")

func blocksRecord(rt *Route, local, remote []uint32, ms uint64) (ring.Request, error) {
	if !inline(local, remote) {
		return ring.Request{}, errNotInline
	}
	req := ring.Request{Op: ring.OpBlocks, Handle: rt.Handle, TimeoutMs: ms, N: uint32(len(local))}
	copy(req.Local[:], local)
	copy(req.Remote[:], remote)
	return req, nil
}

// StartBlocks posts a block transfer on rt and returns its tag for Wait (or
// Cancel). Every tag must be waited for.
func (r *Ring) StartBlocks(rt *Route, local, remote []uint32) (uint64, error) {
	req, err := blocksRecord(rt, local, remote, 0)
	if err != nil {
		return 0, err
	}
	return r.post(req)
}

// BlocksContext is a block transfer on rt under ctx: its deadline travels
// in the record, a cancel of ctx cancels it through the ring.
func (r *Ring) BlocksContext(ctx context.Context, rt *Route, local, remote []uint32) (RawResult, error) {
	ms, err := ringTimeoutMs(ctx)
	if err != nil {
		return RawResult{}, err
	}
	req, err := blocksRecord(rt, local, remote, ms)
	if err != nil {
		return RawResult{}, err
	}
	return r.postWait(ctx, req)
}
