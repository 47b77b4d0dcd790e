package region

// Memory a client allocated itself: a sealed memfd handed over on the raw
// submit socket (internal/region/fdpass) is kept here under a token until a
// RegisterRegion names it (host_file.path fdpass.TokenPath), then mapped
// like an imported file. Possession of the descriptor, open read-write, is
// the caller's right to it; the token is good only for the uid and process
// that handed it over.

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/region/fdpass"
)

// Limits on descriptors waiting for their RegisterRegion.
const (
	MaxDepositsPerConn = 64
	MaxDeposits        = 4096
)

// deposit is a handed-over descriptor not yet registered.
type deposit struct {
	f    *os.File
	size uint64
	uid  uint32
	pid  int32
	from *Depositor
}

// deposits is the registry's table of them (its own lock: handing over
// never waits for a registration). It hands a deposited descriptor to the
// registration that names its token, mapped.
type deposits struct {
	mu    sync.Mutex
	byTok map[uint64]*deposit
}

// Depositor hands descriptors of one connection to the registry; Close
// drops those not registered.
type Depositor struct {
	t   *deposits
	who Caller
	pid int32
	n   int // guarded by t.mu
}

// Depositor returns the depositor of a connection whose peer the kernel
// named (SO_PEERCRED).
func (g *Registry) Depositor(who Caller, pid int32) *Depositor {
	return &Depositor{t: g.dep, who: who, pid: pid}
}

// Put checks the file open at fd (fdpass.Check) and keeps it under a new
// token. It takes fd: closed on failure.
func (d *Depositor) Put(fd int) (token, size uint64, err error) {
	size, err = fdpass.Check(fd)
	if err != nil {
		unix.Close(fd)
		return 0, 0, err
	}
	dep := &deposit{f: os.NewFile(uintptr(fd), "memfd"), size: size, uid: d.who.UID, pid: d.pid, from: d}
	t := d.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if d.n >= MaxDepositsPerConn || len(t.byTok) >= MaxDeposits {
		dep.f.Close()
		return 0, 0, fmt.Errorf("%w: host_fd: %d descriptors of this connection and %d in all wait for their RegisterRegion, limits %d and %d: register or close them first",
			errs.ErrResourceExhausted, d.n, len(t.byTok), MaxDepositsPerConn, MaxDeposits)
	}
	if t.byTok == nil {
		t.byTok = map[uint64]*deposit{}
	}
	for token == 0 || t.byTok[token] != nil {
		var b [8]byte
		_, _ = rand.Read(b[:])
		token = binary.LittleEndian.Uint64(b[:])
	}
	t.byTok[token] = dep
	d.n++
	return token, size, nil
}

// Close drops the descriptors of d not registered yet.
func (d *Depositor) Close() {
	t := d.t
	t.mu.Lock()
	defer t.mu.Unlock()
	for tok, dep := range t.byTok {
		if dep.from == d {
			delete(t.byTok, tok)
			dep.f.Close()
		}
	}
	d.n = 0
}

// take hands the file of token to its registration, for the uid (and, both
// known, the process) that deposited it.
func (t *deposits) take(path string, token uint64, who Caller, pid int32) (*os.File, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	dep := t.byTok[token]
	if dep == nil {
		return nil, fmt.Errorf("%w: host_file.path %s: no descriptor waits under that token (it was registered already, or the submit socket connection that handed it over closed: keep it open until RegisterRegion returns)", errs.ErrNotFound, path)
	}
	if !who.Known || (dep.uid != who.UID && who.UID != 0) || (pid > 0 && dep.pid > 0 && dep.pid != pid) {
		return nil, fmt.Errorf("%w: host_file.path %s: the descriptor was handed over by uid %d pid %d, not by the caller (%s, pid %d)", errs.ErrPermissionDenied, path, dep.uid, dep.pid, who, pid)
	}
	delete(t.byTok, token)
	dep.from.n--
	return dep.f, nil
}

// close drops every descriptor still waiting (the registry closes).
func (t *deposits) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for tok, d := range t.byTok {
		delete(t.byTok, tok)
		d.f.Close()
	}
}

// mapDeposit maps [offset, offset+size) of the descriptor path names, for
// who in process pid (0: unknown), as a region not registered yet.
func (t *deposits) mapDeposit(path string, token, offset, size uint64, who Caller, pid int32) (*Region, error) {
	f, err := t.take(path, token, who, pid)
	if err != nil {
		return nil, err
	}
	kept := false
	defer func() {
		if !kept {
			f.Close()
		}
	}()
	// The seals forbid shrinking: the size seen now is a floor for good.
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("region: fstat the descriptor of %s: %w", path, err)
	}
	if err := checkRange(path, uint64(st.Size), offset, &size); err != nil {
		return nil, err
	}
	mem, unmap, err := mapFile(f, offset, size)
	if err != nil {
		return nil, err
	}
	kept = true
	// No path to map it by: the region is reachable only through the
	// mapping of the client that made it (and its descriptor).
	return &Region{Mem: mem, ShmOff: offset, release: unmap, Owner: who, file: f, sealed: true}, nil
}

// checkRange checks [offset, offset+*size) against a file of fsize bytes;
// *size 0 becomes the rest of the file.
func checkRange(path string, fsize, offset uint64, size *uint64) error {
	if offset%uint64(os.Getpagesize()) != 0 {
		return fmt.Errorf("%w: host_file.offset %d is not a multiple of the page size %d", errs.ErrInvalidArgument, offset, os.Getpagesize())
	}
	if offset >= fsize {
		return fmt.Errorf("%w: host_file.offset %d is at or past the end of %s (%d bytes)", errs.ErrInvalidArgument, offset, path, fsize)
	}
	if *size == 0 {
		*size = fsize - offset
	}
	if *size > fsize-offset {
		return fmt.Errorf("%w: host_file.size %d at offset %d runs past the end of %s (%d bytes)", errs.ErrInvalidArgument, *size, offset, path, fsize)
	}
	return nil
}
