package auth_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/credentials"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/testca"
)

// syncBuf is a log sink the handshake goroutines share.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestRefusedHandshakesAreLogged: a client whose certificate another CA
// issued is refused by the API listener's and the peer listener's TLS, and
// the daemon's log says so (at most once a second); an accepted one is not
// logged.
func TestRefusedHandshakesAreLogged(t *testing.T) {
	ours, theirs := testca.New(t, "ours"), testca.New(t, "theirs")
	load := func(ca *testca.CA, id string) *auth.PeerTLS {
		c, k := ca.Issue(t, id)
		p, err := auth.LoadPeerTLS(c, k, ca.PEM)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	server, good, stranger := load(ours, "daemon"), load(ours, "client"), load(theirs, "client")
	var sink syncBuf
	log := hclog.New(&hclog.LoggerOptions{Output: &sink, Level: hclog.Warn})
	api, peer := auth.NewPeerCred(log), auth.LogRefused(credentials.NewTLS(server.Server), "peer", log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	handshake := func(where string, client *auth.PeerTLS) error {
		a, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		_ = a.SetDeadline(time.Now().Add(5 * time.Second))
		_ = b.SetDeadline(time.Now().Add(5 * time.Second))
		cerr := make(chan error, 1)
		go func() {
			cc := tls.Client(a, client.ClientFor("localhost:7470"))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := cc.HandshakeContext(ctx)
			if err == nil {
				_, err = cc.Read(make([]byte, 1)) // TLS 1.3: the server's refusal comes after
			}
			cerr <- err
		}()
		err = nil
		if where == "api" {
			_, _, err = api.ServerHandshake(tls.Server(b, server.Server))
		} else {
			_, _, err = peer.ServerHandshake(b)
		}
		b.Close()
		<-cerr
		return err
	}
	for _, where := range []string{"api", "peer"} {
		before := strings.Count(sink.String(), "TLS handshake refused")
		if err := handshake(where, stranger); err == nil {
			t.Fatalf("%s: a certificate of another CA was accepted", where)
		}
		if got := strings.Count(sink.String(), "TLS handshake refused"); got != before+1 || !strings.Contains(sink.String(), "listener="+where) {
			t.Fatalf("%s: log %q: want one line naming the listener", where, sink.String())
		}
		if err := handshake(where, stranger); err == nil { // within the second: not logged again
			t.Fatalf("%s: accepted the second time", where)
		}
		if got := strings.Count(sink.String(), "TLS handshake refused"); got != before+1 {
			t.Fatalf("%s: %d lines within a second, want 1", where, got-before)
		}
	}
	time.Sleep(1100 * time.Millisecond)
	n := strings.Count(sink.String(), "TLS handshake refused")
	if err := handshake("api", good); err != nil {
		t.Fatalf("our own CA's client: %v", err)
	}
	if got := strings.Count(sink.String(), "TLS handshake refused"); got != n {
		t.Fatalf("an accepted handshake was logged: %q", sink.String())
	}
}
