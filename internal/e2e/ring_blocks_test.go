package e2e

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// ringNode starts a daemon with --transport auto and a submit socket.
func ringNode(t *testing.T, name string) (*node, string) {
	var sock string
	n := startNode(t, name, autoTransport, func(c *daemon.Config) {
		sock = filepath.Join(filepath.Dir(c.Socket), "submit.sock")
		c.SubmitSocket = sock
	})
	return n, sock
}

// TestRingBlocks moves block ids over the ring on a bound route, 1 to 4
// pairs a record, over tcp and local, and checks every block of every
// segment; a request of more ids goes over gRPC on the same route.
func TestRingBlocks(t *testing.T) {
	a, sock := ringNode(t, "a")
	b := startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rg, err := client.DialRing(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer rg.Close()
	r := rand.New(rand.NewPCG(31, 7))
	for _, kind := range []b2bv1.TransportKind{b2bv1.TransportKind_TRANSPORT_KIND_TCP, b2bv1.TransportKind_TRANSPORT_KIND_LOCAL} {
		t.Run(kind.String(), func(t *testing.T) {
			ln, rn := "rsrc-"+kind.String(), "rdst-"+kind.String()
			src := registerKV(ctx, t, a.c, "", false, ln, "", func(int) byte { return byte(r.Uint32()) })
			dst := registerKV(ctx, t, b.c, rn+"-r", true, rn, rn, func(int) byte { return kvUntouch })
			rt, err := a.c.BindRoute(ctx, client.Blocks{LocalLayout: ln, Peer: b.d.PeerAddr(), RemoteLayout: rn, Transport: kind})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Release(ctx)
			srcIDs, dstIDs := kvIDs(r, 22)
			at := 0
			for _, n := range []int{1, 2, 3, 4, 12} { // 12: over gRPC
				res, err := rt.Transfer(ctx, rg, srcIDs[at:at+n], dstIDs[at:at+n])
				if err != nil {
					t.Fatalf("%d ids: %v", n, err)
				}
				if res.Blocks != uint64(n*kvSegments) || res.Bytes != uint64(n*kvSegments*kvBlock) || res.Total <= 0 {
					t.Fatalf("%d ids: %+v", n, res)
				}
				at += n
			}
			checkKV(t, src, dst, srcIDs, dstIDs)
			// And the ring's own call, with a deadline in the record.
			for _, reg := range src.regions {
				fill(reg.Bytes[srcIDs[0]*kvBlock:(srcIDs[0]+1)*kvBlock], func(int) byte { return byte(r.Uint32()) })
			}
			dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
			defer dcancel()
			if _, err := rg.BlocksContext(dctx, rt, srcIDs[:1], dstIDs[:1]); err != nil {
				t.Fatal(err)
			}
			checkKV(t, src, dst, srcIDs, dstIDs)
		})
	}
}

// TestRingBlocksRefusals: a refused block record carries the code and
// message TransferBlocks gives for the same ids; a released route, and
// one of another client's connection that closed, is NotFound.
func TestRingBlocksRefusals(t *testing.T) {
	a, sock := ringNode(t, "a")
	b := startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rg, err := client.DialRing(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer rg.Close()
	registerKV(ctx, t, a.c, "", false, "src", "", func(int) byte { return 1 })
	registerKV(ctx, t, b.c, "dst-r", true, "dst", "dst", func(int) byte { return kvUntouch })
	bl := client.Blocks{LocalLayout: "src", Peer: b.d.PeerAddr(), RemoteLayout: "dst"}
	rt, err := a.c.BindRoute(ctx, bl)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		local, remote []uint32
	}{
		{"local id out of range", []uint32{kvPool}, []uint32{0}},
		{"remote id out of range", []uint32{1}, []uint32{kvPool + 7}},
		{"remote id twice", []uint32{1, 2}, []uint32{3, 3}},
	} {
		_, rerr := rg.BlocksContext(ctx, rt, tc.local, tc.remote)
		g := bl
		g.LocalIDs, g.RemoteIDs = tc.local, tc.remote
		_, gerr := a.c.TransferBlocks(ctx, g)
		rs, gs := status.Convert(rerr), status.Convert(gerr)
		if rerr == nil || gerr == nil || rs.Code() != codes.InvalidArgument || rs.Code() != gs.Code() || rs.Message() != gs.Message() {
			t.Errorf("%s: ring %v, gRPC %v: want the same InvalidArgument", tc.name, rerr, gerr)
		}
	}
	// Binding checks the fields as TransferBlocks does.
	bad := bl
	bad.RemoteLayout = ""
	_, berr := a.c.BindRoute(ctx, bad)
	_, gerr := a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: "src", Peer: b.d.PeerAddr(), LocalIDs: []uint32{1}, RemoteIDs: []uint32{1}})
	if bs, gs := status.Convert(berr), status.Convert(gerr); berr == nil || bs.Code() != codes.InvalidArgument || bs.Message() != gs.Message() {
		t.Errorf("bind without remote_layout: %v; TransferBlocks: %v", berr, gerr)
	}
	if _, err := a.c.BindRoute(ctx, client.Blocks{LocalLayout: "nope", Peer: b.d.PeerAddr(), RemoteLayout: "dst"}); status.Code(err) != codes.NotFound {
		t.Errorf("bind of an unknown layout: %v, want NotFound", err)
	}
	if err := rt.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rg.BlocksContext(ctx, rt, []uint32{1}, []uint32{1}); status.Code(err) != codes.NotFound {
		t.Errorf("a released route: %v, want NotFound", err)
	}
	// A route goes with its connection.
	c2, err := client.Dial(a.d.APIAddr())
	if err != nil {
		t.Fatal(err)
	}
	rt2, err := c2.BindRoute(ctx, bl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rg.BlocksContext(ctx, rt2, []uint32{1}, []uint32{1}); err != nil {
		t.Fatalf("a route of another connection of the same user: %v", err)
	}
	c2.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := rg.BlocksContext(ctx, rt2, []uint32{1}, []uint32{1})
		if status.Code(err) == codes.NotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the route outlived its connection's close: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
