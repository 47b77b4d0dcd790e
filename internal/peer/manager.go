// Package peer keeps the daemon's connections to other daemons: one gRPC
// control connection per peer address (handshake done once) and one data-path
// connection per transport, rebuilt after a failure.
package peer

import (
	"context"
	"errors"
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
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// ProtocolVersion is the peer protocol spoken by this build. 2: transports
// are kinds with opaque adverts, keys and signals.
const ProtocolVersion = 2

// Manager owns the connections to peers.
type Manager struct {
	self     *b2bv1.HandshakeRequest
	dialOpts []grpc.DialOption
	log      hclog.Logger
	// loopbackOnly: plaintext (--insecure) may only reach loopback peers.
	loopbackOnly bool
	// choice holds the kinds this daemon runs and picks one per request.
	choice chooser
	// kept holds the peers, their cap and idle reaping.
	kept peerTable
}

// Limits bound what the manager keeps for peers.
type Limits struct {
	// IdleTimeout: a peer with nothing in flight and no prepared plan for
	// this long has its control and data connections closed and is
	// forgotten; the next batch to it connects afresh. <= 0: the default.
	IdleTimeout time.Duration
	// MaxPeers caps the peers kept at once; a batch to another peer is
	// refused with ResourceExhausted. <= 0: the default.
	MaxPeers int
	// ConnsPerPeer caps a peer's data connections of one kind, each
	// carrying one batch at a time (connSet). <= 0: the default.
	ConnsPerPeer int
}

// Defaults of Limits (b2bd's --peer-idle-timeout and --max-peers).
const (
	DefaultIdleTimeout = 5 * time.Minute
	DefaultMaxPeers    = 1024
)

// SetLimits sets the idle timeout and the peer cap; zero fields take the
// defaults. Peers kept already count against a lowered cap.
func (m *Manager) SetLimits(l Limits) { m.kept.setLimits(l) }

// SetCalibration hands auto the daemon's measurement of its same-host
// paths (transport.Calibration): from then on a peer on this host is
// given the kind measured fastest for a batch's route and block size.
func (m *Manager) SetCalibration(c *transport.Calibration) { m.choice.measured.Store(c) }

// Ranked are the kinds this daemon runs, highest rank first: the order
// auto tries them in.
func (m *Manager) Ranked() []transport.Kind { return slices.Clone(m.choice.ranked) }

type state struct {
	addr string
	// busy counts what uses the peer now: manager calls in progress,
	// writes in flight on its data connections and live prepared plans
	// (trackedConn); lastUse is when the last of them ended (UnixNano). A
	// peer is idle while busy is 0, and reaped once idle long enough. busy
	// is raised under peerTable.mu, so the reaper, which holds it, never
	// takes a peer that a caller has just looked up.
	busy    atomic.Int64
	lastUse atomic.Int64
	// sniff is the control connection's last raw TCP connection, to say
	// what answered when a handshake fails (not a b2bd peer port).
	sniff atomic.Pointer[sniffConn]

	mu ctxMutex // serialises (re)connecting; Get waits for it under its ctx
	// up: the last handshake succeeded; a change is logged once.
	up     bool
	cc     *grpc.ClientConn
	client b2bv1.PeerClient
	hs     *b2bv1.HandshakeResponse
	// notes is the open NotifyStream (notestream.go); noNoteStream the
	// channel whose peer has none. notesMu guards both, apart from mu:
	// a note never waits for a handshake.
	notesMu      sync.Mutex
	notes        *noteStream
	noNoteStream b2bv1.PeerClient
	// instance is the peer's instance ID from its last handshake, kept
	// when hs is dropped: prepared plans compare it to the one they were
	// made under to notice a restarted peer without a round trip.
	instance atomic.Uint64
	conns    map[transport.Kind]*connSet
	// unusable says, per kind both sides offer, why it cannot reach the
	// peer (its driver's Usable, run once per handshake); a kind absent
	// is usable.
	unusable map[transport.Kind]error
	// cacheMu guards resolved, layouts and cacheGen. It is apart from mu,
	// which a handshake holds over the network: dropping a stale entry
	// (a refused key, a prepared plan's re-bind) must never wait for a
	// handshake, or a batch against a frozen peer overruns its deadline.
	// Lock order: mu, then cacheMu.
	cacheMu sync.Mutex
	// cacheGen counts clears: an answer fetched before a clear (the peer
	// may have restarted since) is not cached after it.
	cacheGen uint64
	// resolved caches region resolutions; cleared whenever the peer may have
	// changed (new handshake, broken connection, refused key).
	resolved map[string]cacheEntry[Resolved]
	// layouts caches layout resolutions, cleared with resolved.
	layouts map[string]cacheEntry[*transport.LayoutResolution]
}

// New creates a manager. self is what this daemon says in its handshake;
// loopbackOnly refuses peers off this host (plaintext mode).
func New(self *b2bv1.HandshakeRequest, ts []transport.Transport, log hclog.Logger, loopbackOnly bool, dialOpts ...grpc.DialOption) *Manager {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	m := &Manager{self: self, log: log, loopbackOnly: loopbackOnly}
	m.choice = chooser{transports: map[transport.Kind]transport.Transport{}, log: log}
	m.kept = peerTable{log: log, peers: map[string]*state{}}
	m.SetLimits(Limits{})
	for _, t := range ts {
		m.choice.transports[t.Kind()] = t
	}
	m.SetDrivers(transport.Lookup)
	if len(dialOpts) == 0 {
		dialOpts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	m.dialOpts = dialOpts
	return m
}

// SetDrivers sets where the manager finds each kind's capabilities (Caps
// and Usable): the process-wide registry by default; tests give their own.
// A kind without a driver ranks 0, is usable whenever both offer it, and
// can do nothing (its Caps are empty), so it is never chosen.
func (m *Manager) SetDrivers(lookup func(transport.Kind) (transport.Driver, bool)) {
	m.choice.setDrivers(lookup)
}

// Session is what a batch needs from a peer.
type Session = transport.Session

// Get returns a data connection to addr for a request that needs need,
// over transport want ("" = the highest-ranked kind both sides offer that
// reaches the peer and whose Caps meet need), connecting and handshaking
// as needed. The Session carries the kind's Caps.
func (m *Manager) Get(ctx context.Context, addr string, want transport.Kind, need transport.Need) (Session, error) {
	if err := CheckAddr(addr); err != nil {
		return Session{}, err
	}
	if m.loopbackOnly && !auth.IsLoopback(addr) {
		return Session{}, fmt.Errorf("%w: peer %s is not a loopback address, and this daemon runs --insecure (plaintext is loopback-only; configure --tls-*)", errs.ErrFailedPrecondition, addr)
	}
	for try := 1; ; try++ {
		s, err := m.getOnce(ctx, addr, want, need)
		if errors.Is(err, errDialedAcrossReset) && try < getTries && ctx.Err() == nil {
			continue
		}
		return s, err
	}
}

// getTries bounds Get's fresh starts after a reset during an extra dial.
const getTries = 3

// getOnce is one try of Get: the peer's state is looked up afresh, so a
// peer closed or reaped meanwhile is not revived.
func (m *Manager) getOnce(ctx context.Context, addr string, want transport.Kind, need transport.Need) (Session, error) {
	st, err := m.kept.acquire(addr, true)
	if err != nil {
		return Session{}, err
	}
	defer st.done()
	if err := st.mu.LockContext(ctx); err != nil {
		return Session{}, peerBusy(addr, err)
	}
	s, err := m.get(ctx, st, want, need)
	if errors.Is(err, errLockLost) {
		return s, err // the lock is no longer this call's
	}
	if err != nil {
		m.kept.dropUnused(st)
	}
	st.mu.Unlock()
	return s, err
}

// done ends a use of st counted by peerTable.acquire (or by a tracked
// write).
func (st *state) done() {
	st.lastUse.Store(time.Now().UnixNano())
	st.busy.Add(-1)
}

// closeLocked closes st's data connections, then its control connection
// (a data connection may say goodbye over it): in the background unless
// wait, as closing a channel whose dial to a stopped peer is under way
// waits for that dial, and the caller holds st.mu, which every call to the
// peer waits for.
func (st *state) closeLocked(wait bool) {
	for k, set := range st.conns {
		set.closeAll()
		delete(st.conns, k)
	}
	st.closeNotes()
	if st.cc != nil {
		if wait {
			_ = st.cc.Close()
		} else {
			closeChannel(st.cc)
		}
		st.cc, st.client = nil, nil
	}
	st.hs = nil
}

// closeChannel closes a peer's control channel in the background (see
// closeLocked).
func closeChannel(cc *grpc.ClientConn) {
	go func() { _ = cc.Close() }()
}

// get is Get's work on st, whose lock the caller holds.
func (m *Manager) get(ctx context.Context, st *state, want transport.Kind, need transport.Need) (Session, error) {
	addr := st.addr
	cachedHS := st.hs != nil
	if err := m.handshake(ctx, st); err != nil {
		return Session{}, err
	}
	kind, recheck, err := m.choice.choose(st, want, need)
	if err != nil && cachedHS {
		// The peer may have restarted with other transports since the
		// handshake: ask again before refusing.
		st.hs = nil
		if err := m.handshake(ctx, st); err != nil {
			return Session{}, err
		}
		kind, recheck, err = m.choice.choose(st, want, need)
	}
	if err != nil {
		return Session{}, err
	}
	limit := m.kept.connsPerPeer()
	if m.choice.caps[kind].SingleConn {
		limit = 1
	}
	p := peerOf(addr, kind, st.hs, st.client)
	c, reused, err := st.conn(ctx, kind, limit, func(ctx context.Context) (transport.Conn, error) {
		return m.choice.transports[kind].Connect(ctx, p)
	})
	if err != nil {
		// The peer may have restarted with a new token or QP state:
		// handshake afresh next time. Not after a reset during the dial
		// (the handshake there may be another batch's fresh one), nor
		// without the lock.
		if !errors.Is(err, errDialedAcrossReset) && !errors.Is(err, errLockLost) {
			st.hs = nil
		}
		return Session{}, fmt.Errorf("peer %s: connect %s data path: %w", addr, kind, err)
	}
	if !reused {
		m.log.Info("data path connected", "peer", addr, "transport", kind, "connections", len(st.conns[kind].conns))
	}
	return Session{Kind: kind, Conn: c, Caps: m.choice.caps[kind], Name: st.hs.GetNodeName(), Reused: reused, Recheck: recheck}, nil
}

// Broken tells the manager that a batch on s failed in a way that leaves the
// connection unusable or the peer possibly restarted.
// It never waits for the peer's lock, which another call may hold across a
// handshake with a frozen peer: the batch reporting it must still answer at
// its deadline. A busy lock leaves the work to a goroutine.
func (m *Manager) Broken(addr string, s Session) {
	st, _ := m.kept.acquire(addr, false)
	if st == nil {
		return
	}
	if !st.mu.TryLock() {
		go func() {
			defer st.done()
			st.mu.Lock()
			defer st.mu.Unlock()
			st.brokenLocked(s)
		}()
		return
	}
	defer st.done()
	defer st.mu.Unlock()
	st.brokenLocked(s)
}

// brokenLocked drops st's connection s, and with it the handshake and the
// cached resolutions, unless another batch reported it first. The caller
// holds st.mu.
func (st *state) brokenLocked(s Session) {
	if set := st.conns[s.Kind]; set == nil || !set.remove(s.Conn) {
		// Another batch on the same connection already reported it, and a
		// fresh one may be carrying retries by now: forgetting the handshake
		// again would make the next Get handshake anew and close that fresh
		// connection under them (32 concurrent batches hit by one failed
		// WRITE then failed their retries with "connection closed").
		return
	}
	st.hs = nil
	st.clearCache()
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
		closeChannel(st.cc)
		st.cc, st.client = nil, nil
	}
	if st.cc == nil {
		// passthrough: the dialer resolves host:port itself, once per
		// connection. The sniffing dialer comes first, so a dialer of the
		// caller's (tests: bufconn) replaces it.
		st.sniff.Store(nil)
		opts := append([]grpc.DialOption{grpc.WithContextDialer(st.dial)}, m.dialOpts...)
		cc, err := grpc.NewClient("passthrough:///"+st.addr, opts...)
		if err != nil {
			return fmt.Errorf("%w: peer %q: %v", errs.ErrInvalidArgument, st.addr, err)
		}
		st.cc, st.client = cc, b2bv1.NewPeerClient(cc)
	}
	hs, err := st.client.Handshake(ctx, m.self)
	if err != nil && ctx.Err() != nil {
		// The caller gave up (its transfer was cancelled, say), not the
		// peer: the channel stays, for the other batches resolving over it
		// (closing it failed them with "the client connection is closing").
		return fmt.Errorf("peer %s: handshake: %w", st.addr, fromRPC(ctx, err))
	}
	if err != nil {
		err = fromRPC(ctx, err)
		if why := st.sniffed(); why != "" {
			err = fmt.Errorf("%w: peer %q is not a b2bd peer port: %s; give the destination daemon's --peer-listen address (default port %d) (%v)",
				errs.ErrFailedPrecondition, st.addr, why, DefaultPort, err)
		}
		// No channel is kept for a peer that failed: gRPC would redial it
		// in the background, with a warning each time, until the daemon
		// stops. A restarted peer is dialled afresh by the next batch.
		closeChannel(st.cc)
		st.cc, st.client = nil, nil
		if st.up {
			m.log.Warn("peer unreachable", "peer", st.addr, "error", err)
			st.up = false
		} else {
			m.log.Debug("peer handshake failed", "peer", st.addr, "error", err)
		}
		return fmt.Errorf("peer %s: handshake: %w", st.addr, err)
	}
	if hs.GetProtocolVersion() != ProtocolVersion {
		return fmt.Errorf("%w: peer %s speaks protocol %d, this daemon %d", errs.ErrFailedPrecondition, st.addr, hs.GetProtocolVersion(), ProtocolVersion)
	}
	if !st.up {
		m.log.Info("peer connected", "peer", st.addr, "node", hs.GetNodeName())
		st.up = true
	}
	// A new handshake means the peer may have restarted: old data paths
	// and region keys are stale.
	for k, set := range st.conns {
		set.closeAll()
		delete(st.conns, k)
	}
	st.clearCache()
	st.hs = hs
	st.instance.Store(hs.GetInstanceId())
	st.unusable = m.choice.usable(st)
	return nil
}

// Instance is the instance ID the peer at addr gave in its last handshake
// (set once per daemon start), 0 when it never answered one. It takes no
// lock but the peer table's and makes no call.
func (m *Manager) Instance(addr string) uint64 {
	st := m.kept.lookup(addr)
	if st == nil {
		return 0
	}
	return st.instance.Load()
}

// Connected counts peers with a live data path, for Status. A peer whose
// lock is held (connecting, a handshake over the network) is skipped rather
// than waited for, so Status never blocks on a slow peer; the count is a
// snapshot, possibly low.
func (m *Manager) Connected() int { return m.kept.connected() }

// Close drops every connection.
func (m *Manager) Close() { m.kept.close() }

// Peers counts the peers kept now (connected or being connected).
func (m *Manager) Peers() int { return m.kept.count() }

// KindToProto and KindFromProto convert transport names at the API boundary.
func KindToProto(k transport.Kind) b2bv1.TransportKind {
	switch k {
	case transport.TCP:
		return b2bv1.TransportKind_TRANSPORT_KIND_TCP
	case transport.Verbs:
		return b2bv1.TransportKind_TRANSPORT_KIND_VERBS
	case transport.Local:
		return b2bv1.TransportKind_TRANSPORT_KIND_LOCAL
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
	case b2bv1.TransportKind_TRANSPORT_KIND_LOCAL:
		return transport.Local, nil
	}
	return "", fmt.Errorf("%w: transport %d is not a known TransportKind", errs.ErrInvalidArgument, k)
}
