// Package memguard contains faults on memory that a client can take away.
//
// Host regions are files in the shm directory, mapped by the daemon and by
// the client that owns them. A client that truncates its file makes the
// daemon's next access to the vanished pages raise SIGBUS, which would kill
// the daemon and every other client's transfers with it. Go code that reads
// or writes a region's bytes runs inside Do, which turns such a fault into
// an error for that region's batch alone. System calls on the same pages
// fail with EFAULT instead; IsFault recognises both.
package memguard

import (
	"errors"
	"fmt"
	"runtime/debug"
	"syscall"

	"github.com/b2bd/b2bd/internal/errs"
)

// ErrFault marks an access to region memory that faulted.
var ErrFault = errors.New("memory fault on a region")

// Do runs f and returns an error wrapping ErrFault and errs.ErrDataLoss if f
// faulted on memory (SIGBUS or SIGSEGV at a non-nil address) instead of
// letting the fault kill the process. Any other panic is passed on. f must
// not leave shared state half-changed on a fault: callers treat the region's
// bytes as lost and fail the batch.
func Do(f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r) // not ours: a real bug keeps its stack
			}
			err = fmt.Errorf("%w (%w) at %#x: its backing file was truncated or replaced under the mapping", ErrFault, errs.ErrDataLoss, fe.Addr())
		}
	}()
	f()
	return nil
}

// IsFault reports whether err is a contained fault or a system call's EFAULT
// on region memory.
func IsFault(err error) bool {
	return errors.Is(err, ErrFault) || errors.Is(err, syscall.EFAULT)
}
