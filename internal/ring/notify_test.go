package ring

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// TestNotifyRecord: a notify record round-trips, its blob is read back
// from the arena, and what does not fit is refused naming the field.
func TestNotifyRecord(t *testing.T) {
	blob, err := AppendNotify(nil, "r12", []byte("\x00b2bkeys note"))
	if err != nil {
		t.Fatal(err)
	}
	arena := make([]byte, 4096)
	copy(arena[100:], blob)
	rec := make([]byte, RecLen)
	Request{Tag: 9, Op: OpNotify, BlobOff: 100, BlobLen: uint32(len(blob))}.Encode(rec)
	r, err := Decode(rec)
	if err != nil || r.Op != OpNotify || !r.Arena || r.BlobOff != 100 || r.BlobLen != uint32(len(blob)) {
		t.Fatalf("decoded %+v, %v", r, err)
	}
	region, note, err := r.NotifyFromArena(arena)
	if err != nil || region != "r12" || string(note) != "\x00b2bkeys note" {
		t.Fatalf("from the arena: %q %q %v", region, note, err)
	}
	copy(arena[100:], bytes.Repeat([]byte{0xEE}, len(blob))) // the client reuses the space: the copy holds
	if string(note) != "\x00b2bkeys note" {
		t.Fatal("the note was not copied out of the arena")
	}
	for _, tc := range []struct {
		name string
		edit func([]byte)
		want string
	}{
		{"no arena flag", func(b []byte) { b[10] = 0 }, "flags 0x0 for op notify, want 1 (arena)"},
		{"reserved word", func(b []byte) { b[bodyOff+12] = 1 }, "ring notify reserved word is 1, want 0"},
		{"short blob", func(b []byte) { b[bodyOff+8], b[bodyOff+9] = 3, 0 }, "ring notify blob_len 3: want 4 to"},
		{"length", func(b []byte) { b[12] = 24 }, "ring record length 24 for op notify, want 16"},
	} {
		b := append([]byte(nil), rec...)
		tc.edit(b)
		if _, err := Decode(b); err == nil || !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want InvalidArgument %q", tc.name, err, tc.want)
		}
	}
	past := Request{Tag: 9, Op: OpNotify, BlobOff: 4090, BlobLen: 10}
	if _, _, err := past.NotifyFromArena(arena); err == nil || !strings.Contains(err.Error(), "ring notify blob_off 4090 + blob_len 10 ends past the arena of 4096 bytes") {
		t.Errorf("past the arena: %v", err)
	}
	for _, tc := range []struct {
		region string
		note   []byte
		want   string
	}{
		{"", []byte("x"), "region id is 0 bytes: want 1 to 1024"},
		{strings.Repeat("r", MaxTrigRegion+1), []byte("x"), "region id is 1025 bytes"},
		{"r1", nil, "notification is 0 bytes: want 1 to 4096"},
		{"r1", make([]byte, MaxNote+1), "notification is 4097 bytes"},
	} {
		if _, err := AppendNotify(nil, tc.region, tc.note); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("AppendNotify(%d-byte region, %d-byte note): %v; want %q", len(tc.region), len(tc.note), err, tc.want)
		}
	}
	for _, tc := range []struct {
		blob []byte
		want string
	}{
		{[]byte{1}, "blob is 1 bytes"},
		{[]byte{0, 0, 'x'}, "region id is 0 bytes"},
		{[]byte{2, 0, 'r', '1'}, "holds a 2-byte region id and no notification"},
	} {
		if _, _, err := DecodeNotify(tc.blob); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DecodeNotify(%x): %v; want %q", tc.blob, err, tc.want)
		}
	}
}

// FuzzDecodeNotify: any blob decodes to a region and a note within their
// limits that re-encode to the same blob, or is refused as InvalidArgument.
func FuzzDecodeNotify(f *testing.F) {
	for _, s := range []struct{ r, n string }{{"r1", "x"}, {"reg", strings.Repeat("n", MaxNote)}} {
		b, _ := AppendNotify(nil, s.r, []byte(s.n))
		f.Add(b)
	}
	f.Add([]byte{0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, blob []byte) {
		region, note, err := DecodeNotify(blob)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("error of no class: %v", err)
			}
			return
		}
		if len(region) == 0 || len(region) > MaxTrigRegion || len(note) == 0 || len(note) > MaxNote {
			t.Fatalf("accepted a %d-byte region and a %d-byte note", len(region), len(note))
		}
		again, err := AppendNotify(nil, region, note)
		if err != nil || !bytes.Equal(again, blob) {
			t.Fatalf("re-encodes to %x (%v), was %x", again, err, blob)
		}
	})
}
