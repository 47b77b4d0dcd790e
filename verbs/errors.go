package verbs

import (
	"errors"
	"reflect"
)

// The package's error classes. Every error this package returns wraps one
// of them (and, for a failed C call, the syscall.Errno): test with
// errors.Is. The package imports no gRPC: errors cross to the daemon's
// status codes in internal/errs (see sentinel.Is).
var (
	// ErrClosed: a method was called on a closed (or nil) handle. It is
	// also a failed precondition.
	ErrClosed error = &sentinel{"handle is closed", "failed precondition"}
	// ErrUnavailable: libibverbs, a device or a feature is missing here.
	ErrUnavailable error = &sentinel{"unavailable", "unavailable"}
	// ErrInvalidArgument: the request is malformed (bad sizes, a block
	// outside its region).
	ErrInvalidArgument error = &sentinel{"invalid argument", "invalid argument"}
	// ErrResourceExhausted: memory cannot be pinned (locked-memory limit).
	ErrResourceExhausted error = &sentinel{"resource exhausted", "resource exhausted"}
	// ErrAborted: the device refused a posted WR (QP not in RTS, queue
	// full); the batch it belongs to cannot complete.
	ErrAborted error = &sentinel{"aborted", "aborted"}
	// ErrFailedPrecondition: the handle is in no state for this, e.g. a
	// parent closed while its children are open.
	ErrFailedPrecondition error = &sentinel{"failed precondition", "failed precondition"}
)

// sentinel is an error class. Its text is the text of the matching class
// in internal/errs, and Is reports a match with a plain errors.New value of
// that text, so errs.Code and errors.Is(err, errs.ErrUnavailable) classify
// verbs errors exactly as when this package wrapped errs' sentinels, without
// importing errs (which pulls in gRPC). TestErrsClasses pins the pairing.
// A caller that maps verbs.Err* to its own classes explicitly makes this
// unnecessary.
type sentinel struct {
	msg   string
	class string
}

func (s *sentinel) Error() string { return s.msg }

var plainErrorType = reflect.TypeOf(errors.New(""))

// Is matches errs' class sentinel of the same text (plain errors.New
// values only, never another sentinel of this package).
func (s *sentinel) Is(target error) bool {
	if target == nil || reflect.TypeOf(target) != plainErrorType {
		return false
	}
	return target.Error() == s.class
}
