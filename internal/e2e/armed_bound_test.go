package e2e

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestArmedTransferIsBound: a transfer armed on a key note resolves its
// destination when armed (here from the cache, as a batch went before),
// and posts only there. Its destination's owner
// goes and another client registers the same export name before the note
// fires: the transfer fails (the old key refused, or bound elsewhere)
// and not one byte lands in the new owner's memory (it used to follow
// the name there and answer DONE). Ad hoc batches and block transfers,
// over tcp and local; and an armed batch to a name nobody exports ends
// NotFound at once, before its trigger.
func TestArmedTransferIsBound(t *testing.T) {
	a, b := startNode(t, "a", autoTransport), startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const blk, n = 4096, 4
	src, err := a.c.RegisterHost(ctx, blk*16, "")
	if err != nil {
		t.Fatal(err)
	}
	fill(src.Bytes, func(int) byte { return 7 })
	if _, err := a.c.RegisterLayout(ctx, client.Layout{Name: "src", Segments: []client.Segment{{RegionID: src.Id, BlockLen: blk, Stride: blk}}, NumBlocks: 16}); err != nil {
		t.Fatal(err)
	}
	mailbox, err := a.c.RegisterHost(ctx, 4096, "")
	if err != nil {
		t.Fatal(err)
	}
	ids := []uint32{0, 1, 2, 3}
	offs := strided(n, blk)
	for _, tr := range []string{"tcp", "local"} {
		for _, kind := range []string{"batch", "blocks"} {
			name := fmt.Sprintf("bound-%s-%s", tr, kind)
			what := kind + " over " + tr
			// register makes a client on b own a region (and a layout)
			// exported as name, zeroed.
			register := func() (*client.Client, *client.HostRegion) {
				c := dialSock(t, b.d.APIAddr())
				r, err := c.RegisterHost(ctx, blk*16, name)
				if err != nil {
					t.Fatalf("%s: register %s: %v", what, name, err)
				}
				if kind == "blocks" {
					if _, err := c.RegisterLayout(ctx, client.Layout{Name: name, Export: name, NumBlocks: 16,
						Segments: []client.Segment{{RegionID: r.Id, BlockLen: blk, Stride: blk}}}); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
				}
				return c, r
			}
			start := func(key []byte) (*client.TransferHandle, error) {
				if kind == "blocks" {
					return a.c.StartBlocks(ctx, client.Blocks{LocalLayout: "src", Peer: b.d.PeerAddr(), RemoteLayout: name,
						LocalIDs: ids, RemoteIDs: ids, TransportName: tr}, 20*time.Second, client.AfterNote(mailbox.Id, key))
				}
				return a.c.StartTransfer(ctx, client.Transfer{SrcRegion: src.Id, Peer: b.d.PeerAddr(), DstRegion: name,
					Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: blk}, TransportName: tr}, 20*time.Second, client.AfterNote(mailbox.Id, key))
			}
			x, old := register()
			// A batch first, so that a's cache holds the old resolution.
			warm := func() {
				t.Helper()
				var werr error
				if kind == "blocks" {
					_, werr = a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: "src", Peer: b.d.PeerAddr(), RemoteLayout: name, LocalIDs: ids, RemoteIDs: ids, TransportName: tr})
				} else {
					_, werr = transfer(ctx, a.c, src.Id, b.d.PeerAddr(), name, offs, offs, blk)
				}
				if werr != nil {
					t.Fatalf("%s: the first batch: %v", what, werr)
				}
			}
			// goes deregisters the owner's registration (a lease ends the same way).
			goes := func(x *client.Client, r *client.HostRegion) {
				t.Helper()
				if kind == "blocks" {
					if err := x.DeregisterLayout(ctx, name); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
				}
				r.Unmap()
				if err := x.Deregister(ctx, r.Id); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				x.Close()
			}
			fire := func(key []byte) {
				t.Helper()
				note, err := client.KeyNote([][]byte{key}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := a.c.NotifyRegion(ctx, mailbox.Id, note); err != nil {
					t.Fatal(err)
				}
			}
			// Re-registered before the arm, the cache not told: the
			// transfer was armed against the new registration, and lands
			// there. The daemon reads the binding's time as the peer's
			// age of it against its own clock, which the answer's travel
			// makes later than the truth (docs/notes.md, Rules): a binding
			// within that travel of the arm counts as after it, and is
			// refused. So the arm comes well after (as the refusal below
			// comes well after the arm): arming at once failed 4 runs in
			// 10 on the 2-core machine, the binding read 10 µs to 3 ms late.
			warm()
			goes(x, old)
			x, old = register()
			time.Sleep(50 * time.Millisecond)
			h, err := start([]byte("before-" + name))
			if err != nil {
				t.Fatalf("%s: arm: %v", what, err)
			}
			fire([]byte("before-" + name))
			if o, err := h.Wait(ctx, 0); err != nil || o.GetState() != b2bv1.TransferState_TRANSFER_STATE_DONE {
				t.Fatalf("%s: armed after a re-registration the cache had not seen: %v %v, want DONE", what, o, err)
			}
			if i := badBlock(src.Bytes, old.Bytes, offs, offs, blk); i >= 0 {
				t.Fatalf("%s: armed after a re-registration: block %d did not land in the registration it was armed against", what, i)
			}
			clear(old.Bytes)
			// Re-registered after the arm: refused, nothing lands.
			warm()
			key := []byte("go-" + name)
			h, err = start(key)
			if err != nil {
				t.Fatalf("%s: arm: %v", what, err)
			}
			time.Sleep(50 * time.Millisecond) // armed: resolved, at its gate
			goes(x, old)
			y, fresh := register()
			fire(key)
			o, err := h.Wait(ctx, 0)
			if err != nil {
				t.Fatalf("%s: wait: %v", what, err)
			}
			if o.GetState() == b2bv1.TransferState_TRANSFER_STATE_DONE {
				t.Fatalf("%s: DONE after its destination was re-registered by another client: want it refused", what)
			}
			if c := codes.Code(o.GetCode()); c != codes.NotFound && c != codes.FailedPrecondition {
				t.Fatalf("%s: outcome %v, want NotFound or FailedPrecondition", what, o)
			}
			if !bytes.Equal(fresh.Bytes, make([]byte, len(fresh.Bytes))) {
				t.Fatalf("%s: bytes landed in the new owner's region", what)
			}
			fresh.Unmap()
			y.Close()
		}
	}
	// Armed to an export nobody holds: resolved at once, so the handle
	// ends NotFound without its trigger.
	h, err := a.c.StartTransfer(ctx, client.Transfer{SrcRegion: src.Id, Peer: b.d.PeerAddr(), DstRegion: "nobody",
		Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: blk}}, 20*time.Second, client.AfterNote(mailbox.Id, []byte("never")))
	if err != nil {
		t.Fatal(err)
	}
	o, err := h.Wait(ctx, 10*time.Second)
	if err != nil || codes.Code(o.GetCode()) != codes.NotFound {
		t.Fatalf("armed to an export nobody holds: %v %v, want NotFound before the trigger", o, err)
	}
}
