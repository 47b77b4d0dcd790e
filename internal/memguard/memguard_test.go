package memguard

import (
	"errors"
	"os"
	"path/filepath"
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
	if err := Do(func() { b[size-1] = 1 }); err != nil {
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
			err := Do(tc.f)
			if !IsFault(err) || !errors.Is(err, errs.ErrDataLoss) {
				t.Fatalf("Do = %v, want a fault wrapping ErrDataLoss", err)
			}
		})
	}
	// Pages still inside the file stay usable.
	if err := Do(func() { b[100] = 1 }); err != nil {
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
	_ = Do(func() { panic("boom") })
	t.Fatal("Do swallowed a panic that was not a memory fault")
}

var sink byte

func BenchmarkDo(b *testing.B) {
	buf := make([]byte, 64)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = Do(func() { buf[i%64]++ })
	}
}
