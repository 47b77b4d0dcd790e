package e2e

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

const (
	kvSegments = 8
	kvPool     = 256
	kvBlock    = 4096
	kvUntouch  = 0xEE // the destination's bytes before any transfer
)

// kvSide is one daemon's layout: one region (and segment) per layer.
type kvSide struct {
	regions []*client.HostRegion
}

// registerKV registers kvSegments regions of kvPool blocks through c,
// exported as prefix+i when export is set, and a layout over them.
func registerKV(ctx context.Context, t *testing.T, c *client.Client, prefix string, export bool, name, layoutExport string, fillWith func(int) byte) kvSide {
	t.Helper()
	var s kvSide
	var segs []client.Segment
	for i := 0; i < kvSegments; i++ {
		exp := ""
		if export {
			exp = prefix + string(rune('0'+i))
		}
		r, err := c.RegisterHost(ctx, kvPool*kvBlock, exp)
		if err != nil {
			t.Fatal(err)
		}
		fill(r.Bytes, fillWith)
		s.regions = append(s.regions, r)
		segs = append(segs, client.Segment{RegionID: r.Id, BlockLen: kvBlock, Stride: kvBlock})
	}
	if _, err := c.RegisterLayout(ctx, client.Layout{Name: name, Segments: segs, NumBlocks: kvPool, Export: layoutExport}); err != nil {
		t.Fatal(err)
	}
	return s
}

// kvIDs draws n distinct ids below kvPool, twice: sources and other destinations.
func kvIDs(r *rand.Rand, n int) (src, dst []uint32) {
	for _, p := range r.Perm(kvPool)[:n] {
		src = append(src, uint32(p))
	}
	for _, p := range r.Perm(kvPool)[:n] {
		dst = append(dst, uint32(p))
	}
	return src, dst
}

// checkKV fails t unless every target block of every segment of dst equals
// its source block and every other block is untouched.
func checkKV(t *testing.T, src, dst kvSide, srcIDs, dstIDs []uint32) {
	t.Helper()
	from := map[uint32]uint32{}
	for i, d := range dstIDs {
		from[d] = srcIDs[i]
	}
	untouched := bytes.Repeat([]byte{kvUntouch}, kvBlock)
	for s := range dst.regions {
		for b := uint32(0); b < kvPool; b++ {
			got := dst.regions[s].Bytes[uint64(b)*kvBlock : uint64(b+1)*kvBlock]
			want := untouched
			if sb, ok := from[b]; ok {
				want = src.regions[s].Bytes[uint64(sb)*kvBlock : uint64(sb+1)*kvBlock]
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("segment %d block %d: wrong bytes (target %v)", s, b, from[b])
			}
		}
	}
}

// TestTransferBlocks moves 64 of 256 block ids of 8 segments into other
// ids, over tcp and local, and checks every block of every segment.
func TestTransferBlocks(t *testing.T) {
	a, b := startNode(t, "a", autoTransport), startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := rand.New(rand.NewPCG(23, 5))
	for _, kind := range []b2bv1.TransportKind{b2bv1.TransportKind_TRANSPORT_KIND_TCP, b2bv1.TransportKind_TRANSPORT_KIND_LOCAL} {
		t.Run(kind.String(), func(t *testing.T) {
			ln, rn := "src-"+kind.String(), "dst-"+kind.String()
			src := registerKV(ctx, t, a.c, "", false, ln, "", func(int) byte { return byte(r.Uint32()) })
			dst := registerKV(ctx, t, b.c, rn+"-r", true, rn, rn, func(int) byte { return kvUntouch })
			srcIDs, dstIDs := kvIDs(r, 64)
			resp, err := a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: ln, Peer: b.d.PeerAddr(), RemoteLayout: rn, LocalIDs: srcIDs, RemoteIDs: dstIDs, Transport: kind})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Transport != kind || resp.Blocks != 64*kvSegments || resp.Bytes != 64*kvSegments*kvBlock {
				t.Fatalf("response %v", resp)
			}
			if ph := resp.GetPhases(); ph.GetValidateNs() == 0 || ph.GetPlanNs() == 0 || ph.GetWireNs()+ph.GetPostNs() == 0 || ph.GetTotalNs() == 0 {
				t.Fatalf("phases %v: a phase is missing", ph)
			}
			checkKV(t, src, dst, srcIDs, dstIDs)
		})
	}
}

// TestTransferBlocksHalfHeads: the sender has twice the receivers' block
// (two ranks of the decode side), and two layouts over the same regions
// each move one half of every block to one rank, byte for byte.
func TestTransferBlocksHalfHeads(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := rand.New(rand.NewPCG(7, 11))
	src := registerKV(ctx, t, a.c, "", false, "full", "", func(int) byte { return byte(r.Uint32()) })
	const half = kvBlock / 2
	var ranks [2][]*client.HostRegion
	for h := 0; h < 2; h++ {
		var lsegs, rsegs []client.Segment
		for i := 0; i < kvSegments; i++ {
			lsegs = append(lsegs, client.Segment{RegionID: src.regions[i].Id, Offset: uint64(h) * half, BlockLen: half, Stride: kvBlock})
			reg, err := b.c.RegisterHost(ctx, kvPool*half, "rank"+string(rune('0'+h))+"-"+string(rune('0'+i)))
			if err != nil {
				t.Fatal(err)
			}
			fill(reg.Bytes, func(int) byte { return kvUntouch })
			ranks[h] = append(ranks[h], reg)
			rsegs = append(rsegs, client.Segment{RegionID: reg.Id, BlockLen: half, Stride: half})
		}
		name := "half" + string(rune('0'+h))
		if _, err := a.c.RegisterLayout(ctx, client.Layout{Name: name, Segments: lsegs, NumBlocks: kvPool}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.c.RegisterLayout(ctx, client.Layout{Name: name, Segments: rsegs, NumBlocks: kvPool, Export: "rank" + name}); err != nil {
			t.Fatal(err)
		}
	}
	srcIDs, dstIDs := kvIDs(r, 64)
	for h := 0; h < 2; h++ {
		name := "half" + string(rune('0'+h))
		if _, err := a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: name, Peer: b.d.PeerAddr(), RemoteLayout: "rank" + name, LocalIDs: srcIDs, RemoteIDs: dstIDs}); err != nil {
			t.Fatal(err)
		}
	}
	from := map[uint32]uint32{}
	for i, d := range dstIDs {
		from[d] = srcIDs[i]
	}
	untouched := bytes.Repeat([]byte{kvUntouch}, half)
	for h := 0; h < 2; h++ {
		for s := 0; s < kvSegments; s++ {
			for blk := uint32(0); blk < kvPool; blk++ {
				got := ranks[h][s].Bytes[uint64(blk)*half : uint64(blk+1)*half]
				want := untouched
				if sb, ok := from[blk]; ok {
					o := uint64(sb)*kvBlock + uint64(h)*half
					want = src.regions[s].Bytes[o : o+half]
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("rank %d segment %d block %d: wrong bytes", h, s, blk)
				}
			}
		}
	}
}

// TestTransferBlocksRefusals: each bad input gets its code and a message
// naming the field, the index and the limit, and lands nothing.
func TestTransferBlocksRefusals(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src := registerKV(ctx, t, a.c, "", false, "src", "", func(i int) byte { return byte(i) })
	dst := registerKV(ctx, t, b.c, "d", true, "dst", "dst", func(int) byte { return kvUntouch })
	peer := b.d.PeerAddr()
	// Remote layouts that cannot take the transfer.
	var halfSegs []client.Segment
	for _, r := range dst.regions {
		halfSegs = append(halfSegs, client.Segment{RegionID: r.Id, BlockLen: kvBlock / 2, Stride: kvBlock})
	}
	mustLayout := func(c *client.Client, l client.Layout) {
		t.Helper()
		if _, err := c.RegisterLayout(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	mustLayout(b.c, client.Layout{Name: "halves", Segments: halfSegs, NumBlocks: kvPool, Export: "halves"})
	mustLayout(b.c, client.Layout{Name: "private", Segments: halfSegs[:1], NumBlocks: kvPool})
	mustLayout(b.c, client.Layout{Name: "theirs", Segments: halfSegs[1:2], NumBlocks: kvPool, Export: "theirs", ExportTo: []string{"someone-else"}})

	blocks := func(remote string, src, dst []uint32) error {
		_, err := a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: "src", Peer: peer, RemoteLayout: remote, LocalIDs: src, RemoteIDs: dst})
		return err
	}
	seg := func(off uint64) []client.Segment {
		return []client.Segment{{RegionID: src.regions[0].Id, Offset: off, BlockLen: kvBlock, Stride: kvBlock}}
	}
	many := make([]uint32, 1<<22/kvSegments+1) // ids × segments one over the limit
	for i := range many {
		many[i] = uint32(i % kvPool)
	}
	for _, tc := range []struct {
		name  string
		call  func() error
		class error
		says  []string
	}{
		{"id out of range", func() error { return blocks("dst", []uint32{1, 2}, []uint32{3, kvPool}) }, errs.ErrInvalidArgument, []string{"remote_ids[1]", "256"}},
		{"local id out of range", func() error { return blocks("dst", []uint32{kvPool + 5}, []uint32{3}) }, errs.ErrInvalidArgument, []string{"local_ids[0]", "261", "256"}},
		{"duplicate destination id", func() error { return blocks("dst", []uint32{1, 2}, []uint32{7, 7}) }, errs.ErrInvalidArgument, []string{"remote_ids[1]", "remote_ids[0]"}},
		{"incompatible layouts", func() error { return blocks("halves", []uint32{1}, []uint32{2}) }, errs.ErrInvalidArgument, []string{"segment", "4096", "2048"}},
		{"unknown remote layout", func() error { return blocks("nope", []uint32{1}, []uint32{2}) }, errs.ErrNotFound, []string{`"nope"`}},
		{"unexported remote layout", func() error { return blocks("private", []uint32{1}, []uint32{2}) }, errs.ErrNotFound, []string{`"private"`}},
		{"peer not in export_to", func() error { return blocks("theirs", []uint32{1}, []uint32{2}) }, errs.ErrPermissionDenied, []string{`"theirs"`, "someone-else"}},
		{"ids over the limit", func() error { return blocks("dst", many, many) }, errs.ErrResourceExhausted, []string{"local_ids", "4194304"}},
		{"ids not whole uint32s", func() error {
			_, err := a.c.API().TransferBlocks(ctx, &b2bv1.TransferBlocksRequest{LocalLayout: "src", Peer: peer, RemoteLayout: "dst", LocalIds: []byte{1, 2, 3}, RemoteIds: []byte{1, 2, 3}})
			return err
		}, errs.ErrInvalidArgument, []string{"local_ids", "3"}},
		{"unknown local layout", func() error {
			_, err := a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: "ghost", Peer: peer, RemoteLayout: "dst", LocalIDs: []uint32{1}, RemoteIDs: []uint32{1}})
			return err
		}, errs.ErrNotFound, []string{"local_layout", `"ghost"`}},
		{"segment outside its region", func() error {
			_, err := a.c.RegisterLayout(ctx, client.Layout{Name: "out", Segments: seg(8), NumBlocks: kvPool})
			return err
		}, errs.ErrInvalidArgument, []string{"segments[0]", "size"}},
		{"zero segments", func() error {
			_, err := a.c.RegisterLayout(ctx, client.Layout{Name: "empty", NumBlocks: kvPool})
			return err
		}, errs.ErrInvalidArgument, []string{"segments"}},
		{"layout over an unknown region", func() error {
			_, err := a.c.RegisterLayout(ctx, client.Layout{Name: "ghostly", Segments: []client.Segment{{RegionID: "r-gone", BlockLen: 8, Stride: 8}}, NumBlocks: 1})
			return err
		}, errs.ErrNotFound, []string{"segments[0].region_id", "r-gone"}},
		{"deregistering a held region", func() error { return a.c.Deregister(ctx, src.regions[3].Id) }, errs.ErrFailedPrecondition, []string{`layout "src"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if got := grpcstatus.FromStatus(err); !errors.Is(got, tc.class) {
				t.Fatalf("got %v, want %v", err, tc.class)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Fatalf("%v: does not say %q", err, s)
				}
			}
		})
	}
	for s, r := range dst.regions {
		for i, x := range r.Bytes {
			if x != kvUntouch {
				t.Fatalf("segment %d byte %d changed by a refused request", s, i)
			}
		}
	}
	// Once the layout is gone, its regions may go.
	if err := a.c.DeregisterLayout(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	if err := a.c.Deregister(ctx, src.regions[3].Id); err != nil {
		t.Fatalf("deregister after the layout went: %v", err)
	}
}

// TestLayoutReregisteredIsResolvedAfresh: peers cache a resolved layout
// with no age limit, so deregistering an exported layout must revoke what
// they cached. The receiver re-registers its export name with the segments
// in reverse region order; the sender's next transfer, at once, must land
// by the new geometry, not the cached one.
func TestLayoutReregisteredIsResolvedAfresh(t *testing.T) {
	a, b := startNode(t, "a", autoTransport), startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := rand.New(rand.NewPCG(31, 3))
	for _, kind := range []b2bv1.TransportKind{b2bv1.TransportKind_TRANSPORT_KIND_TCP, b2bv1.TransportKind_TRANSPORT_KIND_LOCAL} {
		t.Run(kind.String(), func(t *testing.T) {
			ln, rn := "src-"+kind.String(), "dst-"+kind.String()
			src := registerKV(ctx, t, a.c, "", false, ln, "", func(int) byte { return byte(r.Uint32()) })
			dst := registerKV(ctx, t, b.c, rn+"-r", true, rn, rn, func(int) byte { return kvUntouch })
			srcIDs, dstIDs := kvIDs(r, 16)
			send := func() {
				t.Helper()
				if _, err := a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: ln, Peer: b.d.PeerAddr(), RemoteLayout: rn, LocalIDs: srcIDs, RemoteIDs: dstIDs, Transport: kind}); err != nil {
					t.Fatal(err)
				}
			}
			send() // the sender now caches rn
			checkKV(t, src, dst, srcIDs, dstIDs)
			if err := b.c.DeregisterLayout(ctx, rn); err != nil {
				t.Fatal(err)
			}
			var rev kvSide
			var segs []client.Segment
			for i := kvSegments - 1; i >= 0; i-- {
				reg := dst.regions[i]
				fill(reg.Bytes, func(int) byte { return kvUntouch })
				rev.regions = append(rev.regions, reg)
				segs = append(segs, client.Segment{RegionID: reg.Id, BlockLen: kvBlock, Stride: kvBlock})
			}
			if _, err := b.c.RegisterLayout(ctx, client.Layout{Name: rn, Segments: segs, NumBlocks: kvPool, Export: rn}); err != nil {
				t.Fatal(err)
			}
			send()
			checkKV(t, src, rev, srcIDs, dstIDs)
		})
	}
}
