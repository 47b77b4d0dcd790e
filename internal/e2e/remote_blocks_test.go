package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestRemoteBlocks moves a KV request by block id between two hosts over
// verbs (the Soft-RoCE testbed's VMs in `make test-rdma`): pushed into the
// peer's layout, then pulled back into other local ids, every block of
// every segment compared by CRC32C on both daemons. Like TestRemote it
// needs B2B_E2E_SRC_API, B2B_E2E_DST_API and B2B_E2E_DST_PEER.
func TestRemoteBlocks(t *testing.T) {
	src, dst, peer := remoteClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const segs, pool, block, n = 8, 64, 8192, 24
	r := rand.New(rand.NewPCG(23, 24))
	stamp := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)

	// Source: segs local regions, random bytes, one layout.
	var sregs []*client.HostRegion
	var sseg, dseg []client.Segment
	for i := 0; i < segs; i++ {
		s, err := src.RegisterHost(ctx, pool*block, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Unmap(); _ = src.Deregister(context.Background(), s.Id) })
		for k := range s.Bytes {
			s.Bytes[k] = byte(r.Uint32())
		}
		sregs = append(sregs, s)
		sseg = append(sseg, client.Segment{RegionID: s.Id, BlockLen: block, Stride: block})
	}
	sl := "e2e-kv-src-" + stamp
	if _, err := src.RegisterLayout(ctx, client.Layout{Name: sl, Segments: sseg, NumBlocks: pool}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.DeregisterLayout(context.Background(), sl) })
	// Destination: segs exported regions on the peer, writable and readable.
	var dregs []string
	for i := 0; i < segs; i++ {
		d, err := dst.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
			Source:     &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: pool * block}},
			ExportName: fmt.Sprintf("e2e-kv-%s-%d", stamp, i), Readers: []string{"*"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dst.Deregister(context.Background(), d.Region.Id) })
		dregs = append(dregs, d.Region.Id)
		dseg = append(dseg, client.Segment{RegionID: d.Region.Id, BlockLen: block, Stride: block})
	}
	dl := "e2e-kv-dst-" + stamp
	if _, err := dst.RegisterLayout(ctx, client.Layout{Name: dl, Segments: dseg, NumBlocks: pool, Export: dl, Readers: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dst.DeregisterLayout(context.Background(), dl) })

	// digests of blocks ids of each segment's region through c
	digests := func(c *client.Client, regions []string, ids []uint32) [][]uint64 {
		var out [][]uint64
		offs := make([]uint64, len(ids))
		for i, id := range ids {
			offs[i] = uint64(id) * block
		}
		for _, reg := range regions {
			cs, err := c.Checksum(ctx, reg, offs, nil, block, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, client.Unpack(cs.BlockDigests))
		}
		return out
	}
	var sids []string
	for _, s := range sregs {
		sids = append(sids, s.Id)
	}
	same := func(what string, a, b [][]uint64) {
		t.Helper()
		for s := range a {
			for i := range a[s] {
				if a[s][i] != b[s][i] {
					t.Fatalf("%s: segment %d entry %d differs", what, s, i)
				}
			}
		}
	}

	// Push: n random ids (a run of consecutive ones first, so some merge) into other ids.
	perm, dperm := r.Perm(pool), r.Perm(pool)
	var localIDs, remoteIDs []uint32
	for i := 0; i < 6; i++ {
		localIDs, remoteIDs = append(localIDs, uint32(10+i)), append(remoteIDs, uint32(40+i))
	}
	for _, p := range dperm {
		if len(remoteIDs) == n {
			break
		}
		if p < 40 || p >= 46 {
			remoteIDs = append(remoteIDs, uint32(p))
			localIDs = append(localIDs, uint32(perm[len(localIDs)]))
		}
	}
	verbs := b2bv1.TransportKind_TRANSPORT_KIND_VERBS
	resp, err := src.TransferBlocks(ctx, client.Blocks{LocalLayout: sl, Peer: peer, RemoteLayout: dl, LocalIDs: localIDs, RemoteIDs: remoteIDs, Transport: verbs})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Transport != verbs || resp.Blocks != n*segs || resp.Bytes != n*segs*block {
		t.Fatalf("push response %v", resp)
	}
	same("push", digests(src, sids, localIDs), digests(dst, dregs, remoteIDs))
	t.Logf("pushed %d ids x %d segments over verbs: %d WRs, phases %v", n, segs, resp.WorkRequests, resp.GetPhases())

	// Pull: the pushed blocks back into other local ids (unique), from remote ids that may repeat.
	used := map[uint32]bool{}
	for _, id := range localIDs {
		used[id] = true
	}
	var pullLocal, pullRemote []uint32
	for id := uint32(0); id < pool && len(pullLocal) < n; id++ {
		if !used[id] {
			pullLocal = append(pullLocal, id)
			pullRemote = append(pullRemote, remoteIDs[len(pullRemote)%(n/2)])
		}
	}
	before := digests(src, sids, pullLocal)
	resp, err = src.TransferBlocks(ctx, client.Blocks{LocalLayout: sl, Peer: peer, RemoteLayout: dl, LocalIDs: pullLocal, RemoteIDs: pullRemote,
		Transport: verbs, Op: b2bv1.TransferOp_TRANSFER_OP_READ})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Transport != verbs || resp.Bytes != uint64(len(pullLocal))*segs*block {
		t.Fatalf("pull response %v", resp)
	}
	after := digests(src, sids, pullLocal)
	same("pull", after, digests(dst, dregs, pullRemote))
	changed := 0
	for s := range after {
		for i := range after[s] {
			if after[s][i] != before[s][i] {
				changed++
			}
		}
	}
	if changed == 0 {
		t.Fatal("pull: no local block changed")
	}
	t.Logf("pulled %d ids x %d segments over verbs: %d WRs, phases %v", len(pullLocal), segs, resp.WorkRequests, resp.GetPhases())
}
