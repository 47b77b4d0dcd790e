package region

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/region/fdpass"
)

// sealedMemfd is a memfd of size bytes sealed against shrinking, filled
// with fill, and a mapping of it.
func sealedMemfd(t *testing.T, size int, fill byte) (int, []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	for i := range b {
		b[i] = fill + byte(i)
	}
	return fd, b
}

// put hands a dup of fd over (Put takes the descriptor it is given).
func put(t *testing.T, d *Depositor, fd int) uint64 {
	t.Helper()
	dup, err := unix.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := d.Put(dup)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// A token registers once, for the uid and process that handed the
// descriptor over, within the file; the region maps the memfd's pages.
func TestDepositRegisters(t *testing.T) {
	g := newRegistry(t, &fakeTransport{kind: "tcp"})
	const size = 64 << 10
	fd, mine := sealedMemfd(t, size, 7)
	defer unix.Close(fd)
	d := g.Depositor(alice, 42)
	defer d.Close()
	tok := put(t, d, fd)
	path := fdpass.TokenPath(tok)

	_, err := g.ImportHost(path, 0, 0, Export{}, bob, Lease{PID: 42})
	wantErr(t, err, errs.ErrPermissionDenied, "host_file.path", "uid 1000")
	_, err = g.ImportHost(path, 0, 0, Export{}, alice, Lease{PID: 43})
	wantErr(t, err, errs.ErrPermissionDenied, "pid 42")
	_, err = g.ImportHost(path, 0, 2*size, Export{}, alice, Lease{PID: 42})
	wantErr(t, err, errs.ErrInvalidArgument, "host_file.size")
	// A failed registration consumed the token: hand it over again.
	_, err = g.ImportHost(path, 0, 0, Export{}, alice, Lease{PID: 42})
	wantErr(t, err, errs.ErrNotFound, "host_file.path")

	tok = put(t, d, fd)
	r, err := g.ImportHost(fdpass.TokenPath(tok), 4096, 0, Export{Name: "pool"}, alice, Lease{PID: 42})
	if err != nil {
		t.Fatal(err)
	}
	if r.Mem.Len != size-4096 || r.ShmPath != "" || !bytes.Equal(r.Mem.Host, mine[4096:]) {
		t.Fatalf("region over the memfd: %d bytes, path %q, same bytes %v", r.Mem.Len, r.ShmPath, bytes.Equal(r.Mem.Host, mine[4096:]))
	}
	mine[5000] ^= 0xff // the same pages both ways
	if r.Mem.Host[5000-4096] != mine[5000] {
		t.Fatal("a write through the client's mapping is not in the region")
	}
	if err := g.Deregister(r.ID, alice); err != nil {
		t.Fatal(err)
	}
}

// Closing the depositor (its connection) drops its tokens; the limit per
// connection holds.
func TestDepositorCloseAndLimit(t *testing.T) {
	g := newRegistry(t, &fakeTransport{kind: "tcp"})
	fd, _ := sealedMemfd(t, 4096, 1)
	defer unix.Close(fd)
	d := g.Depositor(alice, 0)
	tok := put(t, d, fd)
	d.Close()
	_, err := g.ImportHost(fdpass.TokenPath(tok), 0, 0, Export{}, alice)
	wantErr(t, err, errs.ErrNotFound, "closed")

	d = g.Depositor(alice, 0)
	defer d.Close()
	for range MaxDepositsPerConn {
		put(t, d, fd)
	}
	dup, _ := unix.Dup(fd)
	_, _, err = d.Put(dup)
	wantErr(t, err, errs.ErrResourceExhausted, "limits 64")
	// An unsealed one is refused and closed.
	bad, _ := unix.MemfdCreate("t", unix.MFD_CLOEXEC)
	unix.Ftruncate(bad, 4096)
	_, _, err = g.Depositor(alice, 0).Put(bad)
	wantErr(t, err, errs.ErrInvalidArgument, "F_SEAL_SHRINK")
	if _, err := unix.FcntlInt(uintptr(bad), unix.F_GETFD, 0); err == nil {
		t.Fatal("the refused descriptor is still open")
	}
}
