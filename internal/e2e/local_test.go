package e2e

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

func autoTransport(c *daemon.Config) { c.Transport = "auto" }

// TestLocalTransferVerified: two daemons on this host with --transport auto
// prove it in their handshake and move batches over the same-host path
// (shared memory), every block checked byte for byte and by the daemons'
// CRC32C; un-exporting the destination revokes the sender's mapping.
func TestLocalTransferVerified(t *testing.T) {
	a, b := startNode(t, "a", autoTransport), startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := rand.New(rand.NewPCG(3, 4))
	for _, size := range []uint64{128, 4096, 65536} {
		n := 10000
		if size >= 65536 {
			n = 2000
		}
		srcOff, srcSize := layout(n, size, r)
		dstOff, dstSize := layout(n, size, r)
		src, dst := registerPair(ctx, t, a.c, b.c, srcSize, dstSize, "dst")
		fill(src.Bytes, func(int) byte { return byte(r.Uint32()) })
		resp, err := transfer(ctx, a.c, src.Id, b.d.PeerAddr(), "dst", srcOff, dstOff, size)
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if resp.Transport != b2bv1.TransportKind_TRANSPORT_KIND_LOCAL {
			t.Fatalf("size %d: went over %v, want local (auto prefers it on one host)", size, resp.Transport)
		}
		if resp.Blocks != uint64(n) || resp.Bytes != uint64(n)*size {
			t.Fatalf("size %d: response %v", size, resp)
		}
		sameBlocks(ctx, t, a.c, b.c, src, dst, srcOff, dstOff, size)
		if size == 4096 {
			// Un-export: the old key no longer pins, so the batch fails
			// NotFound and lands nothing more.
			if err := b.c.Export(ctx, dst.Id, ""); err != nil {
				t.Fatal(err)
			}
			clear(dst.Bytes)
			_, err := c2(ctx, a.c, src.Id, b.d.PeerAddr(), "dst", srcOff, dstOff, size, b2bv1.TransportKind_TRANSPORT_KIND_LOCAL)
			if !errors.Is(grpcstatus.FromStatus(err), errs.ErrNotFound) {
				t.Fatalf("batch into an un-exported region: %v, want NotFound", err)
			}
			if !bytes.Equal(dst.Bytes, make([]byte, len(dst.Bytes))) {
				t.Fatal("bytes landed in an un-exported region")
			}
		}
		release(ctx, t, a.c, src)
		release(ctx, t, b.c, dst)
	}
}

// TestLocalNotOfferedFallsBack: a peer that runs TCP only is reached over
// TCP under auto, and a batch that insists on local is refused clearly.
func TestLocalNotOfferedFallsBack(t *testing.T) {
	a, b := startNode(t, "a", autoTransport), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, dst := registerPair(ctx, t, a.c, b.c, 1<<16, 1<<16, "dst")
	fill(src.Bytes, func(i int) byte { return byte(i * 5) })
	offs := strided(16, 4096)
	resp, err := transfer(ctx, a.c, src.Id, b.d.PeerAddr(), "dst", offs, offs, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Transport != b2bv1.TransportKind_TRANSPORT_KIND_TCP || !bytes.Equal(src.Bytes, dst.Bytes) {
		t.Fatalf("went over %v (want tcp), bytes equal: %v", resp.Transport, bytes.Equal(src.Bytes, dst.Bytes))
	}
	_, err = c2(ctx, a.c, src.Id, b.d.PeerAddr(), "dst", offs, offs, 4096, b2bv1.TransportKind_TRANSPORT_KIND_LOCAL)
	if !errors.Is(grpcstatus.FromStatus(err), errs.ErrFailedPrecondition) {
		t.Fatalf("local forced to a TCP-only peer: %v, want FailedPrecondition", err)
	}
}

// c2 is transfer with a transport asked for.
func c2(ctx context.Context, c *client.Client, srcID, peer, dst string, srcOff, dstOff []uint64, size uint64, k b2bv1.TransportKind) (*b2bv1.BatchTransferResponse, error) {
	return c.BatchTransfer(ctx, client.Transfer{SrcRegion: srcID, Peer: peer, DstRegion: dst, Transport: k,
		Blocks: client.Descriptors{Src: srcOff, Dst: dstOff, BlockLength: size}})
}
