// Package callid names a synchronous transfer call, so that its caller's
// cancel can reach the daemon (CancelCall) instead of ending the call at
// the client: the daemon then answers after the data path stopped, and no
// byte of a pull lands in the caller's memory after that answer.
//
// The Go client puts a fresh id in the call's metadata (Key) and, when its
// caller cancels, sends CancelCall with it and waits for the call's answer.
// An id is a capability: 128 random bits, so only its caller can name it.
// The daemon keeps the calls in flight, and the cancels that came before
// their call, in a Registry.
package callid

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
)

// Key is the metadata key that carries a call's id.
const Key = "b2b-call-id"

// MaxLen is the longest id the daemon takes.
const MaxLen = 64

// New returns a fresh id: 32 hex digits of crypto/rand.
func New() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms (Go 1.24+ aborts instead)
	return hex.EncodeToString(b[:])
}

// Check is nil when id is 1 to MaxLen characters of [0-9A-Za-z_-], and
// otherwise an InvalidArgument naming what (the field or key), the value
// and the limit.
func Check(what, id string) error {
	bad := len(id) == 0 || len(id) > MaxLen
	for i := 0; i < len(id) && !bad; i++ {
		c := id[i]
		bad = !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '-')
	}
	if bad {
		return fmt.Errorf("%w: %s is %q: want 1 to %d characters of [0-9A-Za-z_-]", errs.ErrInvalidArgument, what, clip(id), MaxLen)
	}
	return nil
}

// Parse reads the id from a call's metadata values: sent is false when
// there is none; more than one value, or a bad one, is an InvalidArgument.
func Parse(values []string) (id string, sent bool, err error) {
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", false, fmt.Errorf("%w: metadata %s has %d values: send one", errs.ErrInvalidArgument, Key, len(values))
	}
	if err := Check("metadata "+Key, values[0]); err != nil {
		return "", false, err
	}
	return values[0], true, nil
}

// clip keeps an error message short whatever a caller sent.
func clip(s string) string {
	if len(s) > 2*MaxLen {
		return s[:2*MaxLen] + "..."
	}
	return s
}
