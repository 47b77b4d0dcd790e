package tcp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// queued is how many bytes c's socket holds unread.
func queued(c net.Conn) (int, error) {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var qerr error
	if err := rc.Control(func(fd uintptr) { n, qerr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
		return 0, err
	}
	return n, qerr
}

// TestResetDropsQueuedBytes: bytes a sender wrote before it reset the
// stream (abort) sit in the receiver's socket buffer, readable; the
// receiver's reads, straight into a region or through its buffer, return
// errReset instead of placing them, and a frame's check says reset. A
// stream closed normally (FIN) is not taken for a reset: its bytes are
// read.
func TestResetDropsQueuedBytes(t *testing.T) {
	payload := bytes.Repeat([]byte{0xa5}, 32<<10)
	for _, tc := range []struct {
		name  string
		block bool // readBlock (straight into a region) or Read (the buffer)
		reset bool // abort, or a plain close
	}{
		{"block/reset", true, true},
		{"buffer/reset", false, true},
		{"block/close", true, false},
		{"buffer/close", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server := tcpPair(t)
			w := newLowWater(server)
			// Before anything happened: not reset.
			if w.reset.reset(true) {
				t.Fatal("a fresh stream reads as reset")
			}
			if _, err := client.Write(payload); err != nil {
				t.Fatal(err)
			}
			// The bytes are in the receiver's socket buffer before the end.
			for deadline := time.Now().Add(10 * time.Second); ; {
				n, err := queued(server)
				if err != nil {
					t.Fatal(err)
				}
				if n >= len(payload) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d bytes arrived", n, len(payload))
				}
				time.Sleep(time.Millisecond)
			}
			if tc.reset {
				if err := abort(client); err != nil {
					t.Fatal(err)
				}
			} else if err := client.Close(); err != nil {
				t.Fatal(err)
			}
			// The kernel handles the reset or the FIN at once on loopback;
			// wait for the state to change, within a bound.
			time.Sleep(10 * time.Millisecond)
			_ = server.SetReadDeadline(time.Now().Add(10 * time.Second))
			region := make([]byte, len(payload))
			var n int
			var err error
			for n < len(region) && err == nil {
				var k int
				if tc.block {
					k, err = w.readBlock(region[n:])
				} else {
					// The read buffer: only the k bytes Read returned are
					// placed.
					buf := make([]byte, len(region)-n)
					k, err = w.Read(buf)
					copy(region[n:], buf[:k])
				}
				n += k
				// A reader that was stopped finds the time passed too.
				time.Sleep(2 * resetCheckEvery)
			}
			if tc.reset {
				if !errors.Is(err, errReset) {
					t.Fatalf("read %d bytes, err %v; want errReset", n, err)
				}
				if bytes.Count(region, []byte{0xa5}) != 0 {
					t.Fatalf("%d bytes of a reset stream were placed", bytes.Count(region, []byte{0xa5}))
				}
				if !w.reset.reset(true) {
					t.Fatal("a frame's check does not see the reset")
				}
				return
			}
			if err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("after a close: %v", err)
			}
			if !bytes.Equal(region, payload) {
				t.Fatalf("after a close: read %d of %d bytes", n, len(payload))
			}
			if w.reset.reset(true) {
				t.Fatal("a closed stream reads as reset")
			}
		})
	}
}
