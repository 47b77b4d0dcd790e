package e2e

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
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
		src, err := a.c.RegisterHost(ctx, srcSize, "")
		if err != nil {
			t.Fatal(err)
		}
		dst, err := b.c.RegisterHost(ctx, dstSize, "dst")
		if err != nil {
			t.Fatal(err)
		}
		for i := range src.Bytes {
			src.Bytes[i] = byte(r.Uint32())
		}
		resp, err := a.c.BatchTransfer(ctx, client.Transfer{
			SrcRegion: src.Id, Peer: b.d.PeerAddr(), DstRegion: "dst",
			Blocks: client.Descriptors{Src: srcOff, Dst: dstOff, BlockLength: size},
		})
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if resp.Blocks != uint64(n) || resp.Bytes != uint64(n)*size {
			t.Fatalf("size %d: response %v", size, resp)
		}
		for i := range n {
			if !bytes.Equal(src.Bytes[srcOff[i]:srcOff[i]+size], dst.Bytes[dstOff[i]:dstOff[i]+size]) {
				t.Fatalf("size %d: block %d differs", size, i)
			}
		}
		cs, err := a.c.Checksum(ctx, src.Id, srcOff, nil, size, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
		if err != nil {
			t.Fatal(err)
		}
		cd, err := b.c.Checksum(ctx, dst.Id, dstOff, nil, size, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
		if err != nil {
			t.Fatal(err)
		}
		if cs.Digest != cd.Digest || !bytes.Equal(cs.BlockDigests, cd.BlockDigests) {
			t.Fatalf("size %d: checksums differ", size)
		}
		for _, h := range []*client.HostRegion{src, dst} {
			h.Unmap()
		}
		if err := a.c.Deregister(ctx, src.Id); err != nil {
			t.Fatal(err)
		}
		if err := b.c.Deregister(ctx, dst.Id); err != nil {
			t.Fatal(err)
		}
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
	for i := range src.Bytes {
		src.Bytes[i] = byte(i * 13)
	}
	for round, blocks := range []int{4, 4, 64, 16} { // same size (new key), bigger, smaller
		dst, err := b.c.RegisterHost(ctx, uint64(blocks)*size, "x")
		if err != nil {
			t.Fatal(err)
		}
		offs := make([]uint64, blocks)
		for i := range offs {
			offs[i] = uint64(blocks-1-i) * size
		}
		resp, err := a.c.BatchTransfer(ctx, client.Transfer{SrcRegion: src.Id, Peer: b.d.PeerAddr(), DstRegion: "x",
			Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: size}})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if resp.Bytes != uint64(blocks)*size || !bytes.Equal(src.Bytes[:blocks*size], dst.Bytes) {
			t.Fatalf("round %d: reported %d bytes; data equal: %v", round, resp.Bytes, bytes.Equal(src.Bytes[:blocks*size], dst.Bytes))
		}
		dst.Unmap()
		if err := b.c.Deregister(ctx, dst.Id); err != nil {
			t.Fatal(err)
		}
	}
}
