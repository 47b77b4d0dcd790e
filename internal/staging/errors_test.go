package staging

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/gpudirect/cudatest"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/memory"
)

// TestDomainError: each gpudirect error class becomes the gRPC code it had
// when gpudirect wrapped internal/errs itself, and the text is unchanged.
func TestDomainError(t *testing.T) {
	cudaErr := func(r gpudirect.Result) error {
		return gpudirect.CallError(&gpudirect.Error{Result: r}, 0, "cuTest")
	}
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"invalid value", cudaErr(gpudirect.ErrorInvalidValue), codes.InvalidArgument},
		{"invalid handle", cudaErr(gpudirect.ErrorInvalidHandle), codes.InvalidArgument},
		{"out of memory", cudaErr(gpudirect.ErrorOutOfMemory), codes.ResourceExhausted},
		{"not supported", cudaErr(gpudirect.ErrorNotSupported), codes.Unimplemented},
		{"not permitted", cudaErr(gpudirect.ErrorNotPermitted), codes.PermissionDenied},
		{"already registered", cudaErr(gpudirect.ErrorHostMemoryAlreadyRegistered), codes.AlreadyExists},
		{"not registered", cudaErr(gpudirect.ErrorHostMemoryNotRegistered), codes.NotFound},
		{"invalid context", cudaErr(gpudirect.ErrorInvalidContext), codes.FailedPrecondition},
		{"illegal address", cudaErr(gpudirect.ErrorIllegalAddress), codes.Unavailable},
		{"unknown result", cudaErr(12345), codes.Unavailable},
		{"closed", fmt.Errorf("x: %w", gpudirect.ErrClosed), codes.FailedPrecondition},
		{"stream destroyed", gpudirect.ErrStreamDestroyed, codes.FailedPrecondition},
		{"no driver", fmt.Errorf("no libcuda: %w", gpudirect.ErrNoDriver), codes.Unavailable},
		{"aborted", fmt.Errorf("%w: panicked", gpudirect.ErrAborted), codes.Aborted},
		{"joined", errors.Join(cudaErr(gpudirect.ErrorNoDevice), fmt.Errorf("%w: bad", gpudirect.ErrInvalidValue)), codes.InvalidArgument},
		{"not gpudirect", errors.New("plain"), codes.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DomainError(tt.err)
			if c := grpcstatus.Code(got); c != tt.want {
				t.Errorf("Code(%v) = %v, want %v", got, c, tt.want)
			}
			if got.Error() != tt.err.Error() {
				t.Errorf("text %q, want %q", got.Error(), tt.err.Error())
			}
			if !errors.Is(got, tt.err) {
				t.Errorf("%v no longer wraps the original", got)
			}
		})
	}
	if DomainError(nil) != nil {
		t.Fatal("DomainError(nil) != nil")
	}
}

// TestRegionsAdapter: the region hook gets memory.Memory and domain errors.
func TestRegionsAdapter(t *testing.T) {
	m := cudatest.New()
	defer m.Close()
	r := Regions{CUDA: m}
	mem, h, free, err := r.Alloc(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if mem.Kind != memory.CUDA || mem.Len != 1<<20 || mem.DmabufFD < 0 || len(h) != gpudirect.IPCHandleSize {
		t.Fatalf("Alloc = %+v", mem)
	}
	imp, release, err := r.Import(0, h, 4096, 100)
	if err != nil || imp.Addr == 0 || imp.Len != 100 {
		t.Fatalf("Import = %+v, %v", imp, err)
	}
	if _, _, err := r.Import(0, h[:10], 0, 1); grpcstatus.Code(err) != codes.InvalidArgument {
		t.Fatalf("Import(short handle) = %v (%v)", err, grpcstatus.Code(err))
	}
	m.FailNextResult("MemAlloc", gpudirect.ErrorOutOfMemory)
	if _, _, _, err := r.Alloc(0, 4096); grpcstatus.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Alloc(out of memory) = %v (%v)", err, grpcstatus.Code(err))
	}
	for _, f := range []func() error{release, release, free, free} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	if l := m.Leaks(); len(l) != 0 {
		t.Fatalf("leaks: %v", l)
	}
}
