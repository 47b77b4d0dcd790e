package ring

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/notify"
)

// arec is an arena blocks record.
func arec(tag, handle, ms uint64, n uint32, idsOff, noteOff uint64, noteLen uint32) Request {
	return Request{Tag: tag, Op: OpBlocks, Handle: handle, TimeoutMs: ms, N: n, Arena: true, IDsOff: idsOff, NoteOff: noteOff, NoteLen: noteLen}
}

// TestArenaLimits: the limits are gRPC's own.
func TestArenaLimits(t *testing.T) {
	if MaxNote != batch.MaxNotification || MaxArenaIDs != layout.DefaultMaxIDs {
		t.Fatalf("MaxNote %d, MaxArenaIDs %d; gRPC's limits are %d and %d", MaxNote, MaxArenaIDs, batch.MaxNotification, layout.DefaultMaxIDs)
	}
	if need := uint64(8*MaxArenaIDs + MaxNote); need > MaxArena {
		t.Fatalf("the largest record takes %d bytes, over MaxArena %d", need, MaxArena)
	}
}

func TestArenaDecodeTable(t *testing.T) {
	good := func(r Request) []byte { b := make([]byte, RecLen); r.Encode(b); return b }
	with := func(b []byte, f func([]byte)) []byte { f(b); return b }
	le := binary.LittleEndian
	for _, tc := range []struct {
		name string
		rec  []byte
		want Request
		msg  string // "" = accepted
	}{
		{"ids", good(arec(3, 9, 0, 513, 64, 0, 0)), arec(3, 9, 0, 513, 64, 0, 0), ""},
		{"ids and note", good(arec(3, 9, 70, 1, 8, 16, 4096)), arec(3, 9, 70, 1, 8, 16, 4096), ""},
		{"max ids", good(arec(3, 9, 0, MaxArenaIDs, 0, 0, 0)), arec(3, 9, 0, MaxArenaIDs, 0, 0, 0), ""},
		{"count 0", good(arec(3, 9, 0, 0, 0, 0, 0)), Request{}, "count 0: want 1 to 16777216 id pairs (0 only with a note"},
		{"a note alone", good(arec(3, 9, 0, 0, 0, 0, 5)), arec(3, 9, 0, 0, 0, 0, 5), ""},
		{"count past the limit", good(arec(3, 9, 0, MaxArenaIDs+1, 0, 0, 0)), Request{}, "count 16777217: want 1 to 16777216"},
		{"count 2^32-1", good(arec(3, 9, 0, 1<<32-1, 0, 0, 0)), Request{}, "count 4294967295"},
		{"note past the limit", good(arec(3, 9, 0, 1, 0, 8, MaxNote+1)), Request{}, "note_len 4097: want 0 to 4096"},
		{"handle 0", good(arec(3, 0, 0, 1, 0, 0, 0)), Request{}, "route handle is 0"},
		{"deadline", good(arec(3, 9, MaxTimeoutMs+1, 1, 0, 0, 0)), Request{}, "timeout_ms 86400001"},
		{"reserved", with(good(arec(3, 9, 0, 1, 0, 0, 0)), func(b []byte) { b[bodyOff+36] = 1 }), Request{}, "reserved word 0x1"},
		{"length", with(good(arec(3, 9, 0, 1, 0, 0, 0)), func(b []byte) { le.PutUint32(b[12:], 48) }), Request{}, "length 48 for op blocks with flag arena, want 40"},
		{"junk past the body", with(good(arec(3, 9, 0, 1, 0, 0, 0)), func(b []byte) { b[60] = 2 }), Request{}, "byte 60 is 0x2 past the blocks body"},
		{"flag on submit", with(good(Request{Tag: 3, Op: OpSubmit, Handle: 2}), func(b []byte) { b[10] = 1 }), Request{}, "flags 0x1, want 0 (or, for op blocks, 1 (arena) or 3 (arena and note))"},
		{"flag 2", with(good(arec(3, 9, 0, 1, 0, 0, 0)), func(b []byte) { b[10] = 2 }), Request{}, "flags 0x2"},
		{"armed", good(armed(arec(3, 9, 70, 2, 8, 16, 5), 512, 20)), armed(arec(3, 9, 70, 2, 8, 16, 5), 512, 20), ""},
		{"armed trig_len short", good(armed(arec(3, 9, 0, 1, 0, 0, 0), 0, 5)), Request{}, "trig_len 5: want 6 to 1092"},
		{"armed trig_len long", good(armed(arec(3, 9, 0, 1, 0, 0, 0), 0, 1093)), Request{}, "trig_len 1093"},
		{"armed length", with(good(armed(arec(3, 9, 0, 1, 0, 0, 0), 0, 8)), func(b []byte) { le.PutUint32(b[12:], 40) }), Request{}, "length 40 for op blocks with flags arena and note, want 48"},
	} {
		got, err := Decode(tc.rec)
		if tc.msg == "" {
			if err != nil || got != tc.want {
				t.Errorf("%s: Decode = %+v, %v; want %+v", tc.name, got, err, tc.want)
			}
			continue
		}
		if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.msg) || got.Tag != 3 {
			t.Errorf("%s: Decode = %+v, %v; want InvalidArgument with %q", tc.name, got, err, tc.msg)
		}
	}
}

// armed makes r, an arena blocks record, wait for a key note whose trigger
// is n bytes at off of the arena.
func armed(r Request, off uint64, n uint32) Request {
	r.Armed, r.TrigOff, r.TrigLen = true, off, n
	return r
}

// TestTriggerFromArena: the trigger is bounds-checked, well formed and a copy.
func TestTriggerFromArena(t *testing.T) {
	if MaxTrigKey != notify.MaxKeyLen {
		t.Fatalf("MaxTrigKey %d, notify.MaxKeyLen %d", MaxTrigKey, notify.MaxKeyLen)
	}
	arena := make([]byte, 4096)
	trig := AppendTrigger(nil, "r-17", []byte("key"))
	copy(arena[100:], trig)
	n := uint32(len(trig))
	for _, tc := range []struct {
		name string
		r    Request
		edit func([]byte)
		msg  string
	}{
		{"good", armed(Request{}, 100, n), nil, ""},
		{"past the arena", armed(Request{}, 4090, n), nil, "trig_off 4090 + trig_len 11 ends past the arena of 4096 bytes"},
		{"offset 2^64-1", armed(Request{}, 1<<64-1, n), nil, "ends past the arena"},
		{"length disagrees", armed(Request{}, 100, n+1), nil, "trig_len 12, but its region id (4) and key (3) take 11"},
		{"reserved", armed(Request{}, 100, n), func(a []byte) { a[103] = 1 }, "reserved byte 0x1"},
		{"no region", armed(Request{}, 100, n), func(a []byte) { a[100] = 0 }, "region id of 0 bytes"},
		{"no key", armed(Request{}, 100, n), func(a []byte) { a[102] = 0 }, "key of 0 bytes"},
		{"key too long", armed(Request{}, 100, n), func(a []byte) { a[102] = 65 }, "key of 65 bytes"},
	} {
		a := append([]byte(nil), arena...)
		if tc.edit != nil {
			tc.edit(a)
		}
		region, key, err := tc.r.TriggerFromArena(a)
		if tc.msg == "" {
			if err != nil || region != "r-17" || string(key) != "key" {
				t.Errorf("%s: %q %q %v", tc.name, region, key, err)
			}
			a[110] = 'X' // the client writes again: the key is a copy
			if string(key) != "key" {
				t.Errorf("%s: the key aliases the arena", tc.name)
			}
			continue
		}
		if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err %v, want InvalidArgument with %q", tc.name, err, tc.msg)
		}
	}
}

// TestFromArena: offsets and lengths are checked in 64 bits against the
// arena; what is copied out is a copy.
func TestFromArena(t *testing.T) {
	arena := make([]byte, 4096)
	le := binary.LittleEndian
	for i := range 4 {
		le.PutUint32(arena[100+4*i:], uint32(10+i))
	}
	copy(arena[200:], "note")
	for _, tc := range []struct {
		name string
		r    Request
		msg  string
	}{
		{"ids past the end", arec(1, 1, 0, 2, 4090, 0, 0), "ids_off 4090 + 16 bytes of ids (count 2) ends past the arena of 4096 bytes"},
		{"ids offset huge", arec(1, 1, 0, 2, 1<<64-8, 0, 0), "ids_off 18446744073709551608"},
		{"ids offset at the end", arec(1, 1, 0, 1, 4096, 0, 0), "ids_off 4096 + 8 bytes"},
		{"note past the end", arec(1, 1, 0, 1, 0, 4095, 2), "note_off 4095 + note_len 2 ends past the arena of 4096 bytes"},
		{"note offset huge", arec(1, 1, 0, 1, 0, 1<<64-1, 1), "note_off 18446744073709551615"},
		{"max ids in a small arena", arec(1, 1, 0, MaxArenaIDs, 0, 0, 0), "count 16777216"},
	} {
		if _, _, _, err := tc.r.FromArena(arena); !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want InvalidArgument with %q", tc.name, err, tc.msg)
		}
	}
	l, r, note, err := arec(1, 1, 0, 2, 100, 200, 4).FromArena(arena)
	if err != nil || string(l) != string(arena[100:108]) || string(r) != string(arena[108:116]) || string(note) != "note" {
		t.Fatalf("FromArena = %x %x %q, %v", l, r, note, err)
	}
	clear(arena)
	if le.Uint32(l) != 10 || le.Uint32(r[4:]) != 13 || string(note) != "note" {
		t.Fatal("the copy changed with the arena")
	}
	if _, _, note, _ := arec(1, 1, 0, 1, 0, 4096, 0).FromArena(arena); note != nil {
		t.Fatalf("no note: %q", note)
	}
}

func TestHelloSizes(t *testing.T) {
	for _, tc := range []struct {
		tag, h uint64
		sq, cq uint32
		arena  uint64
		msg    string
	}{
		{HelloArena, 0, DefaultEntries, DefaultEntries, DefaultArena, ""},
		{HelloArena, HelloSizes(16, 4096, MaxArena), 16, 4096, MaxArena, ""},
		{HelloArena, HelloSizes(16, 32, 8192), 16, 32, 8192, ""},
		{HelloArena, HelloSizes(16, 32, MaxArena+ArenaUnit), 0, 0, 0, "ring arena bytes 201330688: want a multiple of 4096 from 4096 to 201326592"},
		{HelloArena, 0xffff << 16, 0, 0, 0, "ring arena bytes 268431360"},
		{HelloArena, HelloSizes(3, 4, 0), 0, 0, 0, "submission entries 3"},
		{HelloArena, HelloSizes(4, 8192, 0), 0, 0, 0, "completion entries 8192"},
		{HelloArena, 1 << 50, 0, 0, 0, "bits 48-63"},
		// An older client's Hello: sq low, cq high, no arena.
		{Hello, 0, DefaultEntries, DefaultEntries, 0, ""},
		{Hello, 8 | 8<<32, 8, 8, 0, ""},
		{Hello, 1<<16 | 8<<32, 0, 0, 0, "submission entries 65536"},
	} {
		sq, cq, a, err := ParseHello(tc.tag, tc.h)
		if tc.msg == "" {
			if err != nil || sq != tc.sq || cq != tc.cq || a != tc.arena {
				t.Errorf("%#x %#x: %d %d %d, %v", tc.tag, tc.h, sq, cq, a, err)
			}
		} else if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%#x %#x: %v, want %q", tc.tag, tc.h, err, tc.msg)
		}
	}
	for _, n := range []uint64{100, ArenaUnit + 1, MaxArena + ArenaUnit} {
		if _, _, err := Create(4, 4, n); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("Create arena %d: %v", n, err)
		}
	}
	// A ring without an arena maps as before.
	fd, r, err := Create(4, 4, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := Map(fd)
	if err != nil || len(c.Arena) != 0 || len(r.mem) != Size(4, 4, 0) {
		t.Fatalf("Map of a ring without an arena: %v, %d arena bytes", err, len(c.Arena))
	}
	c.Close()
}

// FuzzArenaDecode: a hostile record and arena size never make the daemon
// read outside the arena or panic; what is accepted lies inside it.
func FuzzArenaDecode(f *testing.F) {
	for _, r := range []Request{arec(1, 2, 0, 5, 0, 40, 3), arec(1, 2, 9, MaxArenaIDs, 1<<63, 1<<64-1, MaxNote), arec(1, 2, 0, 1, 4088, 4096, 0)} {
		b := make([]byte, RecLen)
		r.Encode(b)
		f.Add(b, uint16(1))
	}
	for _, r := range []Request{armed(arec(1, 2, 0, 1, 0, 8, 0), 16, 11), armed(arec(1, 2, 0, 1, 0, 8, 0), 1<<64-8, 1092)} {
		b := make([]byte, RecLen)
		r.Encode(b)
		f.Add(b, uint16(1))
	}
	f.Fuzz(func(t *testing.T, b []byte, units uint16) {
		r, err := Decode(b)
		if err != nil || !r.Arena {
			return
		}
		arena := make([]byte, int(units%64)*512)
		if r.Armed {
			for i := range arena {
				arena[i] = byte(i * 7)
			}
			region, key, err := r.TriggerFromArena(arena)
			if err == nil && (r.TrigOff+uint64(r.TrigLen) > uint64(len(arena)) || len(region) == 0 || len(key) == 0 || len(key) > MaxTrigKey) {
				t.Fatalf("%+v: trigger %q %q accepted in an arena of %d", r, region, key, len(arena))
			}
			if err != nil && !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("error of no class: %v", err)
			}
		}
		l, rm, note, err := r.FromArena(arena)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("error of no class: %v", err)
			}
			return
		}
		if r.IDsOff+8*uint64(r.N) > uint64(len(arena)) || r.NoteOff+uint64(r.NoteLen) > uint64(len(arena)) {
			t.Fatalf("%+v accepted in an arena of %d", r, len(arena))
		}
		if len(l) != 4*int(r.N) || len(rm) != 4*int(r.N) || len(note) != int(r.NoteLen) {
			t.Fatalf("%+v: %d %d %d bytes", r, len(l), len(rm), len(note))
		}
	})
}
