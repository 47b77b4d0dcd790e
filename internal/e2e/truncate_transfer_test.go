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
)

// A client that truncates (or replaces) its region's shm file while it is
// registered must cost only the batches that touch that region: the batch
// fails with DataLoss (or succeeds only if every byte really landed), the
// daemons live on, and other regions' batches verify byte for byte.

// truncCase is one way of taking a region's memory away.
type truncCase struct {
	name string
	// during: take it away while the batch runs (else before it starts,
	// which makes the fault certain).
	during bool
	size   uint64 // block size: < 4 KiB goes through the sender's staging copy
	n      int
	// unlink: remove the file and create a new one at the same path instead
	// of truncating: the daemon's mapping keeps the old file's pages.
	unlink bool
}

var truncCases = []truncCase{
	{name: "small blocks, before", size: 128, n: 20000},
	{name: "large blocks, before", size: 256 << 10, n: 64},
	{name: "small blocks, during", during: true, size: 128, n: 200000},
	{name: "large blocks, during", during: true, size: 256 << 10, n: 256},
	{name: "unlink and recreate, before", size: 4096, n: 4096, unlink: true},
}

// takeAway truncates path to 0 bytes, or unlinks it and creates an empty
// file at the same path.
func takeAway(path string, unlink bool) error {
	if !unlink {
		return os.Truncate(path, 0)
	}
	if err := os.Remove(path); err != nil {
		return err
	}
	return os.WriteFile(path, nil, 0o600)
}

func TestTruncateSourceDuringTransfer(t *testing.T) {
	testTruncate(t, true)
}

func TestTruncateDestinationDuringTransfer(t *testing.T) {
	testTruncate(t, false)
}

func testTruncate(t *testing.T, source bool) {
	a, b := startNode(t, "a"), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for ci, c := range truncCases {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(ci), 11))
			srcOff, srcSize := layout(c.n, c.size, r)
			dstOff, dstSize := layout(c.n, c.size, r)
			name := fmt.Sprintf("trunc%d", ci)
			src, dst := registerPair(ctx, t, a.c, b.c, srcSize, dstSize, name)
			// Remember what the source holds; after a truncation neither this
			// process nor the daemon can read it there again.
			want := make([]byte, len(src.Bytes))
			for i := range want {
				want[i] = byte(r.Uint32() | 1) // never 0: a block that did not land shows
			}
			copy(src.Bytes, want)
			victim, victimNode := dst, b
			if source {
				victim, victimNode = src, a
			}
			path := victim.GetShmPath()
			// Our own mapping of the victim would fault too: drop it.
			victimBytes := victim.Bytes
			if !c.unlink {
				victim.Unmap()
			}
			takenAway := make(chan error, 1)
			if c.during {
				go func() {
					for activeBatches(ctx, t, victimNode, victim.GetId()) == 0 && ctx.Err() == nil {
					}
					takenAway <- takeAway(path, c.unlink)
				}()
			} else {
				takenAway <- takeAway(path, c.unlink)
			}
			resp, terr := transfer(ctx, a.c, src.Id, b.d.PeerAddr(), name, srcOff, dstOff, c.size)
			if err := <-takenAway; err != nil {
				t.Fatal(err)
			}
			switch {
			case terr == nil:
				// Success must mean every byte landed: check them, where the
				// destination's memory can still be read.
				t.Logf("batch succeeded (%d bytes)", resp.GetBytes())
				if !source && !c.unlink && !c.during {
					t.Fatalf("batch into a truncated destination reported success")
				}
				if c.unlink || source {
					dstBytes := dst.Bytes
					if !source {
						dstBytes = victimBytes // the daemon's mapping is of the old file, as is ours
					}
					if i := badBlock(want, dstBytes, srcOff, dstOff, c.size); i >= 0 {
						t.Fatalf("batch reported success but block %d did not land", i)
					}
				}
			case status.Code(terr) == codes.DataLoss:
				t.Logf("batch failed as it should: %v", terr)
				region := src.Id
				if !source {
					region = name
				}
				msg := status.Convert(terr).Message()
				if !strings.Contains(msg, region) {
					t.Errorf("DataLoss message does not name the region %s: %s", region, msg)
				}
				// A fault is answered, not retried: at the receiver the
				// stream stays in step (the frame is drained and the batch
				// refused), and the sender does not retry its own fault.
				if strings.Contains(msg, "retry") {
					t.Errorf("the batch was retried after a fault (a stream fell out of step?): %s", msg)
				}
			default:
				t.Fatalf("batch: got %v (code %v), want DataLoss or a verified success", terr, status.Code(terr))
			}
			if c.unlink {
				if terr != nil {
					t.Fatalf("unlinked file: the daemon's mapping is intact, the batch should land: %v", terr)
				}
			} else if !c.during && terr == nil {
				t.Fatalf("memory taken away before the batch, yet it succeeded")
			}
			// The daemons live on, every pin is released, and a batch
			// between other regions verifies byte for byte.
			checkHealthy(ctx, t, a, b, r)
			waitIdle(ctx, t, a, src.Id)
			waitIdle(ctx, t, b, dst.Id)
			if victimBytes != nil && c.unlink {
				victim.Unmap()
			}
			release(ctx, t, a.c, src)
			release(ctx, t, b.c, dst)
		})
	}
}

// checkHealthy moves a fresh batch between fresh regions and verifies it.
func checkHealthy(ctx context.Context, t *testing.T, a, b *node, r *rand.Rand) {
	t.Helper()
	const n, size = 3000, 512
	srcOff, srcSize := layout(n, size, r)
	dstOff, dstSize := layout(n, size, r)
	src, dst := registerPair(ctx, t, a.c, b.c, srcSize, dstSize, "healthy")
	fill(src.Bytes, func(int) byte { return byte(r.Uint32()) })
	if _, err := transfer(ctx, a.c, src.Id, b.d.PeerAddr(), "healthy", srcOff, dstOff, size); err != nil {
		t.Fatalf("next batch between other regions: %v", err)
	}
	if i := badBlock(src.Bytes, dst.Bytes, srcOff, dstOff, size); i >= 0 {
		t.Fatalf("next batch between other regions: block %d differs", i)
	}
	release(ctx, t, a.c, src)
	release(ctx, t, b.c, dst)
}
