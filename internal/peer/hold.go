package peer

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// ResolveHeld is Resolve for one batch: a resolution it fetches holds
// the region on the peer (Peer.HoldRegion) until release, which the batch
// calls once its last byte was acknowledged and which returns once the
// peer let go; so the region cannot be deregistered between the answer and
// the batch's first frame, where the peer's data path pins it. A cached
// resolution holds nothing (release does nothing): the peer pins from the
// first frame, and refuses a key deregistered before it.
func (m *Manager) ResolveHeld(ctx context.Context, addr string, s Session, name string, a transport.Access) (r Resolved, cached bool, release func(), err error) {
	release = func() {}
	r, cached, err = resolveCached(ctx, &m.kept, addr, cacheKey(name, a), resolveTTL, func(st *state) map[string]cacheEntry[Resolved] { return st.resolved },
		func(ctl b2bv1.PeerClient) (Resolved, error) {
			resp, rel, err := holdRegion(ctx, ctl, &b2bv1.ResolveRegionRequest{Name: name, Access: accessProto(a)})
			if err != nil {
				return r, fromRPC(ctx, err)
			}
			release = rel
			return resolvedFromProto(resp), nil
		})
	return r, cached, release, err
}

// holdReleaseWait bounds release's wait for the peer's end of a hold: a
// live peer ends it within a round trip, so that a client told that its
// batch landed may deregister the region at once; a peer cut off (its
// links down) must not hold the batch's answer until its deadline.
const holdReleaseWait = 250 * time.Millisecond

// holdRegion opens a HoldRegion stream and returns its answer and the end
// of its hold: release ends our side and waits for the peer's end, at most
// holdReleaseWait, then cuts the stream (the peer lets go when it sees the
// cut). A peer without HoldRegion is asked ResolveRegion, which holds
// nothing.
func holdRegion(ctx context.Context, ctl b2bv1.PeerClient, req *b2bv1.ResolveRegionRequest) (*b2bv1.ResolveRegionResponse, func(), error) {
	sctx, cut := context.WithCancel(ctx)
	st, err := ctl.HoldRegion(sctx)
	if err == nil {
		if err = st.Send(req); errors.Is(err, io.EOF) {
			_, err = st.Recv() // the stream's own error
		}
	}
	var resp *b2bv1.ResolveRegionResponse
	if err == nil {
		resp, err = st.Recv()
	}
	if status.Code(err) == codes.Unimplemented {
		cut()
		resp, err = ctl.ResolveRegion(ctx, req)
		return resp, func() {}, err
	}
	if err != nil {
		cut()
		return nil, nil, err
	}
	return resp, func() {
		defer cut()
		_ = st.CloseSend()
		t := time.AfterFunc(holdReleaseWait, cut)
		defer t.Stop()
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}, nil
}
