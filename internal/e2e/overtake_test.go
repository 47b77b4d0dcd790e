package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestSmallBatchOvertakesLarge sends a large batch and, once its bytes are
// landing, a small one to the same peer: over tcp the small one must end
// while the large one is still in flight, because a connection carries one
// batch at a time and a busy one makes the manager connect another
// (peer.connSet). With --conns-per-peer 1 (all there was before), and over
// the same-host kind, which keeps one connection, the small batch waits for
// every byte of the large one: those rows show the test tells the two apart.
// Both batches' bytes are compared.
func TestSmallBatchOvertakesLarge(t *testing.T) {
	for _, k := range pullKinds {
		for _, conns := range []int{0, 1} { // 0: the default
			// The same-host kind keeps one connection per peer
			// (Caps.SingleConn): its batches wait for each other.
			overtakes := conns != 1 && k.kind != b2bv1.TransportKind_TRANSPORT_KIND_LOCAL
			t.Run(fmt.Sprintf("%s/conns=%d", k.name, conns), func(t *testing.T) { overtake(t, k.kind, k.cfg, conns, overtakes) })
		}
	}
}

func overtake(t *testing.T, kind b2bv1.TransportKind, cfg func(*daemon.Config), conns int, overtakes bool) {
	withConns := func(c *daemon.Config) { cfg(c); c.ConnsPerPeer = conns }
	a, b := startNode(t, "a", withConns), startNode(t, "b", withConns)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := rand.New(rand.NewPCG(7, 11))
	// 256 MiB: hundreds of ms over either path on a loaded 2-core
	// machine, against a small batch's few ms.
	const bigBlock, bigN = 4 << 20, 64
	const smallBlock, smallN = 4 << 10, 8
	bigOff, bigSize := layout(bigN, bigBlock, r)
	smallOff, smallSize := layout(smallN, smallBlock, r)
	bigSrc, err := a.c.RegisterHost(ctx, bigSize, "")
	if err != nil {
		t.Fatal(err)
	}
	bigDst, err := b.c.RegisterHost(ctx, bigSize, "big")
	if err != nil {
		t.Fatal(err)
	}
	smallSrc, err := a.c.RegisterHost(ctx, smallSize, "")
	if err != nil {
		t.Fatal(err)
	}
	smallDst, err := b.c.RegisterHost(ctx, smallSize, "small")
	if err != nil {
		t.Fatal(err)
	}
	// No zero byte, so that the first landed byte shows (anyLanded).
	fill(bigSrc.Bytes, func(int) byte { return byte(r.Uint32()) | 1 })
	fill(smallSrc.Bytes, func(int) byte { return byte(r.Uint32()) | 1 })
	write := func(src *client.HostRegion, dst string, off []uint64, size uint64) error {
		_, err := a.c.BatchTransfer(ctx, client.Transfer{SrcRegion: src.Id, Peer: b.d.PeerAddr(), DstRegion: dst, Transport: kind,
			Op: b2bv1.TransferOp_TRANSFER_OP_WRITE, Blocks: client.Descriptors{Src: off, Dst: off, BlockLength: size}})
		return err
	}
	// Warm the path once (handshake, first connection, mappings),
	// so that the big batch starts moving bytes at once.
	if err := write(smallSrc, "small", smallOff, smallBlock); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	bigDone := make(chan struct{})
	go func() {
		defer close(bigDone)
		errc <- write(bigSrc, "big", bigOff, bigBlock)
	}()
	if !landing(ctx, bigDst.Bytes, bigOff, bigBlock, bigDone) {
		t.Fatal("the big batch ended before its bytes were seen landing: make it bigger")
	}
	if err := write(smallSrc, "small", smallOff, smallBlock); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bigDone:
		if overtakes {
			t.Errorf("the small batch ended after the big one: it waited behind it (--conns-per-peer %d)", conns)
		}
	default: // the big one's answer may trail the small one's by microseconds when it waited
	}
	if !overtakes {
		// It ran once the big one's connection was free: every byte of
		// the big one had landed by then.
		for _, o := range bigOff {
			if !bytes.Equal(bigSrc.Bytes[o:o+bigBlock], bigDst.Bytes[o:o+bigBlock]) {
				t.Fatalf("the small batch ended before the big one's block at %d landed, with one connection", o)
			}
		}
	}
	<-bigDone
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	sameBlocks(ctx, t, a.c, b.c, bigSrc, bigDst, bigOff, bigOff, bigBlock)
	sameBlocks(ctx, t, a.c, b.c, smallSrc, smallDst, smallOff, smallOff, smallBlock)
	release(ctx, t, a.c, bigSrc, smallSrc)
	release(ctx, t, b.c, bigDst, smallDst)
}

// landing waits until bytes of the batch land in dst (anyLanded): it
// holds its connection then, not just its regions. False if done closed
// first.
func landing(ctx context.Context, dst []byte, offs []uint64, size uint64, done <-chan struct{}) bool {
	for ctx.Err() == nil {
		select {
		case <-done:
			return false
		default:
		}
		if anyLanded(dst, offs, size) {
			return true
		}
		time.Sleep(50 * time.Microsecond)
	}
	return false
}
