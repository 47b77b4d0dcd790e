package e2e

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// TestTransferVerified moves 10,000 random blocks of several sizes between
// two daemons and checks every block, both by the daemons' per-block CRC32C
// and byte for byte.
func TestTransferVerified(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := rand.New(rand.NewPCG(7, 8))
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
		if resp.Blocks != uint64(n) || resp.Bytes != uint64(n)*size {
			t.Fatalf("size %d: response %v", size, resp)
		}
		sameBlocks(ctx, t, a.c, b.c, src, dst, srcOff, dstOff, size)
		release(ctx, t, a.c, src)
		release(ctx, t, b.c, dst)
	}
}

// TestReregisteredDestination: the sender caches region resolutions; when
// the destination re-registers the name (new key, maybe a new size), the
// next batch must still land every byte in the new region, never report
// success for an empty or misdirected write.
func TestReregisteredDestination(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size = 4096
	src, err := a.c.RegisterHost(ctx, 64*size, "")
	if err != nil {
		t.Fatal(err)
	}
	fill(src.Bytes, func(i int) byte { return byte(i * 13) })
	for round, blocks := range []int{4, 4, 64, 16} { // same size (new key), bigger, smaller
		dst, err := b.c.RegisterHost(ctx, uint64(blocks)*size, "x")
		if err != nil {
			t.Fatal(err)
		}
		offs := reversed(blocks, size)
		resp, err := transfer(ctx, a.c, src.Id, b.d.PeerAddr(), "x", offs, offs, size)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if resp.Bytes != uint64(blocks)*size || !bytes.Equal(src.Bytes[:blocks*size], dst.Bytes) {
			t.Fatalf("round %d: reported %d bytes; data equal: %v", round, resp.Bytes, bytes.Equal(src.Bytes[:blocks*size], dst.Bytes))
		}
		release(ctx, t, b.c, dst)
	}
}
