package verbs

import (
	"errors"
	"os"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// Without a device (the build host, or a CGO_ENABLED=0 build) New reports
// ErrUnavailable rather than failing in some other way.
func TestNewUnavailable(t *testing.T) {
	if os.Getenv("B2B_RDMA_DEV") != "" {
		t.Skip("a device is present")
	}
	cfg := DefaultConfig()
	_, err := New(cfg, nil, nil)
	if !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("New without a device: %v, want ErrUnavailable", err)
	}
	cfg.Device = "no-such-device0"
	if _, err := New(cfg, nil, nil); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("New with a missing device: %v", err)
	}
	t.Logf("%v", err)
}

func TestNewBadConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.QPsPerPeer = 1000
	if _, err := New(cfg, nil, nil); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("got %v", err)
	}
}
