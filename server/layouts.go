package server

import (
	"context"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/layout"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// maxTransferTimeout bounds TransferBlocks' timeout_ms.
const maxTransferTimeout = time.Hour

func (l *local) RegisterLayout(ctx context.Context, req *b2bv1.RegisterLayoutRequest) (*b2bv1.RegisterLayoutResponse, error) {
	segs := make([]layout.Segment, len(req.GetSegments()))
	for i, s := range req.GetSegments() {
		segs[i] = layout.Segment{Region: s.GetRegionId(), Offset: s.GetOffset(), BlockLen: s.GetBlockLen(), Stride: s.GetStride()}
	}
	e, err := l.s.batches.Layouts().Register(req.GetName(), segs, req.GetNumBlocks(), exportOf(req.GetExportName(), req.GetExportTo(), req.GetReaders(), req.GetReadOnly()), caller(ctx), lease(ctx, req.GetPersist()))
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	l.s.cfg.Log.Info("layout registered", "name", e.Name, "segments", len(e.Segments), "num_blocks", e.NumBlocks, "export", e.Export)
	return &b2bv1.RegisterLayoutResponse{Layout: layoutProto(e)}, nil
}

func (l *local) DeregisterLayout(ctx context.Context, req *b2bv1.DeregisterLayoutRequest) (*b2bv1.DeregisterLayoutResponse, error) {
	if err := l.s.batches.Layouts().Deregister(req.GetName(), caller(ctx)); err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.DeregisterLayoutResponse{}, nil
}

func (l *local) ListLayouts(ctx context.Context, req *b2bv1.ListLayoutsRequest) (*b2bv1.ListLayoutsResponse, error) {
	var out []*b2bv1.Layout
	for _, e := range l.s.batches.Layouts().List(caller(ctx)) {
		out = append(out, layoutProto(e))
	}
	return &b2bv1.ListLayoutsResponse{Layouts: out}, nil
}

func (l *local) TransferBlocks(ctx context.Context, req *b2bv1.TransferBlocksRequest) (*b2bv1.BatchTransferResponse, error) {
	entry := time.Now()
	r, timeout, err := blocksRequest(ctx, req)
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	res, err := l.s.batches.TransferBlocks(ctx, r)
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	stamp(&res.Phases, begun(ctx, entry), entry)
	return transferResponse(res), nil
}

// BindBlockRoute binds what a TransferBlocks names besides its ids, for the
// ring's block records; the route is this connection's.
func (l *local) BindBlockRoute(ctx context.Context, req *b2bv1.BindBlockRouteRequest) (*b2bv1.BindBlockRouteResponse, error) {
	r := batch.BlocksRequest{Local: req.GetLocalLayout(), Caller: caller(ctx), Peer: req.GetPeer(), Remote: req.GetRemoteLayout()}
	r.Transport, r.BadTransport = kindOf(req.GetTransport(), req.GetTransportName())
	r.Op, r.BadOp = opOf(req.GetOp())
	h, err := l.s.batches.Routes().Bind(r, owner(ctx))
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.BindBlockRouteResponse{Handle: h}, nil
}

func (l *local) ReleaseBlockRoute(ctx context.Context, req *b2bv1.ReleaseBlockRouteRequest) (*b2bv1.ReleaseBlockRouteResponse, error) {
	if err := l.s.batches.Routes().Release(owner(ctx), req.GetHandle()); err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.ReleaseBlockRouteResponse{}, nil
}

// blocksRequest converts req; timeout is its timeout_ms (0: none).
func blocksRequest(ctx context.Context, req *b2bv1.TransferBlocksRequest) (batch.BlocksRequest, time.Duration, error) {
	timeout, err := timeoutMs("timeout_ms", req.GetTimeoutMs())
	if err != nil {
		return batch.BlocksRequest{}, 0, err
	}
	r := batch.BlocksRequest{Local: req.GetLocalLayout(), Caller: caller(ctx), Peer: req.GetPeer(), Remote: req.GetRemoteLayout(),
		LocalIDs: req.GetLocalIds(), RemoteIDs: req.GetRemoteIds(), Notification: req.GetNotification()}
	r.Transport, r.BadTransport = kindOf(req.GetTransport(), req.GetTransportName())
	r.Op, r.BadOp = opOf(req.GetOp())
	return r, timeout, nil
}

// ResolveLayout hands a peer allowed to write the layout its segments and
// its regions' keys. Each region must itself be exported to the peer: the
// receiving side writes only exported regions, and keys go only to peers
// allowed to write them.
func (p *peerService) ResolveLayout(ctx context.Context, req *b2bv1.ResolveLayoutRequest) (*b2bv1.ResolveLayoutResponse, error) {
	if req.GetName() == "" {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: name is empty", errs.ErrInvalidArgument))
	}
	who := auth.PeerIdentity(ctx)
	a, err := accessOf(req.GetAccess())
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	e, err := p.s.batches.Layouts().LookupFor(req.GetName(), who, a)
	if err != nil {
		p.s.cfg.Log.Warn("layout resolution refused", "name", req.GetName(), "peer", who, "error", err)
		return nil, grpcstatus.ToStatus(err)
	}
	resp := &b2bv1.ResolveLayoutResponse{Name: e.Export, NumBlocks: e.NumBlocks, BoundAgeNs: ageNs(e.Created)}
	for i, r := range e.Regions() {
		name := p.s.cfg.Registry.ExportName(r.ID)
		if name == "" {
			return nil, grpcstatus.ToStatus(fmt.Errorf("%w: layout %q: segment %d's region is not exported: peers write only exported regions", errs.ErrFailedPrecondition, req.GetName(), firstSegment(e, i)))
		}
		reg, release, err := p.s.cfg.Registry.LookupFor(name, who, a)
		if err != nil {
			return nil, grpcstatus.ToStatus(fmt.Errorf("layout %q: segment %d's region: %w", req.GetName(), firstSegment(e, i), err))
		}
		rr := resolveResponse(p.s.cfg.Registry, reg, a)
		release()
		if age := rr.GetBoundAgeNs(); age != 0 && age < resp.BoundAgeNs { // the youngest binding
			resp.BoundAgeNs = age
		}
		resp.Regions = append(resp.Regions, &b2bv1.ResolvedLayoutRegion{Name: rr.GetName(), Size: rr.GetSize(), Keys: rr.GetKeys(), Kind: rr.GetKind(), Device: rr.GetDevice()})
	}
	for i := 0; i < e.Layout.NumSegments(); i++ {
		s := e.Layout.Segment(i)
		resp.Segments = append(resp.Segments, &b2bv1.ResolvedSegment{Region: e.Layout.Template(i).Region, Offset: s.Offset, BlockLen: s.BlockLen, Stride: s.Stride})
	}
	return resp, nil
}

// firstSegment is the first segment of e in its region index ri.
func firstSegment(e *batch.Entry, ri int) int {
	for i := 0; i < e.Layout.NumSegments(); i++ {
		if int(e.Layout.Template(i).Region) == ri {
			return i
		}
	}
	return -1
}

func layoutProto(e *batch.Entry) *b2bv1.Layout {
	out := &b2bv1.Layout{Name: e.Name, NumBlocks: e.NumBlocks, ExportName: e.Export, ExportTo: e.ExportTo, Readers: e.Readers, ReadOnly: e.ReadOnly, Persist: e.Lease.Client == 0}
	for _, s := range e.Segments {
		out.Segments = append(out.Segments, &b2bv1.LayoutSegment{RegionId: s.Region, Offset: s.Offset, BlockLen: s.BlockLen, Stride: s.Stride})
	}
	return out
}
