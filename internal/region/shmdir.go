package region

// Shared-memory directory: the instance lock, reclaiming files a crashed
// instance left, opening and mapping files inside the directory.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
)

// Modes of the permission model (docs/architecture.md, "Permissions"). They are applied
// with chmod and chown, never through the umask.
const (
	ShmDirMode  = os.ModeDir | os.ModeSetgid | 0o770 // drwxrws---, group: Config.Group
	ShmFileMode = 0o660                              // daemon-allocated region files, owned by the caller
)

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

// shmDir is the shared-memory directory as this daemon instance uses it:
// its resolved path, the instance's ID and the lock that marks the instance
// alive, so that files are named, opened and reclaimed in one place.
type shmDir struct {
	path     string // resolved: imports are checked against it
	instance string // this daemon instance's random ID: its files are b2bd-<instance>-*
	lock     *os.File
	lockPath string // .b2bd-<instance>.lock, flocked for the daemon's lifetime
	unlocked sync.Once
	log      hclog.Logger
}

// openShmDir creates dir if needed (ShmDirMode, group), takes this
// instance's lock in it and removes what dead instances left.
func openShmDir(dir string, group int, log hclog.Logger) (*shmDir, error) {
	if err := prepareShmDir(dir, group); err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("region: resolve shm dir %s: %w", dir, err)
	}
	d := &shmDir{path: real, log: log}
	if err := d.lockInstance(); err != nil {
		return nil, err
	}
	d.reclaim()
	return d, nil
}

// newRegionPath is a fresh name for a daemon-allocated region's file.
func (d *shmDir) newRegionPath() string {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	return filepath.Join(d.path, reservedPrefix+d.instance+"-region-"+hex.EncodeToString(rnd[:]))
}

// unlock removes and releases the instance lock (once): the instance is
// over, and a later daemon may take its leftovers for a dead one's.
func (d *shmDir) unlock() {
	d.unlocked.Do(func() {
		_ = os.Remove(d.lockPath)
		_ = d.lock.Close()
	})
}

// lockInstance picks this instance's ID and takes its lock. The file is
// locked before it gets the name other daemons look for, so that no daemon
// starting at the same time can take it for a dead one.
func (d *shmDir) lockInstance() error {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	d.instance = hex.EncodeToString(rnd[:])
	final := filepath.Join(d.path, lockPrefix+d.instance+lockSuffix)
	tmp := filepath.Join(d.path, lockPrefix+d.instance+".init")
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
	d.lock, d.lockPath = f, final
	return nil
}

// reclaim removes what dead instances left in the shm directory: for every
// lock file that this daemon can lock (its instance is gone) and that a
// daemon of this uid made, the instance's files and then the lock file.
func (d *shmDir) reclaim() {
	dir := d.path
	entries, err := os.ReadDir(dir)
	if err != nil {
		d.log.Warn("cannot look for files of dead daemon instances", "dir", dir, "error", err)
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, lockPrefix) || !strings.HasSuffix(name, lockSuffix) {
			continue
		}
		id := strings.TrimSuffix(strings.TrimPrefix(name, lockPrefix), lockSuffix)
		if id == d.instance || !isInstanceID(id) {
			continue
		}
		dead, files, bytes, err := d.reclaimInstance(id, entries)
		if err != nil {
			d.log.Warn("reclaiming a dead daemon instance's files", "instance", id, "error", err)
		}
		if dead {
			d.log.Info("reclaimed the files of a dead daemon instance", "instance", id, "dir", dir, "files", files, "bytes", bytes)
		}
	}
}

// reclaimInstance removes instance id's files if it is dead (its lock file
// can be locked).
func (d *shmDir) reclaimInstance(id string, entries []os.DirEntry) (dead bool, files int, bytes int64, err error) {
	lockPath := filepath.Join(d.path, lockPrefix+id+lockSuffix)
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
		d.log.Debug("not a lock file of this daemon's uid; leaving it", "path", lockPath, "uid", st.Uid, "mode", fmt.Sprintf("%#o", st.Mode))
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
		p := filepath.Join(d.path, e.Name())
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
func (g *Registry) ShmDir() string { return g.dir.path }

// open opens path only if it resolves to a regular file inside the
// shm directory: symlinks are followed and the target checked, so a link to
// /etc/passwd is refused.
func (d *shmDir) open(path string) (*os.File, string, error) {
	if path == "" {
		return nil, "", fmt.Errorf("%w: host_file.path is empty", errs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(d.path, path)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, "", fmt.Errorf("%w: host_file.path %s does not exist", errs.ErrNotFound, path)
		}
		return nil, "", fmt.Errorf("%w: host_file.path %s: %v", errs.ErrInvalidArgument, path, err)
	}
	if rel, err := filepath.Rel(d.path, real); err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return nil, "", fmt.Errorf("%w: host_file.path %s resolves to %s, outside the shm directory %s", errs.ErrPermissionDenied, path, real, d.path)
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

func mapFile(f *os.File, offset, size uint64) (memory.Memory, func() error, error) {
	if size > uint64(int(^uint(0)>>1)) {
		return memory.Memory{}, nil, fmt.Errorf("%w: %d bytes cannot be mapped", errs.ErrInvalidArgument, size)
	}
	// No MAP_POPULATE: faulting every page in cost more than the rest of a
	// registration (about 1 s a GiB of 4 KiB pages on a loaded 2-core host);
	// the pages fault in on first use instead, and a transport that pins
	// them (an RDMA MR) faults them in itself.
	b, err := unix.Mmap(int(f.Fd()), int64(offset), int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		if errors.Is(err, unix.ENOMEM) {
			return memory.Memory{}, nil, fmt.Errorf("%w: mmap %s (%d bytes): %v", errs.ErrResourceExhausted, f.Name(), size, err)
		}
		return memory.Memory{}, nil, fmt.Errorf("region: mmap %s (%d bytes at %d): %w", f.Name(), size, offset, err)
	}
	// Huge pages where the file system offers them on request (tmpfs
	// huge=advise, shmem_enabled=advise): 512 times fewer faults.
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
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
