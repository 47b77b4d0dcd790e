package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/callid"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/region"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// cancellableCalls are the synchronous calls that move bytes while their
// caller waits and honour a b2b-call-id (callid): CancelCall stops one, and
// it answers once its data path stopped.
var cancellableCalls = map[string]bool{
	b2bv1.B2B_BatchTransfer_FullMethodName:  true,
	b2bv1.B2B_SubmitTransfer_FullMethodName: true,
	b2bv1.B2B_TransferBlocks_FullMethodName: true,
}

// cancellableStreams are the streams that honour a b2b-call-id likewise:
// CancelCall stops every submit of the stream, and answers once the stream
// ended.
var cancellableStreams = map[string]bool{
	b2bv1.B2B_SubmitStream_FullMethodName: true,
}

const (
	// earlyTTL is how long a cancel whose call has not arrived is kept: a
	// call sent before its cancel arrives within a round trip, so a minute
	// is generous, and bounded.
	earlyTTL = time.Minute
	// maxEarly bounds those remembered cancels across every caller.
	maxEarly = 4096
)

// errCallCancelled is the cause a call's context is cancelled with when its
// caller sent CancelCall.
var errCallCancelled = errors.New("cancelled by its caller (CancelCall)")

// callKey names a call: its caller (so that one caller cannot stop another's
// calls even with a guessed id) and its id.
type callKey struct {
	caller region.Caller
	id     string
}

// calls is the registry of the cancellable calls in flight that carry an
// id, and of the ids cancelled before their call arrived.
type calls struct {
	mu    sync.Mutex
	live  map[callKey]liveCall
	early map[callKey]time.Time // when the cancel came
}

// liveCall is a call in flight: how to stop it, and done, closed once it
// returned (its data path stopped).
type liveCall struct {
	stop context.CancelCauseFunc
	done chan struct{}
}

// enter registers the call id of caller, returning the context the call runs
// under and leave, which the call runs when it returns. A call whose
// cancel came first starts cancelled. An id already in flight is refused:
// ids name one call each.
func (c *calls) enter(ctx context.Context, caller region.Caller, id string) (context.Context, func(), error) {
	k := callKey{caller, id}
	ctx, cancel := context.WithCancelCause(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.live[k]; dup {
		cancel(nil)
		return nil, nil, fmt.Errorf("%w: metadata %s %q names a call already in flight: send a fresh id per call", errs.ErrAlreadyExists, callid.Key, id)
	}
	if c.live == nil {
		c.live = map[callKey]liveCall{}
	}
	lc := liveCall{stop: cancel, done: make(chan struct{})}
	c.live[k] = lc
	if _, ok := c.early[k]; ok {
		delete(c.early, k)
		cancel(errCallCancelled)
	}
	return ctx, func() {
		c.mu.Lock()
		delete(c.live, k)
		c.mu.Unlock()
		cancel(nil)
		close(lc.done)
	}, nil
}

// cancel stops caller's call id and returns a channel closed once the call
// returned, or, when no such call is in flight, remembers the id for
// earlyTTL and returns nil.
func (c *calls) cancel(caller region.Caller, id string, now time.Time) (ended <-chan struct{}, err error) {
	k := callKey{caller, id}
	c.mu.Lock()
	defer c.mu.Unlock()
	if lc, ok := c.live[k]; ok {
		lc.stop(errCallCancelled)
		return lc.done, nil
	}
	if c.early == nil {
		c.early = map[callKey]time.Time{}
	}
	if len(c.early) >= maxEarly {
		for ek, at := range c.early {
			if now.Sub(at) > earlyTTL {
				delete(c.early, ek)
			}
		}
	}
	if len(c.early) >= maxEarly {
		return nil, fmt.Errorf("%w: %d cancels wait for calls that have not arrived (at most %d, each kept %v)",
			errs.ErrResourceExhausted, len(c.early), maxEarly, earlyTTL)
	}
	c.early[k] = now
	return nil, nil
}

// stoppedByCaller rewrites a call's Canceled answer when its caller's
// CancelCall cut it, to say the answer came after the data path stopped.
func stoppedByCaller(ctx context.Context, err error, id string) error {
	if err == nil || !errors.Is(context.Cause(ctx), errCallCancelled) {
		return err
	}
	st := status.Convert(err)
	if st.Code() != codes.Canceled {
		return err // it ended otherwise before the cancel took hold
	}
	return status.Errorf(codes.Canceled, "the caller cancelled the call (%s %s); the transfer stopped before this answer: %s",
		callid.Key, id, st.Message())
}

func (l *local) CancelCall(ctx context.Context, req *b2bv1.CancelCallRequest) (*b2bv1.CancelCallResponse, error) {
	id := req.GetCallId()
	if err := callid.Check("call_id", id); err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	ended, err := l.s.calls.cancel(caller(ctx), id, time.Now())
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	if ended == nil {
		return &b2bv1.CancelCallResponse{}, nil
	}
	// As CancelTransfer: the answer means no byte of the call can land any
	// more, so a client interrupted anywhere (even before it held the
	// call's answer) needs nothing else.
	select {
	case <-ended:
		return &b2bv1.CancelCallResponse{InFlight: true}, nil
	case <-ctx.Done():
		return nil, grpcstatus.ToStatus(fmt.Errorf("cancel of call %s: stopped, still ending when this CancelCall ended: %w", id, ctx.Err()))
	}
}
