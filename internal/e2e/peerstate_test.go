package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/daemon"
	"github.com/b2bd/b2bd/internal/testca"
)

// closedPort is a loopback port that nothing listens on (bound, then closed).
func closedPort(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(freePort(t))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// TestDeadPeerStormLeavesNoState: batches to 100 distinct unreachable peers
// each fail with Unavailable, and afterwards (plus one live peer used and
// left idle) the daemon's goroutines and file descriptors, as its Status
// reports them, come back to their baseline within the idle timeout.
func TestDeadPeerStormLeavesNoState(t *testing.T) {
	const idle = 300 * time.Millisecond
	short := func(c *daemon.Config) { c.PeerIdleTimeout = idle }
	a, b := startNode(t, "a", short), startNode(t, "b", short)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	src, _ := registerPair(ctx, t, a.c, b.c, 1<<16, 1<<16, "storm-dst")
	offs := strided(16, 1024)

	base := settled(t, "a", a.c)
	if base.peers != 0 {
		t.Fatalf("a settled with %d peers connected before any batch", base.peers)
	}
	port := closedPort(t)
	for i := range 100 {
		peer := fmt.Sprintf("127.0.0.%d:%s", 2+i, port)
		_, err := transfer(ctx, a.c, src.Id, peer, "x", offs, offs, 1024)
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("batch to dead peer %s: %v, want Unavailable", peer, err)
		}
	}
	if _, err := transfer(ctx, a.c, src.Id, b.d.PeerAddr(), "storm-dst", offs, offs, 1024); err != nil {
		t.Fatalf("batch to the live peer: %v", err)
	}

	// Back to the baseline, peers 0 included: polled, with a bound far
	// above the idle timeout.
	noGrowth(t, "a, after 100 dead peers and one idle live one,", a.c, base)
	// The reaped live peer is dialled afresh by the next batch.
	if _, err := transfer(ctx, a.c, src.Id, b.d.PeerAddr(), "storm-dst", offs, offs, 1024); err != nil {
		t.Fatalf("batch to the live peer after it was reaped: %v", err)
	}
}

// TestMaxPeersRefused: a daemon capped at 2 peers refuses a batch to a third
// with ResourceExhausted naming the cap and the flag, while two live peers
// are kept.
func TestMaxPeersRefused(t *testing.T) {
	a := startNode(t, "a", func(c *daemon.Config) { c.MaxPeers = 2 })
	b, c := startNode(t, "b"), startNode(t, "c")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, err := a.c.RegisterHost(ctx, 1<<16, "")
	if err != nil {
		t.Fatal(err)
	}
	offs := strided(4, 1024)
	for _, n := range []*node{b, c} {
		if _, err := n.c.RegisterHost(ctx, 1<<16, "cap-dst"); err != nil {
			t.Fatal(err)
		}
		if _, err := transfer(ctx, a.c, src.Id, n.d.PeerAddr(), "cap-dst", offs, offs, 1024); err != nil {
			t.Fatal(err)
		}
	}
	_, err = transfer(ctx, a.c, src.Id, "127.0.0.1:"+closedPort(t), "cap-dst", offs, offs, 1024)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--max-peers") || !strings.Contains(err.Error(), " 2") {
		t.Fatalf("third peer: %v, want ResourceExhausted naming --max-peers and its value 2", err)
	}
}

// TestPeerAddressMistakes: a peer address without a port, a daemon's data
// port and a port where a web server listens are each refused at once with
// a message that says what is wrong and what to give instead, in plaintext
// and under mutual TLS.
func TestPeerAddressMistakes(t *testing.T) {
	t.Run("plaintext", func(t *testing.T) { peerAddressMistakes(t) })
	t.Run("tls", func(t *testing.T) {
		ca := testca.New(t, "b2bd test CA")
		peerAddressMistakes(t, withTLS(t, ca, "a"), withTLS(t, ca, "b"))
	})
}

func peerAddressMistakes(t *testing.T, security ...func(*daemon.Config)) {
	var sa, sb []func(*daemon.Config)
	if len(security) == 2 {
		sa, sb = security[:1], security[1:]
	}
	a, b := startNode(t, "a", sa...), startNode(t, "b", sb...)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") }))
	defer web.Close()
	ctx := context.Background()
	src, err := a.c.RegisterHost(ctx, 1<<16, "")
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dataPort := ""
	for _, tr := range st.Transports {
		if d, ok := strings.CutPrefix(tr.Detail, "data listener "); ok {
			dataPort = d
		}
	}
	if dataPort == "" {
		t.Fatalf("b's Status names no data listener: %v", st.Transports)
	}
	offs := strided(4, 1024)
	for _, tc := range []struct {
		name, peer string
		code       codes.Code
		want       []string
	}{
		{"no port", "localhost", codes.InvalidArgument, []string{`"localhost"`, "has no port", "localhost:7470", "--peer-listen"}},
		{"port out of range", "127.0.0.1:70000", codes.InvalidArgument, []string{"peer", "70000", "1 to 65535"}},
		{"data port", dataPort, codes.FailedPrecondition, []string{"data port", "the peer port is " + b.d.PeerAddr()}},
		{"web server", web.Listener.Addr().String(), codes.FailedPrecondition, []string{"not a b2bd peer port", "HTTP/1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A deadline far away: the answer must come from the mistake
			// being recognised, not from the deadline.
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := transfer(ctx, a.c, src.Id, tc.peer, "x", offs, offs, 1024)
			t.Logf("peer %q: %v", tc.peer, err)
			if status.Code(err) != tc.code {
				t.Fatalf("peer %q: %v, want %v", tc.peer, err, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("peer %q: %v, want it to say %q", tc.peer, err, w)
				}
			}
		})
	}
}
