package e2e

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
)

// TestStreamSubmitAfterItsEnd: a submit on a SubmitStream after its
// CloseSend, or after Close, is refused with a code that says so
// (FailedPrecondition, or the stream's own end), not Internal or a bare
// EOF (Unknown).
func TestStreamSubmitAfterItsEnd(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, dst := registerPair(ctx, t, a.c, b.c, 1<<20, 1<<20, "sdst")
	defer release(ctx, t, a.c, src)
	defer release(ctx, t, b.c, dst)
	plan, err := a.c.Prepare(ctx, client.Transfer{SrcRegion: src.Id, Peer: b.d.PeerAddr(), DstRegion: "sdst",
		Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	defer plan.Release(ctx) // before the regions (deferred earlier)
	for _, how := range []string{"CloseSend", "Close"} {
		st, err := a.c.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Submit(plan); err != nil {
			t.Fatalf("%s: the first submit: %v", how, err)
		}
		if how == "CloseSend" {
			if err := st.CloseSend(); err != nil {
				t.Fatal(err)
			}
		} else {
			st.Close()
		}
		_, err = st.Submit(plan)
		switch c := status.Code(err); {
		case err == nil:
			t.Fatalf("after %s: a submit was taken", how)
		case c == codes.Unknown || c == codes.Internal:
			t.Fatalf("after %s: %v (code %v): want one that says the stream ended", how, err, c)
		case how == "CloseSend" && c != codes.FailedPrecondition:
			t.Fatalf("after CloseSend: %v, want FailedPrecondition", err)
		}
		for range st.Results() {
		}
	}
}
