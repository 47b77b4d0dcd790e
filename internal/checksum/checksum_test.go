package checksum

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
)

// TestBlocksTruncatedMapping: hashing a mapping whose file was truncated
// returns a fault, whichever worker goroutine hits the vanished pages,
// instead of killing the process; an intact mapping hashes as before.
func TestBlocksTruncatedMapping(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	const size = 16 << 20
	f, err := os.Create(filepath.Join(t.TempDir(), "region"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	const n = 4096
	off, lens := make([]uint64, n), make([]uint64, n)
	for i := range off {
		off[i], lens[i] = uint64(i)*4096, 4096
	}
	out := make([]uint64, n)
	for _, a := range []Algorithm{CRC32C, XXH64} {
		if err := Blocks(a, mem, off, lens, out); err != nil {
			t.Fatalf("intact mapping: %v", err)
		}
		if out[n-1] != Block(a, make([]byte, 4096)) {
			t.Fatalf("intact mapping: wrong digest")
		}
	}
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		off, lens []uint64
	}{
		{"one worker, one block", []uint64{size - 4096}, []uint64{4096}},
		{"parallel workers, only the last faults", off, lens},
		{"parallel workers, every one faults", off[1:], lens[1:]},
	}
	for _, tc := range cases {
		for _, a := range []Algorithm{CRC32C, XXH64} {
			err := Blocks(a, mem, tc.off, tc.lens, out[:len(tc.off)])
			if !errors.Is(err, memguard.ErrFault) || !errors.Is(err, errs.ErrDataLoss) {
				t.Fatalf("%s (alg %d): %v, want a fault wrapping ErrDataLoss", tc.name, a, err)
			}
		}
	}
}
