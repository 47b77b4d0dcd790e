package e2e

import (
	"bytes"
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// node is one real daemon on real sockets, inside the test process.
type node struct {
	d      *daemon.Daemon
	c      *client.Client
	cancel context.CancelFunc
	done   chan error
}

func startNode(t *testing.T, name string, mutate ...func(*daemon.Config)) *node {
	t.Helper()
	dir := t.TempDir()
	cfg := daemon.Config{
		NodeName: name, Socket: filepath.Join(dir, "b2bd.sock"), SocketMode: "0660",
		PeerListen: "127.0.0.1:0", ShmDir: filepath.Join(dir, "shm"), Transport: "tcp",
		DefaultTimeout: 20 * time.Second, ShutdownGrace: 5 * time.Second, MaxDescriptors: 1 << 20, Insecure: true,
	}
	cfg.KindFlags = map[string]string{"data-listen": "127.0.0.1:0"}
	for _, m := range mutate {
		m(&cfg)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Warn, Output: testWriter{t}})
	d, err := daemon.New(cfg, log)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{d: d, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- d.Serve(ctx) }()
	n.c, err = client.Dial(d.APIAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.stop(t) })
	return n
}

func (n *node) stop(t *testing.T) {
	if n.cancel == nil {
		return
	}
	n.c.Close()
	n.cancel()
	n.cancel = nil
	select {
	case err := <-n.done:
		if err != nil {
			t.Errorf("daemon exit: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("daemon did not stop")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Logf("%s", p); return len(p), nil }

// layout places n blocks of size bytes at random, non-adjacent slots.
func layout(n int, size uint64, r *rand.Rand) (offs []uint64, regionSize uint64) {
	slot := size + 64
	perm := r.Perm(n)
	offs = make([]uint64, n)
	for i, p := range perm {
		offs[i] = uint64(p) * slot
	}
	return offs, uint64(n) * slot
}

// dialSock connects a client to the daemon listening on sock; the client is
// closed when the test ends.
func dialSock(t *testing.T, sock string) *client.Client {
	t.Helper()
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startProcPair builds b2bd and starts two daemon processes, a and b, with
// a client on each.
func startProcPair(t *testing.T) (a, b *proc, ca, cb *client.Client) {
	t.Helper()
	bin := buildDaemon(t)
	a, b = startProc(t, bin, "a"), startProc(t, bin, "b")
	return a, b, dialSock(t, a.sock), dialSock(t, b.sock)
}

// registerPair registers a source region of srcSize bytes through cs and a
// destination region of dstSize bytes exported as name through cd, both
// mapped here.
func registerPair(ctx context.Context, t *testing.T, cs, cd *client.Client, srcSize, dstSize uint64, name string) (src, dst *client.HostRegion) {
	t.Helper()
	src, err := cs.RegisterHost(ctx, srcSize, "")
	if err != nil {
		t.Fatal(err)
	}
	dst, err = cd.RegisterHost(ctx, dstSize, name)
	if err != nil {
		t.Fatal(err)
	}
	return src, dst
}

// fill sets every byte of b, in order, to f of its index.
func fill(b []byte, f func(i int) byte) {
	for i := range b {
		b[i] = f(i)
	}
}

// transfer sends the blocks of size bytes at srcOff of region srcID, through
// c, to dstOff of the region that peer exports as dst.
func transfer(ctx context.Context, c *client.Client, srcID, peer, dst string, srcOff, dstOff []uint64, size uint64) (*b2bv1.BatchTransferResponse, error) {
	return c.BatchTransfer(ctx, client.Transfer{SrcRegion: srcID, Peer: peer, DstRegion: dst,
		Blocks: client.Descriptors{Src: srcOff, Dst: dstOff, BlockLength: size}})
}

// badBlock is the index of the first block of size bytes whose bytes at
// srcOff[i] in src differ from those at dstOff[i] in dst, or -1 when every
// block matches.
func badBlock(src, dst []byte, srcOff, dstOff []uint64, size uint64) int {
	for i := range srcOff {
		if !bytes.Equal(src[srcOff[i]:srcOff[i]+size], dst[dstOff[i]:dstOff[i]+size]) {
			return i
		}
	}
	return -1
}

// sameBlocks fails t unless the blocks of size bytes at srcOff of src (on
// ca's daemon) equal those at dstOff of dst (on cb's), byte for byte here
// and by both daemons' CRC32C per block.
func sameBlocks(ctx context.Context, t *testing.T, ca, cb *client.Client, src, dst *client.HostRegion, srcOff, dstOff []uint64, size uint64) {
	t.Helper()
	if i := badBlock(src.Bytes, dst.Bytes, srcOff, dstOff, size); i >= 0 {
		t.Fatalf("block %d of %d B differs", i, size)
	}
	cs, err := ca.Checksum(ctx, src.Id, srcOff, nil, size, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
	if err != nil {
		t.Fatal(err)
	}
	cd, err := cb.Checksum(ctx, dst.Id, dstOff, nil, size, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
	if err != nil {
		t.Fatal(err)
	}
	if cs.Digest != cd.Digest || !bytes.Equal(cs.BlockDigests, cd.BlockDigests) || cs.Blocks != uint64(len(srcOff)) {
		t.Fatalf("blocks of %d B: checksums differ: %x/%x over %d blocks", size, cs.Digest, cd.Digest, cs.Blocks)
	}
}

// release unmaps host regions registered through c and deregisters them.
func release(ctx context.Context, t *testing.T, c *client.Client, rs ...*client.HostRegion) {
	t.Helper()
	for _, r := range rs {
		r.Unmap()
		if err := c.Deregister(ctx, r.Id); err != nil {
			t.Fatal(err)
		}
	}
}

// strided is n offsets stride bytes apart, from 0 up.
func strided(n int, stride uint64) []uint64 {
	offs := make([]uint64, n)
	for i := range offs {
		offs[i] = uint64(i) * stride
	}
	return offs
}

// reversed is n offsets stride bytes apart, from the highest down to 0.
func reversed(n int, stride uint64) []uint64 {
	offs := make([]uint64, n)
	for i := range offs {
		offs[i] = uint64(n-1-i) * stride
	}
	return offs
}
