package peer

import (
	"slices"
	"testing"

	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// A peer with several RDMA devices sends one verbs key per rail: the first
// is the transport's key (what a one-rail reader takes), all of them are
// RailKeys by rail; rail indices beyond the limit are dropped.
func TestResolvedRailKeys(t *testing.T) {
	v, tc := b2bv1.TransportKind_TRANSPORT_KIND_VERBS, b2bv1.TransportKind_TRANSPORT_KIND_TCP
	cases := []struct {
		name string
		keys []*b2bv1.RegionKey
		want transport.RemoteKey
		rail []transport.RemoteKey
	}{
		{"one rail", []*b2bv1.RegionKey{{Transport: v, Key: 7, RemoteAddr: 70}, {Transport: tc, Key: 9}},
			transport.RemoteKey{Key: 7, Addr: 70}, nil},
		{"two rails", []*b2bv1.RegionKey{{Transport: v, Key: 7, RemoteAddr: 70}, {Transport: v, Key: 8, RemoteAddr: 80, Rail: 1}},
			transport.RemoteKey{Key: 7, Addr: 70}, []transport.RemoteKey{{Key: 7, Addr: 70}, {Key: 8, Addr: 80}}},
		{"rail out of range dropped", []*b2bv1.RegionKey{{Transport: v, Key: 7}, {Transport: v, Key: 8, Rail: 1 << 20}},
			transport.RemoteKey{Key: 7}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := resolvedFromProto(&b2bv1.ResolveRegionResponse{Name: "x", Keys: c.keys})
			if r.Keys[transport.Verbs] != c.want || !slices.Equal(r.RailKeys, c.rail) {
				t.Fatalf("keys %v rails %v, want %v %v", r.Keys, r.RailKeys, c.want, c.rail)
			}
		})
	}
	req := VerbsConnectFromProto(VerbsConnectToProto(transport.VerbsConnect{Node: "a", Rail: 3}))
	if req.Rail != 3 {
		t.Fatalf("ConnectVerbs rail %d after a round trip", req.Rail)
	}
}
