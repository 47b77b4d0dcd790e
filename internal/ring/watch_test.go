package ring

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// TestNoteRecords: a frame cut in records and put back together is the
// frame; each record says the frame's length and its offset.
func TestNoteRecords(t *testing.T) {
	for _, size := range []int{0, 1, MsgMax - 20, MsgMax, 1000, MaxNote} {
		note := bytes.Repeat([]byte{7}, size)
		for i := range note {
			note[i] = byte(i * 13)
		}
		frame := AppendNoteFrame(nil, NoteFrame{Sender: "node-b", Region: "wbox", Dropped: 3, Note: note})
		recs := NoteRecords(nil, 9, frame, 4, 5)
		var got []byte
		for i, c := range recs {
			b := make([]byte, CompLen)
			c.Encode(b)
			d, err := DecodeCompletion(b)
			if err != nil || d.Tag != 9 || d.Code != CodeNote || d.Wire != int64(len(frame)) || d.Total != int64(len(got)) || d.Blocks != 4 || d.Bytes != 5 {
				t.Fatalf("size %d, record %d: %+v, %v", size, i, d, err)
			}
			got = append(got, d.Msg...)
		}
		n, err := DecodeNoteFrame(got)
		if err != nil || n.Sender != "node-b" || n.Region != "wbox" || n.Dropped != 3 || !bytes.Equal(n.Note, note) {
			t.Fatalf("size %d: %+v, %v", size, n, err)
		}
	}
	rec := make([]byte, RecLen)
	Request{Tag: 3, Op: OpWatch, BlobOff: 8, BlobLen: 4}.Encode(rec)
	r, err := Decode(rec)
	if err != nil || r.Op != OpWatch || !r.Arena {
		t.Fatalf("decoded %+v, %v", r, err)
	}
	arena := append(make([]byte, 8), "wbox"...)
	if id, err := r.WatchFromArena(arena); err != nil || id != "wbox" {
		t.Fatalf("region %q, %v", id, err)
	}
	Request{Tag: 3, Op: OpWatch, BlobOff: 8, BlobLen: 0}.Encode(rec)
	if _, err := Decode(rec); err == nil || !strings.Contains(err.Error(), "ring watch region id is 0 bytes: want 1 to 1024") {
		t.Fatalf("an empty region id: %v", err)
	}
	if _, err := (Request{Op: OpWatch, BlobOff: 10, BlobLen: 4}).WatchFromArena(arena); err == nil || !strings.Contains(err.Error(), "ends past the arena of 12 bytes") {
		t.Fatalf("past the arena: %v", err)
	}
}

// FuzzDecodeNoteFrame: any bytes decode to a frame that re-encodes to
// them, or are refused as InvalidArgument.
func FuzzDecodeNoteFrame(f *testing.F) {
	f.Add(AppendNoteFrame(nil, NoteFrame{Sender: "a", Region: "r", Dropped: 1, Note: []byte("x")}))
	f.Add([]byte{200, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := DecodeNoteFrame(b)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("error of no class: %v", err)
			}
			return
		}
		if again := AppendNoteFrame(nil, n); !bytes.Equal(again, b) {
			t.Fatalf("re-encodes to %x, was %x", again, b)
		}
	})
}
