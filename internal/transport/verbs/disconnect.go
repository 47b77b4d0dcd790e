package verbs

import (
	"context"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// DisconnectVerbs is the receiving side of a peer's disconnect signal: it drops
// the set that node connected as id, releasing what its batches pinned.
func (t *Transport) DisconnectVerbs(node string, id uint64) bool {
	t.mu.Lock()
	var found *qpSet
	for s := range t.sets {
		if !s.sender && s.id == id && s.peer == node {
			found = s
			break
		}
	}
	t.mu.Unlock()
	if found == nil {
		return false
	}
	t.p.drop(found)
	return true
}

// ctlFor is the newest control plane Connect was given for peer, else
// own (the set's).
func (t *Transport) ctlFor(peer string, own transport.Signal) transport.Signal {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.ctls[peer]; c != nil {
		return c
	}
	return own
}

// disconnect asks a receiver over the control plane to drop its half of
// set id, for a sender whose QPs could not carry the goodbye; until it
// does, the receiver keeps the set and every batch it had half-landed
// pinned. While the peer is unreachable (link down, daemon restarting) it
// retries in the background, for at most a keepalive period: by then the
// receiver's keepalive has freed the set anyway.
//
// Each try goes over the peer's newest control plane, not the set's own:
// the peer manager closes a channel whose handshake failed (one that lost
// its peer while the link was down, say) and dials a fresh one for the
// next batch, and a call on the closed channel fails at once, every time.
// Retrying on it held the receiver's pins until its keepalive (30 s).
func (t *Transport) disconnect(own transport.Signal, peer string, id uint64) {
	t.bg.Add(1)
	go func() {
		defer t.bg.Done()
		start := time.Now()
		deadline := start.Add(t.cfg.KeepAlive)
		for try, wait := 1, 50*time.Millisecond; ; try, wait = try+1, min(2*wait, time.Second) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := callDisconnect(ctx, t.ctlFor(peer, own), t.node, id)
			cancel()
			if c := errs.Class(err); c != errs.ErrUnavailable && c != context.DeadlineExceeded {
				switch {
				case err != nil:
					t.log.Debug("verbs disconnect over the control plane", "peer", peer, "conn", id, "error", err)
				case try > 1:
					t.log.Info("verbs disconnect over the control plane delivered", "peer", peer, "conn", id, "tries", try,
						"after", time.Since(start))
				}
				return
			}
			if time.Now().Add(wait).After(deadline) {
				t.log.Warn("verbs disconnect gave up; the peer's keepalive frees the set and what its batches pinned", "peer", peer, "conn", id,
					"tries", try, "after", time.Since(start), "error", err)
				return
			}
			select {
			case <-t.stopBG:
				return
			case <-time.After(wait):
			}
		}
	}()
}
