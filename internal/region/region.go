// Package region owns the daemon's registered memory: host regions backed by
// shared-memory files, and (through the CUDA hook) GPU regions. Each region
// is registered with every available transport, and is reference-counted so
// that no batch ever reads or writes memory that has been released.
package region

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
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
	Mem      memory.Memory
	ShmPath  string // host regions: the file clients map
	ShmOff   uint64
	IPC      []byte // daemon-allocated CUDA regions: the handle clients open
	IPCOff   uint64

	regs    map[transport.Kind]transport.Registration
	release func() error // unmap / free; runs once after every transport let go
	owned   bool         // the daemon created ShmPath and removes it

	active  int  // batches using the region (guarded by Registry.mu)
	closing bool // deregistration started
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

// CUDA allocates and imports GPU memory; the gpudirect layer implements it.
type CUDA interface {
	// Alloc allocates size bytes on device and returns the memory, its IPC
	// handle, and a function that frees it.
	Alloc(device int, size uint64) (memory.Memory, []byte, func() error, error)
	// Import opens an IPC handle and returns [offset, offset+size) of it.
	Import(device int, handle []byte, offset, size uint64) (memory.Memory, func() error, error)
}

// Config configures a Registry.
type Config struct {
	ShmDir     string // where host regions' files live
	Transports []transport.Transport
	CUDA       CUDA   // nil on hosts without a usable GPU
	CUDAWhy    string // why CUDA is nil, for error messages
	Log        hclog.Logger
}

// Registry is the set of regions of one daemon.
type Registry struct {
	cfg    Config
	mu     sync.Mutex
	seq    uint64
	byID   map[string]*Region
	byName map[string]*Region
	byKey  map[keyRef]*Region
}

type keyRef struct {
	k   transport.Kind
	key uint64
}

// New creates the shm directory if needed.
func New(cfg Config) (*Registry, error) {
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	if err := os.MkdirAll(cfg.ShmDir, 0o770); err != nil {
		return nil, fmt.Errorf("region: create shm dir %s: %w", cfg.ShmDir, err)
	}
	dir, err := filepath.EvalSymlinks(cfg.ShmDir)
	if err != nil {
		return nil, fmt.Errorf("region: resolve shm dir %s: %w", cfg.ShmDir, err)
	}
	cfg.ShmDir = dir
	return &Registry{cfg: cfg, byID: map[string]*Region{}, byName: map[string]*Region{}, byKey: map[keyRef]*Region{}}, nil
}

// ShmDir is the resolved shared-memory directory.
func (g *Registry) ShmDir() string { return g.cfg.ShmDir }

// Caller is who asks, as the local API's socket credentials tell: regions'
// files are handed to their caller, and imports must be the caller's own.
type Caller struct {
	UID, GID uint32
	Known    bool // false for callers over TCP, whose uid the kernel cannot tell
}

// AllocHost creates a shared-memory file of size bytes, owned by the caller,
// and maps it.
func (g *Registry) AllocHost(size uint64, export Export, who Caller) (*Region, error) {
	if size == 0 {
		return nil, fmt.Errorf("%w: host_alloc.size is 0: a region needs at least one byte", errs.ErrInvalidArgument)
	}
	if size > 1<<46 {
		return nil, fmt.Errorf("%w: host_alloc.size %d exceeds the limit of %d bytes", errs.ErrInvalidArgument, size, uint64(1)<<46)
	}
	if err := export.check(); err != nil {
		return nil, err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	path := filepath.Join(g.cfg.ShmDir, "region-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o660)
	if err != nil {
		return nil, fmt.Errorf("region: create %s: %w", path, err)
	}
	defer f.Close()
	if who.Known && os.Geteuid() == 0 && who.UID != 0 {
		// The daemon runs as root; the caller must be able to map the file.
		if err := f.Chown(int(who.UID), int(who.GID)); err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("region: hand %s to uid %d: %w", path, who.UID, err)
		}
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil {
		os.Remove(path)
		if errors.Is(err, unix.ENOSPC) {
			return nil, fmt.Errorf("%w: host_alloc.size %d: no room in %s: %v", errs.ErrResourceExhausted, size, g.cfg.ShmDir, err)
		}
		return nil, fmt.Errorf("region: fallocate %s (%d bytes): %w", path, size, err)
	}
	mem, unmap, err := mapFile(f, 0, size)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	r := &Region{Mem: mem, ShmPath: path, release: unmap, owned: true}
	return g.add(r, export)
}

// ImportHost maps [offset, offset+size) of a file that lies in the shm
// directory and belongs to the caller. size 0 means to the end of the file.
func (g *Registry) ImportHost(path string, offset, size uint64, export Export, who Caller) (*Region, error) {
	if err := export.check(); err != nil {
		return nil, err
	}
	if !who.Known {
		return nil, fmt.Errorf("%w: host_file imports need the local Unix socket, where the caller's uid is known", errs.ErrPermissionDenied)
	}
	f, real, err := g.openInShmDir(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("region: stat %s: %w", real, err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && who.UID != 0 && sys.Uid != who.UID {
		return nil, fmt.Errorf("%w: host_file.path %s belongs to uid %d, not to the caller (uid %d)", errs.ErrPermissionDenied, real, sys.Uid, who.UID)
	}
	fsize := uint64(st.Size())
	if offset%uint64(os.Getpagesize()) != 0 {
		return nil, fmt.Errorf("%w: host_file.offset %d is not a multiple of the page size %d", errs.ErrInvalidArgument, offset, os.Getpagesize())
	}
	if offset >= fsize {
		return nil, fmt.Errorf("%w: host_file.offset %d is at or past the end of %s (%d bytes)", errs.ErrInvalidArgument, offset, path, fsize)
	}
	if size == 0 {
		size = fsize - offset
	}
	if size > fsize-offset {
		return nil, fmt.Errorf("%w: host_file.size %d at offset %d runs past the end of %s (%d bytes)", errs.ErrInvalidArgument, size, offset, path, fsize)
	}
	mem, unmap, err := mapFile(f, offset, size)
	if err != nil {
		return nil, err
	}
	return g.add(&Region{Mem: mem, ShmPath: real, ShmOff: offset, release: unmap}, export)
}

// openInShmDir opens path only if it resolves to a regular file inside the
// shm directory: symlinks are followed and the target checked, so a link to
// /etc/passwd is refused.
func (g *Registry) openInShmDir(path string) (*os.File, string, error) {
	if path == "" {
		return nil, "", fmt.Errorf("%w: host_file.path is empty", errs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(g.cfg.ShmDir, path)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, "", fmt.Errorf("%w: host_file.path %s does not exist", errs.ErrNotFound, path)
		}
		return nil, "", fmt.Errorf("%w: host_file.path %s: %v", errs.ErrInvalidArgument, path, err)
	}
	if rel, err := filepath.Rel(g.cfg.ShmDir, real); err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return nil, "", fmt.Errorf("%w: host_file.path %s resolves to %s, outside the shm directory %s", errs.ErrPermissionDenied, path, real, g.cfg.ShmDir)
	}
	pre, err := os.Stat(real)
	if err != nil || !pre.Mode().IsRegular() {
		return nil, "", fmt.Errorf("%w: host_file.path %s is not a regular file", errs.ErrInvalidArgument, real)
	}
	f, err := os.OpenFile(real, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, "", fmt.Errorf("%w: host_file.path %s: %v", errs.ErrPermissionDenied, real, err)
	}
	// The file opened must be the one checked (no swap in between).
	st, err := f.Stat()
	if err != nil || !os.SameFile(pre, st) {
		f.Close()
		return nil, "", fmt.Errorf("%w: host_file.path %s changed while being opened", errs.ErrPermissionDenied, real)
	}
	return f, real, nil
}

// AllocCUDA allocates GPU memory on device.
func (g *Registry) AllocCUDA(device int, size uint64, export Export) (*Region, error) {
	if g.cfg.CUDA == nil {
		return nil, fmt.Errorf("%w: cuda_alloc: this daemon has no usable GPU: %s", errs.ErrFailedPrecondition, g.cfg.CUDAWhy)
	}
	if size == 0 {
		return nil, fmt.Errorf("%w: cuda_alloc.size is 0", errs.ErrInvalidArgument)
	}
	if err := export.check(); err != nil {
		return nil, err
	}
	mem, ipc, free, err := g.cfg.CUDA.Alloc(device, size)
	if err != nil {
		return nil, err
	}
	return g.add(&Region{Mem: mem, IPC: ipc, release: free}, export)
}

// ImportCUDA maps an application's GPU allocation through its IPC handle.
func (g *Registry) ImportCUDA(device int, handle []byte, offset, size uint64, export Export) (*Region, error) {
	if g.cfg.CUDA == nil {
		return nil, fmt.Errorf("%w: cuda_ipc: this daemon has no usable GPU: %s", errs.ErrFailedPrecondition, g.cfg.CUDAWhy)
	}
	if size == 0 {
		return nil, fmt.Errorf("%w: cuda_ipc.size is 0", errs.ErrInvalidArgument)
	}
	if err := export.check(); err != nil {
		return nil, err
	}
	mem, free, err := g.cfg.CUDA.Import(device, handle, offset, size)
	if err != nil {
		return nil, err
	}
	return g.add(&Region{Mem: mem, release: free}, export)
}

// add registers r with every transport and publishes it. On failure it
// undoes the registrations and releases the memory.
func (g *Registry) add(r *Region, export Export) (*Region, error) {
	r.regs = make(map[transport.Kind]transport.Registration, len(g.cfg.Transports))
	undo := func() {
		for _, reg := range r.regs {
			_ = reg.Close()
		}
		g.releaseMemory(r)
	}
	// A region is usable with every transport that can take it (GPU memory
	// may suit TCP staging but not this host's NIC); it fails only if none can.
	var failures []error
	for _, t := range g.cfg.Transports {
		reg, err := t.Register(r.Mem)
		if err != nil {
			failures = append(failures, fmt.Errorf("%s: %w", t.Kind(), err))
			continue
		}
		r.regs[t.Kind()] = reg
	}
	if len(r.regs) == 0 && len(g.cfg.Transports) > 0 {
		undo()
		return nil, fmt.Errorf("region: no transport can use %d bytes of %s memory: %w", r.Mem.Len, r.Mem.Kind, errors.Join(failures...))
	}
	for _, f := range failures {
		g.cfg.Log.Warn("region not usable with a transport", "kind", r.Mem.Kind, "error", f)
	}
	g.mu.Lock()
	if _, taken := g.byName[export.Name]; export.Name != "" && taken {
		g.mu.Unlock()
		undo()
		return nil, fmt.Errorf("%w: export_name %q is already used by another region", errs.ErrAlreadyExists, export.Name)
	}
	if export.Name != "" {
		r.Export, r.ExportTo = export.Name, export.To
		g.byName[export.Name] = r
	}
	g.seq++
	r.ID = fmt.Sprintf("r%d", g.seq)
	g.byID[r.ID] = r
	for k, reg := range r.regs {
		g.byKey[keyRef{k, reg.Key().Key}] = r
	}
	g.mu.Unlock()
	g.cfg.Log.Debug("region registered", "id", r.ID, "kind", r.Mem.Kind, "bytes", r.Mem.Len, "export", export.Name)
	return r, nil
}

func (g *Registry) releaseMemory(r *Region) {
	if r.release != nil {
		if err := r.release(); err != nil {
			g.cfg.Log.Warn("release region memory", "id", r.ID, "error", err)
		}
		r.release = nil
	}
	if r.owned && r.ShmPath != "" {
		_ = os.Remove(r.ShmPath)
	}
}

// SetExport sets (or, with an empty name, clears) a region's export.
func (g *Registry) SetExport(id string, export Export) (*Region, error) {
	if err := export.check(); err != nil {
		return nil, err
	}
	name := export.Name
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byID[id]
	if !ok || r.closing {
		return nil, fmt.Errorf("%w: region_id %q is not registered", errs.ErrNotFound, id)
	}
	if name != "" {
		if o, taken := g.byName[name]; taken && o != r {
			return nil, fmt.Errorf("%w: export_name %q is already used by region %s", errs.ErrAlreadyExists, name, o.ID)
		}
	}
	if err := g.revokeIfNarrowed(r, export); err != nil {
		return nil, err
	}
	if r.Export != "" {
		delete(g.byName, r.Export)
	}
	r.Export, r.ExportTo = name, export.To
	if name != "" {
		g.byName[name] = r
	} else {
		r.ExportTo = nil
	}
	return r, nil
}

// Acquire finds a region by ID and holds it for a batch until release.
func (g *Registry) Acquire(id, field string) (*Region, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byID[id]
	if !ok || r.closing {
		return nil, nil, fmt.Errorf("%w: %s %q is not a registered region", errs.ErrNotFound, field, id)
	}
	r.active++
	return r, func() { g.done(r) }, nil
}

// Lookup finds an exported region by name for the peer whose authenticated
// identity is peer ("" when peers are not authenticated), holding it until
// release. A region exported to named peers refuses every other peer.
func (g *Registry) Lookup(name, peer string) (*Region, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byName[name]
	if !ok || r.closing {
		return nil, nil, fmt.Errorf("%w: no region is exported as %q", errs.ErrNotFound, name)
	}
	if len(r.ExportTo) > 0 && !slices.Contains(r.ExportTo, peer) {
		who := peer
		if who == "" {
			who = "an unauthenticated peer"
		}
		return nil, nil, fmt.Errorf("%w: %s may not write region %q (exported to %v)", errs.ErrPermissionDenied, who, name, r.ExportTo)
	}
	r.active++
	return r, func() { g.done(r) }, nil
}

// Pin implements transport.Inbound: the receiving side of a transport holds
// the destination while it places bytes.
func (g *Registry) Pin(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byKey[keyRef{k, key}]
	if !ok || r.closing {
		return memory.Memory{}, nil, fmt.Errorf("%w: no live %s registration has key %#x (deregistered?)", errs.ErrNotFound, k, key)
	}
	if r.Export == "" {
		// Peers may only write exported regions; un-exporting revokes a
		// key a peer still holds.
		return memory.Memory{}, nil, fmt.Errorf("%w: region %s is no longer exported", errs.ErrNotFound, r.ID)
	}
	r.active++
	return r.Mem, func() { g.done(r) }, nil
}

func (g *Registry) done(r *Region) {
	g.mu.Lock()
	r.active--
	g.mu.Unlock()
}

// Deregister releases a region. It refuses while batches use it, so memory
// is never unmapped under a transfer.
func (g *Registry) Deregister(id string) error {
	g.mu.Lock()
	r, ok := g.byID[id]
	if !ok || r.closing {
		g.mu.Unlock()
		return fmt.Errorf("%w: region_id %q is not registered", errs.ErrNotFound, id)
	}
	if r.active > 0 {
		n := r.active
		g.mu.Unlock()
		return fmt.Errorf("%w: region %s is in use by %d batch(es); retry when they finish", errs.ErrFailedPrecondition, id, n)
	}
	g.unpublish(r)
	g.mu.Unlock()
	g.close(r)
	return nil
}

// unpublish removes r from every index; g.mu held.
func (g *Registry) unpublish(r *Region) {
	r.closing = true
	delete(g.byID, r.ID)
	if r.Export != "" && g.byName[r.Export] == r {
		delete(g.byName, r.Export)
	}
	for k, reg := range r.regs {
		delete(g.byKey, keyRef{k, reg.Key().Key})
	}
}

// close deregisters from transports (children first), then frees memory.
func (g *Registry) close(r *Region) {
	for k, reg := range r.regs {
		if err := reg.Close(); err != nil {
			g.cfg.Log.Warn("deregister", "id", r.ID, "transport", k, "error", err)
		}
	}
	g.releaseMemory(r)
	g.cfg.Log.Debug("region released", "id", r.ID)
}

// List returns a snapshot of the regions ordered by ID, with active counts.
func (g *Registry) List() []Snapshot {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Snapshot, 0, len(g.byID))
	for _, r := range g.byID {
		out = append(out, Snapshot{Region: r, Active: r.active})
	}
	sort.Slice(out, func(i, j int) bool {
		return len(out[i].ID) < len(out[j].ID) || (len(out[i].ID) == len(out[j].ID) && out[i].ID < out[j].ID)
	})
	return out
}

// Snapshot is a region plus its use count at the time of List.
type Snapshot struct {
	*Region
	Active int
}

// Len is the number of regions.
func (g *Registry) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.byID)
}

// Close releases every region, waiting for none: callers stop batches first.
func (g *Registry) Close() {
	g.mu.Lock()
	rs := make([]*Region, 0, len(g.byID))
	for _, r := range g.byID {
		g.unpublish(r)
		rs = append(rs, r)
	}
	g.mu.Unlock()
	for _, r := range rs {
		g.close(r)
	}
}

// Export is a region's export: its name and the peers allowed to write it.
type Export struct {
	Name string
	To   []string // peer identities; empty: every authenticated peer
}

func (e Export) check() error {
	if err := checkName(e.Name); err != nil {
		return err
	}
	if e.Name == "" && len(e.To) > 0 {
		return fmt.Errorf("%w: export_to is set but export_name is empty", errs.ErrInvalidArgument)
	}
	for i, p := range e.To {
		if p == "" || len(p) > 253 {
			return fmt.Errorf("%w: export_to[%d] %q is not a peer identity (1..253 bytes)", errs.ErrInvalidArgument, i, p)
		}
	}
	return nil
}

func checkName(name string) error {
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: export_name is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(name), MaxNameLen)
	}
	for i, c := range name {
		if !(c == '-' || c == '_' || c == '.' || c == '/' || c == ':' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
			return fmt.Errorf("%w: export_name %q has %q at byte %d: use letters, digits and -_./:", errs.ErrInvalidArgument, name, c, i)
		}
	}
	return nil
}

func mapFile(f *os.File, offset, size uint64) (memory.Memory, func() error, error) {
	if size > uint64(int(^uint(0)>>1)) {
		return memory.Memory{}, nil, fmt.Errorf("%w: %d bytes cannot be mapped", errs.ErrInvalidArgument, size)
	}
	b, err := unix.Mmap(int(f.Fd()), int64(offset), int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		if errors.Is(err, unix.ENOMEM) {
			return memory.Memory{}, nil, fmt.Errorf("%w: mmap %s (%d bytes): %v", errs.ErrResourceExhausted, f.Name(), size, err)
		}
		return memory.Memory{}, nil, fmt.Errorf("region: mmap %s (%d bytes at %d): %w", f.Name(), size, offset, err)
	}
	m := memory.Memory{Kind: memory.Host, Addr: addrOf(b), Len: size, Host: b, DmabufFD: -1}
	var once sync.Once
	var uerr error
	return m, func() error {
		once.Do(func() { uerr = unix.Munmap(b) })
		return uerr
	}, nil
}
