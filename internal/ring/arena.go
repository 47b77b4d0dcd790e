package ring

import (
	"encoding/binary"
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
)

// The id arena: the last part of the memfd, after the completion ring,
// where a client writes the ids (and the notification) of block records
// too large for a record's body. The client writes the arena, then the
// record that points into it, then publishes; the daemon copies the ids
// and the note out when it takes the record (before its head passes the
// record), so the client may reuse that arena space once the submission
// head passed the record, and writes to it afterwards cannot change the
// transfer. Offsets are from the arena's start; the daemon checks them
// in 64 bits against the arena's size and refuses a record that points
// outside it, in that record's completion.
const (
	// FlagArena on an OpBlocks record: its ids are in the arena.
	FlagArena uint16 = 1
	// arenaBodyLen is an arena blocks body: handle, timeout_ms, count,
	// ids_off, note_off, note_len, reserved.
	arenaBodyLen = 40

	// FlagNote, with FlagArena on an OpBlocks record: the transfer waits in
	// the daemon for a key note (internal/notify, keys.go). The reserved
	// word is then trig_len u32, and the body goes on with trig_off u64:
	// at trig_off of the arena, region_len u16, key_len u8, reserved u8
	// (0), then the note region's id and the key.
	FlagNote uint16 = 2
	// armedBodyLen is an arena blocks body with FlagNote.
	armedBodyLen = 48
	trigHdr      = 4
	// MaxTrigRegion bounds a trigger's region id (a batch blob's names' limit).
	MaxTrigRegion = 1024
	// MaxTrigKey bounds a trigger's key (notify.MaxKeyLen, checked equal by a test).
	MaxTrigKey = 64

	// MaxArenaIDs bounds an arena record's id pairs: TransferBlocks' own
	// limit of ids per request (layout.DefaultMaxIDs).
	MaxArenaIDs = layout.DefaultMaxIDs
	// MaxNote bounds a record's notification: TransferBlocks' field's
	// limit (batch.MaxNotification, checked equal by a test).
	MaxNote = 4096

	// ArenaUnit: an arena's size is a multiple of it, 1 to MaxArena/ArenaUnit
	// units; the Hello frame asks in these units.
	ArenaUnit = 4096
	// DefaultArena is the arena of a Hello that asks for none.
	DefaultArena = 1 << 20
	// MaxArena bounds the arena: one record of MaxArenaIDs pairs
	// (128 MiB) and the largest notification fit, with room to spare.
	MaxArena = 192 << 20
)

// CheckArena refuses an arena size that is not a multiple of ArenaUnit
// from ArenaUnit to MaxArena.
func CheckArena(n uint64) error {
	if n < ArenaUnit || n > MaxArena || n%ArenaUnit != 0 {
		return fmt.Errorf("%w: ring arena bytes %d: want a multiple of %d from %d to %d", errs.ErrInvalidArgument, n, ArenaUnit, ArenaUnit, MaxArena)
	}
	return nil
}

// HelloArena is the tag of a Hello that asks for a ring with an id arena;
// a Hello tagged Hello (an older client) gets a ring without one, laid
// out as before. Either is answered with frames tagged Hello.
const HelloArena uint64 = 0x02676e6972623262 // "b2bring\x02"

// HelloSizes packs the sizes a HelloArena frame asks for into its handle
// field: submission entries in bits 0-15, the arena in ArenaUnits in bits
// 16-31, completion entries in bits 32-47 (0: the default of each).
func HelloSizes(sq, cq uint32, arena uint64) uint64 {
	return uint64(sq&0xffff) | (arena/ArenaUnit&0xffff)<<16 | uint64(cq&0xffff)<<32
}

// ParseHello reads the handle field of a Hello frame tagged tag and checks
// the sizes it asks for. Tagged Hello: submission entries in the low 32
// bits, completion entries in the high 32 (0: both default), no arena.
// Tagged HelloArena: see HelloSizes; bits 48-63 must be 0.
func ParseHello(tag, h uint64) (sq, cq uint32, arena uint64, err error) {
	if tag == Hello {
		sq, cq = uint32(h), uint32(h>>32)
		if h == 0 {
			sq, cq = DefaultEntries, DefaultEntries
		}
	} else {
		sq, cq, arena = uint32(h&0xffff), uint32(h>>32&0xffff), (h>>16&0xffff)*ArenaUnit
		if sq == 0 {
			sq = DefaultEntries
		}
		if cq == 0 {
			cq = DefaultEntries
		}
		if arena == 0 {
			arena = DefaultArena
		}
		if top := h >> 48; top != 0 {
			return 0, 0, 0, fmt.Errorf("%w: ring hello bits 48-63 are %#x, want 0", errs.ErrInvalidArgument, top)
		}
		if err := CheckArena(arena); err != nil {
			return 0, 0, 0, err
		}
	}
	if err := CheckEntries("submission entries", sq); err != nil {
		return 0, 0, 0, err
	}
	if err := CheckEntries("completion entries", cq); err != nil {
		return 0, 0, 0, err
	}
	return sq, cq, arena, nil
}

// decodeArena reads an arena blocks body (its length checked).
func decodeArena(rec []byte, r Request) (Request, error) {
	le := binary.LittleEndian
	b := rec[bodyOff:]
	r.Handle, r.TimeoutMs, r.N = le.Uint64(b), uint64(le.Uint32(b[8:])), le.Uint32(b[12:])
	r.IDsOff, r.NoteOff, r.NoteLen = le.Uint64(b[16:]), le.Uint64(b[24:]), le.Uint32(b[32:])
	if r.Armed {
		r.TrigLen, r.TrigOff = le.Uint32(b[36:]), le.Uint64(b[40:])
		if r.TrigLen < trigHdr+2 || r.TrigLen > trigHdr+MaxTrigRegion+MaxTrigKey {
			return r, fmt.Errorf("%w: ring blocks trig_len %d: want %d to %d bytes", errs.ErrInvalidArgument, r.TrigLen, trigHdr+2, trigHdr+MaxTrigRegion+MaxTrigKey)
		}
	}
	switch {
	case !r.Armed && le.Uint32(b[36:]) != 0:
		return r, fmt.Errorf("%w: ring blocks reserved word %#x, want 0", errs.ErrInvalidArgument, le.Uint32(b[36:]))
	case r.Handle == 0:
		return r, fmt.Errorf("%w: ring blocks route handle is 0, want a bound route's handle (BindBlockRoute)", errs.ErrInvalidArgument)
	case r.TimeoutMs > MaxTimeoutMs:
		return r, fmt.Errorf("%w: ring blocks timeout_ms %d: want 0 (none) or 1 to %d", errs.ErrInvalidArgument, r.TimeoutMs, MaxTimeoutMs)
	case (r.N == 0 && r.NoteLen == 0) || r.N > MaxArenaIDs:
		return r, fmt.Errorf("%w: ring blocks count %d: want 1 to %d id pairs (0 only with a note: the note alone)", errs.ErrInvalidArgument, r.N, MaxArenaIDs)
	case r.NoteLen > MaxNote:
		return r, fmt.Errorf("%w: ring blocks note_len %d: want 0 to %d bytes", errs.ErrInvalidArgument, r.NoteLen, MaxNote)
	}
	return r, nil
}

// FromArena copies r's ids and notification out of arena (a copy, so that
// the client's later writes cannot reach them), after checking that they
// lie inside it: local and remote ids packed as TransferBlocks takes them,
// note nil when r carries none.
func (r Request) FromArena(arena []byte) (local, remote, note []byte, err error) {
	size := uint64(len(arena))
	ids := 8 * uint64(r.N) // N is at most MaxArenaIDs: no overflow
	if r.IDsOff > size || ids > size-r.IDsOff {
		return nil, nil, nil, fmt.Errorf("%w: ring blocks ids_off %d + %d bytes of ids (count %d) ends past the arena of %d bytes",
			errs.ErrInvalidArgument, r.IDsOff, ids, r.N, size)
	}
	if n := uint64(r.NoteLen); r.NoteOff > size || n > size-r.NoteOff {
		return nil, nil, nil, fmt.Errorf("%w: ring blocks note_off %d + note_len %d ends past the arena of %d bytes",
			errs.ErrInvalidArgument, r.NoteOff, n, size)
	}
	b := make([]byte, ids+uint64(r.NoteLen))
	copy(b, arena[r.IDsOff:r.IDsOff+ids])
	if r.NoteLen > 0 {
		note = b[ids:]
		copy(note, arena[r.NoteOff:r.NoteOff+uint64(r.NoteLen)])
	}
	h := ids / 2
	return b[:h:h], b[h:ids:ids], note, nil
}

// TriggerFromArena copies the key-note trigger of an armed record (FlagNote)
// out of arena, after checking that it lies inside it and is well formed.
func (r Request) TriggerFromArena(arena []byte) (region string, key []byte, err error) {
	size, n := uint64(len(arena)), uint64(r.TrigLen)
	if r.TrigOff > size || n > size-r.TrigOff {
		return "", nil, fmt.Errorf("%w: ring blocks trig_off %d + trig_len %d ends past the arena of %d bytes", errs.ErrInvalidArgument, r.TrigOff, n, size)
	}
	b := make([]byte, n) // a copy: the client's later writes cannot reach it
	copy(b, arena[r.TrigOff:r.TrigOff+n])
	rl, kl := uint64(binary.LittleEndian.Uint16(b)), uint64(b[2])
	switch {
	case b[3] != 0:
		return "", nil, fmt.Errorf("%w: ring blocks trigger reserved byte %#x, want 0", errs.ErrInvalidArgument, b[3])
	case rl == 0 || rl > MaxTrigRegion:
		return "", nil, fmt.Errorf("%w: ring blocks trigger region id of %d bytes: want 1 to %d", errs.ErrInvalidArgument, rl, MaxTrigRegion)
	case kl == 0 || kl > MaxTrigKey:
		return "", nil, fmt.Errorf("%w: ring blocks trigger key of %d bytes: want 1 to %d", errs.ErrInvalidArgument, kl, MaxTrigKey)
	case trigHdr+rl+kl != n:
		return "", nil, fmt.Errorf("%w: ring blocks trig_len %d, but its region id (%d) and key (%d) take %d", errs.ErrInvalidArgument, n, rl, kl, trigHdr+rl+kl)
	}
	return string(b[trigHdr : trigHdr+rl]), b[trigHdr+rl:], nil
}

// AppendTrigger appends the arena bytes of a trigger on key notes of
// key to region to dst (clients; tests).
func AppendTrigger(dst []byte, region string, key []byte) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(region)))
	dst = append(dst, byte(len(key)), 0)
	return append(append(dst, region...), key...)
}
