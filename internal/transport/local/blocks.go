package local

import (
	"context"
	"fmt"
	"io"
	"time"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

var _ transport.Conn = (*Conn)(nil)

// blockChunk is how many runs WriteBlocks and ReadBlocks expand at a time
// (16 MiB of 8 KiB blocks: enough to spread over the copy streams).
const blockChunk = 2048

// writeBlocks is the kind's block-id write (Handlers.WriteBlocks): under one hold of the
// connection, one begin pins every destination region of the request at
// once (the receiver answers them all in one reply, with the descriptors
// and handles of those not mapped here yet; mappings are cached), then
// each (source region, destination region) stretch is expanded and copied
// chunk by chunk (nothing is expanded before the first copy), and one end
// lets every pin go and counts the request landed: two messages each way
// however many regions it names (a request over more than maxSetKeys
// regions takes one such exchange per maxSetKeys). Nothing per stretch is
// allocated. On a failure or a cut-off the set is aborted after every
// copy started has ended, before WriteBlocks returns: no copy runs after
// the answer.
func (c *Conn) writeBlocks(ctx context.Context, w *transport.Blocks, sc *transport.BlockScratch) (transport.Stats, error) {
	return c.blocks(ctx, w.Pair, w.IDs, len(w.Local), len(w.Remote), false, sc, func(sr, dr uint32) (transport.Registration, transport.RemoteRegion) {
		return w.Local[sr], w.Remote[dr]
	})
}

// readBlocks is the kind's block-id read (Handlers.ReadBlocks): writeBlocks with the copy
// running the other way, from the peer's regions into ours.
func (c *Conn) readBlocks(ctx context.Context, r *transport.Blocks, sc *transport.BlockScratch) (transport.Stats, error) {
	return c.blocks(ctx, r.Pair, r.IDs, len(r.Remote), len(r.Local), true, sc, func(sr, dr uint32) (transport.Registration, transport.RemoteRegion) {
		return r.Local[dr], r.Remote[sr]
	})
}

// slot is one peer region of a block request's set: its key, whether the
// begin asks for its memory, the first stretch that names it (errors name
// that stretch and region) and, once begun, its mapping here.
type slot struct {
	key    uint64
	flags  uint32
	group  int
	sr, dr uint32
	rm     *remote
}

// blocks moves a block request: regions(sr, dr) is our registration and
// the peer's region of a stretch (a write's source and destination, a
// pull's destination and source).
func (c *Conn) blocks(ctx context.Context, p *layout.Pair, ids layout.IDs, nsrc, ndst int, read bool, sc *transport.BlockScratch,
	regions func(sr, dr uint32) (transport.Registration, transport.RemoteRegion)) (st transport.Stats, err error) {
	waited, err := c.lockCtx(ctx)
	if err != nil {
		return st, err
	}
	defer c.unlock()
	defer func() { st.Post += waited }() // a batch queued behind another: handed over late
	bound, err := c.bind(ctx)
	if err != nil {
		return st, err
	}
	defer bound.release()
	defer func() { c.set = 0 }()
	var endFlags uint32
	if read {
		endFlags = flagRead
	}
	t0 := time.Now()
	planned := false
	ng := p.NumGroups()
	if cap(c.groupOf) < ng {
		c.groupOf = make([]int32, ng)
	}
	if c.slotOf == nil {
		c.slotOf = make(map[uint64]int32, maxSetKeys)
	}
	for g0 := 0; g0 < ng; {
		// The set: the peer regions of groups g0..g1-1, at most maxSetKeys.
		c.setNext()
		g1 := g0
		for ; g1 < ng; g1++ {
			sr, dr := p.GroupRegions(g1)
			if int(sr) >= nsrc || int(dr) >= ndst {
				return st, &transport.StretchError{Group: uint32(g1), SrcRegion: sr, DstRegion: dr,
					Err: fmt.Errorf("%w: samehost: segment group %d names region (source %d, destination %d) beyond the %d sources and %d destinations given", errs.ErrInvalidArgument, g1, sr, dr, nsrc, ndst)}
			}
			_, remote := regions(sr, dr)
			k, ok := c.slotOf[remote.Key.Key]
			if !ok {
				if len(c.slots) == maxSetKeys {
					break
				}
				k = int32(len(c.slots))
				c.slotOf[remote.Key.Key] = k
				c.slots = append(c.slots, slot{key: remote.Key.Key, group: g1, sr: sr, dr: dr})
			}
			c.groupOf[g1] = k
		}
		if err := ctx.Err(); err != nil {
			s := &c.slots[0]
			return st, &transport.StretchError{Group: uint32(s.group), SrcRegion: s.sr, DstRegion: s.dr, Err: err}
		}
		if !planned {
			st.Plan, planned = time.Since(t0), true
		}
		if err := c.beginSet(ctx, read, regions); err != nil {
			return st, err
		}
		var setSegs, setBytes uint64
		for s0 := g0; s0 < g1; {
			sr, dr := p.GroupRegions(s0)
			s1, runs := s0, 0
			for ; s1 < g1; s1++ {
				if s, d := p.GroupRegions(s1); s != sr || d != dr {
					break
				}
				runs += p.GroupRuns(ids, s1)
			}
			fail := func(err error) (transport.Stats, error) {
				_ = c.abort() // after the copies ended: copy returns only then
				return st, &transport.StretchError{Group: uint32(s0), SrcRegion: sr, DstRegion: dr, Err: err}
			}
			if err := ctx.Err(); err != nil {
				return fail(err)
			}
			local, _ := regions(sr, dr)
			sm := local.Memory()
			rm := c.slots[c.groupOf[s0]].rm
			srcLen, dstLen := sm.Len, rm.size
			if read {
				srcLen, dstLen = rm.size, sm.Len
			}
			// Every group inside both regions: no run can fall outside, and
			// the stretch is copied chunk by chunk. Else (a region smaller
			// than its layout says) the whole stretch is checked run by run
			// before its first byte.
			limit := blockChunk
			for g := s0; g < s1; g++ {
				if se, de := p.GroupEnds(g); se > srcLen || de > dstLen {
					limit = runs
					break
				}
			}
			c.pinHostSide(local, sm, rm)
			cur := p.Seek(ids, s0, 0)
			for left := runs; left > 0; {
				c.chunk = sc.ExpandChunk(p, ids, &cur, min(left, limit))
				b := &c.chunk
				if b.N() == 0 {
					return fail(fmt.Errorf("samehost: expansion ended %d runs early", left))
				}
				left -= b.N()
				if err := checkBounds(b, srcLen, dstLen); err != nil {
					return fail(err)
				}
				post, err := c.copy(ctx, sm, rm, b, read)
				st.Post += post
				setSegs, setBytes = setSegs+uint64(b.N()), setBytes+b.Bytes()
				if err != nil {
					return fail(err)
				}
			}
			st.WorkRequests++
			s0 = s1
		}
		st.Segments += setSegs
		if err := c.end(ctx, endFlags, 0, setSegs, setBytes); err != nil {
			return st, err
		}
		g0 = g1
	}
	if !planned {
		st.Plan = time.Since(t0)
	}
	return st, nil
}

// setNext starts a new set: a number never used before on c, no slots.
// c.mu is held.
func (c *Conn) setNext() {
	c.setSeq++
	c.set = c.setSeq
	c.slots = c.slots[:0]
	clear(c.slotOf)
}

// beginSet pins every slot's key on the peer in one exchange and sets each
// slot's mapping: the cached one, else one made from the reply. On success
// the pins are held until the caller's end or abort; on failure none is,
// and the error names the slot's first stretch and region. c.mu is held.
func (c *Conn) beginSet(ctx context.Context, read bool, regions func(sr, dr uint32) (transport.Registration, transport.RemoteRegion)) error {
	n := len(c.slots)
	if c.setBuf == nil {
		c.setBuf = make([]byte, requestSize+maxSetKeys*setEntrySize, max(requestSize+maxSetKeys*setEntrySize, maxSetBody))
	}
	var flags uint32
	if read {
		flags = flagRead
	}
	maps := 0
	for i := range c.slots {
		s := &c.slots[i]
		local, _ := regions(s.sr, s.dr)
		sm := local.Memory()
		rm := c.cache[s.key]
		if rm != nil && (rm.read != read || rm.kind == kindCUDA && sm.Kind == memory.CUDA && rm.dev != sm.Device) {
			// Never a read-only mapping for a write, nor the reverse; a
			// GPU handle is opened on the first stretch's source device.
			c.drop(s.key)
			rm = nil
		}
		s.rm, s.flags = rm, 0
		if rm == nil {
			s.flags = flagMap
			maps++
		} else {
			rm.set = c.set
		}
		e := setEntry{key: s.key, flags: s.flags}
		e.put(c.setBuf[requestSize+i*setEntrySize:])
	}
	(&request{op: opBeginSet, flags: flags, a: uint64(n)}).put(c.setBuf[:requestSize])
	if _, err := c.c.Write(c.setBuf[:requestSize+n*setEntrySize]); err != nil {
		return c.slotErr(0, c.ctxErr(ctx, c.fail(fmt.Errorf("write request: %w", err))))
	}
	// The header, with the descriptors when maps were asked for (recvmsg
	// allocates: only then).
	c.setFDs = c.setFDs[:0]
	var rn int
	var err error
	if maps > 0 {
		if c.setOOB == nil {
			c.setOOB = make([]byte, unix.CmsgSpace(4*maxSetKeys))
		}
		var oobn int
		rn, oobn, _, _, err = c.c.ReadMsgUnix(c.rep[:], c.setOOB)
		if oobn > 0 {
			if msgs, perr := unix.ParseSocketControlMessage(c.setOOB[:oobn]); perr == nil {
				for _, m := range msgs {
					if fds, ferr := unix.ParseUnixRights(&m); ferr == nil {
						c.setFDs = append(c.setFDs, fds...)
					}
				}
			}
		}
	}
	defer c.closeSetFDs()
	if err == nil && rn < replySize {
		_, err = io.ReadFull(c.c, c.rep[rn:])
	}
	if err != nil {
		return c.slotErr(0, c.ctxErr(ctx, c.fail(fmt.Errorf("read reply: %w", err))))
	}
	r, err := parseSetReply(c.rep[:])
	if err != nil {
		return c.slotErr(0, c.fail(err))
	}
	if r.status != statusOK {
		msg := c.msg[:0]
		if r.msgLen > 0 {
			if cap(c.msg) < int(r.msgLen) {
				c.msg = make([]byte, 0, r.msgLen)
			}
			msg = c.msg[:r.msgLen]
			if _, err := io.ReadFull(c.c, msg); err != nil {
				return c.slotErr(0, c.ctxErr(ctx, c.fail(fmt.Errorf("read reply message: %w", err))))
			}
		}
		if r.size >= uint64(n) {
			return c.slotErr(0, c.fail(fmt.Errorf("%w: the set's refusal names key %d of %d", errs.ErrInvalidArgument, r.size, n)))
		}
		// A refused key (deregistered, un-exported, rekeyed) drops what we
		// mapped for it; the peer let every pin of the set go.
		i := int(r.size)
		c.drop(c.slots[i].key)
		_, remote := regions(c.slots[i].sr, c.slots[i].dr)
		if read {
			return c.slotErr(i, fmt.Errorf("%w: samehost: peer refused the read of region %q: %s", statusErr(r.status), remote.Name, msg))
		}
		return c.slotErr(i, fmt.Errorf("%w: samehost: peer refused dst_region %q: %s", statusErr(r.status), remote.Name, msg))
	}
	if r.size != uint64(n) || int(r.fds) != len(c.setFDs) || r.msgLen != 0 {
		return c.slotErr(0, c.fail(fmt.Errorf("%w: the set's reply answers %d of %d keys with %d descriptors (%d came)", errs.ErrInvalidArgument, r.size, n, r.fds, len(c.setFDs))))
	}
	body := c.setBuf[:r.offset]
	if _, err := io.ReadFull(c.c, body); err != nil {
		return c.slotErr(0, c.ctxErr(ctx, c.fail(fmt.Errorf("read the set's answers: %w", err))))
	}
	// Every answer is read and checked before any is mapped: a bad one
	// leaves nothing half made.
	nextFD := 0
	for i := range c.slots {
		a, _, _, rest, err := parseSetAnswer(body, i)
		if err == nil && (a.flags&setFD != 0) != (c.slots[i].flags&flagMap != 0 && a.kind == kindHost) {
			err = fmt.Errorf("%w: samehost set reply: answer %d: descriptor flag does not match the request", errs.ErrInvalidArgument, i)
		}
		if err == nil && (a.flags&setHandle != 0) != (c.slots[i].flags&flagMap != 0 && a.kind == kindCUDA) {
			err = fmt.Errorf("%w: samehost set reply: answer %d: handle flag does not match the request", errs.ErrInvalidArgument, i)
		}
		if err != nil {
			_ = c.abort()
			return c.slotErr(i, c.fail(err))
		}
		if a.flags&setFD != 0 {
			nextFD++
		}
		body = rest
	}
	if nextFD != len(c.setFDs) || len(body) != 0 {
		_ = c.abort()
		return c.slotErr(0, c.fail(fmt.Errorf("%w: samehost set reply: %d descriptors for %d answers that carry one, %d bytes left over", errs.ErrInvalidArgument, len(c.setFDs), nextFD, len(body))))
	}
	body, nextFD = c.setBuf[:r.offset], 0
	for i := range c.slots {
		s := &c.slots[i]
		a, bus, handle, rest, _ := parseSetAnswer(body, i)
		body = rest
		fd := -1
		if a.flags&setFD != 0 {
			fd, c.setFDs[nextFD] = c.setFDs[nextFD], -1 // mapRemote closes it
			nextFD++
		}
		if s.rm != nil {
			continue
		}
		local, remote := regions(s.sr, s.dr)
		t0 := time.Now()
		rm, err := c.mapRemote(a.kind, a.size, a.offset, bus, handle, fd, local.Memory(), read)
		if err != nil {
			_ = c.abort()
			return c.slotErr(i, err)
		}
		c.t.log.Debug("samehost: mapped a destination", "dst_region", remote.Name, "bytes", rm.size, "took", time.Since(t0))
		c.cacheAdd(s.key, rm)
		s.rm = rm
	}
	return nil
}

// closeSetFDs closes the descriptors a set's reply brought that were not
// handed to mapRemote.
func (c *Conn) closeSetFDs() {
	for _, fd := range c.setFDs {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
	c.setFDs = c.setFDs[:0]
}

// slotErr names slot i's first stretch.
func (c *Conn) slotErr(i int, err error) error {
	s := &c.slots[i]
	return &transport.StretchError{Group: uint32(s.group), SrcRegion: s.sr, DstRegion: s.dr, Err: err}
}
