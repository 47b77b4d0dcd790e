package client

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/ring"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestRingRecordRefusals: what the ring client refuses before posting is
// refused with a gRPC status, the code TransferBlocks or BatchTransfer
// gives the same request, and a note alone (no ids) rides in the arena
// as the record format allows.
func TestRingRecordRefusals(t *testing.T) {
	r := &Ring{arena: arena{mem: make([]byte, 4096)}}
	rt := &Route{Handle: 9}
	ids := func(n int) []uint32 { return make([]uint32, n) }
	for _, tc := range []struct {
		name          string
		local, remote []uint32
		note          []byte
		want          codes.Code
		arena         bool // OK cases: an arena record
	}{
		{"one pair inline", ids(1), ids(1), nil, codes.OK, false},
		{"a note alone", nil, nil, []byte("ready"), codes.OK, true},
		{"ids and a note", ids(2), ids(2), []byte("n"), codes.OK, true},
		{"no ids, no note", nil, nil, nil, codes.InvalidArgument, false},
		{"counts differ", ids(2), ids(1), nil, codes.InvalidArgument, false},
		{"note over 4096", ids(1), ids(1), make([]byte, ring.MaxNote+1), codes.InvalidArgument, false},
		{"larger than the arena", ids(600), ids(600), nil, codes.ResourceExhausted, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, p, err := r.blocksRecord(rt, tc.local, tc.remote, 0, blocksOpts{note: tc.note})
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code %v (%v), want %v", got, err, tc.want)
			}
			if err != nil {
				return
			}
			if (p != nil) != tc.arena || req.N != uint32(len(tc.local)) {
				t.Fatalf("arena payload %v, N %d; want arena %v, N %d", p != nil, req.N, tc.arena, len(tc.local))
			}
			if !r.carries(tc.local, tc.remote, tc.note) {
				t.Fatalf("carries: false for a request the ring takes")
			}
		})
	}
	for _, tc := range []struct {
		name string
		t    Transfer
		want codes.Code
	}{
		{"fits", Transfer{SrcRegion: "r1", Peer: "p", DstRegion: "d", Blocks: Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 8}}, codes.OK},
		{"enum and name disagree", Transfer{Transport: b2bv1.TransportKind_TRANSPORT_KIND_TCP, TransportName: "local"}, codes.InvalidArgument},
		{"note over 4096", Transfer{Notification: make([]byte, ring.MaxNote+1)}, codes.InvalidArgument},
		{"larger than the arena", Transfer{Blocks: Descriptors{Src: make([]uint64, 300), Dst: make([]uint64, 300), BlockLength: 8}}, codes.ResourceExhausted},
	} {
		t.Run("batch "+tc.name, func(t *testing.T) {
			if _, err := r.batchRecord(tc.t); status.Code(err) != tc.want {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, tc.want)
			}
		})
	}
}

// TestWarmRefusesItsTransport: Warm refuses a transport enum it cannot
// name, or one its name contradicts, before any call, InvalidArgument as
// BatchTransfer refuses them.
func TestWarmRefusesItsTransport(t *testing.T) {
	c := &Client{} // no connection: a call would panic
	for _, tr := range []Transfer{
		{Transport: 9},
		{Transport: b2bv1.TransportKind_TRANSPORT_KIND_TCP, TransportName: "local"},
	} {
		if _, err := c.Warm(context.Background(), tr); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v %q: %v, want InvalidArgument", tr.Transport, tr.TransportName, err)
		}
	}
}
