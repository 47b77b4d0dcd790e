package server_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/callid"

	"github.com/b2bd/b2bd/internal/region"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestSubmitStreamCancel: a pull submitted on a SubmitStream through the
// Go client waits on its peer (whose serving side is held); the caller
// cancels the stream's context. The stream ends with the daemon's
// Canceled, naming the call id and saying the transfer stopped, the
// submit's result is Canceled, and once the peer goes on and has let go of
// its region, nothing of the pull landed in the caller's region.
func TestSubmitStreamCancel(t *testing.T) {
	bn := bufNet{}
	a, b := newNode(t, "a", bn), newNode(t, "b", bn)
	ctx := context.Background()
	local, err := a.api.RegisterRegion(ctx, hostAlloc(4096, ""))
	if err != nil {
		t.Fatal(err)
	}
	remote, err := b.api.RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: 4096}}, ExportName: "src", Readers: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}
	bytesOf := func(n *node, id string) []byte {
		r, release, err := n.reg.Acquire(id, "region_id", region.Root)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		return r.Mem.Host
	}
	into := bytesOf(a, local.Region.Id)
	for i, from := 0, bytesOf(b, remote.Region.Id); i < len(from); i++ {
		from[i] = 0xab
	}

	c := dialAPI(t, a)
	plan, err := c.Prepare(ctx, client.Transfer{SrcRegion: local.Region.Id, Peer: "b:7470", DstRegion: "src",
		Op: b2bv1.TransferOp_TRANSFER_OP_READ, Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	g := newPinGate()
	b.in.readGate.Store(g)
	var opened sync.Once
	openGate := func() { opened.Do(func() { close(g.open) }) }
	defer openGate() // a failure below must not leave the peer held (its Close waits for it)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	st, err := c.OpenStream(sctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Submit(plan); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.entered: // the pull is at the peer, which holds it
	case <-time.After(30 * time.Second):
		t.Fatal("the pull never reached the peer")
	}
	cancel()
	var results []client.StreamResult
	for r := range st.Results() {
		results = append(results, r)
	}
	if len(results) != 1 || status.Code(results[0].Err) != codes.Canceled {
		t.Fatalf("results %+v; want the submit's Canceled", results)
	}
	const daemons = "the caller cancelled the call (" + callid.Key
	if s := status.Convert(st.Err()); s.Code() != codes.Canceled || !strings.Contains(s.Message(), daemons) || !strings.Contains(s.Message(), "stopped before this answer") {
		t.Fatalf("the stream ended with %v %q; want the daemon's Canceled, naming %q", s.Code(), s.Message(), daemons)
	}
	// The peer goes on now: whatever it sends after the answer must not land.
	openGate()
	select {
	case <-g.released:
	case <-time.After(30 * time.Second):
		t.Fatal("the peer never let go of its region")
	}
	// The peer's bytes, had they been placed, were placed by a reader of
	// ours that the answer said had stopped; look again after a while.
	time.Sleep(100 * time.Millisecond)
	if !bytes.Equal(into, make([]byte, len(into))) {
		t.Fatalf("bytes of the cancelled pull landed after its answer: %d of %d non-zero", len(into)-bytes.Count(into, []byte{0}), len(into))
	}
}
