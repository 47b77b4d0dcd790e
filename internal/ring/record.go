// Package ring is the shared-memory control path: a submission ring and a
// completion ring in one sealed memfd, which the daemon creates and hands to
// one client over its Unix socket. Each direction has one producer and one
// consumer that meet at head/tail indices in the mapping; a consumer spins
// briefly, then sleeps on a futex, and a producer makes the wake syscall
// only when the consumer said it sleeps, so a busy ring costs no syscall per
// record.
//
// The daemon never trusts the mapping: it reads an index once, bounds-checks
// it, and copies a record out before decoding it (Decode).
package ring

import (
	"encoding/binary"
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
)

// Op is what a submission record asks for.
type Op uint16

const (
	OpPing   Op = 1 // answer at once: the floor of a round trip
	OpSubmit Op = 2 // run a prepared plan (Handle), like SubmitTransfer
	OpCancel Op = 3 // cancel the submit in flight under tag Target
	OpBlocks Op = 4 // block ids on a bound route (Handle), like TransferBlocks
	// OpBatch (batch.go) is a BatchTransfer with its request in the arena;
	// OpNotify (notify.go) is NotifyRegion, its note in the arena;
	// OpWatch (watch.go) is WatchNotifications, its notes as completions.
)

func (o Op) String() string {
	switch o {
	case OpPing:
		return "ping"
	case OpSubmit:
		return "submit"
	case OpCancel:
		return "cancel"
	case OpBlocks:
		return "blocks"
	case OpBatch:
		return "batch"
	case OpNotify:
		return "notify"
	case OpWatch:
		return "watch"
	}
	return fmt.Sprintf("op(%d)", uint16(o))
}

// Record sizes. A submission record is
//
//	tag u64, op u16, flags u16 (0), length u32 (the body's), body 48 bytes
//	(ping: none; submit: handle u64, patch u64, and optionally the
//	caller's deadline as timeout_ms u64 (length 24); cancel: target u64),
//	blocks: route handle u64, timeout_ms u32 (0: none), count u32, then
//	count (local id u32, remote id u32) pairs, count 1 to MaxInlineIDs:
//	length 16 + 8 × count; or, with flag FlagArena, the ids and an optional
//	notification in the arena: route handle u64, timeout_ms u32, count u32
//	(1 to MaxArenaIDs), ids_off u64, note_off u64, note_len u32 (0: no
//	notification; up to MaxNote), reserved u32 (0): length 40; at ids_off
//	the count local ids, then the count remote ids, little-endian u32; see
//	arena.go), the unused rest zero.
//
// A completion record is
//
//	tag u64, code u32 (a gRPC code; 0 = done), msg_len u32, blocks u64,
//	bytes u64, wire_ns u64, total_ns u64, msg MsgMax bytes, then, at
//	compTimes, three wall-clock times in Unix ns (0: not known): when an
//	armed transfer's trigger was seen, when its first write was posted and
//	when its last landed. A client older than the times reads only msg_len
//	bytes of message, and a daemon older than them wrote at most 208 bytes
//	of message there, so a client takes the times only from a success,
//	whose message is a transport's name. A success also carries, at
//	compExt (past the room a name takes), the figures a BatchTransfer
//	response has: magic u32 (extMagic), 0 u32, segments u64,
//	work_requests u64, and the validate, resolve, plan, post, notify and
//	armed phases in ns, u64 each; a client finds them by the magic.
const (
	RecLen    = 64
	CompLen   = 256
	compHdr   = 48
	compTimes = CompLen - 24
	MsgMax    = compTimes - compHdr
	// MsgReadMax is what a client reads: a daemon before the times wrote
	// messages of up to 208 bytes.
	MsgReadMax = CompLen - compHdr
	bodyOff    = 16
	// compExt is where a success's figures start; its name is at most
	// extNameMax bytes (else it carries none).
	compExt    = compHdr + extNameMax
	extNameMax = 64
	extLen     = 8 + 8*8
	extMagic   = 0x31534850 // "PHS1"
)

// truncMark ends a message cut to fit MsgMax.
const truncMark = "...[truncated]"

// bodyLen is each op's body length.
var bodyLen = map[Op]uint32{OpPing: 0, OpSubmit: 16, OpCancel: 8, OpBlocks: blocksHdr + 8, OpBatch: BatchBodyLen,
	OpNotify: NotifyBodyLen, OpWatch: NotifyBodyLen}

// submitDeadlineLen is a submit body that carries the caller's deadline.
const submitDeadlineLen = 24

// MaxInlineIDs is the most id pairs one blocks record carries; a larger
// request goes over gRPC (TransferBlocks).
const MaxInlineIDs = 4

// blocksHdr is a blocks body before its id pairs.
const blocksHdr = 16

// MaxTimeoutMs bounds a submit's caller deadline, as the gRPC metadata's
// (internal/callerdeadline) is bounded.
const MaxTimeoutMs = 24 * 3600 * 1000

// Request is a decoded submission record.
type Request struct {
	Tag    uint64
	Op     Op
	Handle uint64 // OpSubmit
	Patch  uint64 // OpSubmit: an offset patch; this daemon refuses non-zero
	// OpSubmit: the caller's deadline, ms from the daemon's reading of the
	// record (1 to MaxTimeoutMs); 0: none sent, the daemon's default.
	TimeoutMs uint64
	Target    uint64 // OpCancel
	// OpBlocks (Handle is the route's, TimeoutMs as a submit's): block
	// Local[i] of the route's local layout and block Remote[i] of its
	// remote one, for i < N (1 to MaxInlineIDs).
	N             uint32
	Local, Remote [MaxInlineIDs]uint32
	// OpBlocks with FlagArena: the N local ids, then the N remote ids, are
	// at IDsOff of the arena; the notification (NoteLen bytes, 0: none) at
	// NoteOff. Local and Remote are then unused.
	Arena           bool
	IDsOff, NoteOff uint64
	NoteLen         uint32
	// OpBlocks with FlagArena|FlagNote: the transfer waits for a key note;
	// its trigger (TriggerFromArena) is TrigLen bytes at TrigOff.
	Armed   bool
	TrigOff uint64
	TrigLen uint32
	// OpBatch (always with FlagArena; TimeoutMs as a submit's): its blob
	// of BlobLen bytes at BlobOff of the arena (BatchFromArena). OpNotify
	// (always with FlagArena): the same, read by NotifyFromArena.
	BlobOff uint64
	BlobLen uint32
}

// Encode writes r into rec (RecLen bytes), zeroing what r does not use.
func (r Request) Encode(rec []byte) {
	rec = rec[:RecLen]
	clear(rec)
	le := binary.LittleEndian
	le.PutUint64(rec[0:], r.Tag)
	le.PutUint16(rec[8:], uint16(r.Op))
	n := bodyLen[r.Op]
	if r.Op == OpSubmit && r.TimeoutMs != 0 {
		n = submitDeadlineLen
		le.PutUint64(rec[bodyOff+16:], r.TimeoutMs)
	}
	if r.Op == OpBatch || r.Op == OpNotify || r.Op == OpWatch {
		le.PutUint16(rec[10:], FlagArena)
		le.PutUint64(rec[bodyOff:], r.BlobOff)
		le.PutUint32(rec[bodyOff+8:], r.BlobLen)
		if r.Op == OpBatch {
			le.PutUint32(rec[bodyOff+12:], uint32(r.TimeoutMs))
		}
	}
	if r.Op == OpBlocks && r.Arena {
		n = arenaBodyLen
		le.PutUint16(rec[10:], FlagArena)
		if r.Armed {
			n = armedBodyLen
			le.PutUint16(rec[10:], FlagArena|FlagNote)
			le.PutUint32(rec[bodyOff+36:], r.TrigLen)
			le.PutUint64(rec[bodyOff+40:], r.TrigOff)
		}
		le.PutUint64(rec[bodyOff:], r.Handle)
		le.PutUint32(rec[bodyOff+8:], uint32(r.TimeoutMs))
		le.PutUint32(rec[bodyOff+12:], r.N)
		le.PutUint64(rec[bodyOff+16:], r.IDsOff)
		le.PutUint64(rec[bodyOff+24:], r.NoteOff)
		le.PutUint32(rec[bodyOff+32:], r.NoteLen)
	} else if r.Op == OpBlocks {
		k := min(r.N, MaxInlineIDs)
		n = blocksHdr + 8*k
		le.PutUint64(rec[bodyOff:], r.Handle)
		le.PutUint32(rec[bodyOff+8:], uint32(r.TimeoutMs))
		le.PutUint32(rec[bodyOff+12:], r.N)
		for i := range k {
			le.PutUint32(rec[bodyOff+blocksHdr+8*int(i):], r.Local[i])
			le.PutUint32(rec[bodyOff+blocksHdr+8*int(i)+4:], r.Remote[i])
		}
	}
	le.PutUint32(rec[12:], n)
	switch r.Op {
	case OpSubmit:
		le.PutUint64(rec[bodyOff:], r.Handle)
		le.PutUint64(rec[bodyOff+8:], r.Patch)
	case OpCancel:
		le.PutUint64(rec[bodyOff:], r.Target)
	}
}

// Decode checks a submission record the daemon has copied out of the ring.
// The returned Request carries the record's tag even on error, so that the
// refusal can be answered under it.
func Decode(rec []byte) (Request, error) {
	if len(rec) != RecLen {
		return Request{}, fmt.Errorf("%w: ring record is %d bytes, want %d", errs.ErrInvalidArgument, len(rec), RecLen)
	}
	le := binary.LittleEndian
	r := Request{Tag: le.Uint64(rec[0:]), Op: Op(le.Uint16(rec[8:]))}
	flags, n := le.Uint16(rec[10:]), le.Uint32(rec[12:])
	want, known := bodyLen[r.Op]
	if r.Op == OpBlocks && flags == FlagArena {
		want, flags, r.Arena = arenaBodyLen, 0, true
	}
	if r.Op == OpBlocks && flags == FlagArena|FlagNote {
		want, flags, r.Arena, r.Armed = armedBodyLen, 0, true, true
	}
	if r.Op == OpBatch || r.Op == OpNotify || r.Op == OpWatch {
		if flags != FlagArena {
			return r, fmt.Errorf("%w: ring record flags %#x for op %s, want 1 (arena): its request is always in the arena", errs.ErrInvalidArgument, flags, r.Op)
		}
		flags, r.Arena = 0, true
	}
	if r.Op == OpSubmit && n == submitDeadlineLen {
		want = n
	}
	if r.Op == OpBlocks && !r.Arena && n >= blocksHdr+8 && n <= blocksHdr+8*MaxInlineIDs && (n-blocksHdr)%8 == 0 {
		want = n
	}
	switch {
	case r.Tag == 0:
		return r, fmt.Errorf("%w: ring record tag is 0, want non-zero", errs.ErrInvalidArgument)
	case !known:
		return r, fmt.Errorf("%w: ring record op %d unknown, want 1 (ping), 2 (submit), 3 (cancel), 4 (blocks), 5 (batch), 6 (notify) or 7 (watch)", errs.ErrInvalidArgument, uint16(r.Op))
	case flags != 0:
		return r, fmt.Errorf("%w: ring record flags %#x, want 0 (or, for op blocks, 1 (arena) or 3 (arena and note))", errs.ErrInvalidArgument, le.Uint16(rec[10:]))
	case n != want:
		if r.Op == OpBatch || r.Op == OpNotify || r.Op == OpWatch {
			return r, fmt.Errorf("%w: ring record length %d for op %s, want %d", errs.ErrInvalidArgument, n, r.Op, want)
		}
		if r.Armed {
			return r, fmt.Errorf("%w: ring record length %d for op blocks with flags arena and note, want %d", errs.ErrInvalidArgument, n, armedBodyLen)
		}
		if r.Arena {
			return r, fmt.Errorf("%w: ring record length %d for op blocks with flag arena, want %d", errs.ErrInvalidArgument, n, arenaBodyLen)
		}
		if r.Op == OpBlocks {
			return r, fmt.Errorf("%w: ring record length %d for op blocks, want 16 + 8 per id pair (1 to %d pairs): 24 to %d", errs.ErrInvalidArgument, n, MaxInlineIDs, blocksHdr+8*MaxInlineIDs)
		}
		if r.Op == OpSubmit {
			return r, fmt.Errorf("%w: ring record length %d for op %s, want %d or %d (with a deadline)", errs.ErrInvalidArgument, n, r.Op, want, submitDeadlineLen)
		}
		return r, fmt.Errorf("%w: ring record length %d for op %s, want %d", errs.ErrInvalidArgument, n, r.Op, want)
	}
	for i, b := range rec[bodyOff+int(n):] {
		if b != 0 {
			return r, fmt.Errorf("%w: ring record byte %d is %#x past the %s body, want 0", errs.ErrInvalidArgument, bodyOff+int(n)+i, b, r.Op)
		}
	}
	switch r.Op {
	case OpSubmit:
		r.Handle, r.Patch = le.Uint64(rec[bodyOff:]), le.Uint64(rec[bodyOff+8:])
		if r.Handle == 0 {
			return r, fmt.Errorf("%w: ring submit handle is 0, want a prepared plan's handle", errs.ErrInvalidArgument)
		}
		if n == submitDeadlineLen {
			r.TimeoutMs = le.Uint64(rec[bodyOff+16:])
			if r.TimeoutMs == 0 || r.TimeoutMs > MaxTimeoutMs {
				return r, fmt.Errorf("%w: ring submit timeout_ms %d: want 1 to %d", errs.ErrInvalidArgument, r.TimeoutMs, MaxTimeoutMs)
			}
		}
		if r.Patch != 0 {
			return r, fmt.Errorf("%w: ring submit offset patch %d: this daemon supports only 0", errs.ErrUnimplemented, r.Patch)
		}
	case OpBatch:
		return decodeBatchBody(rec, r)
	case OpNotify:
		return decodeNotifyBody(rec, r)
	case OpWatch:
		return decodeWatchBody(rec, r)
	case OpBlocks:
		if r.Arena {
			return decodeArena(rec, r)
		}
		return decodeBlocks(rec, r, n)
	case OpCancel:
		r.Target = le.Uint64(rec[bodyOff:])
		if r.Target == 0 {
			return r, fmt.Errorf("%w: ring cancel target tag is 0, want non-zero", errs.ErrInvalidArgument)
		}
	}
	return r, nil
}

// decodeBlocks reads a blocks body of n bytes, its length checked.
func decodeBlocks(rec []byte, r Request, n uint32) (Request, error) {
	le := binary.LittleEndian
	r.Handle, r.TimeoutMs, r.N = le.Uint64(rec[bodyOff:]), uint64(le.Uint32(rec[bodyOff+8:])), le.Uint32(rec[bodyOff+12:])
	if r.N != (n-blocksHdr)/8 {
		return r, fmt.Errorf("%w: ring blocks count %d in a body of %d bytes, want %d", errs.ErrInvalidArgument, r.N, n, (n-blocksHdr)/8)
	}
	if r.Handle == 0 {
		return r, fmt.Errorf("%w: ring blocks route handle is 0, want a bound route's handle (BindBlockRoute)", errs.ErrInvalidArgument)
	}
	if r.TimeoutMs > MaxTimeoutMs {
		return r, fmt.Errorf("%w: ring blocks timeout_ms %d: want 0 (none) or 1 to %d", errs.ErrInvalidArgument, r.TimeoutMs, MaxTimeoutMs)
	}
	for i := range r.N {
		off := bodyOff + blocksHdr + 8*int(i)
		r.Local[i], r.Remote[i] = le.Uint32(rec[off:]), le.Uint32(rec[off+4:])
	}
	return r, nil
}

// PackedIDs is r's id pairs as TransferBlocks takes them: local ids, then
// remote ids, each packed little-endian uint32, in one allocation.
func (r Request) PackedIDs() (local, remote []byte) {
	k := int(min(r.N, MaxInlineIDs))
	b := make([]byte, 8*k)
	for i := range k {
		binary.LittleEndian.PutUint32(b[4*i:], r.Local[i])
		binary.LittleEndian.PutUint32(b[4*(k+i):], r.Remote[i])
	}
	return b[: 4*k : 4*k], b[4*k:]
}

// Completion is a decoded completion record.
type Completion struct {
	Tag  uint64
	Code uint32 // gRPC code; 0 = done
	// Msg is the refusal's message; on success the name of the transport
	// that carried the request (empty from a daemon before that).
	Msg         string
	Blocks      uint64
	Bytes       uint64
	Wire, Total int64 // ns
	// TriggerSeen, Posted and Landed are the daemon's wall-clock times of
	// the transfer (Unix ns; 0 when not known), as PhaseTimings carries them.
	TriggerSeen, Posted, Landed int64
	// A success's figures, as BatchTransferResponse has them (Figures:
	// the record carried them; a daemon before them did not).
	Figures                                      bool
	Segments, WorkRequests                       uint64
	Validate, Resolve, Plan, Post, Notify, Armed int64 // ns
}

// Encode writes c into rec (CompLen bytes); a message longer than MsgMax is
// cut and ends with a marker.
func (c Completion) Encode(rec []byte) {
	rec = rec[:CompLen]
	le := binary.LittleEndian
	le.PutUint64(rec[0:], c.Tag)
	le.PutUint32(rec[8:], c.Code)
	msg := c.Msg
	if len(msg) > MsgMax {
		msg = msg[:MsgMax-len(truncMark)] + truncMark
	}
	le.PutUint32(rec[12:], uint32(len(msg)))
	le.PutUint64(rec[16:], c.Blocks)
	le.PutUint64(rec[24:], c.Bytes)
	le.PutUint64(rec[32:], uint64(max(c.Wire, 0)))
	le.PutUint64(rec[40:], uint64(max(c.Total, 0)))
	n := copy(rec[compHdr:], msg)
	clear(rec[compHdr+n : compTimes])
	if c.Code == 0 && c.Figures && n <= extNameMax {
		x := rec[compExt : compExt+extLen]
		le.PutUint32(x[0:], extMagic)
		le.PutUint64(x[8:], c.Segments)
		le.PutUint64(x[16:], c.WorkRequests)
		for i, d := range [...]int64{c.Validate, c.Resolve, c.Plan, c.Post, c.Notify, c.Armed} {
			le.PutUint64(x[24+8*i:], uint64(max(d, 0)))
		}
	}
	le.PutUint64(rec[compTimes:], uint64(max(c.TriggerSeen, 0)))
	le.PutUint64(rec[compTimes+8:], uint64(max(c.Posted, 0)))
	le.PutUint64(rec[compTimes+16:], uint64(max(c.Landed, 0)))
}

// DecodeCompletion reads a completion record (the client's side).
func DecodeCompletion(rec []byte) (Completion, error) {
	if len(rec) != CompLen {
		return Completion{}, fmt.Errorf("completion record is %d bytes, want %d", len(rec), CompLen)
	}
	le := binary.LittleEndian
	c := Completion{Tag: le.Uint64(rec[0:]), Code: le.Uint32(rec[8:]), Blocks: le.Uint64(rec[16:]),
		Bytes: le.Uint64(rec[24:]), Wire: int64(le.Uint64(rec[32:])), Total: int64(le.Uint64(rec[40:]))}
	n := le.Uint32(rec[12:])
	if n > MsgReadMax {
		return c, fmt.Errorf("completion message length %d, limit %d", n, MsgReadMax)
	}
	c.Msg = msgString(rec[compHdr : compHdr+n])
	if c.Code == 0 {
		c.TriggerSeen = int64(le.Uint64(rec[compTimes:]))
		c.Posted = int64(le.Uint64(rec[compTimes+8:]))
		c.Landed = int64(le.Uint64(rec[compTimes+16:]))
		if x := rec[compExt : compExt+extLen]; n <= extNameMax && le.Uint32(x[0:]) == extMagic {
			c.Figures = true
			c.Segments, c.WorkRequests = le.Uint64(x[8:]), le.Uint64(x[16:])
			for i, d := range [...]*int64{&c.Validate, &c.Resolve, &c.Plan, &c.Post, &c.Notify, &c.Armed} {
				*d = int64(le.Uint64(x[24+8*i:]))
			}
		}
	}
	return c, nil
}

// msgString is b as a string, the names of the transports without an
// allocation (every successful completion carries one).
func msgString(b []byte) string {
	switch string(b) { // compared without a copy
	case "":
		return ""
	case "tcp":
		return "tcp"
	case "local":
		return "local"
	case "verbs":
		return "verbs"
	}
	return string(b)
}

// Hello is the tag of the first frame on the raw submit socket that asks
// for a ring without an id arena instead of raw frames (HelloArena asks
// for one: arena.go); the frame's handle field carries the submission
// entries (low 32 bits) and completion entries (high 32 bits), 0 for
// DefaultEntries. The daemon answers either with a raw answer frame tagged
// Hello, the memfd riding along as SCM_RIGHTS; later it may send one more
// such frame (the error it dropped the ring with) and close.
const Hello uint64 = 0x01676e6972623262 // "b2bring\x01"
