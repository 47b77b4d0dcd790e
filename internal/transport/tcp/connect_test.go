package tcp

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// helloGate is a peer's data listener that welcomes a conn's streams only
// once all of them said hello (or refuses them all): a Connect that dials
// its streams one after another never gets there.
func helloGate(t *testing.T, streams int, refuse bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for len(held) < streams {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if _, err := io.ReadFull(c, make([]byte, helloLen)); err != nil {
				c.Close()
				continue
			}
			held = append(held, c)
		}
		var w [welcomeLen]byte
		binary.LittleEndian.PutUint32(w[0:], welcomeMagic)
		if refuse {
			binary.LittleEndian.PutUint32(w[4:], 1)
		}
		for _, c := range held {
			_, _ = c.Write(w[:])
		}
		time.Sleep(time.Second) // the streams stay up while Connect checks the welcomes
	}()
	return l.Addr().String()
}

// TestConnectDialsStreamsSideBySide: a conn's streams connect and say hello
// at once, not one after another (a loaded peer's accept made that 10-37 ms
// a conn); one refused stream fails Connect, naming it, with every stream
// closed.
func TestConnectDialsStreamsSideBySide(t *testing.T) {
	const streams = 4
	for _, refuse := range []bool{false, true} {
		tr, err := New(Config{Listen: "127.0.0.1:0", Streams: streams}, &keyed{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		addr := helloGate(t, streams, refuse)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c, err := tr.Connect(ctx, transport.Peer{Address: "127.0.0.1:1", Advert: MarshalAdvert(addr, make([]byte, 16))})
		cancel()
		if refuse {
			if !errors.Is(err, errs.ErrUnavailable) || c != nil {
				t.Fatalf("refused streams: %v, want Unavailable and no conn", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Connect with %d streams welcomed together: %v", streams, err)
		}
		if n := len(c.(*conn).streams); n != streams {
			t.Fatalf("%d streams, want %d", n, streams)
		}
		c.Close()
	}
}

// TestQueuedBatchWaitIsPost: a batch that waits for its conn, busy with
// another, counts the wait as post (handing over), not as wire: the wire
// phase (the rest of the call) stays its own bytes.
func TestQueuedBatchWaitIsPost(t *testing.T) {
	p := newPair(t, 1<<16, 1)
	c := p.conn.(*conn)
	const hold = 200 * time.Millisecond
	c.mu <- struct{}{} // another batch holds the conn
	type out struct {
		st    transport.Stats
		total time.Duration
		err   error
	}
	done := make(chan out, 1)
	go func() {
		t0 := time.Now()
		b := desc.Batch{Src: []uint64{0}, Dst: []uint64{64}, Len: []uint64{8}}
		st, err := transport.Write(context.Background(), p.conn, p.src, p.dst, &b)
		done <- out{st, time.Since(t0), err}
	}()
	time.Sleep(hold)
	c.unlock()
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.st.Post < o.total/2 {
		t.Fatalf("post %v of a %v write that waited %v for its conn: the wait went to the wire", o.st.Post, o.total, hold)
	}
}

func TestStagingSize(t *testing.T) {
	for _, tc := range []struct {
		need  uint64
		limit int
		want  int
	}{
		{1, 4 << 20, 64 << 10},
		{64 << 10, 4 << 20, 64 << 10},
		{64<<10 + 1, 4 << 20, 128 << 10},
		{3 << 20, 4 << 20, 4 << 20},
		{4 << 20, 4 << 20, 4 << 20},
		{100, 1000, 1000},  // a limit under 64 KiB
		{5000, 1000, 5000}, // never short of need
	} {
		if got := stagingSize(tc.need, tc.limit); got != tc.want {
			t.Errorf("stagingSize(%d, %d) = %d, want %d", tc.need, tc.limit, got, tc.want)
		}
	}
}
