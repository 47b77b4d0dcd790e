package server

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/peer"
	"github.com/b2bd/b2bd/internal/transport"
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
	p.s.cfg.Log.Debug("handshake", "peer", req.GetNodeName(), "transports", req.GetKinds())
	return handshakeResponse(p.s.cfg), nil
}

func (p *peerService) ResolveRegion(ctx context.Context, req *b2bv1.ResolveRegionRequest) (*b2bv1.ResolveRegionResponse, error) {
	if req.GetName() == "" {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: name is empty", errs.ErrInvalidArgument))
	}
	a, err := accessOf(req.GetAccess())
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	// Keys are only ever handed to peers granted the access they ask for,
	// and only that access's key.
	r, release, err := p.s.cfg.Registry.LookupFor(req.GetName(), auth.PeerIdentity(ctx), a)
	if err != nil {
		p.s.cfg.Log.Warn("region resolution refused", "name", req.GetName(), "peer", auth.PeerIdentity(ctx), "access", a, "error", err)
		return nil, grpcstatus.ToStatus(err)
	}
	defer release()
	return resolveResponse(p.s.cfg.Registry, r, a), nil
}

// HoldRegion is ResolveRegion for one batch: the region stays held from
// the answer until the caller ends its side of the stream (the batch's last
// byte was acknowledged) or the stream ends (its deadline, cancel or
// connection). A deregistration in between is refused with
// FailedPrecondition: the receiving side of every transport pins the
// region only when the batch's first frame (or metadata) arrives, and
// without this hold the region could go between the answer and then.
func (p *peerService) HoldRegion(stream b2bv1.Peer_HoldRegionServer) error {
	ctx := stream.Context()
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	if req.GetName() == "" {
		return grpcstatus.ToStatus(fmt.Errorf("%w: name is empty", errs.ErrInvalidArgument))
	}
	a, err := accessOf(req.GetAccess())
	if err != nil {
		return grpcstatus.ToStatus(err)
	}
	r, release, err := p.s.cfg.Registry.LookupFor(req.GetName(), auth.PeerIdentity(ctx), a)
	if err != nil {
		p.s.cfg.Log.Warn("region resolution refused", "name", req.GetName(), "peer", auth.PeerIdentity(ctx), "access", a, "error", err)
		return grpcstatus.ToStatus(err)
	}
	defer release()
	if err := stream.Send(resolveResponse(p.s.cfg.Registry, r, a)); err != nil {
		return err
	}
	// One request per stream: the next thing from the caller is its end.
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		if err == nil {
			return grpcstatus.ToStatus(fmt.Errorf("%w: HoldRegion takes one request; a second came for %q", errs.ErrInvalidArgument, req.GetName()))
		}
		return err
	}
	return nil
}

func (p *peerService) Notify(ctx context.Context, req *b2bv1.NotifyRequest) (*b2bv1.NotifyResponse, error) {
	if len(req.GetNotification()) > MaxNotification {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: notification is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(req.GetNotification()), MaxNotification))
	}
	// A writer notifies after its batch landed, a reader after its pull
	// (the owner may reuse the blocks): either grant may notify.
	r, release, err := p.s.cfg.Registry.Lookup(req.GetRegion(), auth.PeerIdentity(ctx))
	if err != nil {
		var rerr error
		if r, release, rerr = p.s.cfg.Registry.LookupFor(req.GetRegion(), auth.PeerIdentity(ctx), transport.AccessRead); rerr != nil {
			return nil, grpcstatus.ToStatus(err)
		}
	}
	release()
	n := p.s.cfg.Notify.Publish(r.ID, notificationOf(req))
	return &b2bv1.NotifyResponse{Delivered: uint32(n)}, nil
}

// NotifyStream is Notify for every note of one peer, answered in order on
// the stream (peer.Manager keeps one open per peer). It ends when the peer
// closes it, or when the daemon drains (Drain): a stream the peer keeps
// open must not hold the peer server's graceful stop for its grace period.
func (p *peerService) NotifyStream(stream b2bv1.Peer_NotifyStreamServer) error {
	ctx := stream.Context()
	answers := make(chan *b2bv1.NotifyResponse)
	errc := make(chan error, 1)
	go func() { // Recv cannot be selected on; it ends with the stream
		for {
			req, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			// Delivered here, as it is read: a key note fires the armed
			// transfers without a hand-off to the sending goroutine first.
			out := p.notifyAnswer(ctx, req)
			select {
			case answers <- out:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-p.s.drain:
			return nil
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case out := <-answers:
			if err := stream.Send(out); err != nil {
				return err
			}
		}
	}
}

// notifyAnswer delivers req as Notify does and says how, for its stream.
func (p *peerService) notifyAnswer(ctx context.Context, req *b2bv1.NotifyRequest) *b2bv1.NotifyResponse {
	out := &b2bv1.NotifyResponse{Seq: req.GetSeq()}
	resp, err := p.Notify(ctx, req)
	if err != nil {
		st := status.Convert(err)
		out.Code, out.Message = uint32(st.Code()), st.Message()
	} else {
		out.Delivered = resp.GetDelivered()
	}
	return out
}

// Signal hands a peer's set-up message to the same kind here, which alone
// reads it (verbs: a QP set's connect or disconnect).
func (p *peerService) Signal(ctx context.Context, req *b2bv1.SignalRequest) (*b2bv1.SignalResponse, error) {
	if n := len(req.GetKind()); n > maxKindName {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: kind is %d bytes, over the limit of %d", errs.ErrInvalidArgument, n, maxKindName))
	}
	h, ok := p.s.cfg.Signals[transport.Kind(req.GetKind())]
	if !ok {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: kind %q: this daemon runs no transport of that kind that takes signals", errs.ErrFailedPrecondition, req.GetKind()))
	}
	out, err := h.HandleSignal(ctx, req.GetPayload())
	if errors.Is(err, errs.ErrUnimplemented) {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: kind %q: this daemon runs no transport of that kind that takes signals", errs.ErrFailedPrecondition, req.GetKind()))
	}
	if err != nil {
		p.s.cfg.Log.Debug("peer signal refused", "kind", req.GetKind(), "peer", auth.PeerIdentity(ctx), "error", err)
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.SignalResponse{Payload: out}, nil
}

// maxKindName bounds a kind named by a peer (Signal), so a refusal never
// echoes more.
const maxKindName = 64
