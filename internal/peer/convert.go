package peer

import (
	"context"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// The Peer service's wire types meet the data-plane contract here: the
// transports see transport.Peer and transport.Signal, never proto messages.

// peerOf is a handshaken peer as the transports see it.
func peerOf(addr string, hs *b2bv1.HandshakeResponse, c b2bv1.PeerClient) transport.Peer {
	p := transport.Peer{Address: addr, Node: hs.GetNodeName(), Signal: signal{c}}
	if hs.GetTcpDataAddress() != "" {
		p.TCP = transport.TCPEndpoint{Addr: hs.GetTcpDataAddress(), Token: hs.GetSessionToken()}
	}
	if l := hs.GetLocal(); l != nil {
		p.Local = transport.LocalEndpoint{BootID: l.GetBootId(), Socket: l.GetSocket(), TokenPath: l.GetTokenPath(), TokenDigest: l.GetTokenDigest()}
	}
	for _, r := range hs.GetVerbsRails() {
		p.Rails = append(p.Rails, transport.VerbsRail{Index: int(r.GetRail()), Port: VerbsPortFromProto(r.GetPort())})
	}
	return p
}

// signal is transport.Signal over the peer's gRPC service.
type signal struct{ c b2bv1.PeerClient }

func (s signal) ConnectVerbs(ctx context.Context, req transport.VerbsConnect) (transport.VerbsAccept, error) {
	resp, err := s.c.ConnectVerbs(ctx, VerbsConnectToProto(req))
	if err != nil {
		return transport.VerbsAccept{}, fromRPC(ctx, err)
	}
	return VerbsAcceptFromProto(resp), nil
}

func (s signal) DisconnectVerbs(ctx context.Context, node string, id uint64) error {
	_, err := s.c.DisconnectVerbs(ctx, &b2bv1.DisconnectVerbsRequest{NodeName: node, ConnectionId: id})
	return fromRPC(ctx, err)
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
	if c := errs.Class(err); ce != nil && (c == context.DeadlineExceeded || c == context.Canceled) {
		return ce
	}
	return err
}

func resolvedFromProto(r *b2bv1.ResolveRegionResponse) Resolved {
	out := Resolved{Name: r.GetName(), Size: r.GetSize(), Keys: make(map[transport.Kind]transport.RemoteKey, len(r.GetKeys()))}
	var rails []transport.RemoteKey // verbs keys by rail, when the peer has several
	for _, k := range r.GetKeys() {
		kind, err := KindFromProto(k.GetTransport())
		if err != nil || kind == "" {
			continue
		}
		if _, dup := out.Keys[kind]; !dup { // the first key given for a transport wins
			out.Keys[kind] = transport.RemoteKey{Key: k.GetKey(), Addr: k.GetRemoteAddr()}
		}
		if kind == transport.Verbs && k.GetRail() < maxRails {
			for len(rails) <= int(k.GetRail()) {
				rails = append(rails, transport.RemoteKey{})
			}
			rails[k.GetRail()] = transport.RemoteKey{Key: k.GetKey(), Addr: k.GetRemoteAddr()}
		}
	}
	if len(rails) > 1 {
		out.RailKeys = rails
	}
	return out
}

// VerbsPortToProto and the functions below convert verbs connection set-up
// between the wire and the transport contract, for both halves: the sender
// here (signal), the receiver in the Peer service.
func VerbsPortToProto(p transport.VerbsPort) *b2bv1.VerbsPort {
	return &b2bv1.VerbsPort{Gid: p.GID, GidIndex: p.GIDIndex, Lid: p.LID, ActiveMtu: p.ActiveMTU, LinkLayer: p.LinkLayer, Device: p.Device}
}

func VerbsPortFromProto(p *b2bv1.VerbsPort) transport.VerbsPort {
	return transport.VerbsPort{GID: p.GetGid(), GIDIndex: p.GetGidIndex(), LID: p.GetLid(), ActiveMTU: p.GetActiveMtu(), LinkLayer: p.GetLinkLayer(), Device: p.GetDevice()}
}

func endpointsToProto(eps []transport.VerbsEndpoint) []*b2bv1.VerbsEndpoint {
	out := make([]*b2bv1.VerbsEndpoint, len(eps))
	for i, e := range eps {
		out[i] = &b2bv1.VerbsEndpoint{QpNum: e.QPN, Psn: e.PSN}
	}
	return out
}

func endpointsFromProto(eps []*b2bv1.VerbsEndpoint) []transport.VerbsEndpoint {
	out := make([]transport.VerbsEndpoint, len(eps))
	for i, e := range eps {
		out[i] = transport.VerbsEndpoint{QPN: e.GetQpNum(), PSN: e.GetPsn()} // a missing endpoint has QP number 0: refused
	}
	return out
}

func VerbsConnectToProto(r transport.VerbsConnect) *b2bv1.ConnectVerbsRequest {
	return &b2bv1.ConnectVerbsRequest{NodeName: r.Node, Port: VerbsPortToProto(r.Port), ConnectionId: r.ConnID, Endpoints: endpointsToProto(r.Endpoints), Rail: uint32(r.Rail)}
}

func VerbsConnectFromProto(r *b2bv1.ConnectVerbsRequest) transport.VerbsConnect {
	return transport.VerbsConnect{Node: r.GetNodeName(), Port: VerbsPortFromProto(r.GetPort()), ConnID: r.GetConnectionId(), Endpoints: endpointsFromProto(r.GetEndpoints()), Rail: int(min(r.GetRail(), maxRails))}
}

// maxRails bounds the rail indices taken from a peer (keys, connect
// requests); a larger index is refused by the rails transport.
const maxRails = 64

// VerbsRailsToProto lists rails for the handshake.
func VerbsRailsToProto(rs []transport.VerbsRail) []*b2bv1.VerbsRail {
	var out []*b2bv1.VerbsRail
	for _, r := range rs {
		out = append(out, &b2bv1.VerbsRail{Rail: uint32(r.Index), Port: VerbsPortToProto(r.Port)})
	}
	return out
}

func VerbsAcceptToProto(r transport.VerbsAccept) *b2bv1.ConnectVerbsResponse {
	return &b2bv1.ConnectVerbsResponse{Port: VerbsPortToProto(r.Port), PathMtu: r.PathMTU, Endpoints: endpointsToProto(r.Endpoints)}
}

func VerbsAcceptFromProto(r *b2bv1.ConnectVerbsResponse) transport.VerbsAccept {
	return transport.VerbsAccept{Port: VerbsPortFromProto(r.GetPort()), PathMTU: r.GetPathMtu(), Endpoints: endpointsFromProto(r.GetEndpoints())}
}
