package verbs

import "encoding/binary"

// The control messages a QP set exchanges besides the RDMA WRITEs. They
// travel as SENDs into the peer's SRQ buffers of recvBufLen bytes.
//
//	off size
//	 0   4  magic "B2BV"
//	 4   1  kind (msgMeta, msgBye)
//	 5   1  version (1)
//	 8   4  batch tag
//	12   4  QPs the batch uses (immediates to expect)
//	16   4  rkey of the destination region (for Inbound.Pin)
//	24   8  blocks
//	32   8  bytes
const (
	msgMagic   = 0x56423242 // "B2BV" little-endian
	msgVersion = 1
	msgLen     = 40
	recvBufLen = 64

	msgMeta = 1
	msgBye  = 2

	// pingImm is the immediate of a keepalive probe (SEND_WITH_IMM). Batch
	// tags run 1..tagMask-1, so neither an ack (the tag) nor a refusal (the
	// tag | refuseBit) is ever mistaken for it.
	pingImm = 0xFFFFFFFF
	tagMask = 0x7FFFFFFF
	// refuseBit marks an ack that refuses its batch: the receiver could not
	// pin the destination (deregistered, un-exported, or its key revoked).
	refuseBit = 0x80000000
)

// nextTag is the tag after t, in 1..tagMask-1.
func nextTag(t uint32) uint32 { return t%(tagMask-1) + 1 }

type message struct {
	kind   uint8
	tag    uint32
	nqp    uint32
	rkey   uint32
	blocks uint64
	bytes  uint64
}

func (m *message) encode(b []byte) {
	_ = b[msgLen-1]
	binary.LittleEndian.PutUint32(b[0:], msgMagic)
	b[4] = m.kind
	b[5] = msgVersion
	b[6], b[7] = 0, 0
	binary.LittleEndian.PutUint32(b[8:], m.tag)
	binary.LittleEndian.PutUint32(b[12:], m.nqp)
	binary.LittleEndian.PutUint32(b[16:], m.rkey)
	binary.LittleEndian.PutUint32(b[20:], 0)
	binary.LittleEndian.PutUint64(b[24:], m.blocks)
	binary.LittleEndian.PutUint64(b[32:], m.bytes)
}

// decode parses a received message; ok is false for anything malformed.
func (m *message) decode(b []byte) bool {
	if len(b) < msgLen || binary.LittleEndian.Uint32(b[0:]) != msgMagic || b[5] != msgVersion {
		return false
	}
	m.kind = b[4]
	m.tag = binary.LittleEndian.Uint32(b[8:])
	m.nqp = binary.LittleEndian.Uint32(b[12:])
	m.rkey = binary.LittleEndian.Uint32(b[16:])
	m.blocks = binary.LittleEndian.Uint64(b[24:])
	m.bytes = binary.LittleEndian.Uint64(b[32:])
	switch m.kind {
	case msgMeta:
		return m.nqp <= maxQPsPerConn && m.tag < tagMask
	case msgBye:
		return true
	}
	return false
}
