package server

import (
	"context"
	"fmt"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/peer"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

type peerService struct {
	b2bv1.UnimplementedPeerServer
	s *Server
}

func (p *peerService) Handshake(ctx context.Context, req *b2bv1.HandshakeRequest) (*b2bv1.HandshakeResponse, error) {
	if v := req.GetProtocolVersion(); v != peer.ProtocolVersion {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: protocol_version %d is not supported; this daemon speaks %d", errs.ErrFailedPrecondition, v, peer.ProtocolVersion))
	}
	p.s.cfg.Log.Debug("handshake", "peer", req.GetNodeName(), "transports", req.GetTransports())
	return handshakeResponse(p.s.cfg), nil
}

func (p *peerService) ResolveRegion(ctx context.Context, req *b2bv1.ResolveRegionRequest) (*b2bv1.ResolveRegionResponse, error) {
	if req.GetName() == "" {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: name is empty", errs.ErrInvalidArgument))
	}
	// Keys are only ever handed to peers allowed to write the region.
	r, release, err := p.s.cfg.Registry.Lookup(req.GetName(), auth.PeerIdentity(ctx))
	if err != nil {
		p.s.cfg.Log.Warn("region resolution refused", "name", req.GetName(), "peer", auth.PeerIdentity(ctx), "error", err)
		return nil, grpcstatus.ToStatus(err)
	}
	defer release()
	return resolveResponse(r), nil
}

func (p *peerService) Notify(ctx context.Context, req *b2bv1.NotifyRequest) (*b2bv1.NotifyResponse, error) {
	if len(req.GetNotification()) > MaxNotification {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: notification is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(req.GetNotification()), MaxNotification))
	}
	r, release, err := p.s.cfg.Registry.Lookup(req.GetRegion(), auth.PeerIdentity(ctx))
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	release()
	n := p.s.cfg.Notify.Publish(r.ID, notificationOf(req))
	return &b2bv1.NotifyResponse{Delivered: uint32(n)}, nil
}

func (p *peerService) DisconnectVerbs(ctx context.Context, req *b2bv1.DisconnectVerbsRequest) (*b2bv1.DisconnectVerbsResponse, error) {
	if p.s.cfg.Verbs == nil {
		return nil, grpcstatus.ToStatus(errNoVerbs)
	}
	if req.GetNodeName() == "" || req.GetConnectionId() == 0 {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: node_name and connection_id must both be set", errs.ErrInvalidArgument))
	}
	return &b2bv1.DisconnectVerbsResponse{Found: p.s.cfg.Verbs.DisconnectVerbs(req.GetNodeName(), req.GetConnectionId())}, nil
}

func (p *peerService) ConnectVerbs(ctx context.Context, req *b2bv1.ConnectVerbsRequest) (*b2bv1.ConnectVerbsResponse, error) {
	if p.s.cfg.Verbs == nil {
		return nil, grpcstatus.ToStatus(errNoVerbs)
	}
	resp, err := p.s.cfg.Verbs.AcceptVerbs(ctx, peer.VerbsConnectFromProto(req))
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return peer.VerbsAcceptToProto(resp), nil
}

var errNoVerbs = fmt.Errorf("%w: this daemon has no RDMA device", errs.ErrFailedPrecondition)
