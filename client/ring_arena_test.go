package client

import (
	"encoding/binary"
	"testing"

	"github.com/b2bd/b2bd/internal/ring"
)

// TestArenaPlace: payloads go in publish order, never wrap, and their
// space comes back only once the submission head passed their record.
func TestArenaPlace(t *testing.T) {
	a := arena{mem: make([]byte, 256)}
	p := func(k int, note string) *arenaPayload {
		l, r := make([]uint32, k), make([]uint32, k)
		for i := range l {
			l[i], r[i] = uint32(i+1), uint32(100+i)
		}
		return &arenaPayload{local: l, remote: r, note: []byte(note)}
	}
	var req ring.Request
	for _, tc := range []struct {
		k           int
		note        string
		rec, head   uint32
		ok          bool
		off, noteAt uint64
	}{
		{10, "hi", 0, 0, true, 0, 80}, // 82 bytes, 8-aligned: 0..88
		{10, "", 1, 0, true, 88, 168},
		{5, "", 2, 0, true, 168, 208},
		{7, "", 3, 0, false, 0, 0},   // would wrap, and 0..88 is record 0's, not taken
		{7, "", 3, 1, true, 0, 56},   // record 0 taken: at the start
		{30, "", 4, 3, false, 0, 0},  // record 3 (0..56) not taken
		{30, "", 4, 4, true, 0, 240}, // nothing live: from 0
		{33, "", 5, 5, false, 0, 0},  // 264 bytes: never fits
	} {
		ok := a.place(&req, p(tc.k, tc.note), tc.rec, tc.head)
		if ok != tc.ok || (ok && (req.IDsOff != tc.off || req.NoteOff != tc.noteAt || req.NoteLen != uint32(len(tc.note)))) {
			t.Fatalf("place %d ids at rec %d head %d: %v at %d/%d; want %v at %d/%d", tc.k, tc.rec, tc.head, ok, req.IDsOff, req.NoteOff, tc.ok, tc.off, tc.noteAt)
		}
		if ok && binary.LittleEndian.Uint32(a.mem[req.IDsOff+4*uint64(tc.k):]) != 100 {
			t.Fatalf("remote ids not after the local ones")
		}
	}
}
