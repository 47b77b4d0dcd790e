package tcp

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A sender that cuts a batch off (deadline, cancel, a failed stream)
// answers its caller at once: it does not wait for the receiver, which may
// be stopped (SIGSTOP, a VM paused) or cut off from it. It resets its
// streams instead (abort, SO_LINGER 0), and the receiver's kernel marks
// them closed the moment the reset arrives, whatever the receiving process
// is doing. The receiver checks that mark before it places bytes: before
// every read straight into a region, after every read into its buffer and
// before every frame. So the bytes of a cut-off batch that sit in its
// socket buffers, or in its read buffer, are never placed, even when the
// receiving process only runs again long after the sender answered. The
// fence connection (conn.fence) follows in the background; it stops a
// receiver the reset did not reach.

// errReset: the sender reset the stream, which it does only when it has
// cut the stream's batch off.
var errReset = errors.New("tcp: the sender reset the stream (it cut the batch off); its bytes are not placed")

// resetCheckEvery: a stream's reset mark is read at most this often by
// the reads of one frame (a system call each), and always before a frame is
// placed. A receiver that was stopped finds the time passed and reads it
// before its next read.
const resetCheckEvery = 50 * time.Microsecond

// tcpClose is the kernel's TCP_CLOSE state (include/net/tcp_states.h): a
// reset stream is in it at once.
const tcpClose = 7

// resetMark reads a stream's TCP state (the state is the first byte of
// TCP_INFO, which the kernel copies only as far as the buffer asked for).
type resetMark struct {
	rc      syscall.RawConn // nil: not a TCP socket, never reset
	checked time.Time
	// get is made once so that reading the mark allocates nothing;
	// state and gerr are its results.
	get   func(fd uintptr)
	state int
	gerr  error
}

func newResetMark(c net.Conn) *resetMark {
	m := &resetMark{}
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		if rc, err := tc.SyscallConn(); err == nil {
			m.rc = rc
		}
	}
	m.get = func(fd uintptr) {
		m.state, m.gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}
	return m
}

// reset says whether the peer reset the stream; unless now, only if
// resetCheckEvery passed since the last look.
func (m *resetMark) reset(now bool) bool {
	if m == nil || m.rc == nil {
		return false
	}
	t := time.Now()
	if !now && t.Sub(m.checked) < resetCheckEvery {
		return false
	}
	m.checked = t
	m.gerr = nil
	if err := m.rc.Control(m.get); err != nil {
		return true // the socket is closed here: nothing more is placed from it
	}
	return m.gerr == nil && m.state&0xff == tcpClose
}

// abort closes nc with a reset (SO_LINGER 0): its unsent bytes are dropped
// here, and the receiver's kernel marks the stream closed when the reset
// arrives. Under TLS the socket below is reset first, so that closing the
// TLS connection does not wait to send its close alert to a receiver that
// reads nothing.
func abort(nc net.Conn) error {
	if tc, ok := nc.(*tls.Conn); ok {
		if err := abort(tc.NetConn()); err != nil {
			return err
		}
		return nc.Close()
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		if err := tc.SetLinger(0); err != nil {
			return fmt.Errorf("tcp: reset stream: %w", err)
		}
	}
	return nc.Close()
}
