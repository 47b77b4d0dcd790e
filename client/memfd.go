package client

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/region/fdpass"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Memory this process allocates itself can be registered without a copy:
// AllocMemfd makes a sealed memfd and maps it (use it at once: fill it, pin
// it with cudaHostRegister), and RegisterMemfd hands the descriptor to the
// daemon over its raw submit socket (b2bd --submit-socket; gRPC cannot carry
// descriptors), then registers it as a host region like any other. The
// daemon maps the same pages: nothing is copied and no page is touched.

// Memfd is host memory this process allocated, shareable with the daemon.
type Memfd struct {
	FD    int    // the memfd, sealed against shrinking; Close closes it
	Bytes []byte // this process's MAP_SHARED mapping of all of it
}

// AllocMemfd creates a memfd of size bytes sealed against shrinking
// (F_SEAL_SHRINK, which the daemon requires) and maps it. Its pages are
// allocated as they are first touched.
func AllocMemfd(size uint64) (*Memfd, error) {
	if size == 0 || size > 1<<46 {
		return nil, fmt.Errorf("b2b client: memfd size %d: want 1 to %d bytes", size, uint64(1)<<46)
	}
	fd, err := unix.MemfdCreate("b2b-host", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("b2b client: memfd_create: %w", err)
	}
	m := &Memfd{FD: fd}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		m.Close()
		return nil, fmt.Errorf("b2b client: size memfd to %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		m.Close()
		return nil, fmt.Errorf("b2b client: seal memfd (F_SEAL_SHRINK): %w", err)
	}
	if m.Bytes, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		m.Close()
		return nil, fmt.Errorf("b2b client: map memfd (%d bytes): %w", size, err)
	}
	_ = unix.Madvise(m.Bytes, unix.MADV_HUGEPAGE) // where shmem huge pages are on request
	return m, nil
}

// Close unmaps m and closes its descriptor. A region registered over it
// stays valid in the daemon (which keeps its own mapping) until deregistered.
func (m *Memfd) Close() error {
	var err error
	if m.Bytes != nil {
		err = unix.Munmap(m.Bytes)
		m.Bytes = nil
	}
	if m.FD >= 0 {
		if cerr := unix.Close(m.FD); err == nil {
			err = cerr
		}
		m.FD = -1
	}
	return err
}

// SubmitSocketFor is the submit socket of the daemon whose API socket is
// api ("unix:///run/b2bd/b2bd.sock" or a path): $B2B_SUBMIT_SOCKET, else
// submit.sock beside the API socket (the Python client's rule).
func SubmitSocketFor(api string) string {
	if env := os.Getenv("B2B_SUBMIT_SOCKET"); env != "" {
		return env
	}
	api = strings.TrimPrefix(strings.TrimPrefix(api, "unix://"), "unix:")
	return filepath.Join(filepath.Dir(api), "submit.sock")
}

// RegisterMemfd registers [offset, offset+size) of the memfd fd (size 0: to
// its end) as a host region, through the submit socket at submitSocket for
// the descriptor. The memfd must be sealed against shrinking and open
// read-write; the daemon keeps its own descriptor, so fd may be closed once
// this returns. The region is leased to this client unless opts has Persist.
func (c *Client) RegisterMemfd(ctx context.Context, submitSocket string, fd int, offset, size uint64, export string, opts ...RegisterOption) (*b2bv1.Region, error) {
	if _, err := fdpass.Check(fd); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: submitSocket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("b2b client: registering a memfd needs the daemon's submit socket (b2bd --submit-socket): dial %s: %w", submitSocket, err)
	}
	// Open until RegisterRegion returned: the daemon drops a token whose
	// connection closed.
	defer uc.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = uc.SetDeadline(d)
	}
	token, err := handOver(uc, fd)
	if err != nil {
		return nil, err
	}
	resp, err := c.api.RegisterRegion(ctx, registerRequest(&b2bv1.RegisterRegionRequest{
		Source:     &b2bv1.RegisterRegionRequest_HostFile{HostFile: &b2bv1.HostFile{Path: fdpass.TokenPath(token), Offset: offset, Size: size}},
		ExportName: export,
	}, opts))
	if err != nil {
		return nil, err
	}
	return resp.GetRegion(), nil
}

// AllocHost allocates size bytes of host memory here (AllocMemfd) and
// registers all of it (RegisterMemfd): the daemon-side equivalent of
// RegisterHost, but the memory is this process's, usable at once, and takes
// no page faults or zeroing to register. Close the Memfd when done with it;
// deregister the region (or let its lease end) to release the daemon's side.
func (c *Client) AllocHost(ctx context.Context, submitSocket string, size uint64, export string, opts ...RegisterOption) (*b2bv1.Region, *Memfd, error) {
	m, err := AllocMemfd(size)
	if err != nil {
		return nil, nil, err
	}
	r, err := c.RegisterMemfd(ctx, submitSocket, m.FD, 0, size, export, opts...)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return r, m, nil
}

// handOver sends fd on uc and returns the daemon's token for it.
func handOver(uc *net.UnixConn, fd int) (uint64, error) {
	req := fdpass.Request()
	if _, _, err := uc.WriteMsgUnix(req[:], unix.UnixRights(fd), nil); err != nil {
		return 0, fmt.Errorf("b2b client: hand the memfd over: %w", err)
	}
	var ans [fdpass.AnswerLen]byte
	if _, err := io.ReadFull(uc, ans[:]); err != nil {
		return 0, fmt.Errorf("b2b client: memfd answer (a daemon too old for descriptors closes the socket): %w", err)
	}
	a, n, err := fdpass.DecodeAnswer(ans[:])
	if err != nil {
		return 0, fmt.Errorf("b2b client: %w", err)
	}
	if a.Code != 0 {
		msg := make([]byte, n)
		if _, err := io.ReadFull(uc, msg); err != nil {
			return 0, fmt.Errorf("b2b client: memfd answer: %w", err)
		}
		return 0, status.Error(codes.Code(a.Code), string(msg))
	}
	return a.Token, nil
}
