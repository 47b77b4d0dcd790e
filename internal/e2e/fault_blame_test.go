package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestFaultNamesTheRegion: a batch whose source or destination memory was
// taken away (its file truncated) fails with DataLoss naming the region
// that faulted, and never the intact one, over every transport: the fault
// says which side it hit, the message does not guess.
func TestFaultNamesTheRegion(t *testing.T) {
	a, b := startNode(t, "a", autoTransport), startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const size, n = 4096, 256
	for ti, tr := range []b2bv1.TransportKind{b2bv1.TransportKind_TRANSPORT_KIND_TCP, b2bv1.TransportKind_TRANSPORT_KIND_LOCAL} {
		for _, source := range []bool{true, false} {
			side := "destination"
			if source {
				side = "source"
			}
			t.Run(fmt.Sprintf("%s/%s", tr, side), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(ti), 21))
				srcOff, srcSize := layout(n, size, r)
				dstOff, dstSize := layout(n, size, r)
				name := fmt.Sprintf("blame-%d-%s", ti, side)
				src, dst := registerPair(ctx, t, a.c, b.c, srcSize, dstSize, name)
				fill(src.Bytes, func(int) byte { return 1 })
				victim := dst
				if source {
					victim = src
				}
				victim.Unmap() // our own mapping would fault too
				if err := os.Truncate(victim.GetShmPath(), 0); err != nil {
					t.Fatal(err)
				}
				_, err := c2(ctx, a.c, src.Id, b.d.PeerAddr(), name, srcOff, dstOff, size, tr)
				if status.Code(err) != codes.DataLoss {
					t.Fatalf("batch with a truncated %s: %v, want DataLoss", side, err)
				}
				msg := status.Convert(err).Message()
				blamed, spared := fmt.Sprintf("dst_region %q", name), "src_region_id "+src.Id
				if source {
					blamed, spared = spared, blamed
				}
				if !strings.Contains(msg, blamed) {
					t.Errorf("the message does not name the faulted %s (%s): %s", side, blamed, msg)
				}
				if strings.Contains(msg, spared) {
					t.Errorf("the message blames the intact region (%s): %s", spared, msg)
				}
			})
		}
	}
}
