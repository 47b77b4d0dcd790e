package errs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ToStatus is the one place where domain errors become gRPC statuses. The
// message is the wrapped error's text, which names the field and the limit.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(Code(err), err.Error())
}

// Code classifies err. The rule, in one place:
//
//   - The outermost domain class in err's wrap tree wins. The tree is walked
//     breadth-first from err itself, following Unwrap() error and the
//     Unwrap() []error of multi-%w errors (left to right), so that
//     fmt.Errorf("%w: ...: %w", ErrAborted, ctx.Err()) is Aborted, and a
//     class that an error adds around a cause overrides the cause's class.
//   - context.DeadlineExceeded and context.Canceled are classes like the
//     others here; ForCaller makes the caller's own deadline or cancellation
//     win over everything at the RPC boundary.
//
// An error without any class is Internal.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	// Breadth-first, outermost first; a small fixed queue covers every
	// realistic chain without allocating, and deeper trees fall back to a
	// slice.
	var buf [16]error
	queue := append(buf[:0], err)
	for i := 0; i < len(queue) && i < maxWalk; i++ {
		e := queue[i]
		if c, ok := classOf(e); ok {
			return c
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			if x := u.Unwrap(); x != nil {
				queue = append(queue, x)
			}
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				if x != nil {
					queue = append(queue, x)
				}
			}
		}
	}
	return codes.Internal
}

// maxWalk bounds Code's walk, against a pathological (or cyclic) tree.
const maxWalk = 1024

// classOf says whether e itself (not what it wraps) is one of the classes.
func classOf(e error) (codes.Code, bool) {
	for _, m := range codeMap {
		if e == m.err {
			return m.code, true
		}
		if x, ok := e.(interface{ Is(error) bool }); ok && x.Is(m.err) {
			return m.code, true
		}
	}
	return 0, false
}

// ForCaller applies the caller rule at an RPC boundary: when the caller's
// ctx is done (or its deadline has passed) as the call fails, its deadline or cancellation is the
// outcome (DeadlineExceeded or Canceled), whatever the failure looked like
// on the way (a dial or read cut off by the deadline shows as an i/o
// timeout, a peer as Unavailable); the message keeps the cause. Otherwise
// err is returned unchanged and Code's outermost-class rule applies.
func ForCaller(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	ce := ctx.Err()
	if ce == nil {
		// A deadline that passed may not show in ctx.Err() yet (its timer
		// fires a moment later), while a dial or read cut off by that same
		// deadline already failed: the deadline is the outcome then too.
		d, ok := ctx.Deadline()
		if !ok || time.Now().Before(d) {
			return err
		}
		ce = context.DeadlineExceeded
	}
	want := codes.Canceled
	if errors.Is(ce, context.DeadlineExceeded) {
		want = codes.DeadlineExceeded
	}
	if Code(err) == want {
		return err
	}
	return fmt.Errorf("%w: %w", ce, err)
}

var codeMap = []struct {
	err  error
	code codes.Code
}{
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
	{ErrInvalidArgument, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrFailedPrecondition, codes.FailedPrecondition},
	{ErrResourceExhausted, codes.ResourceExhausted},
	{ErrPermissionDenied, codes.PermissionDenied},
	{ErrUnimplemented, codes.Unimplemented},
	{ErrDataLoss, codes.DataLoss},
	{ErrAborted, codes.Aborted},
	{ErrUnavailable, codes.Unavailable},
}

// FromStatus turns a peer's gRPC status back into a domain error, so that a
// NotFound from the destination daemon stays NotFound for our caller.
func FromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, m := range codeMap {
		if m.code == st.Code() {
			return wrapped{m.err, st.Message()}
		}
	}
	if st.Code() == codes.Unknown || st.Code() == codes.Internal {
		return wrapped{ErrAborted, st.Message()}
	}
	return wrapped{ErrUnavailable, st.Message()}
}

type wrapped struct {
	kind error
	msg  string
}

func (w wrapped) Error() string { return w.msg }
func (w wrapped) Unwrap() error { return w.kind }
