// Package grpcstatus is the ONE mapping between b2bd's domain errors
// (internal/errs, gRPC-free) and gRPC status codes: ToStatus at the RPC
// boundary, FromStatus for a peer's answers, Code for the class's code.
package grpcstatus

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/errs"
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

// Code is the gRPC code of err's class (errs.Class: the outermost class in
// the wrap tree wins); an error without any class is Internal.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	c := errs.Class(err)
	for _, m := range codeMap {
		if m.err == c {
			return m.code
		}
	}
	return codes.Internal
}

// ForCaller is errs.ForCaller, here too for callers that map the result.
func ForCaller(ctx context.Context, err error) error { return errs.ForCaller(ctx, err) }

var codeMap = []struct {
	err  error
	code codes.Code
}{
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
	{errs.ErrInvalidArgument, codes.InvalidArgument},
	{errs.ErrNotFound, codes.NotFound},
	{errs.ErrAlreadyExists, codes.AlreadyExists},
	{errs.ErrFailedPrecondition, codes.FailedPrecondition},
	{errs.ErrResourceExhausted, codes.ResourceExhausted},
	{errs.ErrPermissionDenied, codes.PermissionDenied},
	{errs.ErrUnimplemented, codes.Unimplemented},
	{errs.ErrDataLoss, codes.DataLoss},
	{errs.ErrAborted, codes.Aborted},
	{errs.ErrUnavailable, codes.Unavailable},
}

// FromStatus turns a peer's gRPC status back into a domain error, so that a
// NotFound from the destination daemon stays NotFound for our caller.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, m := range codeMap {
		if m.code == st.Code() {
			return errs.Wrap(m.err, st.Message())
		}
	}
	if st.Code() == codes.Unknown || st.Code() == codes.Internal {
		return errs.Wrap(errs.ErrAborted, st.Message())
	}
	return errs.Wrap(errs.ErrUnavailable, st.Message())
}
