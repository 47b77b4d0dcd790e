//go:build !cgo || !linux

package dl

import (
	"errors"
	"testing"
)

func TestOpenUnsupported(t *testing.T) {
	l, err := Open("libc.so.6")
	if err == nil || !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Open = %v, %v; want ErrUnsupported", l, err)
	}
}
