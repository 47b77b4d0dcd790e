package e2e

import (
	"bytes"
	"context"
	"fmt"
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
			reregister(small, 128) // the same geometry: only the keys were revoked
			push("s8-"+k, small, 11, 50)
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

// TestRemoteBlocksAfterReregister is TestTransferBlocksAfterReregister
// between two hosts over verbs (the Soft-RoCE testbed's VMs, `make
// test-rdma`), each pushed block compared by CRC32C on both daemons.
func TestRemoteBlocksAfterReregister(t *testing.T) {
	src, dst, peer := remoteClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const small, big, regionLen = 8192, 16384, 128 * 16384
	stamp := strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	r := rand.New(rand.NewPCG(31, 8))
	s, err := src.RegisterHost(ctx, regionLen, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Unmap(); _ = src.Deregister(context.Background(), s.Id) })
	fill(s.Bytes, func(int) byte { return byte(r.Uint32()) })
	d, err := dst.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source:     &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: regionLen}},
		ExportName: "e2e-stale-" + stamp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dst.Deregister(context.Background(), d.Region.Id) })
	for _, bl := range []uint64{small, big} {
		name := fmt.Sprintf("e2e-stale-src%d-%s", bl, stamp)
		if _, err := src.RegisterLayout(ctx, client.Layout{Name: name, Segments: []client.Segment{{RegionID: s.Id, BlockLen: bl, Stride: bl}}, NumBlocks: 128}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.DeregisterLayout(context.Background(), name) })
	}
	dl, export := "e2e-stale-dst-"+stamp, "e2e-stale-x-"+stamp
	t.Cleanup(func() { _ = dst.DeregisterLayout(context.Background(), dl) })
	digest := func(c *client.Client, region string, off, n uint64) uint64 {
		cs, err := c.Checksum(ctx, region, []uint64{off}, nil, n, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, false)
		if err != nil {
			t.Fatal(err)
		}
		return cs.Digest
	}
	for i, step := range []struct {
		blockLen, n uint64
		from, to    uint32
	}{{small, 64, 1, 3}, {small, 128, 5, 100}, {big, 128, 7, 100}, {small, 128, 9, 120}, {small, 128, 11, 50}} {
		_ = dst.DeregisterLayout(ctx, dl)
		if _, err := dst.RegisterLayout(ctx, client.Layout{Name: dl, Export: export,
			Segments: []client.Segment{{RegionID: d.Region.Id, BlockLen: step.blockLen, Stride: step.blockLen}}, NumBlocks: step.n}); err != nil {
			t.Fatal(err)
		}
		local := fmt.Sprintf("e2e-stale-src%d-%s", step.blockLen, stamp)
		if _, err := src.TransferBlocks(ctx, client.Blocks{LocalLayout: local, Peer: peer, RemoteLayout: export,
			LocalIDs: []uint32{step.from}, RemoteIDs: []uint32{step.to}, Transport: b2bv1.TransportKind_TRANSPORT_KIND_VERBS}); err != nil {
			t.Fatalf("step %d: push block %d to %d (%d bytes, %d blocks): %v", i, step.from, step.to, step.blockLen, step.n, err)
		}
		if a, b := digest(src, s.Id, uint64(step.from)*step.blockLen, step.blockLen), digest(dst, d.Region.Id, uint64(step.to)*step.blockLen, step.blockLen); a != b {
			t.Fatalf("step %d: block %d: CRC32C %#x, the source's %#x", i, step.to, b, a)
		}
	}
}
