package server

import (
	"context"
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/region"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// LocalSender is the sender a notification given by NotifyRegion carries.
const LocalSender = "local"

// NotifyRegion delivers a notification to one of the caller's regions.
func (l *local) NotifyRegion(ctx context.Context, req *b2bv1.NotifyRegionRequest) (*b2bv1.NotifyRegionResponse, error) {
	n, err := l.s.notifyRegion(caller(ctx), req.GetRegionId(), req.GetNotification())
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.NotifyRegionResponse{Delivered: uint32(n)}, nil
}

// notifyRegion is NotifyRegion for the RPC and the ring: the region must be
// who's; its watchers get the note as a peer's (sender LocalSender), and a
// key note fires the transfers armed on its keys there.
func (s *Server) notifyRegion(who region.Caller, regionID string, note []byte) (int, error) {
	if len(note) == 0 || len(note) > MaxNotification {
		return 0, fmt.Errorf("%w: notification is %d bytes: want 1 to %d", errs.ErrInvalidArgument, len(note), MaxNotification)
	}
	r, release, err := s.cfg.Registry.Acquire(regionID, "region_id", who)
	if err != nil {
		return 0, err
	}
	release() // a note does not pin the region
	return s.cfg.Notify.Publish(r.ID, notify.Notification{Region: s.cfg.Registry.ExportName(r.ID), Sender: LocalSender,
		Notification: note}), nil
}
