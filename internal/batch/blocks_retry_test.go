package batch

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
)

// layoutAnswer is one resolution of the peer's layout "far": blocks of
// 4 KiB in its region "kv", or err.
type layoutAnswer struct {
	blocks uint64
	cached bool
	err    error
}

// layoutPeers is fakePeers that resolves layouts, in order (the last one
// again when they run out).
type layoutPeers struct {
	*fakePeers
	layouts             []layoutAnswer
	lresolves, lforgets int
}

func (f *layoutPeers) ResolveLayout(ctx context.Context, addr, name string, _ transport.Access) (*transport.LayoutResolution, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.layouts[min(f.lresolves, len(f.layouts)-1)]
	f.lresolves++
	if a.err != nil {
		return nil, false, a.err
	}
	l, err := layout.New(name, []layout.Segment{{Region: "kv", BlockLen: 4096, Stride: 4096, NumBlocks: a.blocks}},
		func(string) (uint64, error) { return regionSize, nil }, layout.Limits{})
	if err != nil {
		return nil, false, err
	}
	keys := map[transport.Kind]transport.RegionKey{transport.TCP: {Key: transport.RemoteKey{Key: 7}}}
	return &transport.LayoutResolution{Layout: l, Regions: []transport.Resolution{{Name: "kv", Size: regionSize, Keys: keys}}}, a.cached, nil
}

func (f *layoutPeers) ForgetLayout(addr, name string, _ transport.Access) {
	f.mu.Lock()
	f.lforgets++
	f.mu.Unlock()
}

func packIDs(ids ...uint32) []byte {
	b := make([]byte, 0, 4*len(ids))
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	return b
}

// TestBlocksRetry: block transfers retry by the policy Run's batches do:
// a resolve cut by a closing peer connection once on a fresh one, a
// geometry that a stale cached layout explains after dropping it, and a
// connection cut after that stale retry on a fresh one still.
func TestBlocksRetry(t *testing.T) {
	cut := fmt.Errorf("%w: tcp: connection reset by peer", errs.ErrAborted)
	closing := fmt.Errorf("%w: grpc: the client connection is closing", errs.ErrUnavailable)
	for _, tc := range []struct {
		name                      string
		conns                     []*fakeConn
		layouts                   []layoutAnswer
		want                      error // nil: success
		gets, lresolves, lforgets int
		broken                    int
		wrote                     []bool // per conn: written on
	}{
		{"resolve cut by a closing connection", []*fakeConn{{}, {}}, []layoutAnswer{{err: closing}, {blocks: 16}}, nil, 2, 2, 0, 1, []bool{false, true}},
		{"resolve cut twice", []*fakeConn{{}, {}, {}}, []layoutAnswer{{err: closing}, {err: closing}, {blocks: 16}}, errs.ErrUnavailable, 2, 2, 0, 2, []bool{false, false, false}},
		{"stale cached geometry", []*fakeConn{{}}, []layoutAnswer{{blocks: 2, cached: true}, {blocks: 16}}, nil, 2, 2, 1, 0, []bool{true}},
		{"geometry of a fresh resolution", []*fakeConn{{}}, []layoutAnswer{{blocks: 2}}, errs.ErrInvalidArgument, 1, 1, 0, 0, []bool{false}},
		{"stale cached geometry, then a cut", []*fakeConn{{}, {errs: []error{cut}, breaks: true}, {}},
			[]layoutAnswer{{blocks: 2, cached: true}, {blocks: 16}}, nil, 3, 3, 1, 1, []bool{false, true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := &layoutPeers{fakePeers: &fakePeers{conns: tc.conns}, layouts: tc.layouts}
			s, req := rig(t, fp.fakePeers)
			s.paths.peers = fp
			if _, err := s.layouts.Register("l", []layout.Segment{{Region: req.Src, BlockLen: 4096, Stride: 4096}}, 16, region.Export{}, req.Caller, region.Lease{}); err != nil {
				t.Fatal(err)
			}
			_, err := s.TransferBlocks(ctxT(t), BlocksRequest{Local: "l", Caller: req.Caller, Peer: req.Peer, Remote: "far",
				LocalIDs: packIDs(0, 1), RemoteIDs: packIDs(2, 5)})
			if tc.want == nil && err != nil || tc.want != nil && errs.Class(err) != tc.want {
				t.Fatalf("err = %v (%v), want %v", err, errs.Class(err), tc.want)
			}
			if fp.gets != tc.gets || fp.lresolves != tc.lresolves || fp.lforgets != tc.lforgets || fp.broken != tc.broken {
				t.Fatalf("%d gets, %d resolves, %d forgets, %d broken; want %d, %d, %d, %d", fp.gets, fp.lresolves, fp.lforgets, fp.broken, tc.gets, tc.lresolves, tc.lforgets, tc.broken)
			}
			for i, c := range tc.conns {
				if (c.writes > 0) != tc.wrote[i] {
					t.Fatalf("conn %d: %d writes", i, c.writes)
				}
			}
		})
	}
}
