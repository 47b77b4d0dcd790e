package verbs

import (
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
)

// The package's error classes. Every error this package returns wraps one
// of them (and, for a failed C call, the syscall.Errno): test with
// errors.Is. They are the daemon's gRPC-free domain classes (internal/errs),
// so the status a caller finally sees is decided in one place, without this
// binding importing gRPC.
var (
	// ErrClosed: a method was called on a closed (or nil) handle. It is
	// also a failed precondition.
	ErrClosed = fmt.Errorf("handle is closed: %w", errs.ErrFailedPrecondition)
	// ErrUnavailable: libibverbs, a device or a feature is missing here.
	ErrUnavailable = errs.ErrUnavailable
	// ErrInvalidArgument: the request is malformed (bad sizes, a block
	// outside its region).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrResourceExhausted: memory cannot be pinned (locked-memory limit).
	ErrResourceExhausted = errs.ErrResourceExhausted
	// ErrAborted: the device refused a posted WR (QP not in RTS, queue
	// full); the batch it belongs to cannot complete.
	ErrAborted = errs.ErrAborted
	// ErrFailedPrecondition: the handle is in no state for this, e.g. a
	// parent closed while its children are open.
	ErrFailedPrecondition = errs.ErrFailedPrecondition
)
