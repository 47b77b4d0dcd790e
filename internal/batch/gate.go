package batch

import (
	"context"
	"sync"
	"time"

	"github.com/b2bd/b2bd/internal/transport"
)

// A gate holds a transfer's post back until something outside it is ready
// (a trigger's counter reached its value: trigger.go). The transfer
// does all its work up to the post first (validate, resolve, plan), so that
// once the gate opens only the post is left: the lag from a layer's counter
// write to its post is the watcher's and the post's, not the planning's.
type gateKey struct{}

type gate struct {
	once sync.Once
	wait func(context.Context) error
	err  error
	// bound fingerprints the destination's keys as the attempt that
	// reached the gate resolved them (armed means bound, as a prepared
	// plan is); opened: the wait returned nil. Attempts of one transfer
	// run one at a time.
	bound  uint64
	opened bool
	since  time.Time // when the transfer was armed
}

// gateOf is ctx's gate, nil when it has none.
func gateOf(ctx context.Context) *gate {
	g, _ := ctx.Value(gateKey{}).(*gate)
	return g
}

// bind records fp, the fingerprint of the destination's keys an attempt
// resolved, and says whether the attempt may post to it: before the gate
// opened, any (the latest is kept); after, the one bound when it opened,
// or another whose name was bound to it (at, the peer's word) before the
// transfer was armed: the cached resolution it used was older than its
// start. A destination re-registered while the transfer waited is refused
// its old key, and the run again must not follow the name to the new
// registration (another owner's memory, as likely as not).
func (g *gate) bind(fp uint64, at time.Time) bool {
	if g == nil {
		return true
	}
	fp |= 1 // never 0: "not bound"
	if g.opened && fp != g.bound && (at.IsZero() || !at.Before(g.since)) {
		return false
	}
	g.bound = fp
	return true
}

// keysPrint folds a destination key into a fingerprint (0 to start).
func keysPrint(fp uint64, k transport.RemoteKey) uint64 {
	fp ^= k.Key + 0x9e3779b97f4a7c15 + fp<<6 + fp>>2
	return fp ^ (k.Addr * 0xbf58476d1ce4e5b9)
}

// WithGate returns ctx carrying wait, which a transfer run under it calls
// once, just before it first posts, and posts only if wait returned nil. A
// retry after that does not wait again.
func WithGate(ctx context.Context, wait func(context.Context) error) context.Context {
	return context.WithValue(ctx, gateKey{}, &gate{wait: wait, since: time.Now()})
}

// passGate waits at ctx's gate, if it has one; an error means nothing may
// be posted.
func passGate(ctx context.Context) error {
	g, ok := ctx.Value(gateKey{}).(*gate)
	if !ok {
		return nil
	}
	g.once.Do(func() {
		g.err = g.wait(ctx)
		g.opened = g.err == nil
	})
	return g.err
}
