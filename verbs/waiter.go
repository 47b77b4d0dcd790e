//go:build linux

package verbs

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Readiness bits returned by Waiter.Wait.
const (
	ReadyCQ    = 1
	ReadyAsync = 2
	ReadyWake  = 4
)

// Waiter blocks a poller until the completion channel or the async event fd
// is readable, Wake is called, or a timeout passes.
//
// It waits in Go's network poller on an epoll fd holding those fds plus an
// eventfd, not in a blocking cgo or raw syscall: a blocked cgo call keeps
// its P until sysmon steals it (20 µs to 10 ms later), which on a
// GOMAXPROCS=1 host (the 1-vCPU test VMs) stalls every other goroutine,
// the batch writers included. A parked goroutine frees its P at once.
type Waiter struct {
	ep     int
	f      *os.File
	rc     syscall.RawConn
	efd    int
	comp   int
	async  int
	ready  int
	evs    [4]unix.EpollEvent
	rbuf   [8]byte
	wbuf   [8]byte
	wakes  atomic.Int32
	readFn func(uintptr) bool
}

// NewWaiter watches compFD and asyncFD (either may be < 0).
func NewWaiter(compFD, asyncFD int) (*Waiter, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("verbs: epoll_create1: %w", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("verbs: eventfd: %w", err)
	}
	w := &Waiter{ep: ep, efd: efd, comp: compFD, async: asyncFD}
	fail := func(e error) (*Waiter, error) {
		unix.Close(efd)
		if w.f != nil {
			w.f.Close()
		} else {
			unix.Close(ep)
		}
		return nil, e
	}
	for _, fd := range []int{compFD, asyncFD, efd} {
		if fd < 0 {
			continue
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return fail(fmt.Errorf("verbs: epoll_ctl(add %d): %w", fd, err))
		}
	}
	if err := unix.SetNonblock(ep, true); err != nil {
		return fail(fmt.Errorf("verbs: epoll fd non-blocking: %w", err))
	}
	w.f = os.NewFile(uintptr(ep), "verbs-waiter")
	rc, err := w.f.SyscallConn()
	if err != nil {
		return fail(fmt.Errorf("verbs: epoll fd: %w", err))
	}
	w.rc = rc
	w.wbuf[0] = 1
	w.readFn = func(uintptr) bool { return w.check() }
	return w, nil
}

// check collects ready fds without blocking; true when any is ready.
func (w *Waiter) check() bool {
	n, err := unix.EpollWait(w.ep, w.evs[:], 0)
	if err != nil || n <= 0 {
		return false
	}
	for k := 0; k < n; k++ {
		switch int(w.evs[k].Fd) {
		case w.comp:
			w.ready |= ReadyCQ
		case w.async:
			w.ready |= ReadyAsync
		case w.efd:
			w.ready |= ReadyWake
			_, _ = unix.Read(w.efd, w.rbuf[:])
			w.wakes.Store(0)
		}
	}
	return w.ready != 0
}

// Wait blocks until something is ready or timeout passes (0 readiness on
// timeout). Only one goroutine may Wait at a time.
func (w *Waiter) Wait(timeout time.Duration) (int, error) {
	w.ready = 0
	if w.check() {
		return w.ready, nil
	}
	if err := w.f.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return 0, fmt.Errorf("verbs: waiter deadline: %w", err)
	}
	err := w.rc.Read(w.readFn)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return w.ready, nil
		}
		return 0, fmt.Errorf("verbs: waiter: %w", err)
	}
	return w.ready, nil
}

// Wake makes a blocked (or the next) Wait return. Safe from any goroutine.
func (w *Waiter) Wake() {
	if w.wakes.Add(1) == 1 {
		_, _ = unix.Write(w.efd, w.wbuf[:])
	}
}

// Close releases the fds (not the watched ones); safe twice.
func (w *Waiter) Close() error {
	if w == nil || w.f == nil {
		return nil
	}
	err := w.f.Close()
	unix.Close(w.efd)
	w.f = nil
	return err
}
