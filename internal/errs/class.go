package errs

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Classes are the domain classes, in the order an error that claims several
// (through an Is method) is classified: the first it matches wins. The gRPC
// mapping (internal/errs/grpcstatus) gives each one code.
var Classes = []error{
	context.DeadlineExceeded,
	context.Canceled,
	ErrInvalidArgument,
	ErrNotFound,
	ErrAlreadyExists,
	ErrFailedPrecondition,
	ErrResourceExhausted,
	ErrPermissionDenied,
	ErrUnimplemented,
	ErrDataLoss,
	ErrAborted,
	ErrUnavailable,
}

// Class classifies err: the class (one of Classes) it belongs to, or nil for
// an error of no class. The rule, in one place:
//
//   - The outermost domain class in err's wrap tree wins. The tree is walked
//     breadth-first from err itself, following Unwrap() error and the
//     Unwrap() []error of multi-%w errors (left to right), so that
//     fmt.Errorf("%w: ...: %w", ErrAborted, ctx.Err()) is Aborted, and a
//     class that an error adds around a cause overrides the cause's class.
//   - context.DeadlineExceeded and context.Canceled are classes like the
//     others here; ForCaller makes the caller's own deadline or cancellation
//     win over everything at the RPC boundary.
func Class(err error) error {
	if err == nil {
		return nil
	}
	// Breadth-first, outermost first; a small fixed queue covers every
	// realistic chain without allocating, and deeper trees fall back to a
	// slice.
	var buf [16]error
	queue := append(buf[:0], err)
	for i := 0; i < len(queue) && i < maxWalk; i++ {
		e := queue[i]
		if c := classOf(e); c != nil {
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
	return nil
}

// maxWalk bounds Class's walk, against a pathological (or cyclic) tree.
const maxWalk = 1024

// classOf says whether e itself (not what it wraps) is one of the classes.
func classOf(e error) error {
	for _, c := range Classes {
		if e == c {
			return c
		}
		if x, ok := e.(interface{ Is(error) bool }); ok && x.Is(c) {
			return c
		}
	}
	return nil
}

// ForCaller applies the caller rule at an RPC boundary: when the caller's
// ctx is done (or its deadline has passed) as the call fails, its deadline or cancellation is the
// outcome (DeadlineExceeded or Canceled), whatever the failure looked like
// on the way (a dial or read cut off by the deadline shows as an i/o
// timeout, a peer as Unavailable); the message keeps the cause. Otherwise
// err is returned unchanged and Class's outermost-class rule applies.
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
	want := context.Canceled
	if errors.Is(ce, context.DeadlineExceeded) {
		want = context.DeadlineExceeded
	}
	if Class(err) == want {
		return err
	}
	return fmt.Errorf("%w: %w", ce, err)
}

// Wrap returns an error whose text is msg and whose class is class; for
// errors that come back from a peer, whose text is the peer's.
func Wrap(class error, msg string) error { return wrapped{class, msg} }

type wrapped struct {
	kind error
	msg  string
}

func (w wrapped) Error() string { return w.msg }
func (w wrapped) Unwrap() error { return w.kind }
