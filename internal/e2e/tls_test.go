package e2e

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/daemon"
	"github.com/b2bd/b2bd/internal/testca"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

func withTLS(t *testing.T, ca *testca.CA, identity string) func(*daemon.Config) {
	cert, key := ca.Issue(t, identity)
	return func(c *daemon.Config) {
		c.Insecure, c.TLSCert, c.TLSKey, c.TLSCA = false, cert, key, ca.PEM
	}
}

// TestTrust: mutual TLS between daemons, per-region export ACLs, and the
// refusals a demanding operator expects.
func TestTrust(t *testing.T) {
	ca, rogue := testca.New(t, "b2bd test CA"), testca.New(t, "rogue CA")
	a := startNode(t, "a", withTLS(t, ca, "a"))
	b := startNode(t, "b", withTLS(t, ca, "b"))
	c := startNode(t, "c", withTLS(t, ca, "c"))
	m := startNode(t, "mallory", withTLS(t, rogue, "mallory"))
	plain := startNode(t, "plain")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const n, size = 500, 4096
	dst, err := b.c.RegisterHost(ctx, n*size, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.API().ExportRegion(ctx, &b2bv1.ExportRegionRequest{RegionId: dst.Id, ExportName: "only-a", ExportTo: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.RegisterHost(ctx, n*size, "anyone"); err != nil {
		t.Fatal(err)
	}
	offs := strided(n, size)
	send := func(from *node, region string) error {
		src, err := from.c.RegisterHost(ctx, n*size, "")
		if err != nil {
			t.Fatal(err)
		}
		defer src.Unmap()
		fill(src.Bytes, func(i int) byte { return byte(i*31) ^ from.d.PeerAddr()[10] })
		_, err = transfer(ctx, from.c, src.Id, b.d.PeerAddr(), region, offs, offs, size)
		if err == nil && region == "only-a" && string(src.Bytes) != string(dst.Bytes) {
			t.Fatalf("%s: transfer succeeded but data differs", region)
		}
		return err
	}
	cases := []struct {
		name string
		from *node
		dst  string
		code codes.Code
		msg  string
	}{
		{"allowed peer over mTLS", a, "only-a", codes.OK, ""},
		{"authenticated peer not in export_to", c, "only-a", codes.PermissionDenied, `c may not write region "only-a" (exported to [a])`},
		{"any authenticated peer", c, "anyone", codes.OK, ""},
		{"certificate from another CA", m, "anyone", codes.Unavailable, "handshake"},
		{"plaintext peer to an mTLS daemon", plain, "anyone", codes.Unavailable, "handshake"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := send(tc.from, tc.dst)
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
}

// TestStartupSecurity: a daemon refuses to start without peer
// authentication, or with plaintext on an address other than loopback.
func TestStartupSecurity(t *testing.T) {
	ca := testca.New(t, "ca")
	cert, key := ca.Issue(t, "x")
	base := func() daemon.Config {
		dir := t.TempDir()
		c := daemon.Config{Socket: filepath.Join(dir, "s"), SocketMode: "0660", PeerListen: "127.0.0.1:0", ShmDir: filepath.Join(dir, "shm"), Transport: "tcp"}
		c.KindFlags = map[string]string{"data-listen": "127.0.0.1:0"}
		return c
	}
	cases := []struct {
		name string
		mut  func(*daemon.Config)
		msg  string
	}{
		{"no authentication chosen", func(c *daemon.Config) {}, "daemons must authenticate each other"},
		{"insecure on all interfaces", func(c *daemon.Config) { c.Insecure, c.PeerListen = true, ":0" }, `--peer-listen ":0" is not a loopback address`},
		{"insecure data plane off loopback", func(c *daemon.Config) { c.Insecure, c.KindFlags["data-listen"] = true, "0.0.0.0:0" }, `--data-listen "0.0.0.0:0" is not a loopback address`},
		{"insecure and tls", func(c *daemon.Config) { c.Insecure, c.TLSCert = true, cert }, "exclusive"},
		{"half the tls flags", func(c *daemon.Config) { c.TLSCert, c.TLSKey = cert, key }, "give all three"},
		{"bad ca file", func(c *daemon.Config) { c.TLSCert, c.TLSKey, c.TLSCA = cert, key, key }, "holds no PEM certificate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mut(&c)
			d, err := daemon.New(c, hclog.NewNullLogger())
			if err == nil {
				t.Fatalf("daemon started; want an error containing %q", tc.msg)
			}
			_ = d
			if !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %q", err, tc.msg)
			}
		})
	}
}

// TestRemoteAPIOverTLS: a daemon's local API served off loopback takes
// mutual TLS, and a gRPC client with a peer certificate gets through (ALPN
// included); one without is refused.
func TestRemoteAPIOverTLS(t *testing.T) {
	ca := testca.New(t, "ca")
	n := startNode(t, "api", withTLS(t, ca, "api"), func(c *daemon.Config) { c.APIListen = "0.0.0.0:0" })
	_ = n
	cert, key := ca.Issue(t, "client")
	tl, err := auth.LoadPeerTLS(cert, key, ca.PEM)
	if err != nil {
		t.Fatal(err)
	}
	addr := n.d.APITCPAddr()
	_, port, _ := net.SplitHostPort(addr)
	target := net.JoinHostPort("127.0.0.1", port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(target, grpc.WithTransportCredentials(credentials.NewTLS(tl.Client)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Status(ctx); err != nil {
		t.Fatalf("status over mutual TLS: %v", err)
	}
	plain, err := client.Dial(target)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.Status(ctx); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext client got %v, want Unavailable", err)
	}
}
