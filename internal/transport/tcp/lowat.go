package tcp

import (
	"fmt"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxLowWater caps the receive low-water mark a block read asks for.
// Measured on loopback (2 vCPUs, 1 MiB reads): a mark of the read's size
// made a stream 10-17% faster than waking on every arriving segment, because
// the reader is woken, and enters read(2), once per block rather than once
// per few kernel segments. The kernel caps the mark at half of tcp_rmem's
// maximum anyway.
const maxLowWater = 1 << 20

// lowWater reads a plaintext TCP connection and sets its receive low-water
// mark (SO_RCVLOWAT) to what each read needs before it is woken: the rest
// of a large block for readBlock, one byte for every other read (headers,
// the read buffer's fills), so that no read ever waits for bytes the sender
// will not send until it has an ack. On other connections (TLS) it only
// reads.
type lowWater struct {
	c   net.Conn
	rc  syscall.RawConn // nil: marks are not set
	cur int             // the mark set on the socket
	// set is made once so that setting a mark allocates nothing (a closure
	// made per call would escape into RawConn.Control); want and serr are
	// its argument and result.
	set  func(fd uintptr)
	want int
	serr error
	// reset is the stream's reset mark (reset.go), read around every read.
	reset *resetMark
	// read is readBlock's read(2), made once like set: it reads rp into
	// rn, rerr unless the stream was reset.
	read func(fd uintptr) bool
	rp   []byte
	rn   int
	rerr error
}

func newLowWater(c net.Conn) *lowWater {
	w := &lowWater{c: c, cur: 1}
	if tc, ok := c.(*net.TCPConn); ok {
		if rc, err := tc.SyscallConn(); err == nil {
			w.rc = rc
		}
	}
	w.set = func(fd uintptr) { w.serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, w.want) }
	w.reset = newResetMark(c)
	w.read = func(fd uintptr) bool {
		if w.reset.reset(false) {
			w.rn, w.rerr = 0, errReset
			return true
		}
		for {
			n, err := unix.Read(int(fd), w.rp)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return false // wait until readable, then look at the mark again
			case err != nil:
				w.rn, w.rerr = 0, err
			case n == 0:
				w.rn, w.rerr = 0, io.EOF
			default:
				w.rn, w.rerr = n, nil
			}
			return true
		}
	}
	return w
}

// Read reads with a mark of one byte: any data wakes it. What it read is
// not placed yet (it goes to the read buffer or a header): a stream the
// sender reset meanwhile fails instead.
func (w *lowWater) Read(p []byte) (int, error) {
	if err := w.mark(1); err != nil {
		return 0, err
	}
	n, err := w.c.Read(p)
	if n > 0 && w.reset.reset(false) {
		return 0, errReset
	}
	return n, err
}

// readBlock reads (the rest of) a large block, woken only once the whole of
// p, up to maxLowWater bytes, has arrived. It reads straight into the
// region: each read(2) comes after a look at the stream's reset mark, also
// when it follows a wait (the receiver may have been stopped meanwhile).
func (w *lowWater) readBlock(p []byte) (int, error) {
	if err := w.mark(min(len(p), maxLowWater)); err != nil {
		return 0, err
	}
	if w.rc == nil {
		return w.c.Read(p)
	}
	w.rp, w.rn, w.rerr = p, 0, nil
	err := w.rc.Read(w.read)
	w.rp = nil
	if err != nil {
		return 0, fmt.Errorf("tcp: read: %w", err)
	}
	if w.rerr != nil && w.rerr != io.EOF && w.rerr != errReset {
		return w.rn, fmt.Errorf("tcp: read: %w", w.rerr)
	}
	return w.rn, w.rerr
}

// mark sets the socket's low-water mark to n bytes. A mark that cannot be
// set fails the read: a mark left higher than the next read's need could
// hold that read until the frame's deadline.
func (w *lowWater) mark(n int) error {
	if w.rc == nil || n == w.cur {
		return nil
	}
	w.want, w.serr = n, nil
	if err := w.rc.Control(w.set); err != nil {
		return fmt.Errorf("tcp: set SO_RCVLOWAT=%d: %w", n, err)
	}
	if w.serr != nil {
		return fmt.Errorf("tcp: set SO_RCVLOWAT=%d: %w", n, w.serr)
	}
	w.cur = n
	return nil
}
