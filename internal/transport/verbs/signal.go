package verbs

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
	verbsv1 "github.com/b2bd/b2bd/proto/b2b/transport/verbs/v1"
)

// What the verbs transport says to the verbs transport of a peer: its
// advert (the RDMA devices) and the QP sets' connect and disconnect, carried
// as opaque bytes by the Peer service (adverts["verbs"], Signal) in
// proto/b2b/transport/verbs/v1. Only this package and rails read them.

// Port describes one side's RDMA port for connection set-up.
type Port struct {
	GID       []byte // 16 bytes
	GIDIndex  uint32
	LID       uint32
	ActiveMTU uint32 // bytes
	LinkLayer string
	Device    string
	// MaxDestRdAtomic: the READs this side's QPs answer at once (their
	// max_dest_rd_atomic); 0 from a peer that predates it (see rdAtomicWith).
	MaxDestRdAtomic uint32
}

// Endpoint is one QP's half of an RC connection.
type Endpoint struct {
	QPN, PSN uint32
}

// ConnectRequest is a sender's half of a verbs connection.
type ConnectRequest struct {
	Node      string // the sender's node name
	Port      Port
	ConnID    uint64
	Endpoints []Endpoint
	// Rail is the receiver's rail to connect to (its RailAdvert.Index); 0
	// when it has one.
	Rail int
}

// Accept is the receiver's half: its port, the path MTU it chose, and one
// endpoint per sender endpoint.
type Accept struct {
	Port      Port
	PathMTU   uint32 // bytes
	Endpoints []Endpoint
}

// RailAdvert is one of a daemon's RDMA devices as its advert lists it.
type RailAdvert struct {
	Index int
	Port  Port
}

// Acceptor is the receiving half of connection set-up: this package's
// Transport for one device, the rails transport over several.
type Acceptor interface {
	AcceptVerbs(ctx context.Context, req ConnectRequest) (Accept, error)
	// DisconnectVerbs drops the receiving half of a sender's connection;
	// false when there is none.
	DisconnectVerbs(node string, id uint64) bool
}

// MaxRails bounds the rail indices taken from a peer (adverts, connect
// requests); a larger index is refused by the rails transport.
const MaxRails = transport.MaxDevices

// MarshalAdvert is the handshake's verbs entry: rails lists every device
// when there are several; nil: one device, connected without naming it.
func MarshalAdvert(rails []RailAdvert) []byte {
	a := &verbsv1.Advert{}
	for _, r := range rails {
		a.Rails = append(a.Rails, &verbsv1.Rail{Rail: uint32(r.Index), Port: portToProto(r.Port)})
	}
	b, _ := proto.Marshal(a) // a well-formed message always marshals
	return b
}

// ParseAdvert reads a peer's verbs advert: its rails, nil with one device.
func ParseAdvert(b []byte) ([]RailAdvert, error) {
	var a verbsv1.Advert
	if err := proto.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("%w: verbs advert: %v", errs.ErrInvalidArgument, err)
	}
	if len(a.GetRails()) > MaxRails {
		return nil, fmt.Errorf("%w: verbs advert lists %d rails, more than %d", errs.ErrInvalidArgument, len(a.GetRails()), MaxRails)
	}
	var out []RailAdvert
	for _, r := range a.GetRails() {
		out = append(out, RailAdvert{Index: int(r.GetRail()), Port: portFromProto(r.GetPort())})
	}
	return out, nil
}

// CallConnect hands the peer our half of a connection over sig and returns
// its half.
func CallConnect(ctx context.Context, sig transport.Signal, req ConnectRequest) (Accept, error) {
	b, err := proto.Marshal(&verbsv1.Signal{Step: &verbsv1.Signal_Connect{Connect: connectToProto(req)}})
	if err != nil {
		return Accept{}, fmt.Errorf("verbs: encode connect: %w", err)
	}
	out, err := sig(ctx, b)
	if err != nil {
		return Accept{}, err
	}
	var r verbsv1.SignalReply
	if err := proto.Unmarshal(out, &r); err != nil || r.GetAccept() == nil {
		return Accept{}, fmt.Errorf("%w: verbs: the peer's answer to connect is not an accept (%v)", errs.ErrUnavailable, err)
	}
	a := r.GetAccept()
	return Accept{Port: portFromProto(a.GetPort()), PathMTU: a.GetPathMtu(), Endpoints: endpointsFromProto(a.GetEndpoints())}, nil
}

// callDisconnect asks the peer to drop the receiving half of connection id
// made by node.
func callDisconnect(ctx context.Context, sig transport.Signal, node string, id uint64) error {
	b, err := proto.Marshal(&verbsv1.Signal{Step: &verbsv1.Signal_Disconnect{Disconnect: &verbsv1.Disconnect{NodeName: node, ConnectionId: id}}})
	if err != nil {
		return fmt.Errorf("verbs: encode disconnect: %w", err)
	}
	_, err = sig(ctx, b)
	return err
}

// WithRail is sig with every connect naming the peer's rail (the rails
// transport connects each of its pairs so); disconnects pass unchanged.
func WithRail(sig transport.Signal, rail int) transport.Signal {
	return func(ctx context.Context, payload []byte) ([]byte, error) {
		var s verbsv1.Signal
		if err := proto.Unmarshal(payload, &s); err != nil {
			return nil, fmt.Errorf("verbs: decode own signal: %w", err)
		}
		if c := s.GetConnect(); c != nil {
			c.Rail = uint32(rail)
			b, err := proto.Marshal(&s)
			if err != nil {
				return nil, fmt.Errorf("verbs: encode connect: %w", err)
			}
			payload = b
		}
		return sig(ctx, payload)
	}
}

// ServeSignal answers a peer's verbs signal with a: the receiving half of
// connect and disconnect. Malformed or empty steps are InvalidArgument,
// naming the field.
func ServeSignal(ctx context.Context, payload []byte, a Acceptor) ([]byte, error) {
	var s verbsv1.Signal
	if err := proto.Unmarshal(payload, &s); err != nil {
		return nil, fmt.Errorf("%w: verbs signal: %v", errs.ErrInvalidArgument, err)
	}
	var reply verbsv1.SignalReply
	switch {
	case s.GetConnect() != nil:
		acc, err := a.AcceptVerbs(ctx, connectFromProto(s.GetConnect()))
		if err != nil {
			return nil, err
		}
		reply.Step = &verbsv1.SignalReply_Accept{Accept: &verbsv1.Accept{Port: portToProto(acc.Port), PathMtu: acc.PathMTU, Endpoints: endpointsToProto(acc.Endpoints)}}
	case s.GetDisconnect() != nil:
		d := s.GetDisconnect()
		if d.GetNodeName() == "" || d.GetConnectionId() == 0 {
			return nil, fmt.Errorf("%w: verbs disconnect: node_name %q and connection_id %d must both be set", errs.ErrInvalidArgument, d.GetNodeName(), d.GetConnectionId())
		}
		reply.Step = &verbsv1.SignalReply_Disconnected{Disconnected: &verbsv1.Disconnected{Found: a.DisconnectVerbs(d.GetNodeName(), d.GetConnectionId())}}
	default:
		return nil, fmt.Errorf("%w: verbs signal: step is not set (want connect or disconnect)", errs.ErrInvalidArgument)
	}
	b, err := proto.Marshal(&reply)
	if err != nil {
		return nil, fmt.Errorf("verbs: encode signal reply: %w", err)
	}
	return b, nil
}

func portToProto(p Port) *verbsv1.Port {
	return &verbsv1.Port{Gid: p.GID, GidIndex: p.GIDIndex, Lid: p.LID, ActiveMtu: p.ActiveMTU, LinkLayer: p.LinkLayer, Device: p.Device, MaxDestRdAtomic: p.MaxDestRdAtomic}
}

func portFromProto(p *verbsv1.Port) Port {
	return Port{GID: p.GetGid(), GIDIndex: p.GetGidIndex(), LID: p.GetLid(), ActiveMTU: p.GetActiveMtu(), LinkLayer: p.GetLinkLayer(), Device: p.GetDevice(),
		MaxDestRdAtomic: p.GetMaxDestRdAtomic()}
}

func endpointsToProto(eps []Endpoint) []*verbsv1.Endpoint {
	out := make([]*verbsv1.Endpoint, len(eps))
	for i, e := range eps {
		out[i] = &verbsv1.Endpoint{QpNum: e.QPN, Psn: e.PSN}
	}
	return out
}

func endpointsFromProto(eps []*verbsv1.Endpoint) []Endpoint {
	out := make([]Endpoint, len(eps))
	for i, e := range eps {
		out[i] = Endpoint{QPN: e.GetQpNum(), PSN: e.GetPsn()} // a missing endpoint has QP number 0: refused
	}
	return out
}

func connectToProto(r ConnectRequest) *verbsv1.Connect {
	return &verbsv1.Connect{NodeName: r.Node, Port: portToProto(r.Port), ConnectionId: r.ConnID, Endpoints: endpointsToProto(r.Endpoints), Rail: uint32(r.Rail)}
}

func connectFromProto(r *verbsv1.Connect) ConnectRequest {
	return ConnectRequest{Node: r.GetNodeName(), Port: portFromProto(r.GetPort()), ConnID: r.GetConnectionId(), Endpoints: endpointsFromProto(r.GetEndpoints()), Rail: int(min(r.GetRail(), MaxRails))}
}
