package e2e

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestTransferBlocksAfterReregister: the destination re-registers its
// exported layout under the same export name (a decode restart) with more
// blocks, then with another block size, while the sender's peer manager
// still holds the old resolution. Each push after a change must resolve
// afresh and land, not be refused by the cached geometry (id out of range,
// incompatible block_len), over tcp and local; every byte is checked.
func TestTransferBlocksAfterReregister(t *testing.T) {
	a, b := startNode(t, "a", autoTransport), startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := rand.New(rand.NewPCG(31, 7))
	const small, big, regionLen = 8192, 16384, 128 * 16384
	for _, kind := range []b2bv1.TransportKind{b2bv1.TransportKind_TRANSPORT_KIND_TCP, b2bv1.TransportKind_TRANSPORT_KIND_LOCAL} {
		t.Run(kind.String(), func(t *testing.T) {
			k := kind.String()
			src, err := a.c.RegisterHost(ctx, regionLen, "")
			if err != nil {
				t.Fatal(err)
			}
			fill(src.Bytes, func(int) byte { return byte(r.Uint32()) })
			dst, err := b.c.RegisterHost(ctx, regionLen, "stale-r-"+k)
			if err != nil {
				t.Fatal(err)
			}
			fill(dst.Bytes, func(int) byte { return kvUntouch })
			for _, l := range []client.Layout{
				{Name: "s8-" + k, Segments: []client.Segment{{RegionID: src.Id, BlockLen: small, Stride: small}}, NumBlocks: 128},
				{Name: "s16-" + k, Segments: []client.Segment{{RegionID: src.Id, BlockLen: big, Stride: big}}, NumBlocks: 128},
			} {
				if _, err := a.c.RegisterLayout(ctx, l); err != nil {
					t.Fatal(err)
				}
			}
			export := "stale-" + k
			reregister := func(blockLen, n uint64) {
				t.Helper()
				_ = b.c.DeregisterLayout(ctx, "d-"+k)
				if _, err := b.c.RegisterLayout(ctx, client.Layout{Name: "d-" + k, Export: export,
					Segments: []client.Segment{{RegionID: dst.Id, BlockLen: blockLen, Stride: blockLen}}, NumBlocks: n}); err != nil {
					t.Fatal(err)
				}
			}
			push := func(local string, blockLen uint64, from, to uint32) {
				t.Helper()
				if _, err := a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: local, Peer: b.d.PeerAddr(), RemoteLayout: export,
					LocalIDs: []uint32{from}, RemoteIDs: []uint32{to}, Transport: kind}); err != nil {
					t.Fatalf("push block %d to %d (%d bytes): %v", from, to, blockLen, err)
				}
				got := dst.Bytes[uint64(to)*blockLen : uint64(to+1)*blockLen]
				if !bytes.Equal(got, src.Bytes[uint64(from)*blockLen:uint64(from+1)*blockLen]) {
					t.Fatalf("block %d (%d bytes): wrong bytes", to, blockLen)
				}
			}
			reregister(small, 64)
			push("s8-"+k, small, 1, 3) // the sender caches 64 blocks of 8 KiB
			reregister(small, 128)
			push("s8-"+k, small, 5, 100) // id 100 only in the new layout
			reregister(big, 128)
			push("s16-"+k, big, 7, 100) // block_len 16 KiB only in the new layout
			reregister(small, 128)
			push("s8-"+k, small, 9, 120)
		})
	}
}

// TestLayoutExportNames: an export name is a name, as region export names
// are: a NUL (the peer's cache key separator), a control byte, a space or
// a non-ASCII letter is refused with InvalidArgument quoting the value, at
// registration and as a transfer's remote_layout; nothing is registered.
func TestLayoutExportNames(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := b.c.RegisterHost(ctx, 4096, "names-r")
	if err != nil {
		t.Fatal(err)
	}
	src, err := a.c.RegisterHost(ctx, 4096, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.RegisterLayout(ctx, client.Layout{Name: "src", Segments: []client.Segment{{RegionID: src.Id, BlockLen: 4096, Stride: 4096}}, NumBlocks: 1}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kv\x00read", "kv\nINFO forged", "kv\x1b[2J", "k v", "kvé"} {
		_, err := b.c.RegisterLayout(ctx, client.Layout{Name: "l", Export: name, Segments: []client.Segment{{RegionID: reg.Id, BlockLen: 4096, Stride: 4096}}, NumBlocks: 1})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "export_name "+strconv.Quote(name)) || !strings.Contains(err.Error(), "-_./:") {
			t.Fatalf("export_name %q: %v, want InvalidArgument quoting it and the rule", name, err)
		}
		_, err = a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: "src", Peer: b.d.PeerAddr(), RemoteLayout: name, LocalIDs: []uint32{0}, RemoteIDs: []uint32{0}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "remote_layout "+strconv.Quote(name)) {
			t.Fatalf("remote_layout %q: %v, want InvalidArgument quoting it", name, err)
		}
	}
	if ls, err := b.c.ListLayouts(ctx); err != nil || len(ls) != 0 {
		t.Fatalf("layouts %v (%v): a refused one was registered", ls, err)
	}
}
