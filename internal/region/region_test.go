package region

import (
	"testing"
	"time"
)

// BenchmarkAllocHost measures registering a 1 GiB host region, which maps
// every page up front.
func BenchmarkAllocHost1G(b *testing.B) {
	g, err := New(Config{ShmDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		start := time.Now()
		r, err := g.AllocHost(1<<30, Export{}, Caller{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(1<<30)/time.Since(start).Seconds()/1e9, "GB/s")
		if err := g.Deregister(r.ID, Root); err != nil {
			b.Fatal(err)
		}
	}
}

// TestOwns: who may act on a region registered by whom.
func TestOwns(t *testing.T) {
	uid := func(u uint32) Caller { return Caller{UID: u, GID: u, Known: true} }
	tlsID := func(id string) Caller { return Caller{Identity: id} }
	cases := []struct {
		name       string
		owner, who Caller
		want       bool
	}{
		{"same uid", uid(1000), uid(1000), true},
		{"other uid", uid(1000), uid(1001), false},
		{"root on the socket", uid(1000), uid(0), true},
		{"root's region, other uid", uid(0), uid(1000), false},
		{"same TLS identity", tlsID("alice"), tlsID("alice"), true},
		{"other TLS identity", tlsID("alice"), tlsID("mallory"), false},
		{"root on the socket, TLS caller's region", tlsID("alice"), uid(0), true},
		{"TLS caller, socket region", uid(1000), tlsID("alice"), false},
		{"TLS caller, root's socket region", uid(0), tlsID("alice"), false},
		{"socket caller, TLS region", tlsID("alice"), uid(1000), false},
		{"unauthenticated TCP, its region", tlsID(""), tlsID(""), true},
		{"unauthenticated TCP, TLS region", tlsID("alice"), tlsID(""), false},
		{"unauthenticated TCP, socket region", uid(1000), tlsID(""), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.owner.Owns(tc.who); got != tc.want {
				t.Fatalf("%v owns, %v asks: %v, want %v", tc.owner, tc.who, got, tc.want)
			}
		})
	}
}
