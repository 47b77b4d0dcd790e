package peer

import (
	"context"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// cutOffPeer answers a hold and then never ends it, as a peer whose links
// went down after its answer looks to us.
type cutOffPeer struct{ fakePeer }

func (p *cutOffPeer) HoldRegion(st b2bv1.Peer_HoldRegionServer) error {
	if _, err := st.Recv(); err != nil {
		return err
	}
	if err := st.Send(&b2bv1.ResolveRegionResponse{Size: 4096}); err != nil {
		return err
	}
	<-st.Context().Done() // our CloseSend reaches it, but it never answers
	return st.Context().Err()
}

// TestHoldReleaseBounded: letting go of a hold waits for the peer's end at
// most holdReleaseWait, not until the batch's deadline: a batch that
// failed on a peer cut off answered only at its deadline.
func TestHoldReleaseBounded(t *testing.T) {
	m, _, _ := newTestManagerWith(t, &cutOffPeer{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const addr = "127.0.0.1:7470"
	s, err := m.Get(ctx, addr, transport.TCP, writeNeed)
	if err != nil {
		t.Fatal(err)
	}
	r, cached, release, err := m.ResolveHeld(ctx, addr, s, "dst", transport.AccessWrite)
	if err != nil || cached || r.Size != 4096 {
		t.Fatalf("ResolveHeld: %+v cached %v: %v", r, cached, err)
	}
	start := time.Now()
	release()
	if took := time.Since(start); took > holdReleaseWait+5*time.Second {
		t.Fatalf("release waited %v for a peer that never ends the hold (bound %v)", took, holdReleaseWait)
	}
}
