package verbs

import "encoding/binary"

// The control messages a QP set exchanges besides the RDMA WRITEs. They
// travel as SENDs into the peer's SRQ buffers of recvBufLen bytes.
//
//	off size
//	 0   4  magic "B2BV"
//	 4   1  kind (msgMeta, msgBye, msgCancel)
//	 5   1  version (1)
//	 8   4  batch tag
//	12   4  QPs the batch uses (immediates to expect)
//	16   4  rkey of the destination region (for Inbound.Pin)
//	20   4  keys: 0, or the number of destination rkeys the batch's
//	        msgKeys messages carried before it (a block request over
//	        several regions: the rkey field is then ignored)
//	24   8  blocks
//	32   8  bytes
//
// msgCancel (the sender stopped batch tag before posting all of it, and
// every WR it did post has completed): only the tag. The receiver drops
// the batch unaccounted and answers tag | refuseBit; a batch that already
// landed was acked with its tag before the cancel arrived. A receiver that
// predates msgCancel ignores it, and the sender falls back to stopping the
// connection.
//
// msgKeys (a block request's destination rkeys, sent on the meta's QP
// right before it, so they arrive first):
//
//	 8   4  batch tag
//	12   4  index of the first key here
//	16   4  keys here (at most keysPerMsg)
//	24  4n  the rkeys
const (
	msgMagic   = 0x56423242 // "B2BV" little-endian
	msgVersion = 1
	msgLen     = 40
	recvBufLen = 64

	msgMeta = 1
	msgBye  = 2
	msgKeys = 3
	// msgCancel is new in kind only: version 1 receivers drop it as
	// malformed, which the sender survives (see above).
	msgCancel = 4

	// keysPerMsg is the rkeys one msgKeys carries (in recvBufLen bytes).
	keysPerMsg = (recvBufLen - 24) / 4
	// maxBatchKeys bounds the destination regions of one batch: its
	// msgKeys fit the sender's control buffer (beside the meta), and a
	// batch takes at most that many SRQ receives at once. A block request
	// over more regions takes transport.WriteStretches.
	maxBatchKeys = 32 * keysPerMsg

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
	nkeys  uint32 // msgMeta: keys sent before it; msgKeys: keys here
	blocks uint64
	bytes  uint64
	first  uint32 // msgKeys: index of keys[0]
	keys   [keysPerMsg]uint32
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
	binary.LittleEndian.PutUint32(b[20:], m.nkeys)
	binary.LittleEndian.PutUint64(b[24:], m.blocks)
	binary.LittleEndian.PutUint64(b[32:], m.bytes)
}

// encodeKeys writes a msgKeys carrying keys (at most keysPerMsg) from index
// first into b (recvBufLen bytes).
func encodeKeys(b []byte, tag, first uint32, keys []uint32) {
	_ = b[recvBufLen-1]
	binary.LittleEndian.PutUint32(b[0:], msgMagic)
	b[4] = msgKeys
	b[5] = msgVersion
	b[6], b[7] = 0, 0
	binary.LittleEndian.PutUint32(b[8:], tag)
	binary.LittleEndian.PutUint32(b[12:], first)
	binary.LittleEndian.PutUint32(b[16:], uint32(len(keys)))
	binary.LittleEndian.PutUint32(b[20:], 0)
	for i, k := range keys {
		binary.LittleEndian.PutUint32(b[24+4*i:], k)
	}
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
	m.nkeys = binary.LittleEndian.Uint32(b[20:])
	m.blocks = binary.LittleEndian.Uint64(b[24:])
	m.bytes = binary.LittleEndian.Uint64(b[32:])
	switch m.kind {
	case msgMeta:
		return m.nqp <= maxQPsPerConn && m.tag < tagMask && m.nkeys <= maxBatchKeys
	case msgKeys:
		m.first, m.nkeys = m.nqp, m.rkey
		m.nqp, m.rkey, m.blocks, m.bytes = 0, 0, 0, 0
		m.keys = [keysPerMsg]uint32{}
		if len(b) < recvBufLen || m.tag >= tagMask || m.nkeys == 0 || m.nkeys > keysPerMsg || m.first >= maxBatchKeys {
			return false
		}
		for i := range m.nkeys {
			m.keys[i] = binary.LittleEndian.Uint32(b[24+4*i:])
		}
		return true
	case msgBye:
		return true
	case msgCancel:
		return m.tag < tagMask
	}
	return false
}
