package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

func sampleBatch() BatchOut {
	return BatchOut{Op: 1, Src: "r-1", Peer: "127.0.0.1:7000", Dst: "far", Transport: "local", Note: []byte("done"),
		BlockLength: 0, SrcOffsets: []uint64{0, 4096}, DstOffsets: []uint64{8192, 0}, Lengths: []uint64{128, 4096}}
}

func packed(v []uint64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], x)
	}
	return b
}

// TestBatchRoundTrip: what a client puts, the daemon decodes field for
// field, the descriptors packed as the RPC packs them.
func TestBatchRoundTrip(t *testing.T) {
	for _, o := range []BatchOut{sampleBatch(), {Src: "s", Peer: "p:1", Dst: "d", BlockLength: 128, SrcOffsets: []uint64{0}, DstOffsets: []uint64{0}}} {
		if err := o.Check(); err != nil {
			t.Fatal(err)
		}
		blob := make([]byte, o.Len())
		o.Put(blob)
		b, err := DecodeBatch(blob)
		if err != nil {
			t.Fatal(err)
		}
		if b.Op != o.Op || b.Src != o.Src || b.Peer != o.Peer || b.Dst != o.Dst || b.Transport != o.Transport || !bytes.Equal(b.Note, o.Note) ||
			b.BlockLength != o.BlockLength || !bytes.Equal(b.SrcOffsets, packed(o.SrcOffsets)) || !bytes.Equal(b.DstOffsets, packed(o.DstOffsets)) ||
			!bytes.Equal(b.Lengs, packed(o.Lengths)) {
			t.Fatalf("decoded %+v from %+v", b, o)
		}
		if len(o.Note) == 0 && b.Note != nil {
			t.Fatalf("no note put, note %q decoded", b.Note)
		}
	}
}

// TestBatchRefused: every malformed blob is refused with InvalidArgument
// and a message naming the field, the value and the limit.
func TestBatchRefused(t *testing.T) {
	o := sampleBatch()
	good := make([]byte, o.Len())
	o.Put(good)
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	le := binary.LittleEndian
	for _, tc := range []struct {
		name string
		blob []byte
		want []string
	}{
		{"short", good[:39], []string{"39 bytes", "40-byte header"}},
		{"reserved", mod(func(b []byte) []byte { le.PutUint32(b[36:], 7); return b }), []string{"reserved word 0x7"}},
		{"long src", mod(func(b []byte) []byte { le.PutUint16(b[4:], MaxBatchString+1); return b }), []string{"src_region_id is 1025 bytes", "limit of 1024"}},
		{"long transport", mod(func(b []byte) []byte { le.PutUint16(b[10:], 60000); return b }), []string{"transport_name is 60000 bytes"}},
		{"long note", mod(func(b []byte) []byte { le.PutUint32(b[12:], MaxNote+1); return b }), []string{"notification is 4097 bytes", "limit of 4096"}},
		{"blob too long", append(append([]byte(nil), good...), 0), []string{"blob_len 118", "adds up to 117"}},
		{"blob too short", good[:len(good)-1], []string{"blob_len 116", "adds up to 117"}},
		{"arrays past the end", mod(func(b []byte) []byte { le.PutUint32(b[24:], 1<<31); return b }), []string{"adds up to"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeBatch(tc.blob)
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("error %v, want InvalidArgument", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q lacks %q", err, w)
				}
			}
		})
	}
	long := sampleBatch()
	long.Peer = strings.Repeat("p", MaxBatchString+1)
	if err := long.Check(); err == nil || !strings.Contains(err.Error(), "peer is 1025 bytes") {
		t.Fatalf("Check of a 1025-byte peer: %v", err)
	}
}

// TestBatchRecord: the record round-trips; without flag arena, with a
// wrong length or a blob_len under the header it is refused; its blob is
// bounds-checked against the arena and copied out of it.
func TestBatchRecord(t *testing.T) {
	o := sampleBatch()
	arena := make([]byte, 4096)
	o.Put(arena[100:])
	req := Request{Tag: 9, Op: OpBatch, BlobOff: 100, BlobLen: uint32(o.Len()), TimeoutMs: 250}
	rec := make([]byte, RecLen)
	req.Encode(rec)
	got, err := Decode(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Arena || got.BlobOff != 100 || got.BlobLen != uint32(o.Len()) || got.TimeoutMs != 250 || got.Tag != 9 {
		t.Fatalf("decoded %+v", got)
	}
	b, err := got.BatchFromArena(arena)
	if err != nil {
		t.Fatal(err)
	}
	clear(arena) // the client reuses the space: the copy must not change
	if b.Src != "r-1" || !bytes.Equal(b.SrcOffsets, packed(o.SrcOffsets)) || string(b.Note) != "done" {
		t.Fatalf("after the arena was cleared: %+v", b)
	}
	for _, tc := range []struct {
		name string
		edit func(b []byte)
		want string
	}{
		{"no arena flag", func(b []byte) { binary.LittleEndian.PutUint16(b[10:], 0) }, "want 1 (arena)"},
		{"length", func(b []byte) { binary.LittleEndian.PutUint32(b[12:], 24) }, "length 24 for op batch, want 16"},
		{"blob under header", func(b []byte) { binary.LittleEndian.PutUint32(b[bodyOff+8:], 39) }, "blob_len 39"},
		{"timeout", func(b []byte) { binary.LittleEndian.PutUint32(b[bodyOff+12:], MaxTimeoutMs+1) }, "timeout_ms 86400001"},
		{"byte past body", func(b []byte) { b[bodyOff+BatchBodyLen] = 1 }, "past the batch body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := append([]byte(nil), rec...)
			tc.edit(b)
			_, err := Decode(b)
			if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want InvalidArgument with %q", err, tc.want)
			}
		})
	}
	for _, r := range []Request{{BlobOff: 4000, BlobLen: 97}, {BlobOff: 1 << 62, BlobLen: 40}, {BlobOff: 4096, BlobLen: 40}} {
		if _, err := r.BatchFromArena(make([]byte, 4096)); !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), "past the arena of 4096") {
			t.Fatalf("blob at %d + %d: %v", r.BlobOff, r.BlobLen, err)
		}
	}
}

// FuzzDecodeBatch: any blob decodes without panic, or is refused with
// InvalidArgument; what decodes lays out to exactly the blob.
func FuzzDecodeBatch(f *testing.F) {
	o := sampleBatch()
	b := make([]byte, o.Len())
	o.Put(b)
	f.Add(b)
	f.Add(make([]byte, batchHdr))
	f.Fuzz(func(t *testing.T, blob []byte) {
		d, err := DecodeBatch(blob)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("error of no class: %v", err)
			}
			return
		}
		again := make([]byte, batchHdr, len(blob))
		copy(again, blob[:batchHdr])
		again = append(again, d.Src+d.Peer+d.Dst+d.Transport...)
		again = append(append(append(append(again, d.Note...), d.SrcOffsets...), d.DstOffsets...), d.Lengs...)
		if !bytes.Equal(again, blob) {
			t.Fatalf("decoded %+v lays out to %x, was %x", d, again, blob)
		}
	})
}
