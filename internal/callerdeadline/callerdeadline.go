// Package callerdeadline carries a caller's transfer deadline from a client
// to its daemon in request metadata, apart from the gRPC call's own
// deadline. The clients give the call a later deadline (the caller's plus
// Grace) and send the caller's in Key, so that the DeadlineExceeded the
// caller gets is the daemon's answer, sent after its data path stopped: a
// pull writes the caller's own memory, and no byte may land there after the
// answer (docs/pull.md, "Deadlines and faults").
package callerdeadline

import (
	"fmt"
	"strconv"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

// Key is the metadata key: the caller's time left, in whole milliseconds,
// relative (so that the client's and the daemon's clocks need not agree).
const Key = "b2b-timeout-ms"

// Max is the longest time left a client may send; a caller with more sends
// none (its call keeps its own deadline, and the daemon's margin applies).
const Max = 24 * time.Hour

// Grace is how much later than the caller's deadline the clients set the
// gRPC call's: time for the daemon to stop the data path and answer.
const Grace = 5 * time.Second

// Format is the metadata value for left, rounded up to a whole millisecond
// so that a deadline is never moved earlier than 1 ms; ok is false when left
// is not in (0, Max] and nothing should be sent.
func Format(left time.Duration) (string, bool) {
	if left <= 0 || left > Max {
		return "", false
	}
	ms := (left + time.Millisecond - 1) / time.Millisecond
	return strconv.FormatInt(int64(ms), 10), true
}

// Parse reads Key's values from a request's metadata: the time left, and
// whether the key was sent. Bad input (more than one value, anything but
// decimal milliseconds from 1 to Max) is an errs.ErrInvalidArgument naming
// the key, the value and the limit.
func Parse(values []string) (time.Duration, bool, error) {
	switch len(values) {
	case 0:
		return 0, false, nil
	case 1:
	default:
		return 0, false, fmt.Errorf("%w: metadata %s has %d values %q: send one", errs.ErrInvalidArgument, Key, len(values), values)
	}
	v := values[0]
	max := int64(Max / time.Millisecond)
	bad := len(v) == 0 || len(v) > 20
	for i := 0; i < len(v) && !bad; i++ {
		bad = v[i] < '0' || v[i] > '9'
	}
	var ms int64
	if !bad {
		var err error
		ms, err = strconv.ParseInt(v, 10, 64)
		bad = err != nil || ms < 1 || ms > max
	}
	if bad {
		return 0, false, fmt.Errorf("%w: metadata %s is %q: want whole milliseconds from 1 to %d (24 h)", errs.ErrInvalidArgument, Key, v, max)
	}
	return time.Duration(ms) * time.Millisecond, true, nil
}
