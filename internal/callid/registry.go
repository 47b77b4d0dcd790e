package callid

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

const (
	// earlyTTL is how long a cancel whose call has not arrived is kept: a
	// call sent before its cancel arrives within a round trip, so a minute
	// is generous, and bounded.
	earlyTTL = time.Minute
	// maxEarly bounds those remembered cancels across every caller.
	maxEarly = 4096
)

// ErrCancelled is the cause a call's context is cancelled with when its
// caller sent CancelCall.
var ErrCancelled = errors.New("cancelled by its caller (CancelCall)")

// Registry holds the cancellable calls in flight that carry an id, and the
// ids cancelled before their call arrived. A call is named by its caller C
// (so that one caller cannot stop another's calls even with a guessed id)
// and its id; C is whatever tells callers apart where the registry is used.
// The zero value is empty and ready.
type Registry[C comparable] struct {
	mu    sync.Mutex
	live  map[callKey[C]]liveCall
	early map[callKey[C]]time.Time // when the cancel came
}

// callKey names a call: its caller and its id.
type callKey[C comparable] struct {
	caller C
	id     string
}

// liveCall is a call in flight: how to stop it, and done, closed once it
// returned (its data path stopped).
type liveCall struct {
	stop context.CancelCauseFunc
	done chan struct{}
}

// Begin registers the call id of caller, returning the context the call
// runs under and end, which the call runs when it returns. A call whose
// cancel came first starts cancelled (cause ErrCancelled). An id already
// in flight is refused with AlreadyExists: ids name one call each.
func (r *Registry[C]) Begin(ctx context.Context, caller C, id string) (_ context.Context, end func(), _ error) {
	k := callKey[C]{caller, id}
	ctx, cancel := context.WithCancelCause(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.live[k]; dup {
		cancel(nil)
		return nil, nil, fmt.Errorf("%w: metadata %s %q names a call already in flight: send a fresh id per call", errs.ErrAlreadyExists, Key, id)
	}
	if r.live == nil {
		r.live = map[callKey[C]]liveCall{}
	}
	lc := liveCall{stop: cancel, done: make(chan struct{})}
	r.live[k] = lc
	if _, ok := r.early[k]; ok {
		delete(r.early, k)
		cancel(ErrCancelled)
	}
	return ctx, func() {
		r.mu.Lock()
		delete(r.live, k)
		r.mu.Unlock()
		cancel(nil)
		close(lc.done)
	}, nil
}

// Cancel stops caller's call id (cause ErrCancelled) and returns a channel
// closed once the call returned, or, when no such call is in flight,
// remembers the id for earlyTTL and returns nil; ResourceExhausted when
// too many cancels wait for their calls.
func (r *Registry[C]) Cancel(caller C, id string, now time.Time) (ended <-chan struct{}, err error) {
	k := callKey[C]{caller, id}
	r.mu.Lock()
	defer r.mu.Unlock()
	if lc, ok := r.live[k]; ok {
		lc.stop(ErrCancelled)
		return lc.done, nil
	}
	if r.early == nil {
		r.early = map[callKey[C]]time.Time{}
	}
	if len(r.early) >= maxEarly {
		for ek, at := range r.early {
			if now.Sub(at) > earlyTTL {
				delete(r.early, ek)
			}
		}
	}
	if len(r.early) >= maxEarly {
		return nil, fmt.Errorf("%w: %d cancels wait for calls that have not arrived (at most %d, each kept %v)",
			errs.ErrResourceExhausted, len(r.early), maxEarly, earlyTTL)
	}
	r.early[k] = now
	return nil, nil
}
