package tcp

import (
	"encoding/binary"
	"time"
)

// Wire format (little-endian). A data connection opens with a hello; then the
// sender writes frames and, after the last frame of its share of a batch,
// reads one ack.
//
//	hello  : magic "B2BH" | version u32 | token [16] | conn id u64 | streams u32 | index u32   (40 B)
//	welcome: magic "B2BW" | status u32                                                      (8 B)
//	fence  : magic "B2BX" | version u32 | token [16] | conn id u64 | 0 u32 | 0 u32           (40 B)
//	         on a connection of its own, answered with a welcome once the receiver
//	         placed its last byte for that sending conn (see Transport.fence).
//	frame  : magic "B2BF" | flags u32 | batch u64 | key u64 | segs u32 | streams u32 |
//	         payload u64 | hold ms u64 (the sender's time left for the batch; 0: unsaid) (48 B)
//	         then segs x (dst offset u64, length u64), then the payload bytes in order.
//	ack    : magic "B2BA" | status u32 | batch u64 | bytes u64 | msglen u32 | reserved u32  (32 B)
//	         then msglen bytes of error text.
const (
	helloMagic   = 0x48423242 // "B2BH"
	welcomeMagic = 0x57423242 // "B2BW"
	frameMagic   = 0x46423242 // "B2BF"
	ackMagic     = 0x41423242 // "B2BA"
	fenceMagic   = 0x58423242 // "B2BX"
	version      = 1

	helloLen   = 40
	welcomeLen = 8
	headerLen  = 48
	segLen     = 16
	ackLen     = 32

	flagLast = 1 // the last frame of this stream's share of the batch
	// flagRead: a pull's request (read.go): segs x (source offset u64,
	// length u64) in the region whose read key is key, and no payload; the
	// receiver answers with an ack whose bytes is payload, followed by
	// those bytes in table order, or with a refusal and no bytes.
	flagRead = 2
	// maxReadFrame bounds the bytes one read request may ask for (the
	// server copies them into a buffer of its own before sending).
	maxReadFrame = 16 << 20

	// maxSegsPerFrame and maxPayload bound what a receiver buffers per frame.
	maxSegsPerFrame = 4096
	maxPayload      = 64 << 20
	maxAckMsg       = 4096
)

// Ack statuses.
const (
	statusOK uint32 = iota
	statusBadKey
	statusBadRange
	statusBadFrame
	statusUnsupported
	// statusDataLoss: the destination's memory faulted while the frame was
	// read into it (its client truncated the region's file).
	statusDataLoss
	// statusFenced: the sending conn was fenced (its Write cut off), so the
	// frame was not placed.
	statusFenced
)

type frameHeader struct {
	flags   uint32
	batch   uint64
	key     uint64
	segs    uint32
	streams uint32
	payload uint64
	// holdMS: how long, in ms, the sender will still try the batch (its
	// deadline, as it sent the frame; 0: none said, as from an older
	// sender). The receiver holds the batch's destination at most that
	// long, and holdGrace more (recv.go).
	holdMS uint64
}

// holdMSAt is holdMS for a batch that ends at deadline (none: 0; past, 1).
func holdMSAt(deadline time.Time) uint64 {
	if deadline.IsZero() {
		return 0
	}
	return uint64(max(1, time.Until(deadline).Milliseconds()))
}

func (h *frameHeader) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], frameMagic)
	le.PutUint32(b[4:], h.flags)
	le.PutUint64(b[8:], h.batch)
	le.PutUint64(b[16:], h.key)
	le.PutUint32(b[24:], h.segs)
	le.PutUint32(b[28:], h.streams)
	le.PutUint64(b[32:], h.payload)
	le.PutUint64(b[40:], h.holdMS)
}

func (h *frameHeader) parse(b []byte) bool {
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != frameMagic {
		return false
	}
	h.flags = le.Uint32(b[4:])
	h.batch = le.Uint64(b[8:])
	h.key = le.Uint64(b[16:])
	h.segs = le.Uint32(b[24:])
	h.streams = le.Uint32(b[28:])
	h.payload = le.Uint64(b[32:])
	h.holdMS = le.Uint64(b[40:])
	return true
}
