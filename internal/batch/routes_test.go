package batch

import (
	"errors"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/region"
)

// TestRoutes: a route is bound only with the fields TransferBlocks takes
// and a layout of the caller's; at most MaxPlans a caller; it is its
// owner's alone to release, and goes with its connection; a transfer on it
// runs TransferBlocks with the route's names and the ids given.
func TestRoutes(t *testing.T) {
	fp := &layoutPeers{fakePeers: &fakePeers{conns: []*fakeConn{{}}}, layouts: []layoutAnswer{{blocks: 16}}}
	s, req := rig(t, fp.fakePeers)
	s.paths.peers = fp
	s.Plans().SetMax(2)
	if _, err := s.layouts.Register("l", []layout.Segment{{Region: req.Src, BlockLen: 4096, Stride: 4096}}, 16, region.Export{}, req.Caller, region.Lease{}); err != nil {
		t.Fatal(err)
	}
	good := BlocksRequest{Local: "l", Caller: req.Caller, Peer: req.Peer, Remote: "far"}
	other := region.Caller{UID: req.Caller.UID + 1}
	for _, tc := range []struct {
		name string
		r    BlocksRequest
		err  error
		msg  string
	}{
		{"no local layout", BlocksRequest{Caller: req.Caller, Peer: "p:1", Remote: "far"}, errs.ErrInvalidArgument, "local_layout is empty"},
		{"no peer", BlocksRequest{Local: "l", Caller: req.Caller, Remote: "far"}, errs.ErrInvalidArgument, "peer is empty"},
		{"no remote layout", BlocksRequest{Local: "l", Caller: req.Caller, Peer: "p:1"}, errs.ErrInvalidArgument, "remote_layout is empty"},
		{"bad op", BlocksRequest{Local: "l", Caller: req.Caller, Peer: "p:1", Remote: "far", BadOp: errs.ErrUnimplemented}, errs.ErrUnimplemented, ""},
		{"unknown layout", BlocksRequest{Local: "nope", Caller: req.Caller, Peer: "p:1", Remote: "far"}, errs.ErrNotFound, "nope"},
		{"someone else's layout", BlocksRequest{Local: "l", Caller: other, Peer: "p:1", Remote: "far"}, errs.ErrPermissionDenied, "belongs to"},
	} {
		if _, err := s.Routes().Bind(tc.r, Owner{Caller: tc.r.Caller, Conn: 1}); !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v with %q", tc.name, err, tc.err, tc.msg)
		}
	}
	o1, o2 := Owner{Caller: req.Caller, Conn: 1}, Owner{Caller: req.Caller, Conn: 2}
	h1, err := s.Routes().Bind(good, o1)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := s.Routes().Bind(good, o2)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Routes().Bind(good, o1)
	if !errors.Is(err, errs.ErrResourceExhausted) || !strings.Contains(err.Error(), "holds 2 block routes, the limit (--max-plans) is 2") {
		t.Fatalf("third route: %v", err)
	}
	res, err := s.Routes().Transfer(ctxT(t), req.Caller, h2, packIDs(0, 1), packIDs(2, 5))
	if err != nil || res.Blocks != 2 || res.Bytes != 2*4096 {
		t.Fatalf("Routes().Transfer = %+v, %v", res, err)
	}
	if _, err := s.Routes().Transfer(ctxT(t), req.Caller, h2, packIDs(16), packIDs(0)); !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), "local_ids[0] = 16") {
		t.Fatalf("Routes().Transfer of an id out of range: %v", err)
	}
	if _, err := s.Routes().Transfer(ctxT(t), other, h2, packIDs(0), packIDs(0)); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("someone else's route: %v", err)
	}
	if err := s.Routes().Release(o2, h1); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("release of another connection's route: %v", err)
	}
	if n := s.Routes().ReleaseConn(1); n != 1 || s.Routes().Len() != 1 {
		t.Fatalf("Routes().ReleaseConn(1) = %d, %d left", n, s.Routes().Len())
	}
	if _, err := s.Routes().Transfer(ctxT(t), req.Caller, h1, packIDs(0), packIDs(0)); !errors.Is(err, errs.ErrNotFound) || !strings.Contains(err.Error(), "block route") {
		t.Fatalf("a route of a closed connection: %v", err)
	}
	if err := s.Routes().Release(o2, h2); err != nil || s.Routes().Len() != 0 {
		t.Fatalf("release: %v, %d left", err, s.Routes().Len())
	}
	if _, err := s.Routes().Bind(good, o1); err != nil { // the count went down with them
		t.Fatal(err)
	}
}
