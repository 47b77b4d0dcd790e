package transport

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/config"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
)

// Ops are the one-sided operations a driver carries.
type Ops uint

const (
	// OpWrite: a post places local blocks in a peer's region (push).
	OpWrite Ops = 1 << iota
	// OpRead: a post fetches a peer's blocks into local memory (pull).
	OpRead
)

// String names ops for messages.
func (o Ops) String() string {
	switch o {
	case 0:
		return "no operation"
	case OpWrite:
		return "write (push)"
	case OpRead:
		return "read (pull)"
	case OpWrite | OpRead:
		return "write and read"
	}
	return fmt.Sprintf("ops(%#x)", uint(o))
}

// Caps is what a driver can do, declared once: the peer manager picks a
// kind by comparing capabilities instead of naming kinds, the batch layer
// refuses a request outside them before calling the kind, and the
// conformance suite (transporttest) fails a kind whose Conns have more or
// less than its Caps say. They are the only statement of what a kind can
// do: no caller learns it by asserting optional interfaces.
type Caps struct {
	// Rank orders the kinds both sides offer: the highest usable one is
	// chosen.
	Rank int
	// SameHostOnly: the kind reaches daemons on this host only.
	SameHostOnly bool
	// Memory are the memory kinds a batch may come from or land in.
	Memory []memory.Kind
	// Ops are the operations its Conns post: OpWrite always, OpRead where
	// they pull (Handlers.Read).
	Ops Ops
	// Blocks: its Conns move a block-id request in one go
	// (Handlers.WriteBlocks, and ReadBlocks where they read); without it a
	// request takes the generic path, one write or read per stretch.
	Blocks bool
	// Prepared: its Conns' Prepare builds a descriptor write's work.
	Prepared bool
	// SingleConn: a Conn keeps state per connection that costs a batch far
	// more to rebuild than to wait for a busy Conn (the same-host kind maps
	// each of the peer's regions per connection: a populated mmap of a host
	// pool at ~60 ms a GiB, a GPU pool's IPC handle at 75 ms for 20 GiB), so the peer manager
	// keeps one Conn per peer of the kind instead of --conns-per-peer.
	SingleConn bool
	// Keys: what its registrations do with their keys beyond Key; their
	// other Registration methods answer errs.ErrUnimplemented, and the
	// conformance suite holds each kind to this.
	Keys KeyCaps
}

// KeyCaps are the Registration methods a kind implements beyond Key.
type KeyCaps struct {
	PerAccess bool // KeyFor: a key per access (a read key apart from the write key)
	Rekey     bool // Rekey: new keys, revoking the old
	RekeyRead bool // RekeyFor(AccessRead): a new read key alone
	Withdraw  bool // Withdraw: the kind pins pages that a truncation would orphan
	Rails     bool // Rails: one MR per device
}

// Need is what one request asks of a kind: its operation and the kind of
// the local memory it moves (0: any).
type Need struct {
	Op     Ops
	Memory memory.Kind
	// Route and BlockBytes (the batch's mean block size) let auto choose
	// by measurement for a peer on this host (Calibration); zero: by rank.
	Route      Route
	BlockBytes uint64
}

// Lacks says which capability c, kind k's, misses for n, nil when it has
// them all; the error is ErrFailedPrecondition and names the kind and what
// is missing.
func (c Caps) Lacks(k Kind, n Need) error {
	if miss := n.Op &^ c.Ops; miss != 0 {
		return fmt.Errorf("%w: transport %s cannot %s (its capabilities: %s)", errs.ErrFailedPrecondition, k, miss, c.Ops)
	}
	if n.Memory != 0 && !c.Supports(n.Memory) {
		return fmt.Errorf("%w: transport %s cannot move %s memory (its capabilities: %v)", errs.ErrFailedPrecondition, k, n.Memory, c.Memory)
	}
	return nil
}

// Env is what the daemon hands every driver's New: the receiving side's
// Inbound, a logger, the node's name, the settings the driver's Flags
// returned, and the daemon-wide services a transport may use. Its fields
// are daemon-wide, never one kind's.
type Env struct {
	Inbound Inbound
	Log     hclog.Logger
	Node    string
	// Settings is what Flags returned, with the parsed values (nil when
	// the driver has no Flags).
	Settings any
	// PeerAddr is this daemon's bound peer control-plane address.
	PeerAddr string
	// ShmDir and Group: the directory of the daemon's shared-memory files
	// and the group owning them (0: none).
	ShmDir string
	Group  int
	// TLS is the daemons' mutual TLS; nil: plaintext on loopback.
	TLS *auth.PeerTLS
	// CUDA is the GPU driver and Staging its pinned host buffers; nil
	// without a GPU.
	CUDA    gpudirect.Interface
	Staging *staging.Pool
}

// Driver is one transport kind as it registers itself from its package's
// init (one line: `func init() { _ = transport.Register(driver) }`); the
// daemon builds every registered driver the configuration enables, and
// names no kind itself (internal/daemon/builtins.go imports the drivers).
type Driver struct {
	Kind Kind
	// Flags adds the kind's flags (which config files also set) to fs,
	// bound to a fresh settings value with the kind's defaults, and returns
	// it; New finds it in Env.Settings. nil when the kind has none.
	Flags func(fs *flag.FlagSet) any
	// Ranges is the documented range of every flag Flags adds (the daemon
	// refuses a flag without one); Check the limits between them, given
	// Flags' settings once parsed (nil: none).
	Ranges config.Ranges
	Check  func(settings any) error
	// Listens names the flags holding addresses the kind listens on:
	// plaintext daemons (--insecure) keep them on loopback.
	Listens []string
	// Required: with --transport auto, the daemon refuses to start
	// without this kind (TCP, the fallback every peer has); otherwise a
	// kind that fails to start is left out and reported in Status.
	Required bool
	// New starts the transport.
	New func(env Env) (Transport, error)
	// Caps is what the kind can do. Where that depends on its
	// configuration (verbs over one device reads and prepares, over
	// several it does neither), CapsOf computes it from the transport New
	// returned; nil: Caps whatever New returned.
	Caps   Caps
	CapsOf func(t Transport) Caps
	// Usable says whether t (a transport New returned) can reach the peer
	// whose advert for this kind is advert (opaque bytes only this kind
	// parses); the error says why not, for the peer manager's record. nil:
	// usable whenever both sides offer the kind.
	Usable func(t Transport, advert []byte) error
}

// Registry holds registered drivers. Most code uses the process-wide one
// through Register and Registered; tests make their own.
type Registry struct {
	mu      sync.Mutex
	drivers map[Kind]Driver
	// failed keeps every refused registration: an init cannot act on an
	// error, so Registered returns them and the daemon refuses to start.
	failed []error
}

// Register adds d. A second driver of the same kind, an empty kind or a
// nil New is refused with ErrAlreadyExists or ErrInvalidArgument; the
// error is also kept for Registered, so an init that drops it loses
// nothing. No panic: the daemon reports it at start.
func (r *Registry) Register(d Driver) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	switch {
	case d.Kind == "":
		err = fmt.Errorf("%w: transport driver with an empty kind", errs.ErrInvalidArgument)
	case d.New == nil:
		err = fmt.Errorf("%w: transport driver %q has no New", errs.ErrInvalidArgument, d.Kind)
	default:
		if _, dup := r.drivers[d.Kind]; dup {
			err = fmt.Errorf("%w: transport driver %q is registered twice", errs.ErrAlreadyExists, d.Kind)
		}
	}
	if err != nil {
		r.failed = append(r.failed, err)
		return err
	}
	if r.drivers == nil {
		r.drivers = map[Kind]Driver{}
	}
	d.Caps.Memory = slices.Clone(d.Caps.Memory)
	r.drivers[d.Kind] = d
	return nil
}

// Registered returns the drivers, highest rank first (ties by kind, so the
// order is stable), and every registration that was refused.
func (r *Registry) Registered() ([]Driver, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Driver, 0, len(r.drivers))
	for _, d := range r.drivers {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Driver) int {
		if c := cmp.Compare(b.Caps.Rank, a.Caps.Rank); c != 0 {
			return c
		}
		return cmp.Compare(a.Kind, b.Kind)
	})
	return out, errors.Join(r.failed...)
}

// Lookup returns the driver of kind k.
func (r *Registry) Lookup(k Kind) (Driver, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.drivers[k]
	return d, ok
}

var drivers Registry

// Register adds d to the process-wide registry; see Registry.Register.
func Register(d Driver) error { return drivers.Register(d) }

// Registered returns the process-wide registry's drivers by rank, and any
// refused registration; see Registry.Registered.
func Registered() ([]Driver, error) { return drivers.Registered() }

// Lookup returns the process-wide registry's driver of kind k.
func Lookup(k Kind) (Driver, bool) { return drivers.Lookup(k) }

// Supports says whether the driver moves memory of kind m.
func (c Caps) Supports(m memory.Kind) bool { return slices.Contains(c.Memory, m) }

// CapsFor is what t, a transport d.New returned, can do: CapsOf's answer
// when the driver has one, else Caps.
func (d Driver) CapsFor(t Transport) Caps {
	if d.CapsOf == nil || t == nil {
		return d.Caps
	}
	c := d.CapsOf(t)
	c.Memory = slices.Clone(c.Memory)
	return c
}

// CheckUsable runs d.Usable (usable when it is nil).
func (d Driver) CheckUsable(t Transport, advert []byte) error {
	if d.Usable == nil {
		return nil
	}
	if err := d.Usable(t, advert); err != nil {
		return fmt.Errorf("transport %s: not usable for this peer: %w", d.Kind, err)
	}
	return nil
}
