package e2e

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
)

// node is one real daemon on real sockets, inside the test process.
type node struct {
	d      *daemon.Daemon
	c      *client.Client
	cancel context.CancelFunc
	done   chan error
}

func startNode(t *testing.T, name string, mutate ...func(*daemon.Config)) *node {
	t.Helper()
	dir := t.TempDir()
	cfg := daemon.Config{
		NodeName: name, Socket: filepath.Join(dir, "b2bd.sock"), SocketMode: "0660",
		PeerListen: "127.0.0.1:0", ShmDir: filepath.Join(dir, "shm"), Transport: "tcp",
		DefaultTimeout: 20 * time.Second, ShutdownGrace: 5 * time.Second, MaxDescriptors: 1 << 20, Insecure: true,
	}
	cfg.TCP.Listen = "127.0.0.1:0"
	for _, m := range mutate {
		m(&cfg)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Warn, Output: testWriter{t}})
	d, err := daemon.New(cfg, log)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{d: d, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- d.Serve(ctx) }()
	n.c, err = client.Dial(d.APIAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.stop(t) })
	return n
}

func (n *node) stop(t *testing.T) {
	if n.cancel == nil {
		return
	}
	n.c.Close()
	n.cancel()
	n.cancel = nil
	select {
	case err := <-n.done:
		if err != nil {
			t.Errorf("daemon exit: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("daemon did not stop")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Logf("%s", p); return len(p), nil }

// layout places n blocks of size bytes at random, non-adjacent slots.
func layout(n int, size uint64, r *rand.Rand) (offs []uint64, regionSize uint64) {
	slot := size + 64
	perm := r.Perm(n)
	offs = make([]uint64, n)
	for i, p := range perm {
		offs[i] = uint64(p) * slot
	}
	return offs, uint64(n) * slot
}
