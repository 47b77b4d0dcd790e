package errs

import (
	"context"
	"errors"

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

// Code classifies err with errors.Is, first match wins.
func Code(err error) codes.Code {
	for _, m := range codeMap {
		if errors.Is(err, m.err) {
			return m.code
		}
	}
	return codes.Internal
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
