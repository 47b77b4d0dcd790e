package tcp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// Pulls (docs/pull.md). A pull is a request frame per frame of the batch
// (flagRead: the key is the region's read token, the table the source
// ranges in the peer's region, no payload) on the same data streams that
// carry writes. The serving daemon pins the source by its read token,
// checks every range, copies the frame's bytes into a buffer of its own
// and answers with an ack carrying the byte count, then the bytes; or with
// a refusal and no bytes. Nothing leaves before the grant and the bounds
// were checked. The puller reads the answer through the same placement
// code as the receiver of a write (receiver.placeIn), straight into its
// own region. Each stream has one request outstanding at a time, so a
// stream never holds more than one frame's answer.

// Read is a pull: b.Src are offsets in the peer's region
// src, b.Dst offsets in dst. It returns once every byte is in dst; after it
// returned (error, deadline or cancel included) no byte of it lands: the
// streams' workers are waited for, and a cut-off stream is closed with
// whatever answer was in flight.
func (c *conn) read(ctx context.Context, dst transport.Registration, src transport.RemoteRegion, b *desc.Batch) (st transport.Stats, err error) {
	waited, err := c.lockCtx(ctx)
	if err != nil {
		return transport.Stats{}, err
	}
	defer c.unlock()
	defer func() { st.Post += waited }()
	if err := c.Err(); err != nil {
		return transport.Stats{}, c.brokenBefore(err)
	}
	if b.N() == 0 {
		return transport.Stats{}, nil
	}
	t0 := time.Now()
	mem := dst.Memory()
	switch {
	case mem.Kind == memory.CUDA && c.t.cfg.Staging == nil:
		return transport.Stats{}, fmt.Errorf("%w: tcp: destination is %s memory and this daemon has no CUDA driver", errs.ErrFailedPrecondition, mem.Kind)
	case mem.Kind == memory.Host && mem.Host == nil:
		return transport.Stats{}, fmt.Errorf("%w: tcp: destination is host memory without a mapping", errs.ErrFailedPrecondition)
	}
	// Both sides' bounds before a request leaves: the peer's region (as
	// resolved; the server checks again) and ours.
	if err := checkBounds(&desc.Batch{Src: b.Src, Dst: b.Dst, Len: b.Len}, src.Size, mem.Len); err != nil {
		return transport.Stats{}, fmt.Errorf("tcp: read from %q: %w", src.Name, err)
	}
	// The plan of the swapped batch: its tables hold the peer's offsets.
	lim := c.limits()
	lim.frameBytes = min(lim.frameBytes, maxReadFrame)
	c.scratch.build(&desc.Batch{Src: b.Dst, Dst: b.Src, Len: b.Len}, src.Key.Key, lim)
	le := binary.LittleEndian
	for i := range c.scratch.frames {
		h := c.scratch.hdr[c.scratch.frames[i].hdrLo:]
		le.PutUint32(h[4:], le.Uint32(h[4:])|flagRead)
	}
	c.scratch.read, c.scratch.readMem, c.scratch.readName = true, mem, src.Name
	st, err = c.run(ctx, &c.scratch, nil, t0)
	c.scratch.read, c.scratch.readMem = false, memory.Memory{}
	c.scratch.trim()
	return st, err
}

// pull runs the job's share of a read plan: per frame, the request, then
// the answer placed in the destination.
func (s *stream) pull(j *job) result {
	_ = s.nc.SetDeadline(j.deadline)
	if s.c.cut.Load() == j.batch {
		_ = s.nc.SetDeadline(time.Unix(1, 0))
	}
	s.ensureRx()
	p := j.p
	sh := p.shares[j.share]
	le := binary.LittleEndian
	var r result
	for f := sh.lo; f < sh.hi; f++ {
		fr := &p.frames[f]
		hdr := p.hdr[fr.hdrLo:fr.hdrHi]
		le.PutUint64(hdr[8:], j.batch)
		// The request is built (the plan): its write is wire, as
		// shareBlocks' pullFrame says.
		if _, err := s.nc.Write(hdr); err != nil {
			r.err = err
			return r
		}
		r.frames++
		var h frameHeader
		h.parse(hdr)
		if err := s.readAnswer(j.batch, &h, p.readName); err != nil {
			r.err = err
			return r
		}
		// The frame's table on this side: (our offset, length) per block.
		table := s.rtable[:int(h.segs)*segLen]
		for x := fr.blk.lo; x < fr.blk.hi; x++ {
			t := (x - fr.blk.lo) * segLen
			le.PutUint64(table[t:], p.used.Src[x]) // built swapped: Src are ours
			le.PutUint64(table[t+8:], p.used.Len[x])
		}
		if _, err := s.rx.placeIn(&h, table, p.readMem); err != nil {
			var re *recvErr
			if errors.As(err, &re) {
				err = re.err
			}
			r.err = fmt.Errorf("destination of blocks %d..%d: %w", fr.blk.lo, fr.blk.hi-1, err)
			return r
		}
	}
	return r
}

// readAnswer reads the answer to a read request: an ack whose bytes must be
// the frame's payload (the bytes follow), or the peer's refusal.
func (s *stream) readAnswer(batch uint64, h *frameHeader, name string) error {
	b := s.ackb[:ackLen]
	if _, err := io.ReadFull(s.rx.br, b); err != nil {
		return err
	}
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != ackMagic {
		return fmt.Errorf("bad answer magic %#x", le.Uint32(b[0:]))
	}
	status, got, n := le.Uint32(b[4:]), le.Uint64(b[16:]), int(le.Uint32(b[24:]))
	if status != statusOK {
		n = min(n, maxAckMsg)
		msg := s.ackb[ackLen : ackLen+n]
		if _, err := io.ReadFull(s.rx.br, msg); err != nil {
			return err
		}
		return &ackError{status: status, msg: string(msg), read: true, region: name}
	}
	if nb := le.Uint64(b[8:]); nb != batch {
		return fmt.Errorf("answer for batch %d while waiting for %d", nb, batch)
	}
	if got != h.payload {
		return fmt.Errorf("answer of %d bytes to a request for %d", got, h.payload)
	}
	return nil
}

// serveRead answers a read request: the table is read, the source pinned by
// its read token and every range checked before any byte is sent. A refusal
// leaves the stream in step (the request has no payload).
func (r *receiver) serveRead(h *frameHeader) error {
	_ = r.c.SetReadDeadline(time.Now().Add(frameTimeout))
	table := r.table[:int(h.segs)*segLen]
	_, err := io.ReadFull(r.meta(), table)
	_ = r.c.SetReadDeadline(time.Time{})
	if err != nil {
		return err
	}
	if re := r.gather(h, table); re != nil {
		r.t.log.Warn("read refused", "batch", h.batch, "error", re.err)
		return r.ack(re.status, h.batch, 0, re.err.Error())
	}
	b := r.ackb[:ackLen]
	le := binary.LittleEndian
	le.PutUint32(b[0:], ackMagic)
	le.PutUint32(b[4:], statusOK)
	le.PutUint64(b[8:], h.batch)
	le.PutUint64(b[16:], h.payload)
	le.PutUint32(b[24:], 0)
	le.PutUint32(b[28:], 0)
	_ = r.c.SetWriteDeadline(time.Now().Add(frameTimeout))
	r.outa = [2][]byte{b, r.out[:h.payload]}
	r.outv = r.outa[:]
	_, err = r.outv.WriteTo(r.c)
	_ = r.c.SetWriteDeadline(time.Time{})
	return err
}

// gather pins the request's source by its read token, checks the ranges
// and copies them, in table order, into r.out. The pin is let go once the
// bytes are copied: a region deregistered, un-exported or re-keyed between
// two frames refuses the next one.
func (r *receiver) gather(h *frameHeader, table []byte) *recvErr {
	if h.payload > maxReadFrame {
		return &recvErr{statusBadRange, fmt.Errorf("tcp: read %d asks for %d bytes in one frame, over the limit of %d", h.batch, h.payload, maxReadFrame)}
	}
	mem, release, err := r.t.in.PinRead(transport.TCP, h.key)
	if errors.Is(err, errs.ErrUnimplemented) {
		return &recvErr{statusUnsupported, fmt.Errorf("tcp: read %d: this daemon serves no reads", h.batch)}
	}
	if err != nil {
		return &recvErr{statusBadKey, fmt.Errorf("tcp: read %d: source: %w", h.batch, err)}
	}
	defer release()
	le := binary.LittleEndian
	var sum uint64
	for i := 0; i < int(h.segs); i++ {
		off, n := le.Uint64(table[i*segLen:]), le.Uint64(table[i*segLen+8:])
		if n == 0 || off > mem.Len || n > mem.Len-off {
			return &recvErr{statusBadRange, fmt.Errorf("tcp: read %d: segment %d [%d,+%d) is outside the %d-byte source", h.batch, i, off, n, mem.Len)}
		}
		sum += n
	}
	if sum != h.payload {
		return &recvErr{statusBadFrame, fmt.Errorf("tcp: read %d: segments total %d bytes, header says %d", h.batch, sum, h.payload)}
	}
	if uint64(cap(r.out)) < h.payload {
		r.out = make([]byte, max(h.payload, 1<<20))
	}
	out := r.out[:h.payload]
	if mem.Kind == memory.CUDA {
		return r.gatherDevice(h, table, mem, out)
	}
	// The source belongs to a client that may truncate its file: the copy
	// faults then, and the read is refused (DataLoss) with nothing sent.
	var seg int
	ferr := memguard.Do(memguard.Source, func() {
		var at uint64
		for seg = 0; seg < int(h.segs); seg++ {
			off, n := le.Uint64(table[seg*segLen:]), le.Uint64(table[seg*segLen+8:])
			copy(out[at:at+n], mem.Host[off:off+n])
			at += n
		}
	})
	if ferr != nil {
		return &recvErr{statusDataLoss, fmt.Errorf("tcp: read %d: source region (%d bytes) segment %d: %w", h.batch, mem.Len, seg, ferr)}
	}
	return nil
}

// gatherDevice stages a GPU source's ranges through the connection's
// pinned buffer.
func (r *receiver) gatherDevice(h *frameHeader, table []byte, mem memory.Memory, out []byte) *recvErr {
	if r.t.cfg.Staging == nil {
		return &recvErr{statusUnsupported, fmt.Errorf("tcp: read %d: source is %s memory and this daemon has no CUDA driver", h.batch, mem.Kind)}
	}
	if r.stager == nil {
		st, err := r.t.cfg.Staging.Get(mem.Device)
		if err != nil {
			return &recvErr{statusUnsupported, fmt.Errorf("tcp: read %d: %w", h.batch, err)}
		}
		r.stager = st
	}
	n := int(h.segs)
	r.offs, r.lens = r.offs[:0], r.lens[:0]
	le := binary.LittleEndian
	for i := 0; i < n; i++ {
		r.offs, r.lens = append(r.offs, le.Uint64(table[i*segLen:])), append(r.lens, le.Uint64(table[i*segLen+8:]))
	}
	got, hostOff, err := r.stager.Read(mem, r.offs, r.lens)
	if err != nil {
		return &recvErr{statusUnsupported, fmt.Errorf("tcp: read %d: copy from the GPU: %w", h.batch, err)}
	}
	if got < n {
		return &recvErr{statusUnsupported, fmt.Errorf("tcp: read %d: %d of %d blocks fit the staging buffer", h.batch, got, n)}
	}
	buf := r.stager.Buffer()
	var at uint64
	for i := 0; i < n; i++ {
		at += uint64(copy(out[at:at+r.lens[i]], buf[hostOff[i]:hostOff[i]+r.lens[i]]))
	}
	return nil
}
