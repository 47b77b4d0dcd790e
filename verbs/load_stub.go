//go:build !cgo || !linux

package verbs

import "fmt"

// errUnavailable is what every stub returns: this binary has no verbs.
var errUnavailable = fmt.Errorf("verbs: built without cgo (or not on Linux); rebuild with CGO_ENABLED=1 for RDMA: %w", ErrUnavailable)

// Load reports that verbs is not compiled in.
func Load() error { return errUnavailable }

// Compiled reports whether this binary has the cgo verbs implementation.
func Compiled() bool { return false }

// EventString names an async event type.
func EventString(t int) string { return fmt.Sprintf("event(%d)", t) }

// StatusString names a WC status.
func StatusString(s WCStatus) string { return fmt.Sprintf("status(%d)", uint32(s)) }
