package batch

import (
	"context"
	"sync"
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
}

// WithGate returns ctx carrying wait, which a transfer run under it calls
// once, just before it first posts, and posts only if wait returned nil. A
// retry after that does not wait again.
func WithGate(ctx context.Context, wait func(context.Context) error) context.Context {
	return context.WithValue(ctx, gateKey{}, &gate{wait: wait})
}

// passGate waits at ctx's gate, if it has one; an error means nothing may
// be posted.
func passGate(ctx context.Context) error {
	g, ok := ctx.Value(gateKey{}).(*gate)
	if !ok {
		return nil
	}
	g.once.Do(func() { g.err = g.wait(ctx) })
	return g.err
}
