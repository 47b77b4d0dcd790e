package memguard

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
)

// TestTruncatedMapping maps a file, truncates it, and reads and writes the
// vanished pages inside Do: the fault must come back as an error, not kill
// the test binary.
func TestTruncatedMapping(t *testing.T) {
	const size = 1 << 20
	path := filepath.Join(t.TempDir(), "region")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	if err := Do(Source, func() { b[size-1] = 1 }); err != nil {
		t.Fatalf("access before truncation: %v", err)
	}
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"read", func() { sink = b[size-1] }},
		{"write", func() { b[size/2] = 7 }},
		{"copy", func() { copy(b[8192:], make([]byte, 4096)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Do(Source, tc.f)
			if !IsFault(err) || !errors.Is(err, errs.ErrDataLoss) {
				t.Fatalf("Do = %v, want a fault wrapping ErrDataLoss", err)
			}
		})
	}
	// Pages still inside the file stay usable.
	if err := Do(Source, func() { b[100] = 1 }); err != nil {
		t.Fatalf("access inside the file after truncation: %v", err)
	}
}

// TestOtherPanicsPass: Do contains memory faults only.
func TestOtherPanicsPass(t *testing.T) {
	defer func() {
		if r := recover(); r != "boom" {
			t.Fatalf("recovered %v, want the original panic", r)
		}
	}()
	_ = Do(Source, func() { panic("boom") })
	t.Fatal("Do swallowed a panic that was not a memory fault")
}

var sink byte

func BenchmarkDo(b *testing.B) {
	buf := make([]byte, 64)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = Do(Source, func() { buf[i%64]++ })
	}
}

// mapTruncated maps a file of size bytes and truncates it to one page: only
// the first page stays readable.
func mapTruncated(t *testing.T, size int) []byte {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "region"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFaultSide: a fault carries the side that faulted, whoever reports
// it: Do the side its caller names, DoCopy the mapping the faulting
// address is in, Syscall the side of the memory the call touched.
func TestFaultSide(t *testing.T) {
	const size = 64 << 10
	truncated := mapTruncated(t, size)
	intact := make([]byte, size)
	for _, tc := range []struct {
		name string
		run  func() error
		want Side
	}{
		{"Do source", func() error { return Do(Source, func() { sink = truncated[size-1] }) }, Source},
		{"Do destination", func() error { return Do(Destination, func() { truncated[size-1] = 1 }) }, Destination},
		{"copy from a truncated source", func() error {
			return DoCopy(intact, truncated, func() { copy(intact, truncated) })
		}, Source},
		{"copy into a truncated destination", func() error {
			return DoCopy(truncated, intact, func() { copy(truncated, intact) })
		}, Destination},
		{"EFAULT on a write from the source", func() error { return Syscall(Source, "writev", syscall.EFAULT) }, Source},
		{"EFAULT on a read into the destination", func() error { return Syscall(Destination, "read", syscall.EFAULT) }, Destination},
		{"reported by the peer", func() error { return fmt.Errorf("refused: %w", At(Destination)) }, Destination},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if !IsFault(err) || !errors.Is(err, errs.ErrDataLoss) {
				t.Fatalf("%v: want a fault wrapping ErrDataLoss", err)
			}
			if got := SideOf(fmt.Errorf("wrapped: %w", err)); got != tc.want {
				t.Fatalf("SideOf(%v) = %v, want %v", err, got, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want.String()) {
				t.Errorf("the message does not say the %v: %v", tc.want, err)
			}
		})
	}
	if err := Syscall(Source, "writev", syscall.EPIPE); IsFault(err) || !errors.Is(err, syscall.EPIPE) {
		t.Errorf("Syscall(EPIPE) = %v, want EPIPE unlabelled", err)
	}
	if got := SideOf(errors.New("other")); got != Unknown {
		t.Errorf("SideOf(not a fault) = %v", got)
	}
}
