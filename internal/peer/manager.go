// Package peer keeps the daemon's connections to other daemons: one gRPC
// control connection per peer address (handshake done once) and one data-path
// connection per transport, rebuilt after a failure.
package peer

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
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
	self       *b2bv1.HandshakeRequest
	transports map[transport.Kind]transport.Transport
	// ranked are the kinds of transports, highest rank first: the order
	// in which an automatic choice tries them.
	ranked []transport.Kind
	// caps are what each kind can do (its driver's CapsFor its transport),
	// the only statement of it the choice and the batch layer read.
	caps map[transport.Kind]transport.Caps
	// driver finds a kind's capabilities (transport.Lookup).
	driver   func(transport.Kind) (transport.Driver, bool)
	dialOpts []grpc.DialOption
	log      hclog.Logger
	// loopbackOnly: plaintext (--insecure) may only reach loopback peers.
	loopbackOnly bool

	// idleNanos and maxPeers are Limits, settable while running.
	idleNanos atomic.Int64
	maxPeers  atomic.Int64

	mu     sync.Mutex
	closed bool
	peers  map[string]*state
	// reapStop is the running reaper's stop channel, nil when none runs:
	// a reaper runs only while peers are kept, so a daemon with none holds
	// no goroutine for them.
	reapStop chan struct{}
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
}

// Defaults of Limits (b2bd's --peer-idle-timeout and --max-peers).
const (
	DefaultIdleTimeout = 5 * time.Minute
	DefaultMaxPeers    = 1024
)

// SetLimits sets the idle timeout and the peer cap; zero fields take the
// defaults. Peers kept already count against a lowered cap.
func (m *Manager) SetLimits(l Limits) {
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.MaxPeers <= 0 {
		l.MaxPeers = DefaultMaxPeers
	}
	m.idleNanos.Store(int64(l.IdleTimeout))
	m.maxPeers.Store(int64(l.MaxPeers))
}

func (m *Manager) idleTimeout() time.Duration { return time.Duration(m.idleNanos.Load()) }

type state struct {
	addr string
	// busy counts what uses the peer now: manager calls in progress,
	// writes in flight on its data connections and live prepared plans
	// (trackedConn); lastUse is when the last of them ended (UnixNano). A
	// peer is idle while busy is 0, and reaped once idle long enough. busy
	// is raised under Manager.mu, so the reaper, which holds it, never
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
	// instance is the peer's instance ID from its last handshake, kept
	// when hs is dropped: prepared plans compare it to the one they were
	// made under to notice a restarted peer without a round trip.
	instance atomic.Uint64
	conns    map[transport.Kind]transport.Conn
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
	m := &Manager{self: self, transports: map[transport.Kind]transport.Transport{}, log: log, peers: map[string]*state{}, loopbackOnly: loopbackOnly}
	m.SetLimits(Limits{})
	for _, t := range ts {
		m.transports[t.Kind()] = t
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
	m.driver = lookup
	m.ranked = m.ranked[:0]
	m.caps = make(map[transport.Kind]transport.Caps, len(m.transports))
	for k, t := range m.transports {
		m.ranked = append(m.ranked, k)
		if d, ok := lookup(k); ok {
			m.caps[k] = d.CapsFor(t)
		}
	}
	rank := func(k transport.Kind) int { return m.caps[k].Rank }
	slices.SortFunc(m.ranked, func(a, b transport.Kind) int {
		if c := cmp.Compare(rank(b), rank(a)); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
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
	st, err := m.acquire(addr, true)
	if err != nil {
		return Session{}, err
	}
	defer m.release(st)
	if err := st.mu.LockContext(ctx); err != nil {
		return Session{}, peerBusy(addr, err)
	}
	defer st.mu.Unlock()
	s, err := m.get(ctx, st, want, need)
	if err != nil {
		m.dropUnused(st)
	}
	return s, err
}

// acquire finds addr's state, creating it when create is set, and counts a
// use of it (release ends it); nil, nil when there is none to find.
func (m *Manager) acquire(addr string, create bool) (*state, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("%w: daemon is shutting down", errs.ErrUnavailable)
	}
	st := m.peers[addr]
	if st == nil {
		if !create {
			return nil, nil
		}
		if max := m.maxPeers.Load(); int64(len(m.peers)) >= max {
			return nil, fmt.Errorf("%w: peer %s: this daemon keeps connections to %d peers, the limit (--max-peers) is %d; a peer is dropped after --peer-idle-timeout (%s) unused",
				errs.ErrResourceExhausted, addr, len(m.peers), max, m.idleTimeout())
		}
		st = &state{addr: addr, conns: map[transport.Kind]transport.Conn{}, resolved: map[string]cacheEntry[Resolved]{}, layouts: map[string]cacheEntry[*transport.LayoutResolution]{}}
		m.peers[addr] = st
		if m.reapStop == nil {
			m.reapStop = make(chan struct{})
			go m.reapLoop(m.reapStop)
		}
	}
	st.busy.Add(1)
	return st, nil
}

// release ends a use of st counted by acquire (or by a tracked write).
func (m *Manager) release(st *state) { st.done() }

func (st *state) done() {
	st.lastUse.Store(time.Now().UnixNano())
	st.busy.Add(-1)
}

// dropUnused forgets st, whose Get failed, when nothing else uses it: a
// peer that never answered keeps no connection, goroutine or redial behind
// it. The caller holds st.mu and one use of st.
func (m *Manager) dropUnused(st *state) {
	if st.hs != nil || len(st.conns) > 0 {
		return
	}
	m.mu.Lock()
	drop := st.busy.Load() == 1 && m.peers[st.addr] == st
	if drop {
		delete(m.peers, st.addr)
		m.stopReaperIfEmpty()
	}
	m.mu.Unlock()
	if drop {
		st.closeLocked(false)
	}
}

// closeLocked closes st's data connections, then its control connection
// (a data connection may say goodbye over it): in the background unless
// wait, as closing a channel whose dial to a stopped peer is under way
// waits for that dial, and the caller holds st.mu, which every call to the
// peer waits for.
func (st *state) closeLocked(wait bool) {
	for k, c := range st.conns {
		_ = c.Close()
		delete(st.conns, k)
	}
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

// stopReaperIfEmpty ends the reaper once no peer is kept; the next new
// peer starts another. The caller holds m.mu.
func (m *Manager) stopReaperIfEmpty() {
	if len(m.peers) == 0 && m.reapStop != nil {
		close(m.reapStop)
		m.reapStop = nil
	}
}

// reapLoop closes idle peers until stop is closed: no peer is left, or the
// manager closed. It checks every eighth of the idle timeout, so a peer
// goes between 1 and 1.125 timeouts after its last use.
func (m *Manager) reapLoop(stop chan struct{}) {
	for {
		idle := m.idleTimeout()
		t := time.NewTimer(min(max(idle/8, 10*time.Millisecond), 10*time.Second))
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		m.reap(time.Now(), idle)
	}
}

// reap closes and forgets every peer idle for idle or longer at now.
func (m *Manager) reap(now time.Time, idle time.Duration) {
	var gone []*state
	m.mu.Lock()
	for addr, st := range m.peers {
		if st.busy.Load() == 0 && now.Sub(time.Unix(0, st.lastUse.Load())) >= idle && st.mu.TryLock() {
			delete(m.peers, addr)
			gone = append(gone, st)
		}
	}
	m.stopReaperIfEmpty()
	m.mu.Unlock()
	for _, st := range gone {
		if st.up {
			m.log.Info("peer idle: its connections are closed until the next batch", "peer", st.addr, "idle_timeout", idle)
		}
		st.closeLocked(false)
		st.mu.Unlock()
	}
}

// get is Get's work on st, whose lock the caller holds.
func (m *Manager) get(ctx context.Context, st *state, want transport.Kind, need transport.Need) (Session, error) {
	addr := st.addr
	cachedHS := st.hs != nil
	if err := m.handshake(ctx, st); err != nil {
		return Session{}, err
	}
	kind, err := m.choose(st, want, need)
	if err != nil && cachedHS {
		// The peer may have restarted with other transports since the
		// handshake: ask again before refusing.
		st.hs = nil
		if err := m.handshake(ctx, st); err != nil {
			return Session{}, err
		}
		kind, err = m.choose(st, want, need)
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
		c, err = m.transports[kind].Connect(ctx, peerOf(addr, kind, st.hs, st.client))
		if err != nil {
			// The peer may have restarted with a new token or QP state:
			// handshake afresh next time.
			st.hs = nil
			return Session{}, fmt.Errorf("peer %s: connect %s data path: %w", addr, kind, err)
		}
		c = track(c, st)
		st.conns[kind] = c
		m.log.Info("data path connected", "peer", addr, "transport", kind)
	}
	return Session{Kind: kind, Conn: c, Caps: m.caps[kind], Name: st.hs.GetNodeName(), Reused: reused}, nil
}

// Broken tells the manager that a batch on s failed in a way that leaves the
// connection unusable or the peer possibly restarted.
// It never waits for the peer's lock, which another call may hold across a
// handshake with a frozen peer: the batch reporting it must still answer at
// its deadline. A busy lock leaves the work to a goroutine.
func (m *Manager) Broken(addr string, s Session) {
	st, _ := m.acquire(addr, false)
	if st == nil {
		return
	}
	if !st.mu.TryLock() {
		go func() {
			defer m.release(st)
			st.mu.Lock()
			defer st.mu.Unlock()
			m.brokenLocked(st, s)
		}()
		return
	}
	defer m.release(st)
	defer st.mu.Unlock()
	m.brokenLocked(st, s)
}

func (m *Manager) brokenLocked(st *state, s Session) {
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
	for k, c := range st.conns {
		_ = c.Close()
		delete(st.conns, k)
	}
	st.clearCache()
	st.hs = hs
	st.instance.Store(hs.GetInstanceId())
	st.unusable = m.usable(st)
	return nil
}

// usable runs, once per handshake, the Usable check of every kind both
// sides offer (the same-host proof, say) and returns why each that failed
// cannot reach the peer.
func (m *Manager) usable(st *state) map[transport.Kind]error {
	out := map[transport.Kind]error{}
	for _, k := range m.ranked {
		adv, offered := st.hs.GetAdverts()[string(k)]
		d, ok := m.driver(k)
		if !offered || !ok || d.Usable == nil {
			continue
		}
		if err := d.Usable(m.transports[k], adv); err != nil {
			out[k] = err
			m.log.Debug("transport cannot reach the peer", "peer", st.addr, "transport", k, "reason", err)
		} else if d.Caps.SameHostOnly {
			m.log.Info("peer is on this host: its same-host transport is usable", "peer", st.addr, "transport", k)
		}
	}
	return out
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

// choose picks the data path to st's peer for a request needing need:
// want when it names one (refused when its Caps lack need), else the
// highest-ranked kind both sides offer that can reach the peer and whose
// Caps meet need. Why each kind was passed over is in the error when none
// is left, and in a debug log otherwise.
func (m *Manager) choose(st *state, want transport.Kind, need transport.Need) (transport.Kind, error) {
	if want != "" {
		if _, ok := m.transports[want]; !ok {
			if _, known := m.driver(want); !known && transport.CheckName(string(want)) != nil {
				return "", fmt.Errorf("%w: transport %q is unknown", errs.ErrInvalidArgument, want)
			}
			return "", fmt.Errorf("%w: transport %s was requested but is not available on this daemon", errs.ErrFailedPrecondition, want)
		}
		if err := m.reaches(st, want); err != nil {
			return "", fmt.Errorf("transport %s was requested but peer %s cannot use it: %w", want, st.addr, err)
		}
		if err := m.caps[want].Lacks(want, need); err != nil {
			return "", fmt.Errorf("transport %s was requested for peer %s: %w", want, st.addr, err)
		}
		return want, nil
	}
	var why []string
	for _, k := range m.ranked {
		err := m.reaches(st, k)
		if err == nil {
			err = m.caps[k].Lacks(k, need)
		}
		if err == nil {
			if len(why) > 0 {
				m.log.Debug("transport chosen", "peer", st.addr, "transport", k, "passed_over", strings.Join(why, "; "))
			}
			return k, nil
		}
		why = append(why, fmt.Sprintf("%s: %v", k, err))
	}
	return "", fmt.Errorf("%w: no transport in common with peer %s for a %s (it offers %v; %s)", errs.ErrFailedPrecondition, st.addr, need.Op, offered(st.hs), strings.Join(why, "; "))
}

// reaches says why kind k (one this daemon runs) cannot carry batches to
// st's peer, or nil: the peer must offer it, and its Usable check passed.
func (m *Manager) reaches(st *state, k transport.Kind) error {
	if _, ok := st.hs.GetAdverts()[string(k)]; !ok {
		return fmt.Errorf("%w: peer %s does not offer it", errs.ErrFailedPrecondition, st.addr)
	}
	if err := st.unusable[k]; err != nil {
		return err
	}
	return nil
}

// offered lists the kinds the peer's handshake offers, sorted.
func offered(hs *b2bv1.HandshakeResponse) []string {
	out := make([]string, 0, len(hs.GetAdverts()))
	for k := range hs.GetAdverts() {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
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
	m.stopReaperIfEmpty()
	m.mu.Unlock()
	for _, st := range peers {
		st.mu.Lock()
		st.closeLocked(true)
		st.mu.Unlock()
	}
}

// Peers counts the peers kept now (connected or being connected).
func (m *Manager) Peers() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.peers)
}

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
