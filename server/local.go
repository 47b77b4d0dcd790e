package server

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/b2bd/b2bd/internal/checksum"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/region"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

type local struct {
	b2bv1.UnimplementedB2BServer
	s *Server
}

func (l *local) RegisterRegion(ctx context.Context, req *b2bv1.RegisterRegionRequest) (*b2bv1.RegisterRegionResponse, error) {
	who := caller(ctx)
	r, err := l.register(req, who, lease(ctx, req.GetPersist()))
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up and will never learn the ID: release it now,
		// or its memory would stay pinned until the daemon stops.
		if derr := l.s.cfg.Registry.Deregister(r.ID, who); derr != nil {
			l.s.cfg.Log.Warn("release abandoned region", "id", r.ID, "error", derr)
		}
		return nil, grpcstatus.ToStatus(fmt.Errorf("register region: caller went away: %w", err))
	}
	l.s.cfg.Log.Info("region registered", "id", r.ID, "kind", r.Mem.Kind, "bytes", r.Mem.Len, "export", r.Export, "owner", r.Owner.String(), "pid", r.PID, "persist", r.Persist)
	return &b2bv1.RegisterRegionResponse{Region: regionProto(r, 0)}, nil
}

func (l *local) register(req *b2bv1.RegisterRegionRequest, who region.Caller, lease region.Lease) (*region.Region, error) {
	reg, name := l.s.cfg.Registry, exportOf(req.GetExportName(), req.GetExportTo(), req.GetReaders(), req.GetReadOnly())
	switch src := req.GetSource().(type) {
	case *b2bv1.RegisterRegionRequest_HostAlloc:
		return reg.AllocHost(src.HostAlloc.GetSize(), name, who, lease)
	case *b2bv1.RegisterRegionRequest_HostFile:
		f := src.HostFile
		return reg.ImportHost(f.GetPath(), f.GetOffset(), f.GetSize(), name, who, lease)
	case *b2bv1.RegisterRegionRequest_CudaAlloc:
		return reg.AllocCUDA(int(src.CudaAlloc.GetDevice()), src.CudaAlloc.GetSize(), name, who, lease)
	case *b2bv1.RegisterRegionRequest_CudaIpc:
		c := src.CudaIpc
		if n := len(c.GetIpcHandle()); n != 64 {
			return nil, fmt.Errorf("%w: cuda_ipc.ipc_handle is %d bytes; a CUipcMemHandle is 64", errs.ErrInvalidArgument, n)
		}
		return reg.ImportCUDA(int(c.GetDevice()), c.GetIpcHandle(), c.GetOffset(), c.GetSize(), name, who, lease)
	default:
		return nil, fmt.Errorf("%w: source is not set: give host_alloc, host_file, cuda_alloc or cuda_ipc", errs.ErrInvalidArgument)
	}
}

func (l *local) DeregisterRegion(ctx context.Context, req *b2bv1.DeregisterRegionRequest) (*b2bv1.DeregisterRegionResponse, error) {
	if err := l.s.cfg.Registry.Deregister(req.GetRegionId(), caller(ctx)); err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.DeregisterRegionResponse{}, nil
}

func (l *local) ListRegions(ctx context.Context, req *b2bv1.ListRegionsRequest) (*b2bv1.ListRegionsResponse, error) {
	var out []*b2bv1.Region
	for _, r := range l.s.cfg.Registry.List(caller(ctx)) {
		out = append(out, regionProto(r.Region, r.Active))
	}
	return &b2bv1.ListRegionsResponse{Regions: out}, nil
}

func (l *local) ExportRegion(ctx context.Context, req *b2bv1.ExportRegionRequest) (*b2bv1.ExportRegionResponse, error) {
	r, err := l.s.cfg.Registry.SetExport(req.GetRegionId(), exportOf(req.GetExportName(), req.GetExportTo(), req.GetReaders(), req.GetReadOnly()), caller(ctx))
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.ExportRegionResponse{Region: regionProto(r, 0)}, nil
}

func (l *local) BatchTransfer(ctx context.Context, req *b2bv1.BatchTransferRequest) (*b2bv1.BatchTransferResponse, error) {
	entry := time.Now()
	res, err := l.s.batches.Transfer(ctx, transferRequest(req, caller(ctx)))
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	stamp(&res.Phases, begun(ctx, entry), entry)
	return transferResponse(res), nil
}

func (l *local) Checksum(ctx context.Context, req *b2bv1.ChecksumRequest) (*b2bv1.ChecksumResponse, error) {
	alg, algErr := checksumAlgorithm(req.GetAlgorithm())
	r, release, err := l.s.cfg.Registry.Acquire(req.GetRegionId(), "region_id", caller(ctx))
	if err == nil {
		defer release()
		err = algErr
	}
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	d := desc.Pool.Get().(*desc.Decoder)
	defer desc.Pool.Put(d)
	b, err := d.DecodeRanges(req.GetOffsets(), req.GetLengths(), req.GetBlockLength(), r.Mem.Len, l.s.cfg.MaxDescriptors)
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	digests := make([]uint64, b.N())
	src := checksum.Source{Mem: r.Mem, ID: r.ID, Path: r.ShmPath}
	if err := checksum.Region(alg, src, l.s.cfg.Staging, b.Src, b.Len, digests); err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return checksumResponse(req, alg, b, digests), nil
}

func (l *local) Status(ctx context.Context, req *b2bv1.StatusRequest) (*b2bv1.StatusResponse, error) {
	c, cfg := l.s.cfg.Counters, l.s.cfg
	persistent, holders := cfg.Registry.Leases().Counts()
	running, held := l.s.batches.Transfers().Counts()
	return &b2bv1.StatusResponse{
		TransfersInFlight: uint32(running), TransfersHeld: uint32(held),
		PersistentRegions: uint32(persistent), LeaseHolders: uint32(holders),
		Version: cfg.Version, NodeName: cfg.NodeName, PeerAddress: cfg.PeerAddress,
		Transports: transportStatuses(cfg.Transports, cfg.Live), CudaAvailable: cfg.CUDAAvailable, CudaDetail: cfg.CUDADetail, OpenFds: cfg.OpenFDs(),
		Regions: uint32(cfg.Registry.Len()), MaxDescriptors: uint32(cfg.MaxDescriptors),
		BatchesSent: c.BatchesSent.Load(), BatchesReceived: c.BatchesReceived.Load(), BatchesFailed: c.BatchesFailed.Load(),
		BytesSent: c.BytesSent.Load(), BytesReceived: c.BytesReceived.Load(),
		PeersConnected: uint32(cfg.Peers.Connected()), Goroutines: uint32(runtime.NumGoroutine()),
		Calibration: calibrationProto(cfg.Calibration),
	}, nil
}

// watchable is the ID of who's region regionID, if it may be watched: it
// must be exported, as peers notify a region by its export name (an
// unexported one would never see a note, and its watcher would wait for
// ever). Watching does not pin the region. WatchNotifications and the
// ring's watch records share it.
func (s *Server) watchable(who region.Caller, regionID string) (string, error) {
	r, release, err := s.cfg.Registry.Acquire(regionID, "region_id", who)
	if err != nil {
		return "", err
	}
	release()
	if s.cfg.Registry.ExportName(r.ID) == "" {
		return "", fmt.Errorf("%w: region_id %q is not exported, so no peer can notify it: export it (ExportRegion, or register with export_name) before watching", errs.ErrFailedPrecondition, r.ID)
	}
	return r.ID, nil
}

func (l *local) WatchNotifications(req *b2bv1.WatchNotificationsRequest, stream b2bv1.B2B_WatchNotificationsServer) error {
	id, err := l.s.watchable(caller(stream.Context()), req.GetRegionId())
	if err != nil {
		return grpcstatus.ToStatus(err)
	}
	w := l.s.cfg.Notify.Subscribe(id)
	defer l.s.cfg.Notify.Unsubscribe(w)
	// Released or unexported between the check and the subscription: the
	// hub's End came before it.
	if _, err := l.s.watchable(caller(stream.Context()), id); err != nil {
		return grpcstatus.ToStatus(err)
	}
	// Headers tell the client it is subscribed: batches after this are seen.
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case n := <-w.C:
			if err := stream.Send(notificationProto(n)); err != nil {
				return err
			}
		case <-w.Done():
			// What came before the end, then the end with its reason.
			for {
				select {
				case n := <-w.C:
					if err := stream.Send(notificationProto(n)); err != nil {
						return err
					}
					continue
				default:
				}
				return grpcstatus.ToStatus(fmt.Errorf("watch ended: %w", w.Err()))
			}
		}
	}
}
