package region

// The registry's life cycle of a region: allocation, import, publication,
// leases, deregistration and close.

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/region/fdpass"
	"github.com/b2bd/b2bd/internal/transport"
)

// maxHostAlloc is the largest host region AllocHost makes (64 TiB); the shm
// directory's filesystem may hold less.
const maxHostAlloc = 1 << 46

// AllocHost creates a shared-memory file of size bytes, owned by the caller,
// and maps it.
// A lease (at most one; none: the region persists) ties it to its client.
func (g *Registry) AllocHost(size uint64, export Export, who Caller, lease ...Lease) (*Region, error) {
	if size == 0 {
		return nil, fmt.Errorf("%w: host_alloc.size is 0: a region needs at least one byte", errs.ErrInvalidArgument)
	}
	if size > maxHostAlloc {
		return nil, fmt.Errorf("%w: host_alloc.size %d exceeds the limit of %d bytes", errs.ErrInvalidArgument, size, uint64(maxHostAlloc))
	}
	if err := export.check(); err != nil {
		return nil, err
	}
	path := g.dir.newRegionPath()
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
		// Closed before the free space is read: a partial reservation goes
		// with the file's last reference. (The deferred Close then finds it
		// closed, harmlessly.)
		f.Close()
		return nil, allocError(err, size, path, g.cfg.ShmDir, statShmFS(g.cfg.ShmDir))
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
	if token, ok, err := fdpass.ParseTokenPath(path); ok || err != nil {
		if err != nil {
			return nil, err
		}
		var pid int32
		if len(lease) > 0 {
			pid = lease[0].PID
		}
		r, err := g.dep.mapDeposit(path, token, offset, size, who, pid)
		if err != nil {
			return nil, err
		}
		return g.add(r, export, lease)
	}
	f, real, err := g.dir.open(path)
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
	if err := checkRange(path, uint64(st.Size()), offset, &size); err != nil {
		return nil, err
	}
	mem, unmap, err := mapFile(f, offset, size)
	if err != nil {
		return nil, err
	}
	kept = true
	return g.add(&Region{Mem: mem, ShmPath: real, ShmOff: offset, release: unmap, Owner: who, file: f}, export, lease)
}

// add registers r with every transport and publishes it. On failure it
// closes what it registered and releases the memory (close).
func (g *Registry) add(r *Region, export Export, lease []Lease) (*Region, error) {
	r.Persist, r.Created = true, time.Now()
	if len(lease) > 0 {
		r.PID, r.client = lease[0].PID, lease[0].Client
		r.Persist = r.client == 0
	}
	r.regs = make(map[transport.Kind]transport.Registration, len(g.cfg.Transports))
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
		g.close(r)
		return nil, fmt.Errorf("region: no transport can use %d bytes of %s memory: %w", r.Mem.Len, r.Mem.Kind, errors.Join(failures...))
	}
	for _, f := range failures {
		g.cfg.Log.Warn("region not usable with a transport", "kind", r.Mem.Kind, "error", f)
	}
	g.mu.Lock()
	if o, taken := g.byName[export.Name]; export.Name != "" && taken {
		err := nameTaken(export.Name, o)
		g.mu.Unlock()
		g.close(r)
		return nil, err
	}
	if export.Name != "" {
		r.Export, r.ExportTo, r.Readers, r.ReadOnly = export.Name, export.To, export.Readers, export.ReadOnly
		r.exported = time.Now()
		g.byName[export.Name] = r
	}
	g.seq++
	r.ID = fmt.Sprintf("r%d", g.seq)
	g.byID[r.ID] = r
	for k, reg := range r.regs {
		g.byKey[keyRef{k, reg.Key().Key}] = r
	}
	g.pins.indexReadKeys(r)
	if r.file != nil && !r.sealed {
		g.files.add(r)
	}
	g.mu.Unlock()
	g.cfg.Log.Debug("region registered", "id", r.ID, "kind", r.Mem.Kind, "bytes", r.Mem.Len, "export", export.Name)
	return r, nil
}

// nameTaken is the refusal of export name, held by o; g.mu held.
func nameTaken(name string, o *Region) error {
	return fmt.Errorf("%w: export_name %q is already used by %s: deregister it (b2bctl deregister %s) or pick another name", errs.ErrAlreadyExists, name, o.Holder(time.Now()), o.ID)
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
	g.pins.unindexReadKeys(r)
}

// close deregisters from transports (children first), then frees memory.
func (g *Registry) close(r *Region) {
	for k, reg := range r.regs {
		if err := reg.Close(); err != nil {
			g.cfg.Log.Warn("deregister", "id", r.ID, "transport", k, "error", err)
		}
	}
	g.files.drop(r)
	r.freeMemory(g.cfg.Log)
	g.cfg.Log.Debug("region released", "id", r.ID)
	if g.cfg.Unwatchable != nil {
		g.cfg.Unwatchable(r.ID, fmt.Errorf("%w: region %s was deregistered (or its client went away)", errs.ErrNotFound, r.ID))
	}
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
	g.dep.close()
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
	g.mu.Unlock()
	for _, r := range rs {
		g.close(r)
	}
	g.drained.Wait()
	g.files.stop()
	g.dir.unlock()
}

// shmFS describes the filesystem of the shm directory, for a refusal to say
// which filesystem refused a size and how much room it had.
type shmFS struct {
	known bool   // statfs succeeded
	name  string // the filesystem's type: tmpfs, ext4, xfs...
	free  uint64 // bytes free to the daemon
	// fsizeLimit is the daemon's RLIMIT_FSIZE (ulimit -f) in bytes, 0
	// when unlimited or unknown: over it the kernel refuses with EFBIG too.
	fsizeLimit uint64
}

// statShmFS describes the filesystem of dir; a failing statfs leaves it
// unknown (a refusal then names only the directory).
func statShmFS(dir string) shmFS {
	var fs shmFS
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) == nil {
		fs = shmFS{known: true, name: fsTypeName(int64(st.Type)), free: st.Bavail * uint64(st.Bsize)}
	}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_FSIZE, &rl) == nil && rl.Cur != unix.RLIM_INFINITY {
		fs.fsizeLimit = rl.Cur
	}
	return fs
}

// fsTypeName names a statfs f_type magic number.
func fsTypeName(magic int64) string {
	switch magic {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.EXT4_SUPER_MAGIC: // ext2 and ext3 share it
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	case unix.HUGETLBFS_MAGIC:
		return "hugetlbfs"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	case unix.FUSE_SUPER_MAGIC:
		return "fuse"
	}
	return fmt.Sprintf("type %#x", magic)
}

// allocError maps fallocate's failure to reserve size bytes at path, in
// the shm directory dir (on fs), to a domain error wrapping err. What the
// caller's size caused is theirs to change (a smaller region, or room made
// in the directory): no space, no quota, no memory, or a file larger than
// the filesystem (or the daemon's ulimit -f) allows are ResourceExhausted; a
// filesystem that cannot reserve space at all is the daemon's setup
// (FailedPrecondition). Anything else stays unclassed (Internal).
func allocError(err error, size uint64, path, dir string, fs shmFS) error {
	where := "the filesystem of shm directory " + dir
	if fs.known {
		where = fmt.Sprintf("the %s filesystem of shm directory %s", fs.name, dir)
	}
	switch {
	case errors.Is(err, syscall.ENOSPC):
		if fs.known {
			return fmt.Errorf("%w: host_alloc.size %d: no room on %s (%d bytes free): %w", errs.ErrResourceExhausted, size, where, fs.free, err)
		}
		return fmt.Errorf("%w: host_alloc.size %d: no room on %s: %w", errs.ErrResourceExhausted, size, where, err)
	case errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: host_alloc.size %d: over the daemon's disk quota on %s: %w", errs.ErrResourceExhausted, size, where, err)
	case errors.Is(err, syscall.ENOMEM):
		return fmt.Errorf("%w: host_alloc.size %d: out of memory reserving it on %s: %w", errs.ErrResourceExhausted, size, where, err)
	case errors.Is(err, syscall.EFBIG) && fs.fsizeLimit != 0 && size > fs.fsizeLimit:
		return fmt.Errorf("%w: host_alloc.size %d exceeds the daemon's file-size limit (ulimit -f) of %d bytes, on %s: %w", errs.ErrResourceExhausted, size, fs.fsizeLimit, where, err)
	case errors.Is(err, syscall.EFBIG), errors.Is(err, syscall.EINVAL):
		// Offset 0 and a length in (0, 2^46] are valid for fallocate(2):
		// EINVAL, like EFBIG, is the filesystem refusing a file that long.
		return fmt.Errorf("%w: host_alloc.size %d is larger than the largest file %s holds (the daemon's own limit is %d bytes): %w", errs.ErrResourceExhausted, size, where, uint64(maxHostAlloc), err)
	case errors.Is(err, syscall.EOPNOTSUPP):
		// Mode 0 unsupported: no size would do; the directory is the problem.
		return fmt.Errorf("%w: host_alloc.size %d: %s cannot reserve space for a file (fallocate unsupported); point --shm-dir at tmpfs: %w", errs.ErrFailedPrecondition, size, where, err)
	}
	return fmt.Errorf("region: fallocate %s (%d bytes): %w", path, size, err)
}
