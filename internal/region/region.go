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
	"time"

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
// is gone (Registry.Expire), so is the region. The server gives each client
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
	// Pins is the key index the transports' receiving sides pin through,
	// made before them (NewPins); nil: New makes one. One registry per Pins.
	Pins *Pins
	// Group is the gid that owns ShmDir (the b2bd group), whose members may
	// map their regions and create files to import there; 0: no group.
	Group int
}

// Modes of the permission model (docs/architecture.md, "Permissions"). They are applied
// with chmod and chown, never through the umask.
const (
	ShmDirMode  = os.ModeDir | os.ModeSetgid | 0o770 // drwxrws---, group: Config.Group
	ShmFileMode = 0o660                              // daemon-allocated region files, owned by the caller
)

// Registry is the set of regions of one daemon.
type Registry struct {
	cfg      Config
	instance string   // this daemon instance's random ID: its files are b2bd-<instance>-*
	lock     *os.File // .b2bd-<instance>.lock, flocked for the daemon's lifetime
	lockPath string
	mu       *sync.Mutex // pins.mu: one lock for the regions and their keys
	pins     *Pins
	seq      uint64
	byID     map[string]*Region
	byName   map[string]*Region
	byKey    map[keyRef]*Region // pins.byKey
	// draining are regions whose lease ended while batches used them:
	// unpublished, released when the last batch lets go.
	draining map[*Region]struct{}
	drained  sync.WaitGroup // releases of drained regions under way
	watch    *watcher       // host regions' files (truncate.go); nil: no inotify
}

// Pins is the index of live registrations by transport key: the receiving
// side of every transport pins its destination through it
// (transport.Inbound's Pin). The daemon makes it first and hands it to the
// transports and then to the registry (Config.Pins), which fills it in as
// regions are registered, so neither needs the other to exist first and
// nothing is bound after construction. It shares the registry's lock.
type Pins struct {
	mu    sync.Mutex
	byKey map[keyRef]*Region
	// byReadKey indexes the registrations' read keys (transport.AccessKeyer):
	// a read pins only through it, a write only through byKey.
	byReadKey map[keyRef]*Region
	g         *Registry // set by New: releases a drained region
}

// NewPins returns an empty key index.
func NewPins() *Pins { return &Pins{byKey: map[keyRef]*Region{}, byReadKey: map[keyRef]*Region{}} }

type keyRef struct {
	k   transport.Kind
	key uint64
}

// New creates the shm directory if needed and gives it ShmDirMode and the
// group.
func New(cfg Config) (*Registry, error) {
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	if err := prepareShmDir(cfg.ShmDir, cfg.Group); err != nil {
		return nil, err
	}
	dir, err := filepath.EvalSymlinks(cfg.ShmDir)
	if err != nil {
		return nil, fmt.Errorf("region: resolve shm dir %s: %w", cfg.ShmDir, err)
	}
	cfg.ShmDir = dir
	if cfg.Pins == nil {
		cfg.Pins = NewPins()
	}
	g := &Registry{cfg: cfg, mu: &cfg.Pins.mu, pins: cfg.Pins, byID: map[string]*Region{}, byName: map[string]*Region{}, byKey: cfg.Pins.byKey,
		draining: map[*Region]struct{}{}}
	cfg.Pins.g = g
	if err := g.lockInstance(); err != nil {
		return nil, err
	}
	g.reclaim()
	g.startWatcher()
	return g, nil
}

// Files in the shm directory that belong to daemon instances. An instance
// holds flock(LOCK_EX) on its lock file for its lifetime, so a lock file
// that can be locked belongs to a dead instance (kill -9, a crash), whose
// region files are then reclaimed. Clients may not import files with these
// prefixes, so reclamation never touches an import.
const (
	reservedPrefix = "b2bd-"  // b2bd-<instance>-region-<rand>
	lockPrefix     = ".b2bd-" // .b2bd-<instance>.lock
	lockSuffix     = ".lock"
)

func isReserved(name string) bool {
	return strings.HasPrefix(name, reservedPrefix) || strings.HasPrefix(name, lockPrefix)
}

// lockInstance picks this instance's ID and takes its lock. The file is
// locked before it gets the name other daemons look for, so that no daemon
// starting at the same time can take it for a dead one.
func (g *Registry) lockInstance() error {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	g.instance = hex.EncodeToString(rnd[:])
	final := filepath.Join(g.cfg.ShmDir, lockPrefix+g.instance+lockSuffix)
	tmp := filepath.Join(g.cfg.ShmDir, lockPrefix+g.instance+".init")
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("region: create instance lock %s: %w", tmp, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("region: lock %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("region: publish instance lock %s: %w", final, err)
	}
	g.lock, g.lockPath = f, final
	return nil
}

// reclaim removes what dead instances left in the shm directory: for every
// lock file that this daemon can lock (its instance is gone) and that a
// daemon of this uid made, the instance's files and then the lock file.
func (g *Registry) reclaim() {
	dir := g.cfg.ShmDir
	entries, err := os.ReadDir(dir)
	if err != nil {
		g.cfg.Log.Warn("cannot look for files of dead daemon instances", "dir", dir, "error", err)
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, lockPrefix) || !strings.HasSuffix(name, lockSuffix) {
			continue
		}
		id := strings.TrimSuffix(strings.TrimPrefix(name, lockPrefix), lockSuffix)
		if id == g.instance || !isInstanceID(id) {
			continue
		}
		dead, files, bytes, err := g.reclaimInstance(id, entries)
		if err != nil {
			g.cfg.Log.Warn("reclaiming a dead daemon instance's files", "instance", id, "error", err)
		}
		if dead {
			g.cfg.Log.Info("reclaimed the files of a dead daemon instance", "instance", id, "dir", dir, "files", files, "bytes", bytes)
		}
	}
}

// reclaimInstance removes instance id's files if it is dead (its lock file
// can be locked).
func (g *Registry) reclaimInstance(id string, entries []os.DirEntry) (dead bool, files int, bytes int64, err error) {
	lockPath := filepath.Join(g.cfg.ShmDir, lockPrefix+id+lockSuffix)
	// Read-only and non-blocking: flock needs no more, and a FIFO a client
	// put under that name must not hang the daemon's start.
	f, err := os.OpenFile(lockPath, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, 0, 0, fmt.Errorf("open %s: %w", lockPath, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false, 0, 0, fmt.Errorf("fstat %s: %w", lockPath, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != uint32(os.Geteuid()) {
		// Not made by a daemon running as this uid (a client's file, or
		// another uid's daemon): never acted on.
		g.cfg.Log.Debug("not a lock file of this daemon's uid; leaving it", "path", lockPath, "uid", st.Uid, "mode", fmt.Sprintf("%#o", st.Mode))
		return false, 0, 0, nil
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, 0, 0, nil // alive: never touch its files
		}
		return false, 0, 0, fmt.Errorf("lock %s: %w", lockPath, err)
	}
	// Dead, and locked by us while its files go (a daemon that finds the
	// same lock file after us finds nothing left).
	prefix := reservedPrefix + id + "-"
	var errsSeen []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		p := filepath.Join(g.cfg.ShmDir, e.Name())
		var fst unix.Stat_t
		if err := unix.Lstat(p, &fst); err != nil {
			continue
		}
		if err := os.Remove(p); err != nil {
			errsSeen = append(errsSeen, err)
			continue
		}
		files++
		bytes += fst.Size
	}
	if err := os.Remove(lockPath); err != nil {
		errsSeen = append(errsSeen, err)
	}
	return true, files, bytes, errors.Join(errsSeen...)
}

func isInstanceID(id string) bool {
	if len(id) != 16 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// prepareShmDir creates dir (parents 0755) or checks that an existing one is
// not a shared directory such as /dev/shm itself, then sets its group and
// mode explicitly.
func prepareShmDir(dir string, group int) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return fmt.Errorf("region: create the parent of --shm-dir %s: %w", dir, err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("region: create --shm-dir %s: %w", dir, err)
		}
	case err != nil:
		return fmt.Errorf("region: --shm-dir %s: %w", dir, err)
	case !st.IsDir():
		return fmt.Errorf("%w: --shm-dir %s is not a directory", errs.ErrInvalidArgument, dir)
	case st.Mode()&(os.ModeSticky|0o002) != 0:
		return fmt.Errorf("%w: --shm-dir %s is a shared directory (mode %v): give b2bd a directory of its own, e.g. /dev/shm/b2bd", errs.ErrInvalidArgument, dir, st.Mode())
	}
	if group > 0 {
		if err := os.Chown(dir, -1, group); err != nil {
			return fmt.Errorf("region: give --shm-dir %s to gid %d: %w", dir, group, err)
		}
	}
	if err := os.Chmod(dir, ShmDirMode); err != nil {
		return fmt.Errorf("region: chmod --shm-dir %s to %v: %w", dir, ShmDirMode, err)
	}
	return nil
}

// MkdirAll is os.MkdirAll with the mode applied explicitly to every
// directory it creates, whatever the umask.
func MkdirAll(dir string, mode os.FileMode) error {
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := MkdirAll(parent, mode); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, mode); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil
		}
		return err
	}
	return os.Chmod(dir, mode)
}

// ShmDir is the resolved shared-memory directory.
func (g *Registry) ShmDir() string { return g.cfg.ShmDir }

// Caller is who asks, as the local API's socket credentials tell: regions'
// files are handed to their caller, and imports must be the caller's own.
// A region belongs to the caller that registered it (see Owns).
type Caller struct {
	UID, GID uint32
	Known    bool // false for callers over TCP, whose uid the kernel cannot tell
	// Identity is a TCP caller's authenticated TLS identity (its
	// certificate's first DNS name); "" over the plaintext loopback API.
	Identity string
}

// Root is a caller with every right over every region.
var Root = Caller{Known: true}

func (c Caller) String() string {
	switch {
	case c.Known:
		return fmt.Sprintf("uid %d", c.UID)
	case c.Identity != "":
		return fmt.Sprintf("TLS identity %q", c.Identity)
	default:
		return "an unauthenticated TCP caller"
	}
}

// Owns reports whether who may act on a region that c registered: root on
// the Unix socket may act on every region; a socket caller on the regions
// registered with its uid; a TCP caller (uid unknown) on the regions
// registered over TCP with its TLS identity. Unauthenticated TCP callers
// (the plaintext loopback API) share one identity, "", and never reach a
// region registered on the socket or with a certificate.
func (c Caller) Owns(who Caller) bool {
	if who.Known && who.UID == 0 {
		return true
	}
	if c.Known || who.Known {
		return c.Known && who.Known && c.UID == who.UID
	}
	return c.Identity == who.Identity
}

// permit checks that who may act on r; g.mu held or r immutable.
func permit(r *Region, field string, who Caller) error {
	if r.Owner.Owns(who) {
		return nil
	}
	return fmt.Errorf("%w: %s %s belongs to %s, not to the caller (%s)", errs.ErrPermissionDenied, field, r.ID, r.Owner, who)
}

// AllocHost creates a shared-memory file of size bytes, owned by the caller,
// and maps it.
// A lease (at most one; none: the region persists) ties it to its client.
func (g *Registry) AllocHost(size uint64, export Export, who Caller, lease ...Lease) (*Region, error) {
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
	path := filepath.Join(g.cfg.ShmDir, reservedPrefix+g.instance+"-region-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("region: create %s: %w", path, err)
	}
	kept := false // the region keeps f (to see it truncated); add closes it on failure
	defer func() {
		if !kept {
			f.Close()
		}
	}()
	// The caller must be able to map the file, and nobody else: it is handed
	// to the caller's uid and gid (the setgid directory's group would let
	// every member of the b2bd group in). A caller whose uid is unknown (TCP)
	// never maps it: the daemon's own gid then.
	uid, gid := -1, os.Getegid()
	if who.Known && os.Geteuid() == 0 {
		uid, gid = int(who.UID), int(who.GID)
	}
	if err := f.Chown(uid, gid); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("region: hand %s to uid %d gid %d: %w", path, uid, gid, err)
	}
	if err := f.Chmod(ShmFileMode); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("region: chmod %s to %#o: %w", path, ShmFileMode, err)
	}
	if err := fallocate(f, size); err != nil {
		os.Remove(path)
		if errors.Is(err, unix.ENOSPC) {
			return nil, fmt.Errorf("%w: host_alloc.size %d: no room in %s: %v", errs.ErrResourceExhausted, size, g.cfg.ShmDir, err)
		}
		return nil, fmt.Errorf("region: fallocate %s (%d bytes): %w", path, size, err)
	}
	id, err := fileIDOf(f)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	mem, unmap, err := mapFile(f, 0, size)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	r := &Region{Mem: mem, ShmPath: path, release: unmap, owned: true, fileID: id, Owner: who, file: f}
	kept = true
	return g.add(r, export, lease)
}

// ImportHost maps [offset, offset+size) of a file that lies in the shm
// directory and belongs to the caller. size 0 means to the end of the file.
func (g *Registry) ImportHost(path string, offset, size uint64, export Export, who Caller, lease ...Lease) (*Region, error) {
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
	kept := false // the region keeps f (to see it truncated); add closes it on failure
	defer func() {
		if !kept {
			f.Close()
		}
	}()
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
	kept = true
	return g.add(&Region{Mem: mem, ShmPath: real, ShmOff: offset, release: unmap, Owner: who, file: f}, export, lease)
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
	for _, p := range []string{path, real} {
		if isReserved(filepath.Base(p)) {
			return nil, "", fmt.Errorf("%w: host_file.path %s: names starting with %q or %q are reserved for the daemon's own files", errs.ErrInvalidArgument, p, reservedPrefix, lockPrefix)
		}
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
func (g *Registry) AllocCUDA(device int, size uint64, export Export, who Caller, lease ...Lease) (*Region, error) {
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
	return g.add(&Region{Mem: mem, IPC: ipc, release: free, Owner: who}, export, lease)
}

// ImportCUDA maps an application's GPU allocation through its IPC handle.
func (g *Registry) ImportCUDA(device int, handle []byte, offset, size uint64, export Export, who Caller, lease ...Lease) (*Region, error) {
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
	return g.add(&Region{Mem: mem, release: free, Owner: who}, export, lease)
}

// add registers r with every transport and publishes it. On failure it
// undoes the registrations and releases the memory.
func (g *Registry) add(r *Region, export Export, lease []Lease) (*Region, error) {
	r.Persist, r.Created = true, time.Now()
	if len(lease) > 0 {
		r.PID, r.client = lease[0].PID, lease[0].Client
		r.Persist = r.client == 0
	}
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
	if o, taken := g.byName[export.Name]; export.Name != "" && taken {
		err := nameTaken(export.Name, o)
		g.mu.Unlock()
		undo()
		return nil, err
	}
	if export.Name != "" {
		r.Export, r.ExportTo, r.Readers, r.ReadOnly = export.Name, export.To, export.Readers, export.ReadOnly
		g.byName[export.Name] = r
	}
	g.seq++
	r.ID = fmt.Sprintf("r%d", g.seq)
	g.byID[r.ID] = r
	for k, reg := range r.regs {
		g.byKey[keyRef{k, reg.Key().Key}] = r
	}
	g.indexReadKeys(r)
	if r.file != nil {
		g.watchFile(r)
	}
	g.mu.Unlock()
	g.cfg.Log.Debug("region registered", "id", r.ID, "kind", r.Mem.Kind, "bytes", r.Mem.Len, "export", export.Name)
	return r, nil
}

// nameTaken is the refusal of export name, held by o; g.mu held.
func nameTaken(name string, o *Region) error {
	return fmt.Errorf("%w: export_name %q is already used by %s: deregister it (b2bctl deregister %s) or pick another name", errs.ErrAlreadyExists, name, o.Holder(time.Now()), o.ID)
}

func (g *Registry) releaseMemory(r *Region) {
	g.mu.Lock()
	g.unwatchFile(r)
	g.mu.Unlock()
	if r.release != nil {
		if err := r.release(); err != nil {
			g.cfg.Log.Warn("release region memory", "id", r.ID, "error", err)
		}
		r.release = nil
	}
	if r.owned && r.ShmPath != "" {
		// The client may have unlinked the file and put its own at the
		// path: only the inode the daemon created is removed.
		if id, err := fileIDAt(r.ShmPath); err == nil && id == r.fileID {
			_ = os.Remove(r.ShmPath)
		} else if err == nil {
			g.cfg.Log.Info("region file was replaced by its client; leaving the new file", "id", r.ID, "path", r.ShmPath)
		}
	}
}

// fileID identifies an inode.
type fileID struct{ dev, ino uint64 }

func fileIDOf(f *os.File) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fileID{}, fmt.Errorf("region: fstat %s: %w", f.Name(), err)
	}
	return fileID{uint64(st.Dev), st.Ino}, nil
}

// fileIDAt identifies the file at path itself (a symlink is not followed).
func fileIDAt(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fileID{}, fmt.Errorf("region: lstat %s: %w", path, err)
	}
	return fileID{uint64(st.Dev), st.Ino}, nil
}

// SetExport sets (or, with an empty name, clears) a region's export, for
// its owner or root.
func (g *Registry) SetExport(id string, export Export, who Caller) (*Region, error) {
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
	if err := permit(r, "region_id", who); err != nil {
		return nil, err
	}
	if name != "" {
		if o, taken := g.byName[name]; taken && o != r {
			return nil, nameTaken(name, o)
		}
	}
	if err := g.revokeIfNarrowed(r, export); err != nil {
		return nil, err
	}
	if r.Export != "" {
		delete(g.byName, r.Export)
	}
	r.Export, r.ExportTo, r.Readers, r.ReadOnly = name, export.To, export.Readers, export.ReadOnly
	if name != "" {
		g.byName[name] = r
	} else {
		r.ExportTo, r.Readers, r.ReadOnly = nil, nil, false
	}
	if len(r.Readers) == 0 {
		g.unindexReadKeys(r)
	} else {
		g.indexReadKeys(r) // readers granted now: their keys are made here
	}
	return r, nil
}

// Acquire finds a region by ID for its owner (or root), and holds it for a
// batch until release.
func (g *Registry) Acquire(id, field string, who Caller) (*Region, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byID[id]
	if !ok || r.closing {
		return nil, nil, fmt.Errorf("%w: %s %q is not a registered region", errs.ErrNotFound, field, id)
	}
	if err := permit(r, field, who); err != nil {
		return nil, nil, err
	}
	if err := g.checkFile(r); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", field, err)
	}
	r.active++
	return r, func() { g.done(r) }, nil
}

// Hold is Acquire for a long-lived holder (a layout, named in holder as
// the refusal of a deregistration should name it, e.g. `layout "kv"`): the
// region stays registered until release.
func (g *Registry) Hold(id, field string, who Caller, holder string) (*Region, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byID[id]
	if !ok || r.closing {
		return nil, nil, fmt.Errorf("%w: %s %q is not a registered region", errs.ErrNotFound, field, id)
	}
	if err := permit(r, field, who); err != nil {
		return nil, nil, err
	}
	if err := g.checkFile(r); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", field, err)
	}
	r.active++
	if r.heldBy == nil {
		r.heldBy = map[string]int{}
	}
	r.heldBy[holder]++
	return r, func() {
		g.mu.Lock()
		if r.heldBy[holder]--; r.heldBy[holder] <= 0 {
			delete(r.heldBy, holder)
		}
		g.mu.Unlock()
		g.done(r)
	}, nil
}

// ExportName is the name region id is exported under, "" when it is not
// exported (or not registered), read under the registry's lock.
func (g *Registry) ExportName(id string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r, ok := g.byID[id]; ok {
		return r.Export
	}
	return ""
}

// Lookup finds an exported region by name for the peer whose authenticated
// identity is peer ("" when peers are not authenticated) to write into,
// holding it until release. A region exported to named peers refuses every
// other peer.
func (g *Registry) Lookup(name, peer string) (*Region, func(), error) {
	return g.LookupFor(name, peer, transport.AccessWrite)
}

// LookupFor is Lookup for access a: AccessRead needs the peer among the
// export's readers ("*": every peer), AccessWrite among its writers
// (export_to; empty: every peer) and the export not read-only.
func (g *Registry) LookupFor(name, peer string, a transport.Access) (*Region, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byName[name]
	if !ok || r.closing {
		return nil, nil, fmt.Errorf("%w: no region is exported as %q", errs.ErrNotFound, name)
	}
	if err := Grants(ExportOf(r), peer, a, "region", name); err != nil {
		return nil, nil, err
	}
	if err := g.checkFile(r); err != nil {
		return nil, nil, err
	}
	r.active++
	return r, func() { g.done(r) }, nil
}

// ExportOf is r's export as set; g.mu held by the caller where it matters.
func ExportOf(r *Region) Export {
	return Export{Name: r.Export, To: r.ExportTo, Readers: r.Readers, ReadOnly: r.ReadOnly}
}

// Grants says whether export e lets peer (its authenticated identity, ""
// when peers are not authenticated) have access a to the thing named
// name (what: "region", "layout"); the refusal wraps ErrPermissionDenied.
func Grants(e Export, peer string, a transport.Access, what, name string) error {
	who := peer
	if who == "" {
		who = "an unauthenticated peer"
	}
	if a&transport.AccessWrite != 0 {
		if e.ReadOnly {
			return fmt.Errorf("%w: %s may not write %s %q (exported read-only)", errs.ErrPermissionDenied, who, what, name)
		}
		if len(e.To) > 0 && !slices.Contains(e.To, peer) {
			return fmt.Errorf("%w: %s may not write %s %q (exported to %v)", errs.ErrPermissionDenied, who, what, name, e.To)
		}
	}
	if a&transport.AccessRead != 0 && !readable(e.Readers, peer) {
		if len(e.Readers) == 0 {
			return fmt.Errorf("%w: %s may not read %s %q (its export grants no readers; set readers)", errs.ErrPermissionDenied, who, what, name)
		}
		return fmt.Errorf("%w: %s may not read %s %q (readers %v)", errs.ErrPermissionDenied, who, what, name, e.Readers)
	}
	return nil
}

// readable: readers grants peer.
func readable(readers []string, peer string) bool {
	return slices.Contains(readers, AnyPeer) || (len(readers) > 0 && slices.Contains(readers, peer))
}

// AnyPeer in an export's readers grants every authenticated peer.
const AnyPeer = "*"

// readKeyOf is reg's read key where it has one of its own
// (transport.AccessKeyer), distinct from its write key.
func readKeyOf(reg transport.Registration) (transport.RemoteKey, bool) {
	ak, ok := reg.(transport.AccessKeyer)
	if !ok {
		return transport.RemoteKey{}, false
	}
	k, err := ak.KeyFor(transport.AccessRead)
	if err != nil || k.Key == reg.Key().Key {
		return transport.RemoteKey{}, false
	}
	return k, true
}

// ReadKey is r's key for reads with transport k: its own read key where the
// registration has one (transport.AccessKeyer), else its key.
func (r *Region) ReadKey(k transport.Kind) (transport.RemoteKey, bool) {
	reg, ok := r.regs[k]
	if !ok {
		return transport.RemoteKey{}, false
	}
	if ak, ok := reg.(transport.AccessKeyer); ok {
		if rk, err := ak.KeyFor(transport.AccessRead); err == nil {
			return rk, true
		}
	}
	return reg.Key(), true
}

// Pin is Pins.Pin on the registry's key index.
func (g *Registry) Pin(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	return g.pins.Pin(k, key)
}

// Pin implements transport.Inbound's Pin: the receiving side of a transport
// holds the destination while it places bytes.
func (p *Pins) Pin(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.byKey[keyRef{k, key}]
	if !ok || r.closing {
		return memory.Memory{}, nil, fmt.Errorf("%w: no live %s registration has key %#x (deregistered?)", errs.ErrNotFound, k, key)
	}
	if r.Export == "" {
		// Peers may only write exported regions; un-exporting revokes a
		// key a peer still holds.
		return memory.Memory{}, nil, fmt.Errorf("%w: region %s is no longer exported", errs.ErrNotFound, r.ID)
	}
	if r.ReadOnly {
		return memory.Memory{}, nil, fmt.Errorf("%w: region %q is exported read-only", errs.ErrNotFound, r.Export)
	}
	if err := p.g.checkFile(r); err != nil {
		return memory.Memory{}, nil, err
	}
	r.active++
	return r.Mem, func() { p.done(r) }, nil
}

// PinRead is Pins.PinRead on the registry's key index.
func (g *Registry) PinRead(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	return g.pins.PinRead(k, key)
}

// PinRead implements transport.ReadPinner: the serving side of a pull holds
// the source while it sends. Only a read key pins, and only while the
// region is exported with readers.
func (p *Pins) PinRead(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.byReadKey[keyRef{k, key}]
	if !ok || r.closing {
		return memory.Memory{}, nil, fmt.Errorf("%w: no live %s registration has read key %#x (deregistered, or its readers narrowed?)", errs.ErrNotFound, k, key)
	}
	if r.Export == "" {
		return memory.Memory{}, nil, fmt.Errorf("%w: region %s is no longer exported", errs.ErrNotFound, r.ID)
	}
	if len(r.Readers) == 0 {
		return memory.Memory{}, nil, fmt.Errorf("%w: region %q no longer grants reads", errs.ErrNotFound, r.Export)
	}
	if err := p.g.checkFile(r); err != nil {
		return memory.Memory{}, nil, err
	}
	r.active++
	return r.Mem, func() { p.done(r) }, nil
}

// done ends one use of r; the last use of a region whose lease ended
// releases it (in its own goroutine: the caller may hold a transport's
// locks, which releasing the registrations takes).
func (p *Pins) done(r *Region) {
	p.mu.Lock()
	r.active--
	last := r.active == 0 && r.drain
	if last {
		r.drain = false
		delete(p.g.draining, r)
	}
	if last {
		p.g.drained.Add(1) // under the lock: Close waits for it
	}
	p.mu.Unlock()
	if last {
		go func() {
			defer p.g.drained.Done()
			p.g.cfg.Log.Info("region of a gone client released after its last batch", "id", r.ID, "owner", r.Owner.String(), "pid", r.PID)
			p.g.close(r)
		}()
	}
}

func (g *Registry) done(r *Region) { g.pins.done(r) }

// Expire ends the leases of client (its last connection closed): its
// regions are unpublished now (their names free, their keys refused) and
// released, at once if no batch or plan uses them, else when the last one
// lets go. It returns how many were released now and how many later.
func (g *Registry) Expire(client uint64) (now, later int) {
	if client == 0 {
		return 0, 0
	}
	var free []*Region
	g.mu.Lock()
	for _, r := range g.byID {
		if r.client != client || r.Persist {
			continue
		}
		g.unpublish(r)
		if r.active == 0 {
			free = append(free, r)
			continue
		}
		r.drain = true
		g.draining[r] = struct{}{}
		later++
	}
	g.mu.Unlock()
	for _, r := range free {
		g.cfg.Log.Info("client gone; its region is released", "id", r.ID, "owner", r.Owner.String(), "pid", r.PID, "export", r.Export)
		g.close(r)
	}
	return len(free), later
}

// Leases counts the regions that persist and the distinct clients holding
// the others' leases.
func (g *Registry) Leases() (persistent, holders int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	seen := map[uint64]struct{}{}
	for _, r := range g.byID {
		if r.Persist {
			persistent++
		} else {
			seen[r.client] = struct{}{}
		}
	}
	return persistent, len(seen)
}

// Deregister releases a region for its owner (or root). It refuses while
// batches use it, so memory is never unmapped under a transfer.
func (g *Registry) Deregister(id string, who Caller) error {
	g.mu.Lock()
	r, ok := g.byID[id]
	if !ok || r.closing {
		g.mu.Unlock()
		return fmt.Errorf("%w: region_id %q is not registered", errs.ErrNotFound, id)
	}
	if err := permit(r, "region_id", who); err != nil {
		g.mu.Unlock()
		return err
	}
	if len(r.heldBy) > 0 {
		names := make([]string, 0, len(r.heldBy))
		for h := range r.heldBy {
			names = append(names, h)
		}
		sort.Strings(names)
		g.mu.Unlock()
		return fmt.Errorf("%w: region %s is held by %s: deregister it first", errs.ErrFailedPrecondition, id, strings.Join(names, ", "))
	}
	if r.active > 0 {
		n := r.active
		g.mu.Unlock()
		return fmt.Errorf("%w: region %s is in use by %d batch(es) or prepared plan(s); retry when they finish, or release the plans (ReleaseTransfer)", errs.ErrFailedPrecondition, id, n)
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
	g.unindexReadKeys(r)
}

// indexReadKeys indexes r's read keys (readKeyOf, which makes them where
// they are made lazily) when r grants readers and is not closing; g.mu
// held. A region without readers gets none: its registrations never make
// a key that can read.
func (g *Registry) indexReadKeys(r *Region) {
	if len(r.Readers) == 0 || r.Export == "" || r.closing {
		return
	}
	for k, reg := range r.regs {
		if _, done := r.readKeys[k]; done {
			continue
		}
		if rk, ok := readKeyOf(reg); ok {
			if r.readKeys == nil {
				r.readKeys = map[transport.Kind]uint64{}
			}
			r.readKeys[k] = rk.Key
			g.pins.byReadKey[keyRef{k, rk.Key}] = r
		}
	}
}

// unindexReadKeys drops r's read keys from the index; g.mu held.
func (g *Registry) unindexReadKeys(r *Region) {
	for k, key := range r.readKeys {
		if g.pins.byReadKey[keyRef{k, key}] == r {
			delete(g.pins.byReadKey, keyRef{k, key})
		}
	}
	clear(r.readKeys)
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

// List returns a snapshot of the regions who may act on (every region for
// root), ordered by ID, with active counts.
func (g *Registry) List(who Caller) []Snapshot {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Snapshot, 0, len(g.byID))
	for _, r := range g.byID {
		if r.Owner.Owns(who) {
			out = append(out, Snapshot{Region: r, Active: r.active})
		}
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

// Close releases every region, waiting for none: callers stop batches
// first. Then the instance lock goes.
func (g *Registry) Close() {
	g.mu.Lock()
	rs := make([]*Region, 0, len(g.byID))
	for _, r := range g.byID {
		g.unpublish(r)
		rs = append(rs, r)
	}
	for r := range g.draining {
		// Leases that ended under a batch: callers stopped batches first.
		r.drain = false
		rs = append(rs, r)
	}
	clear(g.draining)
	lock := g.lock
	g.lock = nil
	g.mu.Unlock()
	for _, r := range rs {
		g.close(r)
	}
	g.drained.Wait()
	g.stopWatcher()
	if lock != nil {
		_ = os.Remove(g.lockPath)
		_ = lock.Close()
	}
}

// Export is a region's export: its name, the peers allowed to write it and
// those allowed to read it.
type Export struct {
	Name     string
	To       []string // writers: peer identities; empty: every authenticated peer
	Readers  []string // readers: peer identities, or AnyPeer; empty: none
	ReadOnly bool     // no writers at all (To must be empty)
}

func (e Export) check() error {
	if err := checkName(e.Name); err != nil {
		return err
	}
	if e.Name == "" && len(e.To) > 0 {
		return fmt.Errorf("%w: export_to is set but export_name is empty", errs.ErrInvalidArgument)
	}
	return e.checkGrants()
}

// checkGrants checks the export's writers and readers.
func (e Export) checkGrants() error {
	if e.Name == "" && len(e.Readers) > 0 {
		return fmt.Errorf("%w: readers is set but export_name is empty", errs.ErrInvalidArgument)
	}
	if e.Name == "" && e.ReadOnly {
		return fmt.Errorf("%w: read_only is set but export_name is empty", errs.ErrInvalidArgument)
	}
	if e.ReadOnly && len(e.To) > 0 {
		return fmt.Errorf("%w: read_only is set and export_to names %d writers: a read-only export has none", errs.ErrInvalidArgument, len(e.To))
	}
	for i, p := range e.To {
		if p == "" || len(p) > 253 || p == AnyPeer {
			return fmt.Errorf("%w: export_to[%d] %q is not a peer identity (1..253 bytes; empty export_to means every peer)", errs.ErrInvalidArgument, i, p)
		}
	}
	for i, p := range e.Readers {
		if p == "" || len(p) > 253 {
			return fmt.Errorf("%w: readers[%d] %q is not a peer identity (1..253 bytes, or \"*\" for every authenticated peer)", errs.ErrInvalidArgument, i, p)
		}
	}
	if len(e.Readers) > maxGrants || len(e.To) > maxGrants {
		return fmt.Errorf("%w: export_to has %d and readers %d peers, over the limit of %d", errs.ErrInvalidArgument, len(e.To), len(e.Readers), maxGrants)
	}
	return nil
}

// CheckGrants validates an export's grants (for layouts, whose names the
// layout registry checks).
func (e Export) CheckGrants() error { return e.checkGrants() }

// maxGrants bounds the peers an export names per access.
const maxGrants = 1024

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

// fallocate reserves size bytes of f, again when a signal interrupted it:
// the runtime's own preemption signals interrupt a large allocation on
// tmpfs, and allocating a range again is harmless.
func fallocate(f *os.File, size uint64) error {
	for {
		err := unix.Fallocate(int(f.Fd()), 0, 0, int64(size))
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
