package verbs

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
	verbsv1 "github.com/b2bd/b2bd/proto/b2b/transport/verbs/v1"
)

// TestDisconnectFollowsNewControlPlane: a set's own control channel was
// closed under it (the peer manager replaced it after a failed handshake),
// so every call on it fails at once with Unavailable; once a newer channel
// to the same peer exists (the next Connect's), the disconnect must reach
// the peer over it, well before the keepalive that would otherwise free the
// receiver's pins. Cases: the newer channel appears before the first try,
// or only while the retries run.
func TestDisconnectFollowsNewControlPlane(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after time.Duration // when the newer channel appears
	}{{"known at once", 0}, {"appears while retrying", 150 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &Transport{cfg: Config{KeepAlive: 30 * time.Second}, log: hclog.NewNullLogger(), node: "b",
				stopBG: make(chan struct{}), ctls: map[string]transport.Signal{}}
			var staleCalls atomic.Int32
			stale := func(ctx context.Context, payload []byte) ([]byte, error) {
				staleCalls.Add(1)
				return nil, errs.Wrap(errs.ErrUnavailable, "grpc: the client connection is closing")
			}
			got := make(chan uint64, 1)
			fresh := func(ctx context.Context, payload []byte) ([]byte, error) {
				var s verbsv1.Signal
				if err := proto.Unmarshal(payload, &s); err != nil {
					return nil, err
				}
				d := s.GetDisconnect()
				if d == nil || d.GetNodeName() != "b" {
					t.Errorf("fresh channel got %v, want b's disconnect", &s)
					return nil, nil
				}
				got <- d.GetConnectionId()
				return nil, nil
			}
			const peer, id = "10.77.0.1:7470", 42
			tr.ctls[peer] = stale // the set's own, as Connect recorded it
			if tc.after == 0 {
				tr.ctls[peer] = fresh
			} else {
				time.AfterFunc(tc.after, func() {
					tr.mu.Lock()
					tr.ctls[peer] = fresh
					tr.mu.Unlock()
				})
			}
			start := time.Now()
			tr.disconnect(stale, peer, id)
			defer func() { close(tr.stopBG); tr.bg.Wait() }()
			select {
			case g := <-got:
				if g != id {
					t.Fatalf("disconnect of conn %d, want %d", g, id)
				}
				// Retries back off to at most 1 s; a few seconds bound it under load.
				if took := time.Since(start); took > tc.after+5*time.Second {
					t.Fatalf("delivered %v after the set closed", took)
				}
				t.Logf("delivered after %v, %d tries on the closed channel", time.Since(start).Round(time.Millisecond), staleCalls.Load())
			case <-time.After(tc.after + 10*time.Second):
				t.Fatalf("no disconnect reached the peer in %v (%d tries on the closed channel)", tc.after+10*time.Second, staleCalls.Load())
			}
		})
	}
}
