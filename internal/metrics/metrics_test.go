package metrics

import (
	"encoding/binary"
	"testing"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

func TestSizeClass(t *testing.T) {
	for _, tc := range []struct {
		blocks, bytes uint64
		want          string
	}{
		{0, 0, SizeLE4KiB},
		{1, 128, SizeLE4KiB},
		{100, 409600, SizeLE4KiB},
		{100, 409700, SizeLE64KiB},
		{1, 64 << 10, SizeLE64KiB},
		{1, 64<<10 + 1, SizeLE1MiB},
		{2, 2 << 20, SizeLE1MiB},
		{1, 1<<20 + 1, SizeGT1MiB},
	} {
		if got := SizeClass(tc.blocks, tc.bytes); got != tc.want {
			t.Errorf("SizeClass(%d, %d) = %s, want %s", tc.blocks, tc.bytes, got, tc.want)
		}
	}
}

func TestTransportLabel(t *testing.T) {
	for k, want := range map[b2bv1.TransportKind]string{
		b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED: "auto",
		b2bv1.TransportKind_TRANSPORT_KIND_TCP:         "tcp",
		b2bv1.TransportKind_TRANSPORT_KIND_VERBS:       "verbs",
		b2bv1.TransportKind(99):                        "auto",
	} {
		if got := TransportLabel(k); got != want {
			t.Errorf("TransportLabel(%v) = %s, want %s", k, got, want)
		}
	}
}

func pack(v ...uint64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], x)
	}
	return b
}

func TestRequested(t *testing.T) {
	for _, tc := range []struct {
		name          string
		d             *b2bv1.Descriptors
		blocks, bytes uint64
	}{
		{"nil", nil, 0, 0},
		{"uniform", &b2bv1.Descriptors{SrcOffsets: pack(0, 8192, 16384), BlockLength: 4096}, 3, 12288},
		{"lengths", &b2bv1.Descriptors{SrcOffsets: pack(0, 100), Lengths: pack(100, 28)}, 2, 128},
		{"truncated", &b2bv1.Descriptors{SrcOffsets: pack(0, 100)[:12], Lengths: pack(100, 28)[:12]}, 1, 100},
	} {
		b, n := requested(tc.d)
		if b != tc.blocks || n != tc.bytes {
			t.Errorf("%s: requested = %d blocks, %d bytes; want %d, %d", tc.name, b, n, tc.blocks, tc.bytes)
		}
	}
}

// FuzzRequested: any descriptor bytes give len(src)/8 blocks and never panic.
func FuzzRequested(f *testing.F) {
	f.Add(pack(0, 1), pack(5, 6), uint64(0))
	f.Add([]byte{1, 2, 3}, []byte{}, uint64(4096))
	f.Fuzz(func(t *testing.T, src, lens []byte, bl uint64) {
		b, _ := requested(&b2bv1.Descriptors{SrcOffsets: src, Lengths: lens, BlockLength: bl})
		if b != uint64(len(src)/8) {
			t.Fatalf("blocks %d for %d source bytes", b, len(src))
		}
	})
}
