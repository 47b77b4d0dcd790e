package e2e

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestWarmTransfer: a warm-up, push and pull, over tcp and local, moves no
// byte and names the kind it made ready; batches after it land every
// block; a warm-up is refused as BatchTransfer refuses the same request
// (code and message).
func TestWarmTransfer(t *testing.T) {
	a := startNode(t, "a", autoTransport)
	b := startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n, size = 64, 4096
	r := rand.New(rand.NewPCG(61, 1))
	for _, kind := range []string{"tcp", "local"} {
		t.Run(kind, func(t *testing.T) {
			local, err := a.c.RegisterHost(ctx, 2*n*size, "")
			if err != nil {
				t.Fatal(err)
			}
			far, err := b.c.RegisterHost(ctx, 2*n*size, "warm-"+kind, client.Readers("*"))
			if err != nil {
				t.Fatal(err)
			}
			fill(local.Bytes, func(int) byte { return byte(r.Uint32()) })
			fill(far.Bytes, func(int) byte { return byte(r.Uint32()) })
			wantLocal, wantFar := bytes.Clone(local.Bytes), bytes.Clone(far.Bytes)
			for _, op := range []b2bv1.TransferOp{b2bv1.TransferOp_TRANSFER_OP_WRITE, opRead} {
				tr := client.Transfer{SrcRegion: local.Id, Peer: b.d.PeerAddr(), DstRegion: "warm-" + kind, TransportName: kind, Op: op}
				for range 2 { // again, once warm
					resp, err := a.c.Warm(ctx, tr)
					if err != nil {
						t.Fatalf("warm-up (%v): %v", op, err)
					}
					if resp.GetTransportName() != kind || resp.GetElapsedNs() == 0 {
						t.Fatalf("warm-up (%v): %+v", op, resp)
					}
				}
			}
			if !bytes.Equal(local.Bytes, wantLocal) || !bytes.Equal(far.Bytes, wantFar) {
				t.Fatal("a warm-up changed a region")
			}
			for _, op := range []b2bv1.TransferOp{b2bv1.TransferOp_TRANSFER_OP_WRITE, opRead} {
				s, d := r.Perm(2 * n)[:n], r.Perm(2 * n)[:n]
				tr := client.Transfer{SrcRegion: local.Id, Peer: b.d.PeerAddr(), DstRegion: "warm-" + kind, TransportName: kind, Op: op,
					Blocks: client.Descriptors{Src: make([]uint64, n), Dst: make([]uint64, n), BlockLength: size}}
				for k := range n {
					tr.Blocks.Src[k], tr.Blocks.Dst[k] = uint64(s[k])*size, uint64(d[k])*size
					lo, fo := tr.Blocks.Src[k], tr.Blocks.Dst[k]
					if op == opRead {
						copy(wantLocal[lo:lo+size], far.Bytes[fo:fo+size])
					} else {
						copy(wantFar[fo:fo+size], local.Bytes[lo:lo+size])
					}
				}
				if _, err := a.c.BatchTransfer(ctx, tr); err != nil {
					t.Fatalf("batch (%v) after the warm-up: %v", op, err)
				}
				if !bytes.Equal(local.Bytes, wantLocal) || !bytes.Equal(far.Bytes, wantFar) {
					t.Fatalf("batch (%v) after the warm-up: the regions differ from what it should have left", op)
				}
			}
		})
	}
	local, err := a.c.RegisterHost(ctx, 1<<20, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.RegisterHost(ctx, 1<<20, "warm-closed"); err != nil {
		t.Fatal(err)
	}
	good := client.Transfer{SrcRegion: local.Id, Peer: b.d.PeerAddr(), DstRegion: "warm-closed"}
	for _, tc := range []struct {
		name string
		edit func(t *client.Transfer)
		code codes.Code
	}{
		{"unknown source region", func(t *client.Transfer) { t.SrcRegion = "nope" }, codes.NotFound},
		{"no peer", func(t *client.Transfer) { t.Peer = "" }, codes.InvalidArgument},
		{"no destination", func(t *client.Transfer) { t.DstRegion = "" }, codes.InvalidArgument},
		{"unknown destination", func(t *client.Transfer) { t.DstRegion = "absent" }, codes.NotFound},
		{"unknown op", func(t *client.Transfer) { t.Op = 9 }, codes.InvalidArgument},
		{"unknown transport", func(t *client.Transfer) { t.TransportName = "carrier-pigeon" }, codes.InvalidArgument},
		{"pull of an export without readers", func(t *client.Transfer) { t.Op = opRead }, codes.PermissionDenied},
	} {
		tr := good
		tc.edit(&tr)
		_, werr := a.c.Warm(ctx, tr)
		tr.Blocks = client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 1}
		_, gerr := a.c.BatchTransfer(ctx, tr)
		ws, gs := status.Convert(werr), status.Convert(gerr)
		if werr == nil || gerr == nil || ws.Code() != tc.code || ws.Code() != gs.Code() || ws.Message() != gs.Message() {
			t.Errorf("%s: warm-up %v, BatchTransfer %v: want the same %v", tc.name, werr, gerr, tc.code)
		}
	}
}
