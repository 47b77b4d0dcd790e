// Package peer keeps the daemon's connections to other daemons: one gRPC
// control connection per peer address (handshake done once) and one data-path
// connection per transport, rebuilt after a failure.
package peer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// ProtocolVersion is the peer protocol spoken by this build.
const ProtocolVersion = 1

// Manager owns the connections to peers.
type Manager struct {
	self       *b2bv1.HandshakeRequest
	transports map[transport.Kind]transport.Transport
	dialOpts   []grpc.DialOption
	log        hclog.Logger
	// loopbackOnly: plaintext (--insecure) may only reach loopback peers.
	loopbackOnly bool

	mu     sync.Mutex
	closed bool
	peers  map[string]*state
}

type state struct {
	addr   string
	mu     sync.Mutex // serialises (re)connecting
	cc     *grpc.ClientConn
	client b2bv1.PeerClient
	hs     *b2bv1.HandshakeResponse
	// instance is the peer's instance ID from its last handshake, kept
	// when hs is dropped: prepared plans compare it to the one they were
	// made under to notice a restarted peer without a round trip.
	instance atomic.Uint64
	conns    map[transport.Kind]transport.Conn
	// resolved caches region resolutions; cleared whenever the peer may have
	// changed (new handshake, broken connection, refused key).
	resolved map[string]resolution
}

// resolution is a cached ResolveRegion answer.
type resolution struct {
	r  Resolved
	at time.Time
}

// Resolved is a peer's export name resolved: its size and its key with each
// transport it is registered with.
type Resolved = transport.Resolution

// resolveTTL bounds how long a resolution is reused: within it a batch pays
// no resolve round trip; after it an un-exported or re-permissioned region is
// noticed even on transports whose keys the receiver cannot revoke (rkeys).
const resolveTTL = time.Second

// New creates a manager. self is what this daemon says in its handshake;
// loopbackOnly refuses peers off this host (plaintext mode).
func New(self *b2bv1.HandshakeRequest, ts []transport.Transport, log hclog.Logger, loopbackOnly bool, dialOpts ...grpc.DialOption) *Manager {
	m := &Manager{self: self, transports: map[transport.Kind]transport.Transport{}, log: log, peers: map[string]*state{}, loopbackOnly: loopbackOnly}
	for _, t := range ts {
		m.transports[t.Kind()] = t
	}
	if len(dialOpts) == 0 {
		dialOpts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	m.dialOpts = dialOpts
	return m
}

// Session is what a batch needs from a peer.
type Session = transport.Session

// Get returns a data connection to addr over transport want ("" = verbs when
// both sides have it, else TCP), connecting and handshaking as needed.
func (m *Manager) Get(ctx context.Context, addr string, want transport.Kind) (Session, error) {
	if m.loopbackOnly && !auth.IsLoopback(addr) {
		return Session{}, fmt.Errorf("%w: peer %s is not a loopback address, and this daemon runs --insecure (plaintext is loopback-only; configure --tls-*)", errs.ErrFailedPrecondition, addr)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return Session{}, fmt.Errorf("%w: daemon is shutting down", errs.ErrUnavailable)
	}
	st := m.peers[addr]
	if st == nil {
		st = &state{addr: addr, conns: map[transport.Kind]transport.Conn{}, resolved: map[string]resolution{}}
		m.peers[addr] = st
	}
	m.mu.Unlock()

	st.mu.Lock()
	defer st.mu.Unlock()
	cachedHS := st.hs != nil
	if err := m.handshake(ctx, st); err != nil {
		return Session{}, err
	}
	kind, err := m.choose(st, want)
	if err != nil && cachedHS {
		// The peer may have restarted with other transports since the
		// handshake: ask again before refusing.
		st.hs = nil
		if err := m.handshake(ctx, st); err != nil {
			return Session{}, err
		}
		kind, err = m.choose(st, want)
	}
	if err != nil {
		return Session{}, err
	}
	c := st.conns[kind]
	if c != nil && c.Err() != nil {
		_ = c.Close()
		delete(st.conns, kind)
		c = nil
	}
	reused := c != nil
	if c == nil {
		c, err = m.transports[kind].Connect(ctx, peerOf(addr, st.hs, st.client))
		if err != nil {
			// The peer may have restarted with a new token or QP state:
			// handshake afresh next time.
			st.hs = nil
			return Session{}, fmt.Errorf("peer %s: connect %s data path: %w", addr, kind, err)
		}
		st.conns[kind] = c
		m.log.Info("data path connected", "peer", addr, "transport", kind)
	}
	return Session{Kind: kind, Conn: c, Name: st.hs.GetNodeName(), Reused: reused}, nil
}

// Broken tells the manager that a batch on s failed in a way that leaves the
// connection unusable or the peer possibly restarted.
func (m *Manager) Broken(addr string, s Session) {
	m.mu.Lock()
	st := m.peers[addr]
	m.mu.Unlock()
	if st == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if c := st.conns[s.Kind]; c != s.Conn {
		// Another batch on the same connection already reported it, and a
		// fresh one may be carrying retries by now: forgetting the handshake
		// again would make the next Get handshake anew and close that fresh
		// connection under them (32 concurrent batches hit by one failed
		// WRITE then failed their retries with "connection closed").
		return
	}
	_ = s.Conn.Close()
	delete(st.conns, s.Kind)
	st.hs = nil
	clear(st.resolved)
	if st.cc != nil {
		st.cc.ResetConnectBackoff()
	}
}

func (m *Manager) handshake(ctx context.Context, st *state) error {
	if st.hs != nil {
		return nil
	}
	if st.cc != nil && st.cc.GetState() == connectivity.TransientFailure {
		// gRPC keeps a channel whose peer went away in TRANSIENT_FAILURE and
		// fails calls at once with the old error until its reconnect backoff
		// expires. A restarted peer must be reachable by the very next batch
		// (and a dead one still fail fast): a fresh channel dials now.
		_ = st.cc.Close()
		st.cc, st.client = nil, nil
	}
	if st.cc == nil {
		// passthrough: the dialer resolves host:port itself, once per connection.
		cc, err := grpc.NewClient("passthrough:///"+st.addr, m.dialOpts...)
		if err != nil {
			return fmt.Errorf("%w: peer %q: %v", errs.ErrInvalidArgument, st.addr, err)
		}
		st.cc, st.client = cc, b2bv1.NewPeerClient(cc)
	}
	hs, err := st.client.Handshake(ctx, m.self)
	if err != nil {
		// A restarted peer should be reachable at the next batch, not after
		// gRPC's exponential reconnect backoff.
		st.cc.ResetConnectBackoff()
		err = fromRPC(ctx, err)
		return fmt.Errorf("peer %s: handshake: %w", st.addr, err)
	}
	if hs.GetProtocolVersion() != ProtocolVersion {
		return fmt.Errorf("%w: peer %s speaks protocol %d, this daemon %d", errs.ErrFailedPrecondition, st.addr, hs.GetProtocolVersion(), ProtocolVersion)
	}
	// A new handshake means the peer may have restarted: old data paths
	// and region keys are stale.
	for k, c := range st.conns {
		_ = c.Close()
		delete(st.conns, k)
	}
	clear(st.resolved)
	st.hs = hs
	st.instance.Store(hs.GetInstanceId())
	return nil
}

// Instance is the instance ID the peer at addr gave in its last handshake
// (set once per daemon start), 0 when it never answered one. It takes no
// lock but the manager's map lock and makes no call.
func (m *Manager) Instance(addr string) uint64 {
	m.mu.Lock()
	st := m.peers[addr]
	m.mu.Unlock()
	if st == nil {
		return 0
	}
	return st.instance.Load()
}

func (m *Manager) choose(st *state, want transport.Kind) (transport.Kind, error) {
	offers := func(k b2bv1.TransportKind) bool { return slices.Contains(st.hs.GetTransports(), k) }
	_, haveVerbs := m.transports[transport.Verbs]
	switch want {
	case "":
		if haveVerbs && offers(b2bv1.TransportKind_TRANSPORT_KIND_VERBS) {
			return transport.Verbs, nil
		}
		if _, ok := m.transports[transport.TCP]; ok && offers(b2bv1.TransportKind_TRANSPORT_KIND_TCP) {
			return transport.TCP, nil
		}
		return "", fmt.Errorf("%w: no transport in common with peer %s (it offers %v)", errs.ErrFailedPrecondition, st.addr, st.hs.GetTransports())
	case transport.Verbs, transport.TCP:
		if _, ok := m.transports[want]; !ok {
			return "", fmt.Errorf("%w: transport %s was requested but is not available on this daemon", errs.ErrFailedPrecondition, want)
		}
		if !offers(KindToProto(want)) {
			return "", fmt.Errorf("%w: transport %s was requested but peer %s does not offer it", errs.ErrFailedPrecondition, want, st.addr)
		}
		return want, nil
	}
	return "", fmt.Errorf("%w: transport %q is unknown", errs.ErrInvalidArgument, want)
}

// Resolve returns the peer's export name resolved to its size and keys,
// from the cache when it can; cached says which, so a caller whose batch is
// refused for a stale key knows a fresh resolution may help.
func (m *Manager) Resolve(ctx context.Context, addr string, s Session, name string) (r Resolved, cached bool, err error) {
	m.mu.Lock()
	st := m.peers[addr]
	m.mu.Unlock()
	if st == nil {
		return r, false, fmt.Errorf("%w: peer %s is not connected", errs.ErrUnavailable, addr)
	}
	st.mu.Lock()
	c, ok := st.resolved[name]
	ctl := st.client
	st.mu.Unlock()
	if ok && time.Since(c.at) < resolveTTL {
		return c.r, true, nil
	}
	if ctl == nil {
		return r, false, fmt.Errorf("%w: peer %s is not connected", errs.ErrUnavailable, addr)
	}
	resp, err := ctl.ResolveRegion(ctx, &b2bv1.ResolveRegionRequest{Name: name})
	if err != nil {
		return r, false, fromRPC(ctx, err)
	}
	r = resolvedFromProto(resp)
	st.mu.Lock()
	st.resolved[name] = resolution{r: r, at: time.Now()}
	st.mu.Unlock()
	return r, false, nil
}

// Notify hands n to the peer at addr (Peer.Notify), for its watchers.
func (m *Manager) Notify(ctx context.Context, addr string, n notify.Notification) error {
	ctl := m.client(addr)
	if ctl == nil {
		return fmt.Errorf("%w: peer %s is not connected", errs.ErrUnavailable, addr)
	}
	_, err := ctl.Notify(ctx, &b2bv1.NotifyRequest{Region: n.Region, Sender: n.Sender,
		Notification: n.Notification, Blocks: n.Blocks, Bytes: n.Bytes})
	return fromRPC(ctx, err)
}

// client is the peer's control-plane client, nil when it has none.
func (m *Manager) client(addr string) b2bv1.PeerClient {
	m.mu.Lock()
	st := m.peers[addr]
	m.mu.Unlock()
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.client
}

// Forget drops a cached resolution.
func (m *Manager) Forget(addr, name string) {
	m.mu.Lock()
	st := m.peers[addr]
	m.mu.Unlock()
	if st != nil {
		st.mu.Lock()
		delete(st.resolved, name)
		st.mu.Unlock()
	}
}

// Connected counts peers with a live data path, for Status. A peer whose
// lock is held (connecting, a handshake over the network) is skipped rather
// than waited for, so Status never blocks on a slow peer; the count is a
// snapshot, possibly low.
func (m *Manager) Connected() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, st := range m.peers {
		if st.mu.TryLock() {
			if len(st.conns) > 0 {
				n++
			}
			st.mu.Unlock()
		}
	}
	return n
}

// Close drops every connection.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	peers := m.peers
	m.peers = map[string]*state{}
	m.mu.Unlock()
	for _, st := range peers {
		st.mu.Lock()
		for _, c := range st.conns {
			_ = c.Close()
		}
		if st.cc != nil {
			_ = st.cc.Close()
		}
		st.mu.Unlock()
	}
}

// KindToProto and KindFromProto convert transport names at the API boundary.
func KindToProto(k transport.Kind) b2bv1.TransportKind {
	switch k {
	case transport.TCP:
		return b2bv1.TransportKind_TRANSPORT_KIND_TCP
	case transport.Verbs:
		return b2bv1.TransportKind_TRANSPORT_KIND_VERBS
	}
	return b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED
}

func KindFromProto(k b2bv1.TransportKind) (transport.Kind, error) {
	switch k {
	case b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED:
		return "", nil
	case b2bv1.TransportKind_TRANSPORT_KIND_TCP:
		return transport.TCP, nil
	case b2bv1.TransportKind_TRANSPORT_KIND_VERBS:
		return transport.Verbs, nil
	}
	return "", fmt.Errorf("%w: transport %d is not a known TransportKind", errs.ErrInvalidArgument, k)
}
