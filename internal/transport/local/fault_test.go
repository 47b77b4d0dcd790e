package local

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/transport"
)

// truncatedMapping maps size bytes of a file that is then cut to one page.
func truncatedMapping(t *testing.T, size int) []byte {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "region"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHostCopyFaultSide: the sender copies into the destination's mapping
// itself, so a fault there is the destination's, not the source's, and
// the error says so (the batch layer names the region from it).
func TestHostCopyFaultSide(t *testing.T) {
	const size = 1 << 20
	b := &desc.Batch{Src: []uint64{size / 2}, Dst: []uint64{size / 2}, Len: []uint64{4096}}
	for _, tc := range []struct {
		name string
		dst  bool
		want memguard.Side
	}{
		{"truncated destination", true, memguard.Destination},
		{"truncated source", false, memguard.Source},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst, src := make([]byte, size), truncatedMapping(t, size)
			if tc.dst {
				dst, src = src, dst
			}
			err := copyHost(context.Background(), dst, src, b, 0, b.N())
			if !memguard.IsFault(err) {
				t.Fatalf("copyHost: %v, want a fault", err)
			}
			if got := memguard.SideOf(err); got != tc.want {
				t.Fatalf("fault on the %v, want the %v: %v", got, tc.want, err)
			}
		})
	}
}

// TestConnectCutByCancel: a peer that accepts the data path but never
// answers its hello (a stopped daemon) holds Connect only until the
// caller cancels, not until its deadline (review 4, finding 6).
func TestConnectCutByCancel(t *testing.T) {
	dir := t.TempDir()
	peer, err := New(Config{Dir: filepath.Join(dir, "peer"), Node: "peer"}, &fakeInbound{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	self, err := New(Config{Dir: filepath.Join(dir, "self"), Node: "self"}, &fakeInbound{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	ep := peer.Endpoint()
	ep.Socket = filepath.Join(dir, "frozen.sock")
	ln, err := net.Listen("unix", ep.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 4) // accepted, never answered
	defer func() {
		ln.Close()
		for len(held) > 0 {
			(<-held).Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err = self.Connect(ctx, transport.Peer{Address: "peer", Node: "peer", Advert: MarshalEndpoint(ep)})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Connect to a peer that never answers, cancelled: %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Connect took %v after a cancel at 50 ms", d)
	}
}
