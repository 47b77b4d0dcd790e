package local

import (
	"encoding/binary"
	"fmt"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/errs"
)

// The Unix-socket protocol between a sender (client) and the receiving
// daemon (server). All integers little-endian.
//
//	hello   client -> server: magic u32, version u32, token [32], node length u16, node
//	welcome server -> client: reply header (status; msg = the server's node name or the error)
//	request client -> server: op u32, flags u32, key u64, a u64, b u64 (32 bytes)
//	reply   server -> client: status u32, kind u32, size u64, offset u64, msg length u32,
//	        fds u32 (32 bytes), then msg, then for a CUDA map the 64-byte IPC handle.
//	        A host map carries the region file's descriptor (SCM_RIGHTS) on the header.
//
// A batch is begin (the server pins the destination key and, with
// flagMap, hands the sender its memory), the sender's copies, then end (the
// server records the landing and lets go) or abort.
//
// Version 2 adds the begin of a set (a block request over many regions, one
// round trip however many regions it names):
//
//	request client -> server: op beginSet, flags (flagRead only), key 0, a = n
//	        (1..maxSetKeys), b 0; then n entries of 16 bytes: key u64,
//	        flags u32 (flagMap only), reserved u32 (0).
//	reply   server -> client: a reply header: status; on success size = n,
//	        offset = the body's length, fds = the descriptors it carries (one
//	        per entry with setFD, in entry order, all on the header); on a
//	        refusal size = the refused entry's index, msg = why, no body.
//	        The body: n entries of 32 bytes: kind u32, flags u32 (setFD,
//	        setHandle), size u64, offset u64, bus id length u32, reserved
//	        u32; then, entry after entry, the bus id and the 64-byte IPC
//	        handle where setHandle is set.
//
// The server holds every key of the set pinned until the end (counted
// landed once, for the whole set) or abort; a refused key releases the
// ones pinned before it. A version 1 client (begin, end, abort only) is
// served as before.
const (
	helloMagic   = 0x4c423242 // "B2BL"
	helloVersion = 2
	// minHelloVersion is the oldest client this server speaks to.
	minHelloVersion = 1
	maxNode         = 255
	requestSize     = 32
	replySize       = 32
	maxMsg          = 4096

	opBegin    = 1
	opEnd      = 2
	opAbort    = 3
	opBeginSet = 4

	// maxSetKeys bounds a set's keys: every descriptor of a set's reply
	// travels in one SCM_RIGHTS message, and Linux takes at most 253
	// (SCM_MAX_FD); it stays below the sender's mapping cache (maxCached),
	// so a set's own mappings are never evicted while it runs.
	maxSetKeys    = 250
	setEntrySize  = 16
	setReplyEntry = 32
	maxBusID      = 64
	setFD         = 1
	setHandle     = 2
	maxSetBody    = maxSetKeys * (setReplyEntry + maxBusID + gpudirect.IPCHandleSize)

	flagMap = 1
	// flagRead: a pull (begin: the key is the source's read key, pinned
	// with Inbound.PinRead; a host source is mapped read-only; end: nothing
	// landed here, so nothing is counted).
	flagRead = 2

	statusOK       = 0
	statusNotFound = 1
	statusInvalid  = 2
	statusInternal = 3
	statusDenied   = 4
	// statusDataLoss: the region failed (its file truncated under it).
	statusDataLoss = 5

	kindHost = 1
	kindCUDA = 2
)

type request struct {
	op, flags uint32
	key, a, b uint64
}

func (r *request) put(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], r.op)
	binary.LittleEndian.PutUint32(b[4:], r.flags)
	binary.LittleEndian.PutUint64(b[8:], r.key)
	binary.LittleEndian.PutUint64(b[16:], r.a)
	binary.LittleEndian.PutUint64(b[24:], r.b)
}

func parseRequest(b []byte) (request, error) {
	if len(b) != requestSize {
		return request{}, fmt.Errorf("%w: samehost request is %d bytes, want %d", errs.ErrInvalidArgument, len(b), requestSize)
	}
	r := request{
		op: binary.LittleEndian.Uint32(b[0:]), flags: binary.LittleEndian.Uint32(b[4:]),
		key: binary.LittleEndian.Uint64(b[8:]), a: binary.LittleEndian.Uint64(b[16:]), b: binary.LittleEndian.Uint64(b[24:]),
	}
	if r.op < opBegin || r.op > opBeginSet {
		return request{}, fmt.Errorf("%w: samehost request op %d is not begin (1), end (2), abort (3) or begin of a set (4)", errs.ErrInvalidArgument, r.op)
	}
	if r.flags&^(flagMap|flagRead) != 0 {
		return request{}, fmt.Errorf("%w: samehost request flags %#x has unknown bits", errs.ErrInvalidArgument, r.flags)
	}
	if r.op == opBeginSet {
		switch {
		case r.flags&flagMap != 0:
			return request{}, fmt.Errorf("%w: samehost begin of a set: flagMap belongs on its entries, not on the request", errs.ErrInvalidArgument)
		case r.key != 0 || r.b != 0:
			return request{}, fmt.Errorf("%w: samehost begin of a set: key %#x and b %d must be 0", errs.ErrInvalidArgument, r.key, r.b)
		case r.a == 0 || r.a > maxSetKeys:
			return request{}, fmt.Errorf("%w: samehost begin of a set names %d keys, want 1 to %d", errs.ErrInvalidArgument, r.a, maxSetKeys)
		}
	}
	return r, nil
}

// setEntry is one key of a set's begin.
type setEntry struct {
	key   uint64
	flags uint32
}

func (e *setEntry) put(b []byte) {
	binary.LittleEndian.PutUint64(b[0:], e.key)
	binary.LittleEndian.PutUint32(b[8:], e.flags)
	binary.LittleEndian.PutUint32(b[12:], 0)
}

// parseSetEntry reads entry i of a set's begin.
func parseSetEntry(b []byte, i int) (setEntry, error) {
	if len(b) != setEntrySize {
		return setEntry{}, fmt.Errorf("%w: samehost set entry %d is %d bytes, want %d", errs.ErrInvalidArgument, i, len(b), setEntrySize)
	}
	e := setEntry{key: binary.LittleEndian.Uint64(b[0:]), flags: binary.LittleEndian.Uint32(b[8:])}
	if e.flags&^flagMap != 0 || binary.LittleEndian.Uint32(b[12:]) != 0 {
		return setEntry{}, fmt.Errorf("%w: samehost set entry %d: flags %#x or its reserved word has unknown bits", errs.ErrInvalidArgument, i, e.flags)
	}
	return e, nil
}

// setAnswer is the server's answer for one key of a set.
type setAnswer struct {
	kind, flags  uint32
	size, offset uint64
	busLen       uint32
}

func (a *setAnswer) put(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], a.kind)
	binary.LittleEndian.PutUint32(b[4:], a.flags)
	binary.LittleEndian.PutUint64(b[8:], a.size)
	binary.LittleEndian.PutUint64(b[16:], a.offset)
	binary.LittleEndian.PutUint32(b[24:], a.busLen)
	binary.LittleEndian.PutUint32(b[28:], 0)
}

// parseSetAnswer reads the answer at the start of b and returns the bytes
// after it and its bus id and handle (empty when absent).
func parseSetAnswer(b []byte, i int) (a setAnswer, bus, handle, rest []byte, err error) {
	if len(b) < setReplyEntry {
		return a, nil, nil, nil, fmt.Errorf("%w: samehost set reply: answer %d is cut short (%d bytes left, want %d)", errs.ErrInvalidArgument, i, len(b), setReplyEntry)
	}
	a = setAnswer{kind: binary.LittleEndian.Uint32(b[0:]), flags: binary.LittleEndian.Uint32(b[4:]),
		size: binary.LittleEndian.Uint64(b[8:]), offset: binary.LittleEndian.Uint64(b[16:]), busLen: binary.LittleEndian.Uint32(b[24:])}
	switch {
	case a.kind != kindHost && a.kind != kindCUDA:
		return a, nil, nil, nil, fmt.Errorf("%w: samehost set reply: answer %d memory kind %d is unknown", errs.ErrInvalidArgument, i, a.kind)
	case a.flags&^(setFD|setHandle) != 0 || binary.LittleEndian.Uint32(b[28:]) != 0:
		return a, nil, nil, nil, fmt.Errorf("%w: samehost set reply: answer %d flags %#x has unknown bits", errs.ErrInvalidArgument, i, a.flags)
	case a.busLen > maxBusID:
		return a, nil, nil, nil, fmt.Errorf("%w: samehost set reply: answer %d bus id is %d bytes, over the limit of %d", errs.ErrInvalidArgument, i, a.busLen, maxBusID)
	}
	rest = b[setReplyEntry:]
	n := int(a.busLen)
	if a.flags&setHandle != 0 {
		n += gpudirect.IPCHandleSize
	}
	if len(rest) < n {
		return a, nil, nil, nil, fmt.Errorf("%w: samehost set reply: answer %d's bus id and handle are cut short", errs.ErrInvalidArgument, i)
	}
	bus, rest = rest[:a.busLen], rest[a.busLen:]
	if a.flags&setHandle != 0 {
		handle, rest = rest[:gpudirect.IPCHandleSize], rest[gpudirect.IPCHandleSize:]
	}
	return a, bus, handle, rest, nil
}

type reply struct {
	status, kind uint32
	size, offset uint64
	msgLen, fds  uint32
}

func (r *reply) put(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], r.status)
	binary.LittleEndian.PutUint32(b[4:], r.kind)
	binary.LittleEndian.PutUint64(b[8:], r.size)
	binary.LittleEndian.PutUint64(b[16:], r.offset)
	binary.LittleEndian.PutUint32(b[24:], r.msgLen)
	binary.LittleEndian.PutUint32(b[28:], r.fds)
}

func parseReply(b []byte) (reply, error) { return parseReplyFDs(b, 1) }

// parseSetReply reads a set's reply header: up to maxSetKeys descriptors,
// a body (offset) of at most maxSetBody bytes.
func parseSetReply(b []byte) (reply, error) {
	r, err := parseReplyFDs(b, maxSetKeys)
	if err == nil && r.status == statusOK && (r.size == 0 || r.size > maxSetKeys || r.offset > maxSetBody) {
		return reply{}, fmt.Errorf("%w: samehost set reply: %d answers in %d bytes, over the limits of %d and %d", errs.ErrInvalidArgument, r.size, r.offset, maxSetKeys, maxSetBody)
	}
	return r, err
}

func parseReplyFDs(b []byte, maxFDs uint32) (reply, error) {
	if len(b) != replySize {
		return reply{}, fmt.Errorf("%w: samehost reply is %d bytes, want %d", errs.ErrInvalidArgument, len(b), replySize)
	}
	r := reply{
		status: binary.LittleEndian.Uint32(b[0:]), kind: binary.LittleEndian.Uint32(b[4:]),
		size: binary.LittleEndian.Uint64(b[8:]), offset: binary.LittleEndian.Uint64(b[16:]),
		msgLen: binary.LittleEndian.Uint32(b[24:]), fds: binary.LittleEndian.Uint32(b[28:]),
	}
	switch {
	case r.status > statusDataLoss:
		return reply{}, fmt.Errorf("%w: samehost reply status %d is unknown", errs.ErrInvalidArgument, r.status)
	case r.kind > kindCUDA:
		return reply{}, fmt.Errorf("%w: samehost reply memory kind %d is unknown", errs.ErrInvalidArgument, r.kind)
	case r.msgLen > maxMsg:
		return reply{}, fmt.Errorf("%w: samehost reply message is %d bytes, over the limit of %d", errs.ErrInvalidArgument, r.msgLen, maxMsg)
	case r.fds > maxFDs:
		return reply{}, fmt.Errorf("%w: samehost reply announces %d descriptors, at most %d", errs.ErrInvalidArgument, r.fds, maxFDs)
	}
	return r, nil
}

// statusErr is the domain class a reply status stands for.
func statusErr(s uint32) error {
	switch s {
	case statusNotFound:
		return errs.ErrNotFound
	case statusInvalid:
		return errs.ErrInvalidArgument
	case statusDenied:
		return errs.ErrPermissionDenied
	case statusDataLoss:
		return errs.ErrDataLoss
	}
	return errs.ErrAborted
}

// statusOf is the reply status for a domain error.
func statusOf(err error) uint32 {
	switch errs.Class(err) {
	case errs.ErrNotFound:
		return statusNotFound
	case errs.ErrInvalidArgument:
		return statusInvalid
	case errs.ErrPermissionDenied:
		return statusDenied
	case errs.ErrDataLoss:
		return statusDataLoss
	}
	return statusInternal
}

// hello is the client's first message.
type hello struct {
	token [TokenSize]byte
	node  string
}

func (h *hello) marshal() []byte {
	b := make([]byte, 8+TokenSize+2+len(h.node))
	binary.LittleEndian.PutUint32(b[0:], helloMagic)
	binary.LittleEndian.PutUint32(b[4:], helloVersion)
	copy(b[8:], h.token[:])
	binary.LittleEndian.PutUint16(b[8+TokenSize:], uint16(len(h.node)))
	copy(b[8+TokenSize+2:], h.node)
	return b
}

const helloFixed = 8 + TokenSize + 2

// parseHelloFixed checks the fixed part and returns the node name's length.
func parseHelloFixed(b []byte, h *hello) (int, error) {
	if len(b) != helloFixed {
		return 0, fmt.Errorf("%w: samehost hello is %d bytes, want %d", errs.ErrInvalidArgument, len(b), helloFixed)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != helloMagic {
		return 0, fmt.Errorf("%w: samehost hello magic %#x is not %#x", errs.ErrInvalidArgument, m, helloMagic)
	}
	if v := binary.LittleEndian.Uint32(b[4:]); v < minHelloVersion || v > helloVersion {
		return 0, fmt.Errorf("%w: samehost hello version %d, this daemon speaks %d to %d", errs.ErrInvalidArgument, v, minHelloVersion, helloVersion)
	}
	copy(h.token[:], b[8:])
	n := int(binary.LittleEndian.Uint16(b[8+TokenSize:]))
	if n > maxNode {
		return 0, fmt.Errorf("%w: samehost hello node name is %d bytes, over the limit of %d", errs.ErrInvalidArgument, n, maxNode)
	}
	return n, nil
}
