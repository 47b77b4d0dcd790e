package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	layoutlim "github.com/b2bd/b2bd/internal/layout"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// arenaMaxIDs is the most ids a request of a one-segment layout may carry
// (ids × segments is bounded, before the ids alone are).
const arenaMaxIDs = layoutlim.DefaultMaxRequestBlocks

// arenaSide is a one-segment layout of arenaMaxIDs blocks of 8 bytes.
type arenaSide struct{ reg *client.HostRegion }

const arenaBlock = 8

func arenaLayout(ctx context.Context, t *testing.T, c *client.Client, name, export string, fillWith func(int) byte) arenaSide {
	t.Helper()
	r, err := c.RegisterHost(ctx, arenaMaxIDs*arenaBlock, export)
	if err != nil {
		t.Fatal(err)
	}
	fill(r.Bytes, fillWith)
	if _, err := c.RegisterLayout(ctx, client.Layout{Name: name, Export: export,
		Segments:  []client.Segment{{RegionID: r.Id, BlockLen: arenaBlock, Stride: arenaBlock}},
		NumBlocks: arenaMaxIDs}); err != nil {
		t.Fatal(err)
	}
	return arenaSide{r}
}

// arenaIDs draws n distinct source and n distinct destination ids; the
// largest requests come in shuffled runs, as a KV cache's blocks do.
func arenaIDs(r *rand.Rand, n int) (src, dst []uint32) {
	if n < 4096 {
		for _, p := range r.Perm(arenaMaxIDs)[:n] {
			src = append(src, uint32(p))
		}
		for _, p := range r.Perm(arenaMaxIDs)[:n] {
			dst = append(dst, uint32(p))
		}
		return src, dst
	}
	const run = 64
	runs := r.Perm(arenaMaxIDs / run)
	for i := 0; i < n; i++ {
		src = append(src, uint32(i))
		dst = append(dst, uint32(runs[i/run]*run+i%run))
	}
	return src, dst
}

// TestRingArenaBlocks moves 1, 5, 513 and the most ids a request may
// carry over the ring (the ids and a notification in its arena), over tcp
// and local, and checks the whole destination after each transfer: at the
// moment its notification arrives, which it does once.
func TestRingArenaBlocks(t *testing.T) {
	a, sock := ringNode(t, "a")
	b := startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rg, err := client.DialRingWith(sock, client.RingOptions{ArenaBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer rg.Close()
	r := rand.New(rand.NewPCG(41, 3))
	for _, kind := range []b2bv1.TransportKind{b2bv1.TransportKind_TRANSPORT_KIND_TCP, b2bv1.TransportKind_TRANSPORT_KIND_LOCAL} {
		t.Run(kind.String(), func(t *testing.T) {
			ln, rn := "asrc-"+kind.String(), "adst-"+kind.String()
			src := arenaLayout(ctx, t, a.c, ln, "", func(int) byte { return byte(r.Uint32()) })
			dst := arenaLayout(ctx, t, b.c, rn, rn, func(int) byte { return kvUntouch })
			want := bytes.Clone(dst.reg.Bytes)
			w, err := b.c.Watch(ctx, dst.reg.Id)
			if err != nil {
				t.Fatal(err)
			}
			rt, err := a.c.BindRoute(ctx, client.Blocks{LocalLayout: ln, Peer: b.d.PeerAddr(), RemoteLayout: rn, Transport: kind})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Release(ctx)
			for i, n := range []int{1, 5, 513, arenaMaxIDs, 3} {
				srcIDs, dstIDs := arenaIDs(r, n)
				for k := range srcIDs {
					copy(want[dstIDs[k]*arenaBlock:(dstIDs[k]+1)*arenaBlock], src.reg.Bytes[srcIDs[k]*arenaBlock:(srcIDs[k]+1)*arenaBlock])
				}
				note := []byte(fmt.Sprintf(`{"req":%d,"ids":%d}`, i, n))
				tag, err := rg.StartBlocks(rt, srcIDs, dstIDs, client.WithNotification(note))
				if err != nil {
					t.Fatalf("%d ids: %v", n, err)
				}
				got, err := w.Recv() // the next note is this one: no other came twice
				if err != nil {
					t.Fatalf("%d ids: watch: %v", n, err)
				}
				if !bytes.Equal(got.Notification, note) || got.Bytes != uint64(n*arenaBlock) || got.Sender != "a" {
					t.Fatalf("%d ids: notification %q, %d bytes from %q; want %q", n, got.Notification, got.Bytes, got.Sender, note)
				}
				checkArena(t, n, dst.reg.Bytes, want) // landed before the note
				res, err := rg.Wait(tag)
				if err != nil || res.Blocks != uint64(n) || res.Bytes != uint64(n*arenaBlock) {
					t.Fatalf("%d ids: %+v, %v", n, res, err)
				}
			}
			// The ring's own call through Route.Transfer, a note, 600 ids.
			srcIDs, dstIDs := arenaIDs(r, 600)
			for k := range srcIDs {
				copy(want[dstIDs[k]*arenaBlock:(dstIDs[k]+1)*arenaBlock], src.reg.Bytes[srcIDs[k]*arenaBlock:(srcIDs[k]+1)*arenaBlock])
			}
			if _, err := rt.Transfer(ctx, rg, srcIDs, dstIDs, client.WithNotification([]byte("last"))); err != nil {
				t.Fatal(err)
			}
			if got, err := w.Recv(); err != nil || string(got.Notification) != "last" {
				t.Fatalf("last notification: %v, %v", got, err)
			}
			checkArena(t, 600, dst.reg.Bytes, want)
			// One id past the limit: the refusal TransferBlocks gives.
			over := make([]uint32, arenaMaxIDs+1)
			for k := range over {
				over[k] = uint32(k % arenaMaxIDs)
			}
			_, rerr := rg.BlocksContext(ctx, rt, over, over)
			_, gerr := a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: ln, Peer: b.d.PeerAddr(), RemoteLayout: rn, Transport: kind, LocalIDs: over, RemoteIDs: over})
			if rs, gs := status.Convert(rerr), status.Convert(gerr); rerr == nil || rs.Code() != codes.ResourceExhausted || rs.Code() != gs.Code() || rs.Message() != gs.Message() {
				t.Fatalf("%d ids: ring %v, gRPC %v: want the same ResourceExhausted", len(over), rerr, gerr)
			}
			checkArena(t, len(over), dst.reg.Bytes, want)
		})
	}
}

// checkArena compares the destination with what it should hold, block by
// block.
func checkArena(t *testing.T, n int, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	for b := 0; b < len(want); b += arenaBlock {
		if !bytes.Equal(got[b:b+arenaBlock], want[b:b+arenaBlock]) {
			t.Fatalf("%d ids: destination block %d: %x, want %x", n, b/arenaBlock, got[b:b+arenaBlock], want[b:b+arenaBlock])
		}
	}
}

// TestRingArenaWraps: with a 4 KiB arena, 300 transfers of 100 ids and a
// note (about five records' worth of arena) are started before any is
// waited for: the client waits for the daemon to take records and reuses
// their space; every destination block is checked.
func TestRingArenaWraps(t *testing.T) {
	a, sock := ringNode(t, "a")
	b := startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rg, err := client.DialRingWith(sock, client.RingOptions{ArenaBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer rg.Close()
	r := rand.New(rand.NewPCG(43, 1))
	src := arenaLayout(ctx, t, a.c, "wsrc", "", func(int) byte { return byte(r.Uint32()) })
	dst := arenaLayout(ctx, t, b.c, "wdst", "wdst", func(int) byte { return kvUntouch })
	want := bytes.Clone(dst.reg.Bytes)
	rt, err := a.c.BindRoute(ctx, client.Blocks{LocalLayout: "wsrc", Peer: b.d.PeerAddr(), RemoteLayout: "wdst"})
	if err != nil {
		t.Fatal(err)
	}
	const n, k = 300, 100
	perm := r.Perm(arenaMaxIDs)[:n*k]
	var tags []uint64
	for i := range n {
		srcIDs, dstIDs := make([]uint32, k), make([]uint32, k)
		for j := range k {
			srcIDs[j], dstIDs[j] = uint32(r.IntN(arenaMaxIDs)), uint32(perm[i*k+j])
			copy(want[dstIDs[j]*arenaBlock:(dstIDs[j]+1)*arenaBlock], src.reg.Bytes[srcIDs[j]*arenaBlock:(srcIDs[j]+1)*arenaBlock])
		}
		tag, err := rg.StartBlocks(rt, srcIDs, dstIDs, client.WithNotification([]byte(fmt.Sprint(i))))
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		tags = append(tags, tag)
	}
	for i, tag := range tags {
		if res, err := rg.Wait(tag); err != nil || res.Bytes != k*arenaBlock {
			t.Fatalf("transfer %d: %+v, %v", i, res, err)
		}
	}
	checkArena(t, n*k, dst.reg.Bytes, want)
	// A request larger than the arena is refused by the ring's call and
	// goes over gRPC through Route.Transfer.
	big := make([]uint32, 600)
	for i := range big {
		big[i] = uint32(i)
	}
	if _, err := rg.StartBlocks(rt, big, big); err == nil {
		t.Fatal("600 id pairs started on a 4 KiB arena")
	}
	if _, err := rt.Transfer(ctx, rg, big, big); err != nil {
		t.Fatalf("600 ids through Route.Transfer: %v", err)
	}
}
