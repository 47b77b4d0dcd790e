package client

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRingClosedIsUnavailable: an operation on a ring whose daemon went
// away (kill -9, restart) or that was closed fails with ErrRingClosed,
// which must carry a gRPC code as every failure does: Unavailable, as the
// Python client's ring answers and as a call to a dead daemon fails.
// Before, status.Code gave Unknown.
func TestRingClosedIsUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"bare", ErrRingClosed},
		{"wrapped", fmt.Errorf("b2b client: submit: %w", ErrRingClosed)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c := status.Code(tc.err); c != codes.Unavailable {
				t.Fatalf("status.Code(%v) = %v, want Unavailable", tc.err, c)
			}
			if !errors.Is(tc.err, ErrRingClosed) {
				t.Fatalf("errors.Is(%v, ErrRingClosed) = false", tc.err)
			}
			if got := status.Convert(tc.err).Message(); got != tc.err.Error() {
				t.Fatalf("message %q, want %q", got, tc.err.Error())
			}
		})
	}
}
