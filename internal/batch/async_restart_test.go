package batch

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

// TestTransferIDsOfAnotherIncarnation: a client that started a transfer on
// a daemon that was then restarted still holds that id, and asks the new
// daemon about it (its channel reconnects to the same socket, and a client
// is its pid there). The new daemon must answer NotFound, not report the
// outcome of another transfer that happens to have the same id: before,
// ids counted from 1 in every daemon, so the dead daemon's transfer 1 was
// reported done with the result of the new daemon's transfer 1.
func TestTransferIDsOfAnotherIncarnation(t *testing.T) {
	const client = 4242 // the same process before and after the restart
	ok := func(context.Context) (Result, error) { return Result{Blocks: 1}, nil }
	for _, tc := range []struct {
		name   string
		before int // transfers the client started on the old daemon
		after  int // and then on the new one
	}{
		{"one each", 1, 1},
		{"more after", 1, 8},
		{"more before", 8, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := NewTransfers(64)
			var stale []uint64
			for range tc.before {
				id, err := old.Start(client, time.Minute, ok)
				if err != nil {
					t.Fatal(err)
				}
				stale = append(stale, id)
			}
			old.Close() // the daemon went away (kill -9: its table is simply gone)

			fresh := NewTransfers(64)
			defer fresh.Close()
			for range tc.after {
				if _, err := fresh.Start(client, time.Minute, ok); err != nil {
					t.Fatal(err)
				}
			}
			for _, id := range stale {
				out, err := fresh.Wait(context.Background(), client, id, time.Second)
				if !errors.Is(err, errs.ErrNotFound) {
					t.Fatalf("Wait(%d), an id of the old daemon, on the new one = %+v, %v; want NotFound", id, out, err)
				}
			}
		})
	}
}
