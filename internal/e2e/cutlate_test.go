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

// TestCutSmallBatchesNoLateBytes: hundreds of small synchronous pushes, in
// a tight loop, each cut by a cancel or a deadline at a random moment
// while the receiving daemon places it, over tcp and the same-host path.
// Each batch has its own destination slot; the slot of a cut batch is
// read at its answer and again once every batch was answered: it must
// not have changed (no byte lands after the answer).
func TestCutSmallBatchesNoLateBytes(t *testing.T) {
	const iters, blocks, size, stride = 300, 4, 512, 1024
	const slot = blocks * stride
	for _, tc := range []struct {
		name string
		kind b2bv1.TransportKind
	}{
		{"tcp", b2bv1.TransportKind_TRANSPORT_KIND_TCP},
		{"local", b2bv1.TransportKind_TRANSPORT_KIND_LOCAL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := startNode(t, "a", autoTransport), startNode(t, "b", autoTransport)
			ctx := context.Background()
			s, d := registerPair(ctx, t, a.c, b.c, iters*slot, iters*slot, "cut-dst")
			r := rand.New(rand.NewPCG(11, uint64(tc.kind)))
			type cut struct {
				i    int
				snap []byte
				err  error
			}
			var cuts []cut
			window := 2 * time.Millisecond
			for i := range iters {
				offs := make([]uint64, blocks)
				for k := range offs {
					offs[k] = uint64(i*slot + k*stride)
				}
				fill(s.Bytes[i*slot:(i+1)*slot], func(j int) byte { return byte(r.Uint32()) | 1 })
				after := time.Duration(r.Int64N(int64(window) + 1))
				cctx, cancel := context.WithCancel(ctx)
				if i%2 == 0 {
					cctx, cancel = context.WithTimeout(ctx, after)
				} else {
					time.AfterFunc(after, cancel)
				}
				_, err := a.c.BatchTransfer(cctx, client.Transfer{SrcRegion: s.Id, Peer: b.d.PeerAddr(), DstRegion: "cut-dst", Transport: tc.kind,
					Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: size}})
				cancel()
				if err == nil {
					if k := badBlock(s.Bytes, d.Bytes, offs, offs, size); k >= 0 {
						t.Fatalf("batch %d answered OK but block %d differs", i, k)
					}
					continue
				}
				cuts = append(cuts, cut{i: i, snap: bytes.Clone(d.Bytes[i*slot : (i+1)*slot]), err: err})
			}
			// Longer than any placement a daemon still had in hand.
			time.Sleep(200 * time.Millisecond)
			late := 0
			for _, c := range cuts {
				if !bytes.Equal(c.snap, d.Bytes[c.i*slot:(c.i+1)*slot]) {
					late++
					t.Errorf("batch %d: its destination changed after its answer (%v)", c.i, c.err)
				}
			}
			t.Logf("%d batches, %d cut, %d changed after the answer", iters, len(cuts), late)
			if len(cuts) == 0 {
				t.Fatal("no batch was cut: the test tests nothing")
			}
		})
	}
}
