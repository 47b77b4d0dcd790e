package client

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/ring"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Route is a bound block route (BindBlockRoute): a Blocks request without
// its ids. The ring's block records name it by Handle and carry its ids,
// up to ring.MaxInlineIDs pairs in the record, more in the ring's id
// arena; it belongs to the connection that bound it and goes with it.
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

// BlocksOption adds to a block transfer on a route.
type BlocksOption func(*blocksOpts)

type blocksOpts struct{ note []byte }

// WithNotification sends note (up to 4096 bytes, as TransferBlocks'
// field) to the watchers of the remote layout once the blocks landed.
func WithNotification(note []byte) BlocksOption {
	return func(o *blocksOpts) { o.note = note }
}

func blocksOptions(opts []BlocksOption) blocksOpts {
	var o blocksOpts
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Transfer moves block local[i] to block remote[i] on the route: through
// r when r is not nil and the request fits it (1 to ring.MaxArenaIDs
// pairs of equal count that fit its arena, or none with a note, which
// then goes alone; a note of at most ring.MaxNote bytes), else through
// TransferBlocks over gRPC. Either way
// a refusal is the gRPC status TransferBlocks gives; ctx's deadline is
// the transfer's.
func (rt *Route) Transfer(ctx context.Context, r *Ring, local, remote []uint32, opts ...BlocksOption) (RawResult, error) {
	o := blocksOptions(opts)
	if r != nil && r.carries(local, remote, o.note) {
		return r.BlocksContext(ctx, rt, local, remote, opts...)
	}
	b := rt.b
	b.LocalIDs, b.RemoteIDs, b.Notification = local, remote, o.note
	resp, err := rt.c.TransferBlocks(ctx, b)
	if err != nil {
		return RawResult{}, err
	}
	ph := resp.GetPhases()
	return RawResult{Blocks: resp.GetBlocks(), Bytes: resp.GetBytes(), Wire: time.Duration(ph.GetWireNs()), Total: time.Duration(ph.GetTotalNs()),
		Transport: resp.GetTransportName(), Posted: unixTime(int64(ph.GetPostedUnixNs())), Landed: unixTime(int64(ph.GetLandedUnixNs())),
		Segments: resp.GetSegments(), WorkRequests: resp.GetWorkRequests()}, nil
}

// carries says whether a block request rides on r.
func (r *Ring) carries(local, remote []uint32, note []byte) bool {
	if len(local) != len(remote) || (len(local) == 0 && len(note) == 0) || len(local) > ring.MaxArenaIDs || len(note) > ring.MaxNote {
		return false
	}
	if len(local) == 0 { // a note alone: an arena record of count 0
		return r.arena.fits(&arenaPayload{note: note})
	}
	if len(local) <= ring.MaxInlineIDs && len(note) == 0 {
		return true
	}
	return r.arena.fits(&arenaPayload{local: local, remote: remote, note: note})
}

// blocksRecord is the record of a block transfer on rt, and its arena
// payload when the ids do not fit the record or a note comes along.
func (r *Ring) blocksRecord(rt *Route, local, remote []uint32, ms uint64, o blocksOpts) (ring.Request, *arenaPayload, error) {
	// Refusals are the gRPC statuses TransferBlocks gives the same
	// request (InvalidArgument naming the field), so that a caller reads
	// one code whichever way the request went.
	n := len(local)
	switch {
	case n != len(remote):
		return ring.Request{}, nil, status.Errorf(codes.InvalidArgument, "b2b client: remote_ids has %d ids, local_ids has %d: they must be equal", len(remote), n)
	case n == 0 && len(o.note) == 0:
		return ring.Request{}, nil, status.Errorf(codes.InvalidArgument, "b2b client: local_ids is empty: a request needs at least one block id (or a notification, sent alone)")
	case n > ring.MaxArenaIDs:
		return ring.Request{}, nil, status.Errorf(codes.ResourceExhausted, "b2b client: local_ids has %d ids, over the limit of %d per request", n, ring.MaxArenaIDs)
	case len(o.note) > ring.MaxNote:
		return ring.Request{}, nil, status.Errorf(codes.InvalidArgument, "b2b client: notification is %d bytes, over the limit of %d", len(o.note), ring.MaxNote)
	}
	req := ring.Request{Op: ring.OpBlocks, Handle: rt.Handle, TimeoutMs: ms, N: uint32(n)}
	if n > 0 && n <= ring.MaxInlineIDs && len(o.note) == 0 {
		copy(req.Local[:], local)
		copy(req.Remote[:], remote)
		return req, nil, nil
	}
	p := &arenaPayload{local: local, remote: remote, note: o.note}
	if !r.arena.fits(p) {
		return ring.Request{}, nil, status.Errorf(codes.ResourceExhausted, "b2b client: %d id pairs and a %d-byte notification take %d bytes, over the ring's arena of %d bytes: use Route.Transfer, which sends them over gRPC",
			n, len(o.note), p.size(), len(r.arena.mem))
	}
	return req, p, nil
}

// StartBlocks posts a block transfer on rt and returns its tag for Wait (or
// Cancel). Every tag must be waited for. Up to ring.MaxInlineIDs pairs
// without a notification ride in the record, the rest in the arena; no
// ids with a notification send the note alone. A request the ring cannot
// carry is refused with the code TransferBlocks gives it (InvalidArgument,
// ResourceExhausted over a limit), or ResourceExhausted when it is larger
// than the ring's arena.
func (r *Ring) StartBlocks(rt *Route, local, remote []uint32, opts ...BlocksOption) (uint64, error) {
	req, p, err := r.blocksRecord(rt, local, remote, 0, blocksOptions(opts))
	if err != nil {
		return 0, err
	}
	return r.postArena(req, p)
}

// BlocksContext is a block transfer on rt under ctx: its deadline travels
// in the record, a cancel of ctx cancels it through the ring.
func (r *Ring) BlocksContext(ctx context.Context, rt *Route, local, remote []uint32, opts ...BlocksOption) (RawResult, error) {
	ms, err := ringTimeoutMs(ctx)
	if err != nil {
		return RawResult{}, err
	}
	req, p, err := r.blocksRecord(rt, local, remote, ms, blocksOptions(opts))
	if err != nil {
		return RawResult{}, err
	}
	return r.postWaitArena(ctx, req, p)
}
