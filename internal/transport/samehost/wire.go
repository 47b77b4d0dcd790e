package samehost

import (
	"encoding/binary"
	"fmt"

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
const (
	helloMagic   = 0x4c423242 // "B2BL"
	helloVersion = 1
	maxNode      = 255
	requestSize  = 32
	replySize    = 32
	maxMsg       = 4096

	opBegin = 1
	opEnd   = 2
	opAbort = 3

	flagMap = 1
	// flagRead: a pull (begin: the key is the source's read key, pinned
	// with ReadPinner; a host source is mapped read-only; end: nothing
	// landed here, so nothing is counted).
	flagRead = 2

	statusOK       = 0
	statusNotFound = 1
	statusInvalid  = 2
	statusInternal = 3
	statusDenied   = 4

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
	if r.op < opBegin || r.op > opAbort {
		return request{}, fmt.Errorf("%w: samehost request op %d is not begin (1), end (2) or abort (3)", errs.ErrInvalidArgument, r.op)
	}
	if r.flags&^(flagMap|flagRead) != 0 {
		return request{}, fmt.Errorf("%w: samehost request flags %#x has unknown bits", errs.ErrInvalidArgument, r.flags)
	}
	return r, nil
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

func parseReply(b []byte) (reply, error) {
	if len(b) != replySize {
		return reply{}, fmt.Errorf("%w: samehost reply is %d bytes, want %d", errs.ErrInvalidArgument, len(b), replySize)
	}
	r := reply{
		status: binary.LittleEndian.Uint32(b[0:]), kind: binary.LittleEndian.Uint32(b[4:]),
		size: binary.LittleEndian.Uint64(b[8:]), offset: binary.LittleEndian.Uint64(b[16:]),
		msgLen: binary.LittleEndian.Uint32(b[24:]), fds: binary.LittleEndian.Uint32(b[28:]),
	}
	switch {
	case r.status > statusDenied:
		return reply{}, fmt.Errorf("%w: samehost reply status %d is unknown", errs.ErrInvalidArgument, r.status)
	case r.kind > kindCUDA:
		return reply{}, fmt.Errorf("%w: samehost reply memory kind %d is unknown", errs.ErrInvalidArgument, r.kind)
	case r.msgLen > maxMsg:
		return reply{}, fmt.Errorf("%w: samehost reply message is %d bytes, over the limit of %d", errs.ErrInvalidArgument, r.msgLen, maxMsg)
	case r.fds > 1:
		return reply{}, fmt.Errorf("%w: samehost reply announces %d descriptors, at most 1", errs.ErrInvalidArgument, r.fds)
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
	if v := binary.LittleEndian.Uint32(b[4:]); v != helloVersion {
		return 0, fmt.Errorf("%w: samehost hello version %d, this daemon speaks %d", errs.ErrInvalidArgument, v, helloVersion)
	}
	copy(h.token[:], b[8:])
	n := int(binary.LittleEndian.Uint16(b[8+TokenSize:]))
	if n > maxNode {
		return 0, fmt.Errorf("%w: samehost hello node name is %d bytes, over the limit of %d", errs.ErrInvalidArgument, n, maxNode)
	}
	return n, nil
}
