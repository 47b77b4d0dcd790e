package peer

import (
	"context"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// The Peer service's wire types meet the data-plane contract here: the
// transports see transport.Peer and transport.Signal, never proto messages.

// peerOf is a handshaken peer as transport kind k sees it: its advert
// for k and a Signal to the same kind on the peer.
func peerOf(addr string, k transport.Kind, hs *b2bv1.HandshakeResponse, c b2bv1.PeerClient) transport.Peer {
	p := transport.Peer{Address: addr, Node: hs.GetNodeName(), Advert: hs.GetAdverts()[string(k)]}
	if c != nil {
		p.Signal = signalOf(c, k)
	}
	return p
}

// signalOf is transport.Signal for kind k over the peer's gRPC service.
func signalOf(c b2bv1.PeerClient, k transport.Kind) transport.Signal {
	return func(ctx context.Context, payload []byte) ([]byte, error) {
		resp, err := c.Signal(ctx, &b2bv1.SignalRequest{Kind: string(k), Payload: payload})
		if err != nil {
			return nil, fromRPC(ctx, err)
		}
		return resp.GetPayload(), nil
	}
}

// fromRPC is grpcstatus.FromStatus for this daemon's own call to a peer
// under ctx. A call that ended because ctx did (its deadline passed, or it
// was cancelled) fails with ctx's error, whatever gRPC reported: the peer's
// server sees the same deadline and resets the stream, and when its reset
// arrives before our timer fires gRPC reports "stream terminated by
// RST_STREAM with error code: CANCEL" instead of "context deadline
// exceeded" (e2e TestDeadlineEveryPhase/resolve/default-timeout failed so in
// 3 of 8 runs on the loaded build machine, before this). Otherwise the
// peer's status, as a domain error.
func fromRPC(ctx context.Context, err error) error {
	err = grpcstatus.FromStatus(err)
	if err == nil {
		return nil
	}
	ce := ctx.Err()
	if ce == nil {
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			ce = context.DeadlineExceeded
		}
	}
	c := errs.Class(err)
	if ce != nil && (c == context.DeadlineExceeded || c == context.Canceled) {
		return ce
	}
	if ce == nil && c == context.Canceled {
		// Our caller did not cancel: gRPC closed the connection under the
		// call (another batch found it broken; "the client connection is
		// closing") or the peer cancelled it. Either way the path is gone,
		// which is Unavailable (a fresh connection may do), not the
		// caller's Canceled.
		return errs.Wrap(errs.ErrUnavailable, "the call was cancelled by the connection or the peer, not by its caller: "+err.Error())
	}
	return err
}

// resolvedFromProto decodes every kind's key once, at resolve time, so a
// batch's Write parses nothing. A key that does not decode is left out (the
// batch then says the region is not registered with that transport).
func resolvedFromProto(r *b2bv1.ResolveRegionResponse) Resolved {
	out := Resolved{Name: r.GetName(), Size: r.GetSize(), Keys: make(map[transport.Kind]transport.RegionKey, len(r.GetKeys())), Device: int(r.GetDevice()),
		BoundAt: boundAt(r.GetBoundAgeNs())}
	switch r.GetKind() {
	case b2bv1.MemoryKind_MEMORY_KIND_HOST:
		out.Memory = memory.Host
	case b2bv1.MemoryKind_MEMORY_KIND_CUDA:
		out.Memory = memory.CUDA
	}
	for kind, b := range r.GetKeys() {
		k, err := transport.UnmarshalRegionKey(b)
		if err != nil || kind == "" {
			continue
		}
		out.Keys[transport.Kind(kind)] = k
	}
	return out
}

// boundAt is a peer's bound age (ns; 0: not given) as a time of ours:
// now less the age, which the answer's travel only makes later.
func boundAt(ageNs uint64) time.Time {
	if ageNs == 0 || ageNs > uint64(1<<62) {
		return time.Time{}
	}
	return time.Now().Add(-time.Duration(ageNs))
}

// layoutFromProto rebuilds a peer's layout and validates it as a local one
// is (segments inside the sizes the peer gave, no overlaps), so a batch
// never trusts the peer's geometry; region names are the export names.
func layoutFromProto(r *b2bv1.ResolveLayoutResponse) (*transport.LayoutResolution, error) {
	regions := r.GetRegions()
	byName := make(map[string]Resolved, len(regions))
	segs := make([]layout.Segment, len(r.GetSegments()))
	for i, s := range r.GetSegments() {
		if int(s.GetRegion()) >= len(regions) {
			return nil, fmt.Errorf("%w: segments[%d].region = %d, but the layout has %d regions", errs.ErrInvalidArgument, i, s.GetRegion(), len(regions))
		}
		g := regions[s.GetRegion()]
		if _, ok := byName[g.GetName()]; !ok {
			byName[g.GetName()] = resolvedFromProto(&b2bv1.ResolveRegionResponse{Name: g.GetName(), Size: g.GetSize(), Keys: g.GetKeys(), Kind: g.GetKind(), Device: g.GetDevice()})
		}
		segs[i] = layout.Segment{Region: g.GetName(), Offset: s.GetOffset(), BlockLen: s.GetBlockLen(), Stride: s.GetStride(), NumBlocks: r.GetNumBlocks()}
	}
	l, err := layout.New(r.GetName(), segs, func(name string) (uint64, error) { return byName[name].Size, nil }, layout.Limits{})
	if err != nil {
		return nil, err
	}
	out := &transport.LayoutResolution{Layout: l, BoundAt: boundAt(r.GetBoundAgeNs())}
	for _, g := range l.Regions() {
		out.Regions = append(out.Regions, byName[g.Name])
	}
	return out, nil
}
