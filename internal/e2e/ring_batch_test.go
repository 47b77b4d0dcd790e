package e2e

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestRingBatch: ad hoc batches (BatchTransfer's request in the ring's
// arena) over tcp and local, push and pull: 10,000 blocks of 128 B at
// random slots, and blocks of mixed lengths with a notification; every
// byte of both regions is checked after each (what was not written must
// be untouched too).
func TestRingBatch(t *testing.T) {
	a, sock := ringNode(t, "a")
	b := startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rg, err := client.DialRingWith(sock, client.RingOptions{ArenaBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer rg.Close()
	r := rand.New(rand.NewPCG(51, 9))
	const slots, blk = 20000, 128
	for _, kind := range []string{"tcp", "local"} {
		t.Run(kind, func(t *testing.T) {
			local, err := a.c.RegisterHost(ctx, slots*blk, "")
			if err != nil {
				t.Fatal(err)
			}
			far, err := b.c.RegisterHost(ctx, slots*blk, "rb-"+kind, client.Readers("*"))
			if err != nil {
				t.Fatal(err)
			}
			w, err := b.c.Watch(ctx, far.Id)
			if err != nil {
				t.Fatal(err)
			}
			for i, tc := range []struct {
				name string
				op   b2bv1.TransferOp
				n    int
				mix  bool
				note string
			}{
				{"push 10000 x 128 B", b2bv1.TransferOp_TRANSFER_OP_WRITE, 10000, false, ""},
				{"pull 10000 x 128 B", opRead, 10000, false, ""},
				{"push mixed lengths, noted", b2bv1.TransferOp_TRANSFER_OP_WRITE, 300, true, "batch-done"},
				{"pull mixed lengths", opRead, 300, true, ""},
			} {
				fill(local.Bytes, func(int) byte { return byte(r.Uint32()) })
				fill(far.Bytes, func(int) byte { return byte(r.Uint32()) })
				srcSlots, dstSlots := r.Perm(slots)[:tc.n], r.Perm(slots)[:tc.n]
				d := client.Descriptors{Src: make([]uint64, tc.n), Dst: make([]uint64, tc.n)}
				if tc.mix {
					d.Len = make([]uint64, tc.n)
				} else {
					d.BlockLength = blk
				}
				for k := range tc.n {
					d.Src[k], d.Dst[k] = uint64(srcSlots[k])*blk, uint64(dstSlots[k])*blk
					if tc.mix {
						d.Len[k] = 1 + uint64(r.IntN(blk))
					}
				}
				// What each region must hold after: the destination's
				// blocks from the source, everything else as it was.
				wantLocal, wantFar := bytes.Clone(local.Bytes), bytes.Clone(far.Bytes)
				for k := range tc.n {
					n := d.BlockLength + 0
					if tc.mix {
						n = d.Len[k]
					}
					if tc.op == opRead {
						copy(wantLocal[d.Src[k]:d.Src[k]+n], far.Bytes[d.Dst[k]:d.Dst[k]+n])
					} else {
						copy(wantFar[d.Dst[k]:d.Dst[k]+n], local.Bytes[d.Src[k]:d.Src[k]+n])
					}
				}
				tr := client.Transfer{SrcRegion: local.Id, Peer: b.d.PeerAddr(), DstRegion: "rb-" + kind, TransportName: kind, Op: tc.op, Blocks: d}
				if tc.note != "" {
					tr.Notification = []byte(tc.note)
				}
				var res client.RawResult
				t0 := time.Now()
				if i%2 == 0 {
					res, err = a.c.TransferRing(ctx, rg, tr)
				} else { // the async form: a tag, then Wait
					var tag uint64
					if tag, err = rg.StartTransfer(tr); err == nil {
						res, err = rg.Wait(tag)
					}
				}
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if res.Blocks != uint64(tc.n) || res.Total <= 0 || res.Transport != kind {
					t.Fatalf("%s: %+v", tc.name, res)
				}
				// The response's figures, over the ring as over gRPC.
				if res.Segments == 0 || res.Segments > uint64(tc.n) {
					t.Fatalf("%s: %d segments for %d blocks: want the response's", tc.name, res.Segments, tc.n)
				}
				// The daemon's wall-clock times, over the ring as over gRPC.
				if res.Posted.Before(t0) || res.Landed.Before(res.Posted) || res.Landed.After(time.Now()) {
					t.Fatalf("%s: posted %v, landed %v: not within the call from %v", tc.name, res.Posted, res.Landed, t0)
				}
				if tc.note != "" {
					got, err := w.Recv()
					if err != nil || string(got.Notification) != tc.note || got.Sender != "a" {
						t.Fatalf("%s: notification %v, %v", tc.name, got, err)
					}
				}
				if !bytes.Equal(local.Bytes, wantLocal) || !bytes.Equal(far.Bytes, wantFar) {
					t.Fatalf("%s: the regions differ from what the batch should have left", tc.name)
				}
			}
		})
	}
}

// TestRingBatchRefusals: a refused batch record carries the code and
// message BatchTransfer gives for the same request; what the ring cannot
// say (a Transport value and a TransportName that disagree) goes to gRPC
// through TransferRing, and StartTransfer refuses it.
func TestRingBatchRefusals(t *testing.T) {
	a, sock := ringNode(t, "a")
	b := startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rg, err := client.DialRing(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer rg.Close()
	local, err := a.c.RegisterHost(ctx, 1<<20, "")
	if err != nil {
		t.Fatal(err)
	}
	far, err := b.c.RegisterHost(ctx, 1<<20, "rbr")
	if err != nil {
		t.Fatal(err)
	}
	fill(far.Bytes, func(int) byte { return kvUntouch })
	good := client.Transfer{SrcRegion: local.Id, Peer: b.d.PeerAddr(), DstRegion: "rbr",
		Blocks: client.Descriptors{Src: []uint64{0, 4096}, Dst: []uint64{0, 4096}, BlockLength: 4096}}
	edit := func(f func(t *client.Transfer)) client.Transfer {
		t := good
		t.Blocks = client.Descriptors{Src: append([]uint64(nil), good.Blocks.Src...), Dst: append([]uint64(nil), good.Blocks.Dst...), BlockLength: 4096}
		f(&t)
		return t
	}
	for _, tc := range []struct {
		name string
		t    client.Transfer
		code codes.Code
	}{
		{"overlapping destinations", edit(func(t *client.Transfer) { t.Blocks.Dst[1] = 100 }), codes.InvalidArgument},
		{"block past the source", edit(func(t *client.Transfer) { t.Blocks.Src[1] = 1 << 20 }), codes.InvalidArgument},
		{"unknown source region", edit(func(t *client.Transfer) { t.SrcRegion = "nope" }), codes.NotFound},
		{"unknown op", edit(func(t *client.Transfer) { t.Op = 9 }), codes.InvalidArgument},
		{"unknown transport", edit(func(t *client.Transfer) { t.TransportName = "carrier-pigeon" }), codes.InvalidArgument},
		{"no peer", edit(func(t *client.Transfer) { t.Peer = "" }), codes.InvalidArgument},
		{"no descriptors", edit(func(t *client.Transfer) { t.Blocks = client.Descriptors{} }), codes.InvalidArgument},
		{"lengths and block length", edit(func(t *client.Transfer) { t.Blocks.Len = []uint64{1, 1} }), codes.InvalidArgument},
		{"pull of an export without readers", edit(func(t *client.Transfer) { t.Op = opRead }), codes.PermissionDenied},
	} {
		tag, serr := rg.StartTransfer(tc.t)
		if serr != nil {
			t.Fatalf("%s: start: %v", tc.name, serr)
		}
		_, rerr := rg.Wait(tag)
		_, gerr := a.c.BatchTransfer(ctx, tc.t)
		rs, gs := status.Convert(rerr), status.Convert(gerr)
		if rerr == nil || gerr == nil || rs.Code() != tc.code || rs.Code() != gs.Code() || rs.Message() != gs.Message() {
			t.Errorf("%s: ring %v, gRPC %v: want the same %v", tc.name, rerr, gerr, tc.code)
		}
	}
	for i, v := range far.Bytes {
		if v != kvUntouch {
			t.Fatalf("byte %d of the destination is %#x after refused batches only", i, v)
		}
	}
	// A Transport value and a name that disagree: gRPC's own refusal.
	mixed := edit(func(t *client.Transfer) {
		t.Transport, t.TransportName = b2bv1.TransportKind_TRANSPORT_KIND_TCP, "local"
	})
	_, rerr := a.c.TransferRing(ctx, rg, mixed)
	_, gerr := a.c.BatchTransfer(ctx, mixed)
	if rs, gs := status.Convert(rerr), status.Convert(gerr); rerr == nil || rs.Code() != codes.InvalidArgument || rs.Message() != gs.Message() {
		t.Errorf("tcp by value, local by name: TransferRing %v, BatchTransfer %v", rerr, gerr)
	}
	if _, err := rg.StartTransfer(mixed); err == nil {
		t.Error("StartTransfer of tcp by value and local by name: no error")
	}
	// And the good request still goes.
	if _, err := a.c.TransferRing(ctx, rg, good); err != nil {
		t.Fatal(err)
	}
	// 100,000 descriptors (1.6 MB of request) over the 1 MiB arena:
	// TransferRing sends them over gRPC, StartTransfer refuses them.
	const n = 100_000
	big := client.Transfer{SrcRegion: local.Id, Peer: b.d.PeerAddr(), DstRegion: "rbr",
		Blocks: client.Descriptors{Src: make([]uint64, n), Dst: make([]uint64, n), BlockLength: 8}}
	for i := range n {
		big.Blocks.Src[i], big.Blocks.Dst[i] = uint64(i)*8, uint64(i)*8
	}
	fill(local.Bytes, func(i int) byte { return byte(i*7 + 1) })
	res, err := a.c.TransferRing(ctx, rg, big)
	if err != nil || res.Blocks != n || res.Transport != "tcp" {
		t.Fatalf("a batch over the arena: %+v, %v", res, err)
	}
	if !bytes.Equal(far.Bytes[:n*8], local.Bytes[:n*8]) {
		t.Fatal("a batch over the arena, sent over gRPC: the destination differs")
	}
	if _, err := rg.StartTransfer(big); err == nil || !strings.Contains(err.Error(), "over the ring's arena") {
		t.Fatalf("StartTransfer of a batch over the arena: %v", err)
	}
}
