package client

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/ring"
)

// TestDialRingRefusesSizes: sizes the Hello frame cannot carry, or the
// daemon refuses, are refused before dialling, naming the size and the
// range; sizes in range go on to the dial (here a socket that is not
// there).
func TestDialRingRefusesSizes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none.sock")
	for _, tc := range []struct {
		o    RingOptions
		want string // "": passes the check
	}{
		{RingOptions{}, ""},
		{RingOptions{SubmitEntries: 2, CompleteEntries: ring.MaxEntries, ArenaBytes: ring.ArenaUnit}, ""},
		{RingOptions{ArenaBytes: ring.MaxArena}, ""},
		{RingOptions{SubmitEntries: 3}, "submission entries 3"},
		{RingOptions{SubmitEntries: 1 << 16}, "submission entries 65536"}, // 0 in the frame: the default
		{RingOptions{CompleteEntries: 8192}, "completion entries 8192"},
		{RingOptions{ArenaBytes: 100}, "arena bytes 100"},                   // 0 units: the default
		{RingOptions{ArenaBytes: ring.ArenaUnit + 100}, "arena bytes 4196"}, // rounded down
		{RingOptions{ArenaBytes: 300 << 20}, "arena bytes 314572800"},       // 16 bits of units: 44 MiB
	} {
		_, err := DialRingWith(path, tc.o)
		if tc.want == "" {
			if status.Code(err) == codes.InvalidArgument || err == nil || !strings.Contains(err.Error(), "dial submit socket") {
				t.Errorf("%+v: %v; want the dial's error", tc.o, err)
			}
			continue
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want InvalidArgument naming %q", tc.o, err, tc.want)
		}
	}
}
