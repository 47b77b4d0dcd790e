package gpudirect

import (
	"errors"
	"fmt"
)

// The package's error classes. Every error gpudirect returns wraps exactly
// one of them (errors.Is), so that callers can classify failures without
// knowing CUDA: the daemon maps them onto its own domain errors, and through
// those onto gRPC codes (internal/staging.DomainError). A failed driver call
// wraps its *Error, whose Unwrap gives the class of its CUresult.
//
// The texts are those the daemon's messages have always carried (they used
// to be the domain errors themselves), so messages read as before.
var (
	// ErrInvalidValue: an argument is wrong (bad device, size 0, an address
	// the driver does not know, CUDA_ERROR_INVALID_VALUE/_HANDLE/_DEVICE).
	ErrInvalidValue = errors.New("invalid argument")
	// ErrOutOfMemory: device or host memory, or another driver resource, is
	// exhausted (CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_TOO_MANY_PEERS).
	ErrOutOfMemory = errors.New("resource exhausted")
	// ErrNotSupported: the driver or device lacks the feature, e.g. dma-buf
	// export (CUDA_ERROR_NOT_SUPPORTED).
	ErrNotSupported = errors.New("unimplemented")
	// ErrNotPermitted: the driver refused the operation (CUDA_ERROR_NOT_PERMITTED).
	ErrNotPermitted = errors.New("permission denied")
	// ErrAlreadyExists: e.g. host memory that is already registered.
	ErrAlreadyExists = errors.New("already exists")
	// ErrNotFound: e.g. host memory that is not registered.
	ErrNotFound = errors.New("not found")
	// ErrInvalidState: the call is valid but not now: a destroyed stream or
	// event, a closed driver, a context error that is not sticky.
	ErrInvalidState = errors.New("failed precondition")
	// ErrUnavailable: the device or driver cannot be used (not initialised,
	// no device, a sticky error such as an illegal address, unknown results).
	ErrUnavailable = errors.New("unavailable")
	// ErrAborted: a call was cut off by a bug (it panicked on the device's
	// worker thread); the daemon carries on.
	ErrAborted = errors.New("aborted")
)

// subclass is a sentinel that is also one of the classes above.
type subclass struct {
	text  string
	class error
}

func (s *subclass) Error() string { return s.text }
func (s *subclass) Unwrap() error { return s.class }

var (
	// ErrNoDriver is wrapped by Load's errors: no usable driver (library
	// missing, cuInit failing, no device, no cgo). It is an ErrUnavailable.
	ErrNoDriver error = &subclass{"unavailable", ErrUnavailable}
	// ErrClosed is wrapped by every call made after Close, and by calls on a
	// stream or event that was destroyed. It is an ErrInvalidState.
	ErrClosed error = &subclass{"gpudirect: driver is closed: failed precondition", ErrInvalidState}
)

// ErrStreamDestroyed and ErrEventDestroyed are returned by calls on a
// stream or event after it was destroyed (or its driver closed). Both are
// ErrClosed.
var (
	ErrStreamDestroyed error = &subclass{"failed precondition: gpudirect: stream was destroyed", ErrClosed}
	ErrEventDestroyed  error = &subclass{"failed precondition: gpudirect: event was destroyed", ErrClosed}
)

// Classes lists the error classes, in the order a caller should test them.
var Classes = []error{ErrInvalidValue, ErrNotFound, ErrAlreadyExists, ErrInvalidState, ErrOutOfMemory, ErrNotPermitted, ErrNotSupported, ErrAborted, ErrUnavailable}

// Result is a CUDA driver status code (CUresult).
type Result int

// The CUresult values the package treats specially (values from cuda.h).
const (
	Success                          Result = 0
	ErrorInvalidValue                Result = 1
	ErrorOutOfMemory                 Result = 2
	ErrorNotInitialized              Result = 3
	ErrorDeinitialized               Result = 4
	ErrorStubLibrary                 Result = 34
	ErrorDeviceUnavailable           Result = 46
	ErrorNoDevice                    Result = 100
	ErrorInvalidDevice               Result = 101
	ErrorInvalidContext              Result = 201
	ErrorAlreadyMapped               Result = 208
	ErrorInvalidHandle               Result = 400
	ErrorNotFound                    Result = 500
	ErrorNotReady                    Result = 600
	ErrorIllegalAddress              Result = 700
	ErrorPeerAccessAlreadyEnabled    Result = 704
	ErrorContextIsDestroyed          Result = 709
	ErrorTooManyPeers                Result = 711
	ErrorHostMemoryAlreadyRegistered Result = 712
	ErrorHostMemoryNotRegistered     Result = 713
	ErrorNotPermitted                Result = 800
	ErrorNotSupported                Result = 801
	ErrorSystemDriverMismatch        Result = 803
	ErrorUnknown                     Result = 999
)

var resultNames = map[Result]string{
	Success:                          "CUDA_SUCCESS",
	ErrorInvalidValue:                "CUDA_ERROR_INVALID_VALUE",
	ErrorOutOfMemory:                 "CUDA_ERROR_OUT_OF_MEMORY",
	ErrorNotInitialized:              "CUDA_ERROR_NOT_INITIALIZED",
	ErrorDeinitialized:               "CUDA_ERROR_DEINITIALIZED",
	ErrorStubLibrary:                 "CUDA_ERROR_STUB_LIBRARY",
	ErrorDeviceUnavailable:           "CUDA_ERROR_DEVICE_UNAVAILABLE",
	ErrorNoDevice:                    "CUDA_ERROR_NO_DEVICE",
	ErrorInvalidDevice:               "CUDA_ERROR_INVALID_DEVICE",
	ErrorInvalidContext:              "CUDA_ERROR_INVALID_CONTEXT",
	ErrorAlreadyMapped:               "CUDA_ERROR_ALREADY_MAPPED",
	ErrorInvalidHandle:               "CUDA_ERROR_INVALID_HANDLE",
	ErrorNotFound:                    "CUDA_ERROR_NOT_FOUND",
	ErrorNotReady:                    "CUDA_ERROR_NOT_READY",
	ErrorIllegalAddress:              "CUDA_ERROR_ILLEGAL_ADDRESS",
	ErrorPeerAccessAlreadyEnabled:    "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	ErrorContextIsDestroyed:          "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	ErrorTooManyPeers:                "CUDA_ERROR_TOO_MANY_PEERS",
	ErrorHostMemoryAlreadyRegistered: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	ErrorHostMemoryNotRegistered:     "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	ErrorNotPermitted:                "CUDA_ERROR_NOT_PERMITTED",
	ErrorNotSupported:                "CUDA_ERROR_NOT_SUPPORTED",
	ErrorSystemDriverMismatch:        "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	ErrorUnknown:                     "CUDA_ERROR_UNKNOWN",
}

// String is the CUresult's name where the package knows it.
func (r Result) String() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUresult(%d)", int(r))
}

// Class maps a CUresult to the package's error class.
func (r Result) Class() error {
	switch r {
	case ErrorInvalidValue, ErrorInvalidHandle, ErrorInvalidDevice:
		return ErrInvalidValue
	case ErrorOutOfMemory, ErrorTooManyPeers:
		return ErrOutOfMemory
	case ErrorNotSupported:
		return ErrNotSupported
	case ErrorNotPermitted:
		return ErrNotPermitted
	case ErrorHostMemoryAlreadyRegistered, ErrorPeerAccessAlreadyEnabled:
		return ErrAlreadyExists
	case ErrorHostMemoryNotRegistered, ErrorNotFound:
		return ErrNotFound
	case ErrorInvalidContext, ErrorContextIsDestroyed, ErrorAlreadyMapped, ErrorNotReady:
		return ErrInvalidState
	default:
		// Not initialised, no device, illegal address (a sticky context
		// error), unknown...: the device cannot be used.
		return ErrUnavailable
	}
}

// Error is a failed CUDA driver call's status. Calls wrap it with the call's
// name and arguments; errors.As finds it, errors.Is matches its class.
type Error struct {
	Result Result
	Name   string // cuGetErrorName, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Desc   string // cuGetErrorString, e.g. "out of memory"
}

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = e.Result.String()
	}
	if e.Desc == "" {
		return name
	}
	return name + ": " + e.Desc
}

// Unwrap returns the error class of the result.
func (e *Error) Unwrap() error { return e.Result.Class() }

// ResultOf returns the CUresult inside err, or Success when there is none.
func ResultOf(err error) Result {
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Result
	}
	return Success
}

// CallError wraps a failed driver call's status the way every
// implementation of Interface reports it: "gpudirect: <call> on device N:
// <CUDA name>: <CUDA description>". call may be a format for args.
func CallError(e *Error, dev int, call string, args ...any) error {
	if len(args) > 0 {
		call = fmt.Sprintf(call, args...)
	}
	return fmt.Errorf("gpudirect: %s on device %d: %w", call, dev, e)
}
