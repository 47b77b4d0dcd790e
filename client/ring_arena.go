package client

import (
	"encoding/binary"

	"github.com/b2bd/b2bd/internal/ring"
)

// arenaPayload is what an arena record points at: a block record's ids
// (all local ids, then all remote ids, little-endian u32) and its note,
// or a batch record's request (batch).
type arenaPayload struct {
	local, remote []uint32
	note          []byte
	batch         *ring.BatchOut
}

// size is the arena bytes p takes, 8-aligned.
func (p *arenaPayload) size() uint64 {
	if p.batch != nil {
		return (p.batch.Len() + 7) &^ 7
	}
	return (8*uint64(len(p.local)) + uint64(len(p.note)) + 7) &^ 7
}

// arenaSpan is the arena space of the record at submission index rec, up
// to position end.
type arenaSpan struct {
	rec uint32
	end uint64
}

// arena allocates the id arena in publish order, as a ring buffer: the
// bytes in [head, tail) (positions that run on, mod len(mem)) belong to
// records the daemon may not have taken yet. The space of a record is
// free again once the daemon's submission head passed it: the daemon
// copies a record's ids and note out before it moves its head past the
// record. A payload never wraps: one that would is placed at the start.
type arena struct {
	mem        []byte
	head, tail uint64
	spans      []arenaSpan // oldest first
}

// fits says whether p can ever be placed (the arena is large enough).
func (a *arena) fits(p *arenaPayload) bool { return p.size() <= uint64(len(a.mem)) }

// reclaim frees the spans of the records before sqHead.
func (a *arena) reclaim(sqHead uint32) {
	i := 0
	for ; i < len(a.spans) && int32(sqHead-a.spans[i].rec) > 0; i++ {
		a.head = a.spans[i].end
	}
	a.spans = a.spans[:copy(a.spans, a.spans[i:])]
	if len(a.spans) == 0 {
		a.head, a.tail = 0, 0 // nothing live: start over at offset 0
	}
}

// place writes p for the record at submission index rec and points req at
// it; false while there is no room yet (records not taken hold it).
func (a *arena) place(req *ring.Request, p *arenaPayload, rec, sqHead uint32) bool {
	a.reclaim(sqHead)
	size, n := uint64(len(a.mem)), p.size()
	if n > size {
		return false
	}
	pos := a.tail
	if off := pos % size; off+n > size {
		pos += size - off
	}
	if pos+n-a.head > size {
		return false
	}
	off, k := pos%size, uint64(len(p.local))
	b := a.mem[off : off+n]
	if p.batch != nil {
		blob := p.batch.Len()
		p.batch.Put(b[:blob])
		req.Arena, req.BlobOff, req.BlobLen = true, off, uint32(blob)
		a.tail = pos + n
		a.spans = append(a.spans, arenaSpan{rec: rec, end: a.tail})
		return true
	}
	le := binary.LittleEndian
	for i, id := range p.local {
		le.PutUint32(b[4*i:], id)
	}
	for i, id := range p.remote {
		le.PutUint32(b[4*(k+uint64(i)):], id)
	}
	copy(b[8*k:], p.note)
	req.Arena, req.IDsOff, req.NoteOff, req.NoteLen = true, off, off+8*k, uint32(len(p.note))
	a.tail = pos + n
	a.spans = append(a.spans, arenaSpan{rec: rec, end: a.tail})
	return true
}
