package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// regionPair is the run's source and destination regions.
type regionPair struct {
	bytes     uint64
	src       sourceMemory
	dstID     string
	dstExport string
	dstKind   b2bv1.MemoryKind
	dstRegion *b2bv1.Region
}

// RegionBytesFor is the region size every planned size fits in: its
// blocks' slots laid end to end.
func RegionBytesFor(plans []SizePlan) uint64 {
	var most uint64
	for _, p := range plans {
		most = max(most, SlotBytes(p.BlockBytes)*uint64(p.Blocks))
	}
	return max(most, 4096)
}

// release unmaps and deregisters both regions.
func (s *regionPair) release(ctx context.Context, eps *endpoints) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var errs []error
	if s.src != nil {
		if err := s.src.Release(); err != nil {
			errs = append(errs, fmt.Errorf("unmap the source region: %w", err))
		}
		if err := eps.src.Deregister(ctx, s.src.ID()); err != nil {
			errs = append(errs, fmt.Errorf("deregister the source region %s: %w", s.src.ID(), err))
		}
	}
	if s.dstID != "" {
		if err := eps.dst.Deregister(ctx, s.dstID); err != nil {
			errs = append(errs, fmt.Errorf("deregister the destination region %s: %w", s.dstID, err))
		}
	}
	return errors.Join(errs...)
}

// allocate registers the source region (mapped or opened here, to fill it)
// and the destination region (exported for the source daemon, never mapped
// here: in two-host mode it is on another machine).
func (r *runner) allocate(ctx context.Context, eps *endpoints, bytes uint64, export string) (*regionPair, error) {
	s := &regionPair{bytes: bytes}
	srcReq := &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: bytes}}}
	dstReq := &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: bytes}}, ExportName: export}
	if slices.Contains(r.cfg.ops(), OpRead) {
		// Reads pull from it: every peer may read (the source daemon's
		// identity is not known here in two-host mode).
		dstReq.Readers = []string{"*"}
	}
	if r.cuda != nil {
		srcReq.Source = &b2bv1.RegisterRegionRequest_CudaAlloc{CudaAlloc: &b2bv1.CudaAlloc{Device: int32(r.cfg.SrcDevice), Size: bytes}}
		dstReq.Source = &b2bv1.RegisterRegionRequest_CudaAlloc{CudaAlloc: &b2bv1.CudaAlloc{Device: int32(r.cfg.DstDevice), Size: bytes}}
	}
	resp, err := eps.src.API().RegisterRegion(ctx, srcReq)
	if err != nil {
		return nil, fmt.Errorf("source region of %s: %w", formatGiB(bytes), err)
	}
	if r.cuda != nil {
		s.src, err = openCUDASource(r.cuda, resp.GetRegion())
	} else {
		var h *client.HostRegion
		h, err = eps.src.MapHostRegion(ctx, resp.GetRegion())
		if err == nil {
			s.src = hostSource{h}
		}
	}
	if err != nil {
		_ = eps.src.Deregister(context.WithoutCancel(ctx), resp.GetRegion().GetId())
		return nil, fmt.Errorf("source region of %s: %w (the bench must run on the source daemon's host)", formatGiB(bytes), err)
	}
	dresp, err := eps.dst.API().RegisterRegion(ctx, dstReq)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("destination region of %s: %w", formatGiB(bytes), err), s.release(ctx, eps))
	}
	s.dstID, s.dstExport, s.dstKind = dresp.GetRegion().GetId(), export, dresp.GetRegion().GetKind()
	s.dstRegion = dresp.GetRegion()
	return s, nil
}
