package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	"github.com/b2bd/b2bd/internal/region/fdpass"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

const memfdBlocks, memfdBlock = 64, 4096

// memfdPair is daemon a (with a submit socket) and b, b holding an
// exported region "kv".
func memfdPair(t *testing.T, transport ...string) (a, b *testNode, sock string, kv *client.HostRegion) {
	t.Helper()
	kind := "tcp"
	if len(transport) > 0 {
		kind = transport[0]
	}
	sock = filepath.Join(t.TempDir(), "submit.sock")
	a = startNode(t, "a", func(c *daemon.Config) { c.SubmitSocket, c.Transport = sock, kind })
	b = startNode(t, "b", func(c *daemon.Config) { c.Transport = kind })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if kv, err = b.c.RegisterHost(ctx, 2*memfdBlocks*memfdBlock, "kv"); err != nil {
		t.Fatal(err)
	}
	return a, b, sock, kv
}

func memfdOffsets() []uint64 {
	o := make([]uint64, memfdBlocks)
	for i := range o {
		o[i] = uint64(i) * 2 * memfdBlock
	}
	return o
}

// sameBlocks fails t unless every block at offs is equal in x and y.
func sameBlocks(t *testing.T, what string, x, y []byte, offs []uint64) {
	t.Helper()
	for i, o := range offs {
		if !bytes.Equal(x[o:o+memfdBlock], y[o:o+memfdBlock]) {
			t.Fatalf("%s: block %d (offset %d) differs", what, i, o)
		}
	}
}

func fillRandom(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 11))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// A memfd the client allocated is a region both ways: every block pushed
// from it lands at the peer, and every block a peer pushes into it shows
// in the client's own mapping.
func TestMemfdRegionMovesBlocks(t *testing.T) {
	for _, tk := range []struct {
		flag string
		kind b2bv1.TransportKind
	}{{"tcp", b2bv1.TransportKind_TRANSPORT_KIND_TCP}, {"auto", b2bv1.TransportKind_TRANSPORT_KIND_LOCAL}} {
		t.Run(tk.flag, func(t *testing.T) { memfdMovesBlocks(t, tk.flag, tk.kind) })
	}
}

func memfdMovesBlocks(t *testing.T, flag string, kind b2bv1.TransportKind) {
	a, b, sock, kv := memfdPair(t, flag)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, m, err := a.c.AllocHost(ctx, sock, 2*memfdBlocks*memfdBlock, "in")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if r.GetShmPath() != "" || r.GetSize() != 2*memfdBlocks*memfdBlock {
		t.Fatalf("memfd region: shm_path %q size %d", r.GetShmPath(), r.GetSize())
	}
	offs := memfdOffsets()
	fillRandom(m.Bytes, 1)
	if _, err := a.c.BatchTransfer(ctx, client.Transfer{SrcRegion: r.GetId(), Peer: b.d.PeerAddr(), DstRegion: "kv", Transport: kind,
		Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: memfdBlock}}); err != nil {
		t.Fatal(err)
	}
	sameBlocks(t, "push from the memfd", m.Bytes, kv.Bytes, offs)

	fillRandom(kv.Bytes, 2)
	if _, err := b.c.BatchTransfer(ctx, client.Transfer{SrcRegion: kv.GetId(), Peer: a.d.PeerAddr(), DstRegion: "in", Transport: kind,
		Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: memfdBlock}}); err != nil {
		t.Fatal(err)
	}
	sameBlocks(t, "push into the memfd", kv.Bytes, m.Bytes, offs)

	// The owner cannot shrink it under the daemon: the seal refuses.
	if err := unix.Ftruncate(m.FD, memfdBlock); !errors.Is(err, unix.EPERM) {
		t.Fatalf("shrinking the sealed memfd: %v, want EPERM", err)
	}
	if err := a.c.Deregister(ctx, r.GetId()); err != nil {
		t.Fatal(err)
	}
}

// The daemon keeps its own descriptor and mapping: a persistent region
// stays valid with its bytes after the client closed its memfd and went
// away, until it is deregistered.
func TestMemfdRegionOutlivesItsClient(t *testing.T) {
	a, b, sock, kv := memfdPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	gone, err := client.Dial(a.d.APIAddr())
	if err != nil {
		t.Fatal(err)
	}
	r, m, err := gone.AllocHost(ctx, sock, 2*memfdBlocks*memfdBlock, "", client.Persist())
	if err != nil {
		t.Fatal(err)
	}
	fillRandom(m.Bytes, 3)
	want := append([]byte(nil), m.Bytes...)
	m.Close()
	gone.Close()
	offs := memfdOffsets()
	if _, err := a.c.BatchTransfer(ctx, client.Transfer{SrcRegion: r.GetId(), Peer: b.d.PeerAddr(), DstRegion: "kv",
		Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: memfdBlock}}); err != nil {
		t.Fatal(err)
	}
	sameBlocks(t, "push after the client left", want, kv.Bytes, offs)
	if err := a.c.Deregister(ctx, r.GetId()); err != nil {
		t.Fatal(err)
	}
}

// handOverRaw sends fd on the submit socket and returns the answer.
func handOverRaw(t *testing.T, sock string, fd int) (fdpass.Answer, *net.UnixConn) {
	t.Helper()
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	req := fdpass.Request()
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if _, _, err := uc.WriteMsgUnix(req[:], oob, nil); err != nil {
		t.Fatal(err)
	}
	var ans [fdpass.AnswerLen]byte
	if _, err := io.ReadFull(uc, ans[:]); err != nil {
		t.Fatal(err)
	}
	a, n, err := fdpass.DecodeAnswer(ans[:])
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(uc, msg); err != nil {
		t.Fatal(err)
	}
	a.Msg = string(msg)
	return a, uc
}

func newMemfd(t *testing.T, size int64, flags int, seals int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

// What the daemon refuses on the socket, with the code and a message
// naming the field and what to do; and tokens it does not know.
func TestMemfdRefusals(t *testing.T) {
	a, _, sock, _ := memfdPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tmp, err := unix.Open(t.TempDir(), unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tmp)
	unix.Ftruncate(tmp, 4096)
	for _, c := range []struct {
		name string
		fd   int
		want []string
	}{
		{"no seals", newMemfd(t, 4096, unix.MFD_ALLOW_SEALING, 0), []string{"host_fd", "F_SEAL_SHRINK", "b2b.alloc_host"}},
		{"sealing not allowed", newMemfd(t, 4096, 0, 0), []string{"host_fd", "F_SEAL_SHRINK", "b2b.alloc_host"}},
		{"plain file", tmp, []string{"host_fd", "not a memfd", "b2b.alloc_host"}},
		{"write sealed", newMemfd(t, 4096, unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK|unix.F_SEAL_WRITE), []string{"host_fd", "write seals"}},
		{"empty", newMemfd(t, 0, unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK), []string{"host_fd", "empty"}},
		{"no descriptor", -1, []string{"host_fd", "no descriptor"}},
	} {
		ans, uc := handOverRaw(t, sock, c.fd)
		uc.Close()
		if codes.Code(ans.Code) != codes.InvalidArgument || ans.Token != 0 {
			t.Errorf("%s: code %v token %d, want InvalidArgument (%s)", c.name, codes.Code(ans.Code), ans.Token, ans.Msg)
		}
		for _, w := range c.want {
			if !strings.Contains(ans.Msg, w) {
				t.Errorf("%s: message %q lacks %q", c.name, ans.Msg, w)
			}
		}
	}
	// The Go client refuses the same before sending anything.
	if _, err := a.c.RegisterMemfd(ctx, sock, newMemfd(t, 4096, unix.MFD_ALLOW_SEALING, 0), 0, 0, ""); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "F_SEAL_SHRINK") {
		t.Errorf("RegisterMemfd of an unsealed memfd: %v, want InvalidArgument naming F_SEAL_SHRINK", err)
	}
	// A token whose connection closed is gone; a made-up one never was.
	ans, uc := handOverRaw(t, sock, newMemfd(t, 4096, unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK))
	if ans.Code != 0 || ans.Size != 4096 {
		t.Fatalf("sealed memfd refused: %v %s", codes.Code(ans.Code), ans.Msg)
	}
	uc.Close()
	for _, c := range []struct {
		path string
		code codes.Code
	}{{fdpass.TokenPath(ans.Token), codes.NotFound}, {fdpass.TokenPath(12345), codes.NotFound}, {"memfd:xyz", codes.InvalidArgument}} {
		var err error
		for range 100 { // the daemon drops the closed connection's token soon
			_, err = a.c.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostFile{HostFile: &b2bv1.HostFile{Path: c.path}}})
			if status.Code(err) == c.code {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), "host_file.path") {
			t.Errorf("RegisterRegion %s: %v, want %v naming host_file.path", c.path, err, c.code)
		}
	}
}

// Registration maps without touching a page: 1 GiB registers in about
// what a gRPC call costs. Logged, not asserted (the host is shared).
func TestMemfdRegistrationTime(t *testing.T) {
	a, _, sock, _ := memfdPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t0 := time.Now()
	r, m, err := a.c.AllocHost(ctx, sock, 1<<30, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("AllocHost 1 GiB (memfd): %v", time.Since(t0))
	m.Close()
	if err := a.c.Deregister(ctx, r.GetId()); err != nil {
		t.Fatal(err)
	}
}
