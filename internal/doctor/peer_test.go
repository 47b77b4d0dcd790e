package doctor

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/daemon"
	"github.com/b2bd/b2bd/internal/testca"
)

type node struct {
	d    *daemon.Daemon
	sock string
}

func startNode(t *testing.T, name string, tlsFrom *testca.CA) *node {
	t.Helper()
	dir := t.TempDir()
	cfg := daemon.Config{
		NodeName: name, Socket: filepath.Join(dir, "b2bd.sock"), SocketMode: "0660",
		PeerListen: "127.0.0.1:0", ShmDir: filepath.Join(dir, "shm"), Transport: "tcp",
		DefaultTimeout: 20 * time.Second, ShutdownGrace: 5 * time.Second, MaxDescriptors: 1 << 20, Insecure: true,
	}
	cfg.KindFlags = map[string]string{"data-listen": "127.0.0.1:0"}
	if tlsFrom != nil {
		cfg.Insecure = false
		cfg.TLSCert, cfg.TLSKey = tlsFrom.Issue(t, name)
		cfg.TLSCA = tlsFrom.PEM
	}
	d, err := daemon.New(cfg, hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Error, Output: os.Stderr}))
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
	return &node{d: d, sock: cfg.Socket}
}

type want struct {
	status Status
	detail string
}

func checkPeer(t *testing.T, rs []Result, wants map[string]want) {
	t.Helper()
	if len(rs) != 4 {
		t.Fatalf("%d results, want 4: %+v", len(rs), rs)
	}
	for _, r := range rs {
		_, suffix, _ := strings.Cut(r.Check, " ")
		_, suffix, _ = strings.Cut(suffix, " ")
		w, ok := wants[suffix]
		if !ok {
			t.Errorf("unexpected check %q", r.Check)
			continue
		}
		if r.Status != w.status || !strings.Contains(r.Detail, w.detail) {
			t.Errorf("%s: %s %q, want %s with %q", r.Check, r.Status, r.Detail, w.status, w.detail)
		}
		if r.Status != Pass && r.Fix == "" {
			t.Errorf("%s: %s without a fix", r.Check, r.Status)
		}
	}
}

func TestPeerInsecure(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	ctx := context.Background()
	base := PeerOptions{Addr: b.d.PeerAddr(), Insecure: true, Socket: a.sock}
	reach := want{Pass, "TCP connect in"}
	tlsW := want{Warn, "plaintext (--insecure) on loopback"}
	tr := want{Warn, `peer "b" (protocol 2) offers tcp`}

	o := base
	o.PeerAPI = b.sock
	checkPeer(t, Peer(ctx, o), map[string]want{"reachable": reach, "tls": tlsW, "transports": tr,
		"round-trip": {Pass, "16 blocks x 4096 B over tcp"}})
	// The scratch region is gone again from both daemons.
	for _, s := range []string{a.sock, b.sock} {
		c, err := client.Dial(s)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := c.Regions(ctx)
		c.Close()
		if err != nil || len(rs) != 0 {
			t.Errorf("%s: regions left behind: %v %v", s, rs, err)
		}
	}

	checkPeer(t, Peer(ctx, base), map[string]want{"reachable": reach, "tls": tlsW, "transports": tr,
		"round-trip": {Warn, "not run: the peer exports nothing this check may write"}})

	o = base
	o.PeerExport = "nope"
	checkPeer(t, Peer(ctx, o), map[string]want{"reachable": reach, "tls": tlsW, "transports": tr,
		"round-trip": {Warn, `the peer has no usable export "nope"`}})

	cb, err := client.Dial(b.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	small, err := cb.RegisterHost(ctx, 4096, "small")
	if err != nil {
		t.Fatal(err)
	}
	defer small.Unmap()
	o.PeerExport = "small"
	checkPeer(t, Peer(ctx, o), map[string]want{"reachable": reach, "tls": tlsW, "transports": tr,
		"round-trip": {Warn, `transfer into "small" refused`}})
	big, err := cb.RegisterHost(ctx, RoundTripBytes, "scratch")
	if err != nil {
		t.Fatal(err)
	}
	defer big.Unmap()
	o.PeerExport = "scratch"
	checkPeer(t, Peer(ctx, o), map[string]want{"reachable": reach, "tls": tlsW, "transports": tr,
		"round-trip": {Warn, "acknowledged by the peer; contents not compared"}})
	// The bytes did land (block i at the mirrored slot).
	src := big.Bytes[(RoundTripBlocks-1)*RoundTripBlock:]
	allZero := true
	for _, x := range src[:RoundTripBlock] {
		allZero = allZero && x == 0
	}
	if allZero {
		t.Error("round trip into the export left it zero")
	}

	o = base
	o.Socket = filepath.Join(t.TempDir(), "none.sock")
	checkPeer(t, Peer(ctx, o), map[string]want{"reachable": reach, "tls": tlsW, "transports": tr,
		"round-trip": {Warn, "not run: local daemon at"}})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	o = base
	o.Addr = dead
	checkPeer(t, Peer(ctx, o), map[string]want{"reachable": {Fail, "connection refused"}, "tls": {Fail, "unreachable"},
		"transports": {Fail, "unreachable"}, "round-trip": {Fail, "unreachable"}})
}

func TestPeerTLS(t *testing.T) {
	good := testca.New(t, "test CA")
	a, b := startNode(t, "a", good), startNode(t, "b", good)
	ctx := context.Background()
	cert, key := good.Issue(t, "doctor")
	pt, err := auth.LoadPeerTLS(cert, key, good.PEM)
	if err != nil {
		t.Fatal(err)
	}
	o := PeerOptions{Addr: b.d.PeerAddr(), TLS: pt, Socket: a.sock, PeerAPI: b.sock}
	checkPeer(t, Peer(ctx, o), map[string]want{"reachable": {Pass, "TCP"}, "tls": {Pass, `peer certificate "b" trusted`},
		"transports": {Warn, "offers tcp"}, "round-trip": {Pass, "per-block checksums match"}})

	other := testca.New(t, "test CA")
	cert, key = other.Issue(t, "stranger")
	pt2, err := auth.LoadPeerTLS(cert, key, other.PEM)
	if err != nil {
		t.Fatal(err)
	}
	o.TLS = pt2
	rs := Peer(ctx, o)
	checkPeer(t, rs, map[string]want{"reachable": {Pass, "TCP"}, "tls": {Fail, "TLS handshake failed"},
		"transports": {Fail, "TLS handshake failed"}, "round-trip": {Fail, "no handshake"}})
	if !strings.Contains(rs[1].Fix, "CA") {
		t.Errorf("tls fix %q does not mention the CA", rs[1].Fix)
	}

	o.TLS = nil
	checkPeer(t, Peer(ctx, o), map[string]want{"reachable": {Pass, "TCP"}, "tls": {Warn, "no TLS flags"},
		"transports": {Warn, "no credentials"}, "round-trip": {Warn, "no handshake"}})
}
