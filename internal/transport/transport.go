// Package transport defines the data plane's contract. It is shaped for
// one-sided writes: register memory and get a key, resolve a remote region
// (done by the control plane, which hands the key here), post a batch of
// (local offset, remote offset, length), and wait until the receiver has the
// whole batch. RDMA WRITE fits it directly; the TCP transport emulates it.
package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/memory"
)

// ErrNotSent marks a failure met before any byte of the batch left: its
// connection was already broken, by another batch (one cut off by its
// cancel, say) or by a Close. Such a batch may run again on a fresh
// connection at no risk, and not as the one retry a batch that broke its
// connection gets: one cancel must not fail the batches queued behind it.
var ErrNotSent = errors.New("nothing of this batch was sent")

// Kind names a transport.
type Kind string

const (
	TCP   Kind = "tcp"
	Verbs Kind = "verbs"
	// Local is the same-host path (internal/transport/local): shared
	// memory for host regions, CUDA IPC and copy engines for GPU regions.
	Local Kind = "local"
)

// RemoteKey is what a peer needs to write into a registered region.
type RemoteKey struct {
	Key  uint64 // the kind's key: a random token, or an rkey
	Addr uint64 // the registration's base address where the kind needs it; else 0
}

// Registration is memory registered with one transport: its keys, one per
// access where the kind tells accesses apart, their replacement, and their
// withdrawal. What a kind cannot do it answers with errs.ErrUnimplemented,
// and its driver's Caps.Keys says so beforehand.
type Registration interface {
	Memory() memory.Memory
	// Key is the key for writes.
	Key() RemoteKey
	// KeyFor is the key for access a, where the kind's keys depend on the
	// access (verbs: one MR per access set, so that a read-only grant's rkey
	// cannot WRITE). ErrUnimplemented: one key serves every access, Key.
	KeyFor(a Access) (RemoteKey, error)
	// Rekey gives the registration new keys (Key returns the new write key
	// from now on) and returns the old write key, which revokes the old
	// ones: the registry rekeys a region when its export narrows or is
	// removed, so a peer that resolved a key before cannot keep using it.
	// The old keys stop working once the batches using them have ended (at
	// once when none does); they are not cut off. ErrUnimplemented: the
	// kind's keys cannot be replaced (Caps.Keys.Rekey false).
	Rekey() (old RemoteKey, err error)
	// RekeyFor replaces access a's key alone (tcp and local: random tokens
	// per access); the registry rekeys the read key when an export's
	// readers narrow. ErrUnimplemented: only Rekey can (Caps.Keys.RekeyRead
	// false).
	RekeyFor(a Access) (old RemoteKey, err error)
	// Withdraw is for kinds that pin the memory's pages (an RDMA MR): once
	// the memory's file is truncated those pages are no longer the file's,
	// and a NIC would keep reading and writing them. The registry then
	// withdraws the registration: every key it handed out stops working (as
	// a Rekey's old key does, once the batches using it ended), no new key
	// is made, and no batch may use it until Close. ErrUnimplemented: the
	// kind pins nothing (Caps.Keys.Withdraw false).
	Withdraw() error
	// Rails lists the registration's MR on each device of a kind over
	// several (rails); nil for a kind over one.
	Rails() []RailRegistration
	// Close releases the transport's hold on the memory (ibv_dereg_mr, say);
	// it is safe to call twice.
	Close() error
}

// SingleKey completes a Registration whose kind has one key for every
// access, which cannot be replaced, pins nothing and runs over one device:
// embed it and write Memory, Key and Close; override what the kind does.
type SingleKey struct{}

func (SingleKey) KeyFor(Access) (RemoteKey, error) {
	return RemoteKey{}, fmt.Errorf("%w: this kind has no key per access", errs.ErrUnimplemented)
}

func (SingleKey) Rekey() (RemoteKey, error) {
	return RemoteKey{}, fmt.Errorf("%w: this kind's keys cannot be replaced", errs.ErrUnimplemented)
}

func (SingleKey) RekeyFor(Access) (RemoteKey, error) {
	return RemoteKey{}, fmt.Errorf("%w: this kind's keys cannot be replaced one access at a time", errs.ErrUnimplemented)
}

func (SingleKey) Withdraw() error {
	return fmt.Errorf("%w: this kind pins no pages to withdraw", errs.ErrUnimplemented)
}

func (SingleKey) Rails() []RailRegistration { return nil }

// RemoteRegion is a peer's exported region as resolved over the control plane.
type RemoteRegion struct {
	Name string
	Size uint64
	// BoundAt is the resolution's (Resolution.BoundAt): an armed batch
	// follows its name to another registration only if bound before it.
	BoundAt time.Time
	Key     RemoteKey
	// Devices: a kind over several devices (verbs over several RDMA
	// devices, internal/transport/verbs/rails): the region's key on each of the
	// peer's devices, by index (Devices[0] is Key); nil with one.
	Devices []RemoteKey
}

// Peer is a remote daemon after a successful handshake, as one transport
// needs it: its addresses, its advert for this transport's kind (opaque
// bytes that only this kind parses), and its control plane for set-up the
// kind does over it (Signal). No wire types: internal/peer converts.
type Peer struct {
	Address string // the peer's control-plane address, host:port
	Node    string // the peer's node name
	// Advert is what the peer's transport of this kind advertised in its
	// handshake (Advert.Data there); empty when it advertised nothing.
	Advert []byte
	// Signal carries this kind's set-up messages to the same kind on the
	// peer (Peer.Signal); nil where there is none.
	Signal Signal
}

// Advert is what a transport advertises about itself: to peers in the
// handshake (Data, in the kind's own message) and in the daemon's Status
// (Detail).
type Advert struct {
	Kind   Kind
	Detail string // device, port, GID or listener, for Status
	// Data is handed to the same kind on every peer as Peer.Advert: TCP's
	// data listener and token, the same-host proof, the RDMA devices. The
	// kind versions it (proto/b2b/transport/<kind>/).
	Data []byte
}

// Signal sends payload, a message of the transport's own kind, to the same
// kind on the peer (its SignalHandler) and returns the answer. Errors carry
// internal/errs classes (a peer's NotFound stays NotFound, an unreachable
// peer is ErrUnavailable).
type Signal func(ctx context.Context, payload []byte) ([]byte, error)

// SignalHandler answers a kind's Signal from peers: the receiving half of
// set-up over the control plane (verbs: creating and dropping QP sets). The
// peer's node name is inside payload, as the kind defines it. Errors carry
// internal/errs classes; ErrUnimplemented: the kind takes no signals.
type SignalHandler interface {
	HandleSignal(ctx context.Context, payload []byte) ([]byte, error)
}

// Session is a live data path to one peer, as the peer manager hands it out
// for a batch.
type Session struct {
	Kind Kind
	Conn Conn
	Name string // the peer's node name
	// Caps is what the kind can do with this peer (its driver's CapsFor):
	// the batch layer checks a request against it before calling Conn.
	Caps Caps
	// Reused: Conn existed before this session was handed out, so it may
	// have died unnoticed with an idle peer (restarted, or its link flapped).
	Reused bool
	// Recheck: auto chose Kind by rank, not knowing the batch's route,
	// and the peer is on this host with a measured choice to make: Get
	// again with Need.Route and Need.BlockBytes may choose another kind.
	Recheck bool
}

// Resolution is a peer's export name resolved over the control plane: its
// size and its key with each transport it is registered with.
type Resolution struct {
	Name string
	Size uint64
	Keys map[Kind]RegionKey
	// Memory and Device are the region's memory kind and CUDA ordinal (0
	// when unknown: a peer of an older protocol), for auto's route.
	Memory memory.Kind
	Device int
	// BoundAt is when, by this daemon's clock, the peer's name came to
	// mean this registration (its answer's time less the age it gave:
	// never earlier than the truth); zero when the peer did not say.
	BoundAt time.Time
}

// LayoutResolution is a peer's exported layout resolved over the control
// plane: the layout (validated against its regions' sizes; its region names
// are the regions' export names) and each region's resolution, by
// Layout.Regions() index.
type LayoutResolution struct {
	Layout  *layout.Layout
	Regions []Resolution
	BoundAt time.Time // as Resolution's, for the layout and its regions' exports
}

// RegionKey is a region's key with one transport: its key, and on a kind
// over several devices the key on each (Devices[0] is Key); nil with one.
type RegionKey struct {
	Key     RemoteKey
	Devices []RemoteKey
}

// Stats describes how a batch went on the wire.
type Stats struct {
	Segments     uint64 // blocks after merging/gathering
	WorkRequests uint64 // verbs: WRs posted; TCP: frames written
	// Plan is the time spent building the batch's work (verbs: WR chains;
	// TCP: frame headers) inside Write; 0 for a prepared write.
	Plan time.Duration
	// Post is the time spent handing the work to the NIC or the sockets,
	// including a wait for the connection while another batch has it;
	// Write's remaining time is the wire and the acknowledgement (socket
	// writes, a pull's requests included, are wire). Local's direct GPU
	// copies count their queueing on the copy engines here; where the CPU
	// (or local's host stage) moves the bytes itself, nothing is handed
	// over: its copies are its wire, Post only the wait.
	Post time.Duration
}

// Request is one operation on a Conn, its sides named as NIXL names them:
// Local is this daemon's memory, Remote the peer's, whichever way the bytes
// go. It holds descriptors (Batch, with Local and Remote) or a block-id
// request (Blocks), never both. The batch layer keeps one per transfer in
// memory it reuses, so posting one allocates nothing.
type Request struct {
	// Op is OpWrite (a push: Local to Remote) or OpRead (a pull: Remote
	// into Local).
	Op Ops
	// Descriptors: Batch.Src holds offsets in the source (Local for a
	// write, Remote for a read), Batch.Dst in the destination.
	Local  Registration
	Remote RemoteRegion
	Batch  *desc.Batch
	// Blocks is a validated block-id request; Scratch its reusable memory.
	Blocks  *Blocks
	Scratch *BlockScratch
	// Warm moves no byte: the kind makes ready what the first batch of Op
	// between Local and Remote would otherwise build on this connection
	// (the same-host kind maps Remote: a GPU pool's IPC handle takes 75 ms
	// for 20 GiB), so that the first batch costs what the later ones do.
	// Batch and Blocks are then nil. A kind with nothing to make ready
	// (Handlers.Warm nil) answers at once.
	Warm bool
}

// Conn is an established data path to one peer.
type Conn interface {
	// Post carries out r. It returns nil only once every byte has landed
	// (a write: in the peer's region, acknowledged by the receiving
	// daemon; a read: in the local registration). On error any subset of
	// the bytes may have landed, and callers must never report success;
	// once Post returned, error or not, no byte of it lands any more
	// (verbs: the QPs are moved to error and drained first). A block-id
	// request that fails names its stretch with a *StretchError. Post
	// honours ctx's deadline and may be called concurrently. An operation
	// or shape outside the kind's Caps (Ops, Blocks) answers
	// errs.ErrUnimplemented; see Handlers for how a kind routes them.
	Post(ctx context.Context, r *Request) (Stats, error)
	// Prepare builds r's work (a write of descriptors) for this
	// connection, to be posted many times (prepared transfers). r is not
	// retained: the Prepared keeps what it needs (in C memory for verbs).
	// The result is bound to this Conn; once the Conn broke, the caller
	// prepares again on a fresh one. errs.ErrUnimplemented where
	// Caps.Prepared is false, or for another operation or shape.
	Prepare(r *Request) (Prepared, error)
	// Err is nil while the connection is usable; once it broke, the peer
	// manager drops it and connects afresh. It never waits for a batch in
	// flight: the manager asks it holding the peer's lock.
	Err() error
	// Close tears the connection down; safe to call twice.
	Close() error
}

// Access is what a key lets a peer do with a region: write into it, read
// from it, or both (read grants).
type Access uint8

const (
	AccessWrite Access = 1 << iota
	AccessRead
)

// Descriptors is a descriptor operation as a kind carries it: the local
// registration, the peer's region and the batch.
type Descriptors func(ctx context.Context, local Registration, remote RemoteRegion, b *desc.Batch) (Stats, error)

// BlockOp is a block-id operation as a kind carries it in one go.
type BlockOp func(ctx context.Context, b *Blocks, sc *BlockScratch) (Stats, error)

// Handlers are a kind's implementations of each operation; embedded in its
// Conn (and set once, when the Conn is made), they give it Post. Write is
// required. A nil Read: the kind cannot pull (errs.ErrUnimplemented, and
// Caps.Ops lacks OpRead). A nil WriteBlocks or ReadBlocks: a block-id
// request takes one Write or Read per stretch (WriteStretches,
// ReadStretches), as where Caps.Blocks is false.
type Handlers struct {
	Write, Read             Descriptors
	WriteBlocks, ReadBlocks BlockOp
	// Warm serves a Request.Warm (read: for pulls); nil: nothing to warm.
	Warm func(ctx context.Context, local Registration, remote RemoteRegion, read bool) error
}

// Post routes r to the handler of its operation and shape.
func (h *Handlers) Post(ctx context.Context, r *Request) (Stats, error) {
	if r.Warm {
		switch {
		case r.Batch != nil || r.Blocks != nil:
			return Stats{}, fmt.Errorf("%w: a warm-up request moves no bytes: it holds no descriptors and no block ids", errs.ErrInvalidArgument)
		case r.Op != OpWrite && r.Op != OpRead:
			return Stats{}, fmt.Errorf("%w: warm-up for operation %s: want a write or a read", errs.ErrInvalidArgument, r.Op)
		case r.Op == OpRead && h.Read == nil:
			return Stats{}, fmt.Errorf("%w: this kind cannot read (pull)", errs.ErrUnimplemented)
		case h.Warm == nil:
			return Stats{}, ctx.Err()
		}
		return Stats{}, h.Warm(ctx, r.Local, r.Remote, r.Op == OpRead)
	}
	if (r.Batch == nil) == (r.Blocks == nil) {
		return Stats{}, fmt.Errorf("%w: a transfer request holds descriptors or block ids, exactly one (batch set: %t, blocks set: %t)", errs.ErrInvalidArgument, r.Batch != nil, r.Blocks != nil)
	}
	switch r.Op {
	case OpWrite:
		switch {
		case r.Batch != nil:
			return h.Write(ctx, r.Local, r.Remote, r.Batch)
		case h.WriteBlocks != nil:
			return h.WriteBlocks(ctx, r.Blocks, r.Scratch)
		default:
			return WriteStretches(ctx, h.Write, r.Blocks, r.Scratch)
		}
	case OpRead:
		switch {
		case h.Read == nil:
			return Stats{}, fmt.Errorf("%w: this kind cannot read (pull)", errs.ErrUnimplemented)
		case r.Batch != nil:
			return h.Read(ctx, r.Local, r.Remote, r.Batch)
		case h.ReadBlocks != nil:
			return h.ReadBlocks(ctx, r.Blocks, r.Scratch)
		default:
			return ReadStretches(ctx, h.Read, r.Blocks, r.Scratch)
		}
	}
	return Stats{}, fmt.Errorf("%w: transfer operation %s: want a write or a read", errs.ErrInvalidArgument, r.Op)
}

// Write posts a descriptor write on c: for tests and one-off callers (the
// request escapes; the batch layer keeps its own).
func Write(ctx context.Context, c Conn, local Registration, remote RemoteRegion, b *desc.Batch) (Stats, error) {
	return c.Post(ctx, &Request{Op: OpWrite, Local: local, Remote: remote, Batch: b})
}

// Read posts a descriptor read (a pull) on c, as Write.
func Read(ctx context.Context, c Conn, local Registration, remote RemoteRegion, b *desc.Batch) (Stats, error) {
	return c.Post(ctx, &Request{Op: OpRead, Local: local, Remote: remote, Batch: b})
}

// PostBlocks posts a block-id request with op on c, as Write.
func PostBlocks(ctx context.Context, c Conn, op Ops, b *Blocks, sc *BlockScratch) (Stats, error) {
	return c.Post(ctx, &Request{Op: op, Blocks: b, Scratch: sc})
}

// Prepare prepares a descriptor write on c, as Write.
func Prepare(c Conn, local Registration, remote RemoteRegion, b *desc.Batch) (Prepared, error) {
	return c.Prepare(&Request{Op: OpWrite, Local: local, Remote: remote, Batch: b})
}

// PreparedWrite is what a kind that prepares needs of r: a write of
// descriptors; any other request answers errs.ErrUnimplemented.
func PreparedWrite(r *Request) (Registration, RemoteRegion, *desc.Batch, error) {
	if r.Op != OpWrite || r.Batch == nil || r.Blocks != nil {
		return nil, RemoteRegion{}, nil, fmt.Errorf("%w: only a write of descriptors can be prepared (operation %s, block ids: %t)", errs.ErrUnimplemented, r.Op, r.Blocks != nil)
	}
	return r.Local, r.Remote, r.Batch, nil
}

// NoPrepare completes a Conn whose kind cannot prepare (Caps.Prepared
// false): embed it.
type NoPrepare struct{}

func (NoPrepare) Prepare(*Request) (Prepared, error) {
	return nil, fmt.Errorf("%w: this kind cannot prepare a batch", errs.ErrUnimplemented)
}

// Prepared is a batch's work built once for one Conn.
type Prepared interface {
	// Write posts the prepared batch, with Conn.Write's contract: nil only
	// once every byte landed and the receiver acknowledged it. Writes of one
	// Prepared may be called concurrently (they are serialised on the Conn)
	// and allocate nothing.
	Write(ctx context.Context) (Stats, error)
	// Close frees the prepared work; safe to call twice, and safe while a
	// Write is in flight (the work is freed when it ends).
	Close() error
}

// Transport is one data-plane implementation.
type Transport interface {
	Kind() Kind
	// Register makes m usable as a batch source and destination.
	Register(m memory.Memory) (Registration, error)
	// Connect opens a data path to p.
	Connect(ctx context.Context, p Peer) (Conn, error)
	// Advertise is what the kind tells peers in the handshake (Data, opaque
	// to all but this kind on the peer) and the daemon's Status line for it
	// (Detail); the daemon sets Kind. The zero Advert: nothing to say.
	Advertise() Advert
	// Status is the kind's live handles and per-device state, for the
	// daemon's Status, its metrics and leak checks.
	Status() Status
	// SignalHandler answers this kind's Peer.Signal from peers;
	// errs.ErrUnimplemented where the kind takes none.
	SignalHandler
	// Close stops the transport, its listeners and pollers; safe to call twice.
	Close() error
}

// Status is a transport's live state: its handles (Resources), and, for a
// kind over several devices, each device's.
type Status struct {
	Resources
	Rails []RailStatus // nil over one device
}

// Quiet completes a Transport that advertises nothing, counts no handles
// and takes no signals: embed it and override what the kind does.
type Quiet struct{}

func (Quiet) Advertise() Advert { return Advert{} }
func (Quiet) Status() Status    { return Status{} }
func (Quiet) HandleSignal(context.Context, []byte) ([]byte, error) {
	return nil, fmt.Errorf("%w: this kind takes no signals", errs.ErrUnimplemented)
}

// Inbound is the daemon as seen by a transport's receiving side.
type Inbound interface {
	// Pin finds the live registration of transport k with key and keeps its
	// memory mapped until release is called.
	Pin(k Kind, key uint64) (m memory.Memory, release func(), err error)
	// PinRead is Pin for a pull's source, by the region's read key: the
	// receiving side of a kind that answers reads (tcp's read frames, the
	// same-host path's read begin) pins through it. A write key never pins
	// for a read, nor a read key for a write, so a key is only ever good for
	// the operation it was granted for. errs.ErrUnimplemented: this side
	// serves no reads.
	PinRead(k Kind, key uint64) (m memory.Memory, release func(), err error)
	// Landed records a batch fully placed in local memory.
	Landed(k Kind, blocks, bytes uint64)
}

// NoReads completes an Inbound that serves no pulls: embed it.
type NoReads struct{}

func (NoReads) PinRead(Kind, uint64) (memory.Memory, func(), error) {
	return memory.Memory{}, nil, fmt.Errorf("%w: this side serves no reads", errs.ErrUnimplemented)
}

// Resources are a transport's live handles, reported by Status so leak
// checks can compare them before and after load.
type Resources struct {
	Connections   int // TCP: accepted data streams; verbs: QP sets, both directions
	QueuePairs    int // verbs only
	MemoryRegions int // verbs only, the transport's own included
}

// RailStatus is one rail (RDMA device) of a transport over several, for
// the daemon's Status.
type RailStatus struct {
	Rail       int
	Device     string
	Detail     string // port, GID, MTU, PCI address, NUMA node
	Up         bool
	LastError  string
	Failovers  uint64 // batch shares moved off this rail
	Reconnects uint64 // times it came back after a failure
	BytesSent  uint64 // batch bytes it carried and saw acknowledged
}

// RailRegistration is a registration's MR on one rail.
type RailRegistration struct {
	Rail      int
	Device    string
	Key       RemoteKey
	Path      string // ibv_reg_mr (host), ibv_reg_dmabuf_mr, ...
	Affinity  string // the rail's tier for this memory
	Preferred bool   // batches from this memory stripe over it while it is up
}

// String names an access for messages.
func (a Access) String() string {
	switch a {
	case AccessWrite:
		return "write"
	case AccessRead:
		return "read"
	case AccessWrite | AccessRead:
		return "read and write"
	}
	return "no access"
}
