// Package errs holds b2bd's domain errors, free of gRPC. Library code wraps
// one of these sentinels with its cause (%w); Class says which class an error
// is (the outermost class in the wrap tree wins), and at BatchTransfer the
// caller's own deadline or cancellation wins over all (ForCaller). The gRPC
// boundary maps classes to status codes in one place, internal/errs/grpcstatus.
package errs

import "errors"

var (
	// ErrInvalidArgument: the request itself is malformed (gRPC InvalidArgument).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound: a named region or peer does not exist (gRPC NotFound).
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: a name is taken (gRPC AlreadyExists).
	ErrAlreadyExists = errors.New("already exists")
	// ErrFailedPrecondition: the system is not in a state to do this, e.g. no
	// GPU on this host, or the region is in use (gRPC FailedPrecondition).
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrResourceExhausted: a configured limit is exceeded (gRPC ResourceExhausted).
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrUnavailable: a peer or device cannot be reached (gRPC Unavailable).
	ErrUnavailable = errors.New("unavailable")
	// ErrAborted: a batch was cut off mid-flight, e.g. the peer died or a
	// work completion failed; no success is reported for it (gRPC Aborted).
	ErrAborted = errors.New("aborted")
	// ErrPermissionDenied: the caller may not do this (gRPC PermissionDenied).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnimplemented: the build or host lacks the feature (gRPC Unimplemented).
	ErrUnimplemented = errors.New("unimplemented")
	// ErrDataLoss: a region's memory went away under the daemon, e.g. its
	// client truncated the backing file (gRPC DataLoss).
	ErrDataLoss = errors.New("data loss")
)
