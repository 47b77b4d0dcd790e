// Package memguard contains faults on memory that a client can take away.
//
// Host regions are files in the shm directory, mapped by the daemon and by
// the client that owns them. A client that truncates its file makes the
// daemon's next access to the vanished pages raise SIGBUS, which would kill
// the daemon and every other client's transfers with it. Go code that reads
// or writes a region's bytes runs inside Do (or DoCopy), which turns such a
// fault into an error for that region's batch alone. System calls on the
// same pages fail with EFAULT instead; Syscall labels those. IsFault
// recognises all of them.
//
// A fault says which side of a batch it hit (Side): the code that touched
// the memory knows whether it was reading the source or writing the
// destination, or (DoCopy) tells by the faulting address. The batch layer
// names the faulted region from that side (SideOf), never by guessing.
package memguard

import (
	"errors"
	"fmt"
	"runtime/debug"
	"syscall"
	"unsafe"

	"github.com/b2bd/b2bd/internal/errs"
)

// ErrFault marks an access to region memory that faulted.
var ErrFault = errors.New("memory fault on a region")

// Side is the end of a batch whose memory faulted.
type Side uint8

const (
	// Unknown: the code that faulted could not tell (a region read
	// outside a batch, or an address in neither mapping).
	Unknown Side = iota
	// Source: the sending region (src_region_id).
	Source
	// Destination: the receiving region (dst_region).
	Destination
)

func (s Side) String() string {
	switch s {
	case Source:
		return "source"
	case Destination:
		return "destination"
	}
	return "unknown"
}

// Fault is a contained fault, or a system call's EFAULT, on region memory.
// It wraps ErrFault and errs.ErrDataLoss (and the system call's error).
type Fault struct {
	Side Side
	Addr uintptr // the faulting address; 0 for a system call's EFAULT
	Op   string  // the system call that failed with EFAULT; "" for a contained fault
	Err  error   // its error; nil for a contained fault
}

func (f *Fault) Error() string {
	what := "a region"
	if f.Side != Unknown {
		what = "the " + f.Side.String() + " region"
	}
	at := fmt.Sprintf("at %#x", f.Addr)
	if f.Op != "" {
		at = fmt.Sprintf("in %s: %v", f.Op, f.Err)
	}
	return fmt.Sprintf("memory fault on %s (%v) %s: its backing file was truncated or replaced under the mapping", what, errs.ErrDataLoss, at)
}

// Unwrap makes a Fault match ErrFault, errs.ErrDataLoss and its cause.
func (f *Fault) Unwrap() []error {
	if f.Err != nil {
		return []error{ErrFault, errs.ErrDataLoss, f.Err}
	}
	return []error{ErrFault, errs.ErrDataLoss}
}

// Do runs f, which touches the side's memory, and returns a *Fault if f
// faulted on memory (SIGBUS or SIGSEGV at a non-nil address) instead of
// letting the fault kill the process. Any other panic is passed on. f must
// not leave shared state half-changed on a fault: callers treat the region's
// bytes as lost and fail the batch.
func Do(side Side, f func()) error {
	return guard(f, func(addr uintptr) Side { return side })
}

// DoCopy runs f, which copies from src into dst, and on a fault tells the
// side by the faulting address: inside dst's bytes the destination, inside
// src's the source.
func DoCopy(dst, src []byte, f func()) error {
	return guard(f, func(addr uintptr) Side {
		switch {
		case within(addr, dst):
			return Destination
		case within(addr, src):
			return Source
		}
		return Unknown
	})
}

func within(addr uintptr, b []byte) bool {
	if len(b) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return addr >= lo && addr-lo < uintptr(len(b))
}

func guard(f func(), side func(addr uintptr) Side) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r) // not ours: a real bug keeps its stack
			}
			err = &Fault{Side: side(fe.Addr()), Addr: fe.Addr()}
		}
	}()
	f()
	return nil
}

// Syscall labels a system call's error on the side's memory: an EFAULT
// becomes a *Fault of that side; any other error (or nil) is returned as
// it is.
func Syscall(side Side, op string, err error) error {
	if err == nil || !errors.Is(err, syscall.EFAULT) {
		return err
	}
	return &Fault{Side: side, Op: op, Err: err}
}

// At is a fault on the side's memory that another process saw and
// reported (a receiver that refused a batch because its destination
// faulted): what wraps it says where.
func At(side Side) error { return &Fault{Side: side, Op: "the peer's copy", Err: errRemote} }

var errRemote = errors.New("reported by the peer")

// SideOf is the side of the fault err carries; Unknown when it carries none
// or the fault could not tell.
func SideOf(err error) Side {
	var f *Fault
	if errors.As(err, &f) {
		return f.Side
	}
	return Unknown
}

// IsFault reports whether err is a contained fault or a system call's EFAULT
// on region memory.
func IsFault(err error) bool {
	return errors.Is(err, ErrFault) || errors.Is(err, syscall.EFAULT)
}
