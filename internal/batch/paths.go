package batch

import (
	"context"
	"errors"
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// paths is the peer manager as every transfer uses it: a data path to the
// peer that can carry the request, and the peer's export resolved for the
// op's access (and forgotten once stale). One place, so that ad hoc
// batches, prepared plans and block transfers resolve alike.
type paths struct{ peers Peers }

// dst finds the data path, the source's registration with it, and the
// destination region's key. With hold, a fresh resolution holds the region
// on the peer until held is called (ResolveHeld); held is never nil, and
// on error nothing is held.
func (ps paths) dst(ctx context.Context, p *Plan, hold bool) (sess transport.Session, remote transport.RemoteRegion, reg transport.Registration, cached bool, held func(), err error) {
	held = func() {}
	fail := func(err error) (transport.Session, transport.RemoteRegion, transport.Registration, bool, func(), error) {
		held()
		return sess, transport.RemoteRegion{}, nil, false, func() {}, err
	}
	if sess, err = ps.session(ctx, p.peer, p.want, transport.Need{Op: p.op.ops(), Memory: p.src.Mem.Kind}); err != nil {
		return fail(err)
	}
	reg, ok := p.src.Registration(sess.Kind)
	if !ok {
		return fail(fmt.Errorf("%w: src_region_id %s (%s memory) is not registered with transport %s", errs.ErrFailedPrecondition, p.src.ID, p.src.Mem.Kind, sess.Kind))
	}
	var rr transport.Resolution
	if hold {
		var release func()
		if rr, cached, release, err = ps.peers.ResolveHeld(ctx, p.peer, sess, p.dst, p.op.access()); release != nil {
			held = release
		}
	} else {
		rr, cached, err = ps.peers.Resolve(ctx, p.peer, sess, p.dst, p.op.access())
	}
	if err != nil {
		// A resolve cut short by this batch's own cancel or deadline says
		// nothing of the peer: the connection, which other batches may be
		// writing on, stays (closing it failed them mid-batch).
		if !isRequestError(err) && ctx.Err() == nil {
			ps.peers.Broken(p.peer, sess)
		}
		return fail(fmt.Errorf("peer %s: resolve dst_region %q for %s: %w", p.peer, p.dst, p.op, err))
	}
	if sess.Recheck && p.blocks > 0 {
		need := transport.Need{Op: p.op.ops(), Memory: p.src.Mem.Kind, Route: transport.RouteOf(p.src.Mem, rr, p.op == OpRead), BlockBytes: p.bytes / p.blocks}
		if s2 := ps.rechoose(ctx, p.peer, sess, need); s2.Kind != sess.Kind {
			if reg2, ok := p.src.Registration(s2.Kind); ok {
				if _, ok := rr.Keys[s2.Kind]; ok {
					sess, reg = s2, reg2
				}
			}
		}
	}
	key, ok := rr.Keys[sess.Kind]
	if !ok {
		return fail(fmt.Errorf("%w: dst_region %q on peer %s is not registered with transport %s", errs.ErrFailedPrecondition, p.dst, p.peer, sess.Kind))
	}
	// Devices: the peer's key on each of its devices, for a kind over
	// several (verbs rails); nil with one.
	remote = transport.RemoteRegion{Name: rr.Name, Size: rr.Size, BoundAt: rr.BoundAt, Key: key.Key, Devices: key.Devices}
	return sess, remote, reg, cached, held, nil
}

// session gets a data path to peer for a request needing need, and
// refuses one the chosen kind's Caps cannot carry before the kind is
// called: the one place the batch layer checks what a kind can do (the
// peer manager chooses by the same Caps; a kind asked for by name, or a
// Peers of a test, may still hand out one that lacks them).
func (ps paths) session(ctx context.Context, peer string, want transport.Kind, need transport.Need) (transport.Session, error) {
	sess, err := ps.peers.Get(ctx, peer, want, need)
	if err != nil {
		return sess, err
	}
	if err := sess.Caps.Lacks(sess.Kind, need); err != nil {
		return transport.Session{}, fmt.Errorf("peer %s: %w: choose another transport, or the other op", peer, err)
	}
	return sess, nil
}

// rechoose asks again for the data path auto chose by rank
// (Session.Recheck), now that need carries the batch's route and block
// size: a peer on this host then gets the kind measured fastest for them
// (transport.Calibration). It keeps sess when the choice stands or the
// other kind is not to be had.
func (ps paths) rechoose(ctx context.Context, peer string, sess transport.Session, need transport.Need) transport.Session {
	if !sess.Recheck || !need.Route.Known() || need.BlockBytes == 0 {
		return sess
	}
	s2, err := ps.session(ctx, peer, "", need)
	if err != nil {
		return sess
	}
	return s2
}

// isRequestError: the peer refused this request, the connection is fine.
func isRequestError(err error) bool {
	// DataLoss: the peer's region failed (its file truncated), not the path.
	for _, t := range []error{errs.ErrNotFound, errs.ErrInvalidArgument, errs.ErrPermissionDenied, errs.ErrFailedPrecondition, errs.ErrDataLoss} {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// forget drops the cached resolution op used.
func (ps paths) forget(peer, name string, op Op) {
	ps.peers.Forget(peer, name, op.access())
}

// layout resolves r's remote layout for r's op, as dst resolves a region:
// the connection stays when the resolve was refused or cut by r's own ctx.
func (ps paths) layout(ctx context.Context, sess transport.Session, r BlocksRequest) (*transport.LayoutResolution, bool, error) {
	rl, cached, err := ps.peers.ResolveLayout(ctx, r.Peer, r.Remote, r.Op.access())
	if err != nil {
		if !isRequestError(err) && ctx.Err() == nil {
			ps.peers.Broken(r.Peer, sess)
		}
		return nil, false, fmt.Errorf("peer %s: resolve remote_layout %q for %s: %w", r.Peer, r.Remote, r.Op, err)
	}
	return rl, cached, nil
}

// forgetLayout drops the cached resolution of r's remote layout that r's
// op used.
func (ps paths) forgetLayout(r BlocksRequest) {
	ps.peers.ForgetLayout(r.Peer, r.Remote, r.Op.access())
}
