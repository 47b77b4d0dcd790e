package tcp

import (
	"bytes"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-acc
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func socketLowWater(t *testing.T, c net.Conn) int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	return v
}

// kernelLowWaterCap is the most the kernel lets a mark be: half of
// tcp_rmem's maximum (net/ipv4/tcp.c, tcp_set_rcvlowat).
func kernelLowWaterCap(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_rmem")
	if err != nil {
		return math.MaxInt
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return math.MaxInt
	}
	n, err := strconv.Atoi(f[2])
	if err != nil {
		return math.MaxInt
	}
	return n / 2
}

// TestLowWater: a block read sets the mark to the rest of the block (capped),
// every other read puts it back to one byte, and no read waits for bytes the
// sender has not sent: a block that arrives in pieces with pauses between
// them, then a few bytes the sender sends only after the block was read
// (as a header after a frame), are all read well within the deadline.
func TestLowWater(t *testing.T) {
	tests := []struct {
		name   string
		block  int
		pieces []int // the block is sent in pieces of these sizes, 30 ms apart
		mark   int   // the mark the first block read sets
	}{
		{"whole block", 256 << 10, []int{256 << 10}, 256 << 10},
		{"block in pieces", 200 << 10, []int{70 << 10, 1, 130<<10 - 1}, 200 << 10},
		{"block above the cap", 3 << 20, []int{1 << 20, 2 << 20}, maxLowWater},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client, server := tcpPair(t)
			w := newLowWater(server)
			_ = server.SetReadDeadline(time.Now().Add(10 * time.Second))
			want := bytes.Repeat([]byte{0xa5, 0x5a, 0x3c}, tc.block/3+1)[:tc.block]
			after := []byte("header after the block")
			readDone := make(chan struct{})
			go func() {
				off := 0
				for _, n := range tc.pieces {
					if _, err := client.Write(want[off : off+n]); err != nil {
						return
					}
					off += n
					time.Sleep(30 * time.Millisecond)
				}
				<-readDone // the next bytes only once the block was read
				_, _ = client.Write(after)
			}()
			got := make([]byte, tc.block)
			first := true
			for off := 0; off < len(got); {
				n, err := w.readBlock(got[off:])
				if err != nil {
					t.Fatalf("readBlock at %d: %v", off, err)
				}
				if first {
					if m := socketLowWater(t, server); m != min(tc.mark, kernelLowWaterCap(t)) {
						t.Fatalf("mark after the first block read: %d, want %d", m, tc.mark)
					}
					first = false
				}
				off += n
			}
			close(readDone)
			if !bytes.Equal(got, want) {
				t.Fatal("block read differs from what was sent")
			}
			hdr := make([]byte, len(after))
			if _, err := io.ReadFull(w, hdr); err != nil {
				t.Fatalf("read after the block (a mark left high would hold it): %v", err)
			}
			if !bytes.Equal(hdr, after) {
				t.Fatalf("read %q after the block, want %q", hdr, after)
			}
			if m := socketLowWater(t, server); m != 1 {
				t.Fatalf("mark after a plain read: %d, want 1", m)
			}
		})
	}
}

// TestLowWaterAllocatesNothing: setting marks is on the data path (twice per
// frame of large blocks).
func TestLowWaterAllocatesNothing(t *testing.T) {
	_, server := tcpPair(t)
	w := newLowWater(server)
	marks := []int{64 << 10, 1, 1 << 20, 300 << 10, 1}
	if a := testing.AllocsPerRun(100, func() {
		for _, m := range marks {
			if err := w.mark(m); err != nil {
				t.Fatal(err)
			}
		}
	}); a != 0 {
		t.Fatalf("%v allocations per %d marks", a, len(marks))
	}
	if m := socketLowWater(t, server); m != 1 {
		t.Fatalf("mark %d after the last mark(1)", m)
	}
}
