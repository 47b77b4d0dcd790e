package e2e

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestPushAfterPull alternates pulls and pushes of large blocks between the
// same two daemons, so that both directions share one connection's streams
// (b2b-bench --op both does this): every batch must land and verify. Over
// tcp a pull of large blocks used to leave its stream's SO_RCVLOWAT at the
// block read's mark, and the next push's ack (a few bytes) then never woke
// the sender: the push hung until its deadline.
func TestPushAfterPull(t *testing.T) {
	for _, k := range pullKinds {
		t.Run(k.name, func(t *testing.T) {
			a, b := startNode(t, "a", k.cfg), startNode(t, "b", k.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r := rand.New(rand.NewPCG(24, 2))
			const size, n = 256 << 10, 40
			localOff, localSize := layout(n, size, r)
			remoteOff, remoteSize := layout(n, size, r)
			local, err := a.c.RegisterHost(ctx, localSize, "")
			if err != nil {
				t.Fatal(err)
			}
			remote, err := b.c.RegisterHost(ctx, remoteSize, "kv", client.Readers("*"))
			if err != nil {
				t.Fatal(err)
			}
			for round := 0; round < 3; round++ {
				// Each batch has its own deadline: a hung one fails alone.
				fill(remote.Bytes, func(int) byte { return byte(r.Uint32()) })
				pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := pull(pctx, a.c, local.Id, b.d.PeerAddr(), "kv", localOff, remoteOff, size, k.kind)
				pcancel()
				if err != nil {
					t.Fatalf("round %d: pull: %v", round, err)
				}
				sameBlocks(ctx, t, b.c, a.c, remote, local, remoteOff, localOff, size)

				fill(local.Bytes, func(int) byte { return byte(r.Uint32()) })
				wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
				_, err = a.c.BatchTransfer(wctx, client.Transfer{SrcRegion: local.Id, Peer: b.d.PeerAddr(), DstRegion: "kv", Transport: k.kind,
					Op: b2bv1.TransferOp_TRANSFER_OP_WRITE, Blocks: client.Descriptors{Src: localOff, Dst: remoteOff, BlockLength: size}})
				wcancel()
				if err != nil {
					t.Fatalf("round %d: the push after a pull: %v", round, err)
				}
				sameBlocks(ctx, t, a.c, b.c, local, remote, localOff, remoteOff, size)
			}
			release(ctx, t, a.c, local)
			release(ctx, t, b.c, remote)
		})
	}
}
