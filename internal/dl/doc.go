// Package dl loads shared libraries at run time (dlopen/dlsym/dlclose), so
// that b2bd links against no vendor library at build time: the CUDA driver
// and libibverbs (package verbs) are looked up when the daemon starts, and their
// absence is an ordinary, reportable condition.
//
// The cgo implementation is in dl.go (cgo && linux); dl_stub.go (!cgo ||
// !linux) reports every library as unavailable, so CGO_ENABLED=0 builds work.
package dl

import "errors"

// ErrUnsupported is returned by Open in builds without cgo or off Linux.
var ErrUnsupported = errors.New("dl: dynamic loading not supported in this build (needs cgo on linux)")

// Error is a failed dlopen, dlsym or dlclose with the loader's own message.
type Error struct {
	Op      string // "dlopen", "dlsym" or "dlclose"
	Library string // the library name as passed to Open
	Symbol  string // the symbol, for dlsym
	Msg     string // dlerror() text, or a description
	Err     error  // an underlying sentinel such as ErrUnsupported, or nil
}

// Unwrap returns the underlying sentinel, if any.
func (e *Error) Unwrap() error { return e.Err }

func (e *Error) Error() string {
	if e.Symbol != "" {
		return "dl: " + e.Op + "(" + e.Library + ", " + e.Symbol + "): " + e.Msg
	}
	return "dl: " + e.Op + "(" + e.Library + "): " + e.Msg
}
