// Package batch owns a batch from its decoded descriptors to "landed and
// notified": the source region, descriptor validation and merging, the
// peer's data path and the destination's key, the retry policy, and the
// notification. The RPC layer (server/) only converts and maps errors.
//
// A batch is planned once (Plan: validated, merged, the source held) and run
// (Run: resolve, write, notify); Transfer is both, for BatchTransfer. The
// split is shaped for prepared transfers, one plan posted many times.
package batch

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/trigger"
)

// MaxNotification bounds a batch's notification.
const MaxNotification = 4096

// Peers is the peer manager (internal/peer's Manager, over gRPC) as a batch
// uses it; this package sees no wire types.
type Peers interface {
	// Get returns a data path to addr over want ("" = the best in common
	// whose Caps meet need), the Session carrying the kind's Caps.
	Get(ctx context.Context, addr string, want transport.Kind, need transport.Need) (transport.Session, error)
	// Resolve resolves the peer's export name for access a (each access
	// its own key, cached apart); cached says it came from the cache (and
	// may be stale).
	Resolve(ctx context.Context, addr string, s transport.Session, name string, a transport.Access) (transport.Resolution, bool, error)
	// ResolveHeld resolves the peer's export name for access a for one
	// batch: a resolution it fetches (not cached) holds the region on the
	// peer, so that it cannot be deregistered before the batch's first
	// frame pins it there, until release, called once the batch's last
	// byte was acknowledged (release waits for the peer to let go). A
	// cached one holds nothing and release does nothing.
	ResolveHeld(ctx context.Context, addr string, s transport.Session, name string, a transport.Access) (r transport.Resolution, cached bool, release func(), err error)
	// Forget drops a cached resolution for access a.
	Forget(addr, name string, a transport.Access)
	// ResolveLayout resolves the peer's exported layout for access a,
	// cached like regions; ForgetLayout drops it.
	ResolveLayout(ctx context.Context, addr, name string, a transport.Access) (*transport.LayoutResolution, bool, error)
	ForgetLayout(addr, name string, a transport.Access)
	// Broken drops s's connection and what the manager knows of the peer.
	Broken(addr string, s transport.Session)
	// Notify hands a landed batch's notification to the peer.
	Notify(ctx context.Context, addr string, n notify.Notification) error
	// Instance is the peer's instance ID from its last handshake (a new one
	// per daemon start), 0 when unknown; it makes no call.
	Instance(addr string) uint64
}

// Op is a transfer's direction.
type Op uint8

const (
	// OpWrite copies local blocks into the peer's export (push).
	OpWrite Op = iota
	// OpRead copies the peer's exported blocks into local ones (pull).
	OpRead
)

func (o Op) String() string {
	if o == OpRead {
		return "read"
	}
	return "write"
}

// ops is the capability o needs of a kind.
func (o Op) ops() transport.Ops {
	if o == OpRead {
		return transport.OpRead
	}
	return transport.OpWrite
}

// access is the grant o needs on the peer's export.
func (o Op) access() transport.Access {
	if o == OpRead {
		return transport.AccessRead
	}
	return transport.AccessWrite
}

// Counters are the daemon's batch statistics.
type Counters struct {
	BatchesSent, BatchesReceived, BatchesFailed atomic.Uint64
	BytesSent, BytesReceived                    atomic.Uint64
}

// Config is what the batch service needs from the daemon.
type Config struct {
	NodeName string // sent with notifications
	// Self is this daemon's instance ID (its handshake's): a peer that
	// answers with it is this daemon (0: not known, never matched).
	Self           uint64
	Registry       *region.Registry
	Peers          Peers
	MaxDescriptors int
	// MaxPlans limits the prepared plans per client identity (0: DefaultMaxPlans).
	MaxPlans int
	// MaxTransfers limits the async transfers per client (0: DefaultMaxTransfers).
	MaxTransfers   int
	DefaultTimeout time.Duration // a batch's deadline when its caller set none
	// Triggers is the trigger watcher's policy (docs/kv.md, "Layer
	// streaming"); the zero value spins while a CPU is free.
	Triggers trigger.Policy
	Counters *Counters
	// Notes is the daemon's notification hub: transfers armed on key
	// notes wait in it (nil: such triggers are refused).
	Notes *notify.Hub
	Log   hclog.Logger
}

// Service sends batches: it owns the attempt core every transfer runs
// (session, resolve, check, gate, post, notify, under one retry policy)
// and the tables that hold transfers between calls, each a type of its own.
type Service struct {
	cfg Config
	// observe is told of every started transfer as it ends (SetObserver).
	observe  atomic.Pointer[Observer]
	paths    paths      // data paths and resolutions (paths.go)
	plans    *Plans     // prepared plans (prepared.go)
	routes   *Routes    // block routes (routes.go)
	layouts  *Layouts   // local block tables (layouts.go)
	async    *Transfers // async handles (async.go)
	triggers triggers   // counters that start transfers (trigger.go)
}

// Observer is told of a transfer as it ends: its result (err nil) or its
// failure, and how long it ran.
type Observer func(res Result, err error, d time.Duration)

// SetObserver has fn told of every transfer started with Start (a batch, a
// block-id transfer or a submit, triggered or not) as it ends: the calls
// that run one to its end are seen by their caller.
func (s *Service) SetObserver(fn Observer) { s.observe.Store(&fn) }

// New fills cfg's defaults and returns the service.
func New(cfg Config) *Service {
	if cfg.MaxDescriptors <= 0 {
		cfg.MaxDescriptors = desc.DefaultMaxBlocks
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = time.Minute
	}
	if cfg.Counters == nil {
		cfg.Counters = &Counters{}
	}
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	s := &Service{paths: paths{peers: cfg.Peers}, layouts: NewLayouts(cfg.Registry), async: NewTransfers(cfg.MaxTransfers),
		triggers: triggers{reg: cfg.Registry, w: trigger.New(cfg.Triggers), notes: cfg.Notes}}
	cfg.Peers = nil // paths holds the one copy
	s.cfg = cfg
	s.plans = &Plans{s: s}
	s.plans.SetMax(cfg.MaxPlans)
	s.routes = &Routes{s: s, max: &s.plans.max}
	return s
}

// Close ends the async transfers, frees every plan and layout and refuses
// new plans (daemon shutdown).
func (s *Service) Close() {
	// First: a running transfer may hold a plan or a layout's regions.
	s.async.Close()
	s.plans.close()
	s.layouts.Close()
}

// Counters returns the service's counters.
func (s *Service) Counters() *Counters { return s.cfg.Counters }

// MaxDescriptors is the most blocks a batch may have.
func (s *Service) MaxDescriptors() int { return s.cfg.MaxDescriptors }

// DefaultTimeout is a transfer's deadline when its caller set none.
func (s *Service) DefaultTimeout() time.Duration { return s.cfg.DefaultTimeout }

// Request is one batch as the caller gave it.
type Request struct {
	Src    string        // the source region's ID
	Caller region.Caller // who asks: the source region must be theirs
	Peer   string        // the destination daemon's peer address
	Dst    string        // the destination region's export name
	// Transport forces a transport; "" lets the peer manager choose.
	Transport transport.Kind
	// BadTransport is set by the RPC layer when the wire value names no
	// transport; it is reported after the field checks.
	BadTransport error
	Descriptors  *desc.Packed // nil: not set
	Notification []byte       // nil: none
	// Op: OpRead pulls the peer's Dst blocks (at the descriptors'
	// dst_offsets) into Src (at src_offsets), which is then the
	// destination: its ranges must not overlap.
	Op Op
	// BadOp is set by the RPC layer when the wire value names no op.
	BadOp error
}

// Result describes a batch that landed (and was notified).
type Result struct {
	Blocks, Bytes uint64 // as the caller described them
	Kind          transport.Kind
	Stats         transport.Stats
	Elapsed       time.Duration // the write, from post to acknowledgement
	Phases        Phases
}

// Phases says where a call's time went. A phase the call skipped is 0.
// Decode (receiving and unmarshalling the request) is measured by the RPC
// layer, which also sets Total from the call's first byte when it knows it.
type Phases struct {
	Decode   time.Duration // receive and unmarshal the request
	Validate time.Duration // fields, the source region, descriptor bounds and overlaps
	Resolve  time.Duration // the data path to the peer and the destination's key and bounds
	Plan     time.Duration // merge, and the transport's building of its work
	Post     time.Duration // handing the work to the NIC or the sockets
	Wire     time.Duration // until every byte landed and the ack came back
	Notify   time.Duration // delivering the notification
	Total    time.Duration // the whole call
	// Triggered transfers: the time armed until the watcher saw the
	// counter's value, and when it saw it.
	Armed       time.Duration
	TriggerSeen time.Time
	// Posted is when the first write began, Landed when the last ended
	// acknowledged (zero: none did).
	Posted, Landed time.Time
}

// write splits a write that began at start into plan, post and wire.
func (ph *Phases) write(st transport.Stats, start time.Time) {
	ph.Landed = time.Now()
	d := ph.Landed.Sub(start)
	if ph.Posted.IsZero() {
		ph.Posted = start
	}
	ph.Plan += st.Plan
	ph.Post += st.Post
	if w := d - st.Plan - st.Post; w > 0 {
		ph.Wire += w
	}
}

// Plan is a batch validated and merged once, ready to run: the source
// region (held until Close), the peer, the destination name, the segments.
type Plan struct {
	peer, dst    string
	want         transport.Kind
	op           Op
	notification []byte
	src          *region.Region
	release      func()
	d            *desc.Decoder
	// batch is as decoded; its remote side is checked against each
	// resolution. A pull's is swapped: Src the peer's offsets, Dst ours
	// (a read's convention: Src in the source).
	batch  desc.Batch
	merged desc.Batch        // what the transport writes or reads
	req    transport.Request // the post, kept here so that it allocates nothing
	blocks uint64
	bytes  uint64
	// validate and merge are how long Plan took for each.
	validate, merge time.Duration
}

// Close releases the plan's source region and scratch memory.
func (p *Plan) Close() {
	if p.release != nil {
		p.release()
		p.release = nil
	}
	if p.d != nil {
		desc.Pool.Put(p.d)
		p.d = nil
	}
}

// Transfer plans and runs one batch under the caller's deadline, else
// DefaultTimeout. On failure the caller's deadline or cancellation is the
// outcome when it is what ended the batch, whatever phase it cut off
// (errs.ForCaller).
func (s *Service) Transfer(ctx context.Context, r Request) (Result, error) {
	return s.bounded(ctx, func(ctx context.Context) (Result, error) { return s.transfer(ctx, r) }, "batch failed", "peer", r.Peer, "dst", r.Dst)
}

// bounded runs one transfer under the caller's deadline, else
// DefaultTimeout, times it whole, and on failure reports the caller's own
// deadline or cancel when that is what ended it (errs.ForCaller), counted
// and logged with msg and kv.
func (s *Service) bounded(ctx context.Context, run func(context.Context) (Result, error), msg string, kv ...any) (Result, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.DefaultTimeout)
		defer cancel()
	}
	start := time.Now()
	res, err := run(ctx)
	res.Phases.Total = time.Since(start)
	if err != nil {
		err = errs.ForCaller(ctx, err)
		s.cfg.Counters.BatchesFailed.Add(1)
		s.cfg.Log.Debug(msg, append(kv, "error", err)...)
	}
	return res, err
}

// pullMargin: a pull's data path must end before the caller's deadline
// fires, since the caller's daemon writes the caller's own memory: gRPC
// answers DeadlineExceeded at the client's deadline whether or not the
// handler stopped, and the handler's deadline (the propagated timeout) is
// a little later. So a pull from a raw gRPC caller runs under the caller's
// deadline less this, which covers the propagation and the data path's cut
// (a copy chunk, a socket read) when the host is not loaded. The clients
// remove the assumption: they send the caller's deadline apart from a later
// gRPC one (CallerDeadline), and the answer waits for the data path.
const pullMargin = 20 * time.Millisecond

// callerDeadlineKey marks a ctx whose deadline is the caller's own, sent by
// a client whose gRPC call ends later (CallerDeadline).
type callerDeadlineKey struct{}

// CallerDeadline bounds ctx by d, the caller's own deadline that a client
// sent beside a later gRPC deadline (internal/callerdeadline), and by ctx's
// deadline less pullMargin; transfers under it answer at d, after their
// data path stopped, with no margin of their own.
func CallerDeadline(ctx context.Context, d time.Time) (context.Context, context.CancelFunc) {
	if hd, ok := ctx.Deadline(); ok && hd.Add(-pullMargin).Before(d) {
		d = hd.Add(-pullMargin)
	}
	ctx, cancel := context.WithDeadline(ctx, d)
	return context.WithValue(ctx, callerDeadlineKey{}, d), cancel
}

// early bounds a pull (op OpRead) by the caller's deadline less
// pullMargin, unless that deadline is the exact one a client sent
// (CallerDeadline); a write keeps ctx.
func early(ctx context.Context, op Op) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if op != OpRead || !ok {
		return ctx, func() {}
	}
	if exact, ok := ctx.Value(callerDeadlineKey{}).(time.Time); ok && exact.Equal(d) {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, d.Add(-pullMargin))
}

func (s *Service) transfer(ctx context.Context, r Request) (Result, error) {
	ctx, cancel := early(ctx, r.Op)
	defer cancel()
	p, err := s.Plan(r)
	if err != nil {
		return Result{}, err
	}
	defer p.Close()
	res, err := s.Run(ctx, p)
	res.Phases.Validate, res.Phases.Plan = p.validate, res.Phases.Plan+p.merge
	return res, err
}

// Plan validates r and everything about it that can be checked locally,
// before anything is dialled: the fields, the source region (held), the
// descriptors against the source and the limits; then merges them.
func (s *Service) Plan(r Request) (*Plan, error) {
	switch {
	case r.Src == "":
		return nil, fmt.Errorf("%w: src_region_id is empty", errs.ErrInvalidArgument)
	case r.Peer == "":
		return nil, fmt.Errorf("%w: peer is empty: give the destination daemon's peer address, host:port", errs.ErrInvalidArgument)
	case r.Dst == "":
		return nil, fmt.Errorf("%w: dst_region is empty: give the destination region's export name", errs.ErrInvalidArgument)
	case r.Descriptors == nil:
		return nil, fmt.Errorf("%w: descriptors is not set", errs.ErrInvalidArgument)
	case len(r.Notification) > MaxNotification:
		return nil, fmt.Errorf("%w: notification is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(r.Notification), MaxNotification)
	case r.BadTransport != nil:
		return nil, r.BadTransport
	case r.BadOp != nil:
		return nil, r.BadOp
	}
	t0 := time.Now()
	p := &Plan{peer: r.Peer, dst: r.Dst, want: r.Transport, op: r.Op, notification: r.Notification}
	var err error
	p.src, p.release, err = s.cfg.Registry.Acquire(r.Src, "src_region_id", r.Caller)
	if err != nil {
		return nil, err
	}
	p.d = desc.Pool.Get().(*desc.Decoder)
	if r.Op == OpRead {
		// The local region is the destination: decoded swapped, so that
		// its ranges are checked for overlaps and against its size.
		pk := desc.Packed{SrcOffsets: r.Descriptors.DstOffsets, DstOffsets: r.Descriptors.SrcOffsets, Lengths: r.Descriptors.Lengths, BlockLength: r.Descriptors.BlockLength}
		p.batch, err = p.d.Decode(pk, desc.Limits{SrcSize: desc.UnknownSize, DstSize: p.src.Mem.Len, MaxBlocks: s.cfg.MaxDescriptors, Swapped: true})
	} else {
		p.batch, err = p.d.Decode(*r.Descriptors, desc.Limits{SrcSize: p.src.Mem.Len, DstSize: desc.UnknownSize, MaxBlocks: s.cfg.MaxDescriptors})
	}
	if err != nil {
		p.Close()
		return nil, err
	}
	p.blocks, p.bytes = uint64(p.batch.N()), p.batch.Bytes()
	t1 := time.Now()
	p.validate = t1.Sub(t0)
	p.merged = p.d.Merge(p.batch)
	if mb := p.merged.Bytes(); mb != p.bytes {
		p.Close()
		// Never hand a transport less than was asked for: success would lie.
		return nil, fmt.Errorf("batch: merged segments hold %d bytes, the descriptors %d (internal error)", mb, p.bytes)
	}
	p.merge = time.Since(t1)
	return p, nil
}

// Run sends p to its peer and returns once every byte landed, the receiving
// daemon acknowledged the batch, and its notification (if any) was
// delivered. It retries as every transfer does (retry.go): a cached
// resolution can be stale (the region was re-registered: its size then
// misjudges the bounds, or the receiver refuses the key before placing any
// byte), and a connection may break under the batch (made before it, it
// may have died unnoticed with an idle peer; fresh, the wire may fail it:
// Soft-RoCE under load NAKs a WRITE with "remote invalid request" now and
// then).
func (s *Service) Run(ctx context.Context, p *Plan) (Result, error) {
	var (
		kind  transport.Kind
		st    transport.Stats
		start time.Time
		ph    Phases
	)
	pol := retryPolicy{peer: p.peer, fresh: "a retry on a fresh connection"}
	stale := func(error) error {
		s.paths.forget(p.peer, p.dst, p.op)
		return nil
	}
	err := s.retry(ctx, pol, stale, func(ctx context.Context, _ bool) (ran, error) {
		t0 := time.Now()
		g := gateOf(ctx)
		// An armed batch holds nothing on the peer while it waits: a
		// destination deregistered meanwhile refuses its key.
		sess, remote, reg, cached, held, err := s.paths.dst(ctx, p, g == nil)
		if err != nil {
			return ran{sess: sess}, err
		}
		if !g.bind(keysPrint(0, remote.Key), remote.BoundAt) {
			held()
			return ran{}, fmt.Errorf("%w: dst_region %q on %s was re-registered after the transfer was armed and its trigger fired: not sent to the new registration", errs.ErrFailedPrecondition, p.dst, p.peer)
		}
		if err := p.checkRemote(remote.Size); err != nil {
			held()
			return ran{cached: cached, suspect: true}, err // the size may be stale, not the request wrong
		}
		if err := s.checkSelfOverlap(p.peer, p.dst, p.src, &p.batch, p.op); err != nil {
			held()
			return ran{}, err
		}
		ph.Resolve += time.Since(t0)
		if err := passGate(ctx); err != nil {
			held()
			return ran{}, err
		}
		start = time.Now()
		st, err = p.move(ctx, sess, reg, remote)
		ph.write(st, start)
		// The peer pinned the region from the first frame to its ack:
		// the resolution's hold on it may go now.
		held()
		if err != nil {
			return ran{sess: sess, posted: true, cached: cached}, p.writeFailed(sess.Kind, err)
		}
		kind = sess.Kind
		return ran{}, nil
	})
	if err != nil {
		return Result{}, err
	}
	return s.landed(ctx, p, kind, st, start, ph)
}

// landed ends a batch whose last write attempt began at start and
// succeeded: it delivers the notification and counts the batch.
func (s *Service) landed(ctx context.Context, p *Plan, kind transport.Kind, st transport.Stats, start time.Time, ph Phases) (Result, error) {
	elapsed := time.Since(start)
	if err := s.notify(ctx, p, &ph); err != nil {
		return Result{}, err
	}
	s.count(p.op, p.bytes)
	return Result{Blocks: p.blocks, Bytes: p.bytes, Kind: kind, Stats: st, Elapsed: elapsed, Phases: ph}, nil
}

// writeFailed says which batch failed a write and, when a region's memory
// went away under it, which region: the side the fault itself carries
// (memguard.SideOf), whichever transport saw it.
func (p *Plan) writeFailed(kind transport.Kind, err error) error {
	if p.op == OpRead {
		return p.readFailed(kind, err)
	}
	if memguard.IsFault(err) {
		switch memguard.SideOf(err) {
		case memguard.Source:
			err = fmt.Errorf("src_region_id %s: %w", p.src.ID, err)
		case memguard.Destination:
			err = fmt.Errorf("dst_region %q on %s: %w", p.dst, p.peer, err)
		default:
			err = fmt.Errorf("src_region_id %s or dst_region %q on %s: %w", p.src.ID, p.dst, p.peer, err)
		}
	}
	return fmt.Errorf("batch of %d blocks to %s/%s over %s: %w", p.blocks, p.peer, p.dst, kind, err)
}

// notify delivers p's notification, if it has one, timing it into ph.
func (s *Service) notify(ctx context.Context, p *Plan, ph *Phases) error {
	if p.notification == nil {
		return nil
	}
	t0 := time.Now()
	err := s.paths.peers.Notify(ctx, p.peer, notify.Notification{Region: p.dst, Sender: s.cfg.NodeName,
		Notification: p.notification, Blocks: p.blocks, Bytes: p.bytes})
	ph.Notify = time.Since(t0)
	if err != nil {
		return fmt.Errorf("batch of %d blocks landed at %s/%s, but its notification was %s: %w", p.blocks, p.peer, p.dst, noteFate(err), err)
	}
	return nil
}

// noteFate says what became of a notification that failed with err: "not
// delivered", unless it left and no answer came (notify.ErrUnconfirmed),
// when the peer may still deliver it: "not confirmed".
func noteFate(err error) string {
	if errors.Is(err, notify.ErrUnconfirmed) {
		return "not confirmed"
	}
	return "not delivered"
}

// count counts a finished transfer: a write as sent, a pull as received.
func (s *Service) count(op Op, bytes uint64) {
	if op == OpRead {
		s.cfg.Counters.BatchesReceived.Add(1)
		s.cfg.Counters.BytesReceived.Add(bytes)
		return
	}
	s.cfg.Counters.BatchesSent.Add(1)
	s.cfg.Counters.BytesSent.Add(bytes)
}

// checkRemote checks the plan's remote ranges against the peer's region
// size as resolved: a write's destinations, a pull's sources.
func (p *Plan) checkRemote(size uint64) error {
	if p.op == OpRead {
		return desc.CheckSrc(p.batch, size, "dst_offsets")
	}
	return desc.CheckDst(p.batch, size)
}

// move posts the plan's merged batch once on sess, a write or a read (a
// pull; session checked the kind's Caps for it).
func (p *Plan) move(ctx context.Context, sess transport.Session, reg transport.Registration, remote transport.RemoteRegion) (transport.Stats, error) {
	op := transport.OpWrite
	if p.op == OpRead {
		op = transport.OpRead
	}
	p.req = transport.Request{Op: op, Local: reg, Remote: remote, Batch: &p.merged}
	st, err := sess.Conn.Post(ctx, &p.req)
	p.req = transport.Request{}
	return st, err
}

// readFailed is writeFailed for a pull: a fault on the source is the
// peer's region, on the destination ours.
func (p *Plan) readFailed(kind transport.Kind, err error) error {
	if memguard.IsFault(err) {
		switch memguard.SideOf(err) {
		case memguard.Source:
			err = fmt.Errorf("dst_region %q on %s (the pull's source): %w", p.dst, p.peer, err)
		case memguard.Destination:
			err = fmt.Errorf("src_region_id %s (the pull's destination): %w", p.src.ID, err)
		default:
			err = fmt.Errorf("dst_region %q on %s or src_region_id %s: %w", p.dst, p.peer, p.src.ID, err)
		}
	}
	return fmt.Errorf("read of %d blocks from %s/%s over %s into %s: %w", p.blocks, p.peer, p.dst, kind, p.src.ID, err)
}
