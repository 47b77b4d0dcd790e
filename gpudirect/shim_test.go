//go:build cgo && linux

package gpudirect

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

// TestCuErr checks the one conversion of the shim's return codes: 0 is nil,
// -CUresult names the call, the device and CUDA's error name and string,
// and an errno is told apart from a CUresult of the same number.
func TestCuErr(t *testing.T) {
	l, err := openLibcuda(buildFake(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := cuErr(l, 0, 0, "cuNothing"); err != nil {
		t.Fatalf("cuErr(0) = %v", err)
	}
	err = cuErr(l, 3, resultCode(ErrorOutOfMemory), "cuMemAlloc_v2(size=%d)", 42)
	if !errors.Is(err, ErrOutOfMemory) || ResultOf(err) != ErrorOutOfMemory ||
		!strings.HasPrefix(err.Error(), "gpudirect: cuMemAlloc_v2(size=42) on device 3: ") {
		t.Fatalf("cuErr(-CUDA_ERROR_OUT_OF_MEMORY) = %v", err)
	}
	t.Logf("CUresult: %v", err)
	err = cuErr(l, noDevice, resultCode(ErrorInvalidValue), "cuInit(0)")
	if !errors.Is(err, ErrInvalidValue) || strings.Contains(err.Error(), "on device") {
		t.Fatalf("cuErr(no device) = %v", err)
	}
	// errno 1 (EPERM) must not read as CUresult 1 (CUDA_ERROR_INVALID_VALUE).
	err = cuErr(l, 0, errnoCode(syscall.EPERM), "calloc")
	if !errors.Is(err, syscall.EPERM) || ResultOf(err) != Success || errors.Is(err, ErrInvalidValue) {
		t.Fatalf("cuErr(B2B_ERRNO(EPERM)) = %v", err)
	}
	if err := cuErr(l, 0, errnoCode(syscall.ENOMEM), "calloc"); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("cuErr(B2B_ERRNO(ENOMEM)) = %v", err)
	}
}
