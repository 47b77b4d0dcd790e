package batch

import (
	"context"
	"testing"
	"time"
)

// TestWaitOfAGoneCallerKeepsTheOutcome: a Wait whose caller already went
// away (its ctx done) while the transfer has ended does not take the
// outcome, which is reported once: the next Poll gets it.
func TestWaitOfAGoneCallerKeepsTheOutcome(t *testing.T) {
	tr := NewTransfers(64)
	defer tr.Close()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	// Wait's select chose at random between the two ready cases: 32 rounds
	// caught it with odds of 1 in 2^32 against.
	for i := range 32 {
		id, err := tr.Start(1, time.Minute, func(context.Context) (Result, error) { return Result{Blocks: 3}, nil })
		if err != nil {
			t.Fatal(err)
		}
		for running, _ := tr.Counts(); running > 0; running, _ = tr.Counts() {
			time.Sleep(time.Millisecond)
		}
		if _, err := tr.Wait(gone, 1, id, 0); err == nil {
			t.Fatalf("round %d: Wait with its caller gone answered, taking the outcome", i)
		}
		out, err := tr.Poll(1, []uint64{id})
		if err != nil {
			t.Fatalf("round %d: the outcome was lost: %v", i, err)
		}
		if out[0].State != Done || out[0].Result.Blocks != 3 {
			t.Fatalf("round %d: outcome %+v, want Done with 3 blocks", i, out[0])
		}
	}
}
