package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
)

// TestShutdownGraceCutsCalls: a call still running when the shutdown
// grace ends (here a watch, which never ends on its own) answers
// Unavailable naming the shutdown and its grace, not the transport's bare
// "Socket closed" (review 4, finding 10).
func TestShutdownGraceCutsCalls(t *testing.T) {
	n := startNode(t, "a", func(c *daemon.Config) { c.ShutdownGrace = 300 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := n.c.RegisterHost(ctx, 4096, "watched")
	if err != nil {
		t.Fatal(err)
	}
	wc, err := client.Dial(n.d.APIAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	w, err := wc.Watch(ctx, r.Id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Header(); err != nil {
		t.Fatal(err)
	}
	n.cancel() // the daemon drains: the watch holds it past the grace
	_, err = w.Recv()
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "--shutdown-grace 300ms") {
		t.Fatalf("a watch at the end of the shutdown grace: %v, want Unavailable naming --shutdown-grace 300ms", err)
	}
	n.stop(t) // it exits, cleanly
}
