// Package region owns the daemon's registered memory: host regions backed by
// shared-memory files, and (through the CUDA hook) GPU regions. Each region
// is registered with every available transport, and is reference-counted so
// that no batch ever reads or writes memory that has been released.
package region

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// MaxNameLen bounds export names.
const MaxNameLen = 128

// Region is one registered range of memory.
type Region struct {
	ID       string
	Export   string
	ExportTo []string // peer identities allowed to write; empty: every authenticated peer
	Readers  []string // peer identities allowed to read; "*": every authenticated peer; empty: none
	ReadOnly bool     // no peer may write it (ExportTo is then empty)
	Mem      memory.Memory
	ShmPath  string // host regions: the file clients map
	ShmOff   uint64
	IPC      []byte // daemon-allocated CUDA regions: the handle clients open
	IPCOff   uint64
	Owner    Caller    // who registered it: only the owner and root may act on it
	PID      int32     // the registering process (SO_PEERCRED); 0: unknown
	Persist  bool      // not leased: stays until Deregister (see Lease)
	Created  time.Time // when it was registered
	// exported is when Export was last set (guarded by Registry.mu).
	exported time.Time

	regs    map[transport.Kind]transport.Registration
	release func() error // unmap / free; runs once after every transport let go
	owned   bool         // the daemon created ShmPath and removes it
	fileID  fileID       // owned: the inode the daemon created at ShmPath
	// file is a host region's open file, fstat'ed for its size; wd its
	// inotify watch (0: none); truncated, once set, fails the region for
	// good (truncate.go). Guarded by Registry.mu.
	file      *os.File
	wd        int32
	truncated *TruncatedError
	sealed    bool // a memfd sealed against shrinking (memfd.go): never watched

	active  int  // batches using the region (guarded by Registry.mu)
	closing bool // deregistration started
	// readKeys are the read keys indexed in Pins.byReadKey, per transport
	// (guarded by Registry.mu): only while the region grants readers, so a
	// write-only region has no read key at all (over verbs no MR with
	// remote READ access).
	readKeys map[transport.Kind]uint64
	client   uint64 // the lease's holder (Lease.Client); 0: persistent
	drain    bool   // its lease ended while in use: released when active drops to 0
	// heldBy names the holders (layouts) counted in active, for the
	// refusal of a deregistration (guarded by Registry.mu).
	heldBy map[string]int
}

// Lease ties a region to the client that registered it: when the client
// is gone (Leases.Expire), so is the region. Leases.Join gives each client
// (a process on the Unix socket, a connection over TCP) its ID.
type Lease struct {
	Client uint64 // the holder; 0: none, the region persists until Deregister
	PID    int32  // the registering process, as SO_PEERCRED told; 0: unknown
}

// Holder describes who holds r, for listings and for the messages of
// whoever collides with it.
func (r *Region) Holder(now time.Time) string {
	h := fmt.Sprintf("region %s, owner %s", r.ID, r.Owner)
	if r.PID > 0 {
		h += fmt.Sprintf(", pid %d", r.PID)
	}
	h += fmt.Sprintf(", registered %s ago", now.Sub(r.Created).Round(time.Millisecond))
	if r.Persist {
		return h + ", persistent (stays until deregistered)"
	}
	return h + ", leased to its client (goes when the client's last connection closes)"
}

// freeMemory unmaps or frees r's memory once no registration holds it,
// and removes the file the daemon created for it.
func (r *Region) freeMemory(log hclog.Logger) {
	if r.release != nil {
		if err := r.release(); err != nil {
			log.Warn("release region memory", "id", r.ID, "error", err)
		}
		r.release = nil
	}
	if r.owned && r.ShmPath != "" {
		// The client may have unlinked the file and put its own at the
		// path: only the inode the daemon created is removed.
		if id, err := fileIDAt(r.ShmPath); err == nil && id == r.fileID {
			_ = os.Remove(r.ShmPath)
		} else if err == nil {
			log.Info("region file was replaced by its client; leaving the new file", "id", r.ID, "path", r.ShmPath)
		}
	}
}

// Registration returns the region's registration with transport k.
func (r *Region) Registration(k transport.Kind) (transport.Registration, bool) {
	g, ok := r.regs[k]
	return g, ok
}

// Transports lists the transports the region is registered with.
func (r *Region) Transports() []transport.Kind {
	out := make([]transport.Kind, 0, len(r.regs))
	for k := range r.regs {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Config configures a Registry.
type Config struct {
	ShmDir     string // where host regions' files live
	Transports []transport.Transport
	CUDA       CUDA   // nil on hosts without a usable GPU
	CUDAWhy    string // why CUDA is nil, for error messages
	Log        hclog.Logger
	// Pins is the key index the transports' receiving sides pin through,
	// made before them (NewPins); nil: New makes one. One registry per Pins.
	Pins *Pins
	// Group is the gid that owns ShmDir (the b2bd group), whose members may
	// map their regions and create files to import there; 0: no group.
	Group int
	// KeyCaps are what each kind's registrations do beyond Key, where the
	// kind's driver is not registered (tests' fakes); New takes the others
	// from the drivers' Caps.
	KeyCaps map[transport.Kind]transport.KeyCaps
	// Unwatchable, where set, is told (outside the registry's lock) that a
	// region can no longer be notified, and why: it was released
	// (deregistered, its client gone, the daemon closing; NotFound) or its
	// export cleared (FailedPrecondition). Its watchers end with that.
	Unwatchable func(id string, why error)
}

// Registry is the set of regions of one daemon.
type Registry struct {
	cfg    Config
	dir    *shmDir     // where host regions' files live, and this instance's lock
	mu     *sync.Mutex // pins.mu: one lock for the regions and their keys
	pins   *Pins
	seq    uint64
	byID   map[string]*Region
	byName map[string]*Region
	byKey  map[keyRef]*Region // pins.byKey
	// draining are regions whose lease ended while batches used them:
	// unpublished, released when the last batch lets go.
	draining map[*Region]struct{}
	drained  sync.WaitGroup // releases of drained regions under way
	files    *fileGuard     // host regions' files, failed when truncated (truncate.go)
	leases   *Leases        // the clients holding leases (leases.go)
	dep      *deposits      // handed-over descriptors waiting for their registration (memfd.go)
}

// firstSeq is where a daemon's region ids start counting: at random, so
// that the ids of a restarted daemon are not those of its last run. A
// client that held r<N> of the old daemon still names it after the restart
// (its channel reaches the new daemon on the same socket, as the same uid),
// and with ids counting from 1 in every run it would act on another
// client's region: send its bytes, deregister it. 2^40 starts: a stale id
// names a new region with odds of about (regions made) / 2^39.
func firstSeq() uint64 { return 1<<20 + rand.Uint64N(1<<40) }

// New creates the shm directory if needed and gives it ShmDirMode and the
// group.
func New(cfg Config) (*Registry, error) {
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	dir, err := openShmDir(cfg.ShmDir, cfg.Group, cfg.Log)
	if err != nil {
		return nil, err
	}
	cfg.ShmDir = dir.path
	if cfg.Pins == nil {
		cfg.Pins = NewPins()
	}
	g := &Registry{cfg: cfg, dir: dir, mu: &cfg.Pins.mu, pins: cfg.Pins, seq: firstSeq(), byID: map[string]*Region{}, byName: map[string]*Region{}, byKey: cfg.Pins.byKey,
		draining: map[*Region]struct{}{}, dep: &deposits{}, files: &fileGuard{mu: &cfg.Pins.mu, log: cfg.Log, keyCaps: map[transport.Kind]transport.KeyCaps{}}}
	for _, t := range cfg.Transports {
		if d, ok := transport.Lookup(t.Kind()); ok {
			g.files.keyCaps[t.Kind()] = d.CapsFor(t).Keys
		}
	}
	for k, c := range cfg.KeyCaps {
		g.files.keyCaps[k] = c
	}
	cfg.Pins.g, cfg.Pins.log = g, cfg.Log
	g.leases = &Leases{g: g}
	g.files.start()
	return g, nil
}
