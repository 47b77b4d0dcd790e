package staging

import (
	"errors"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/errs"
)

// classes maps gpudirect's error classes onto the daemon's domain errors
// (and so onto the gRPC codes users see), one to one.
var classes = []struct{ gpu, domain error }{
	{gpudirect.ErrInvalidValue, errs.ErrInvalidArgument},
	{gpudirect.ErrNotFound, errs.ErrNotFound},
	{gpudirect.ErrAlreadyExists, errs.ErrAlreadyExists},
	{gpudirect.ErrInvalidState, errs.ErrFailedPrecondition},
	{gpudirect.ErrOutOfMemory, errs.ErrResourceExhausted},
	{gpudirect.ErrNotPermitted, errs.ErrPermissionDenied},
	{gpudirect.ErrNotSupported, errs.ErrUnimplemented},
	{gpudirect.ErrAborted, errs.ErrAborted},
	{gpudirect.ErrUnavailable, errs.ErrUnavailable},
}

// DomainError is the adapter between gpudirect and the daemon: it returns
// err (its text unchanged, still matching gpudirect's classes and *Error)
// also wrapping the internal/errs sentinel of every gpudirect class it
// wraps. nil stays nil; an error without a gpudirect class is returned as is.
func DomainError(err error) error {
	if err == nil {
		return nil
	}
	var kinds []error
	for _, c := range classes {
		if errors.Is(err, c.gpu) && !errors.Is(err, c.domain) {
			kinds = append(kinds, c.domain)
		}
	}
	if len(kinds) == 0 {
		return err
	}
	return &domainError{err: err, kinds: kinds}
}

type domainError struct {
	err   error
	kinds []error
}

func (e *domainError) Error() string { return e.err.Error() }

func (e *domainError) Unwrap() []error { return append([]error{e.err}, e.kinds...) }
