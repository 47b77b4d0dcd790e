package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/ring"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// The shared-memory ring (internal/ring) is asked for on the raw submit
// socket with a first frame tagged ring.Hello (no id arena) or
// ring.HelloArena. The ring belongs to the
// socket's caller (SO_PEERCRED): it submits only that caller's plans, and it
// is torn down when the socket closes.
const (
	ringIdle     = 500 * time.Millisecond
	ringParkPoll = time.Millisecond // retry parked completions this often
)

// ringConn is the daemon's side of one ring.
type ringConn struct {
	s      *Server
	c      net.Conn
	who    region.Caller
	reg    *ring.Region
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	slots  chan struct{}
	armed  chan struct{} // transfers waiting for key notes (runArmed)

	inMu     sync.Mutex
	inflight map[uint64]context.CancelFunc // submits and watches by tag
	watches  int

	cqMu    sync.Mutex
	cqTail  uint32
	parked  []ring.Completion // waiting for room in the completion ring
	parkMax int
	dead    bool
	once    sync.Once
}

// serveRing sets up a ring for who on c and serves it until c closes or the
// client breaks the protocol.
func (s *Server) serveRing(ctx context.Context, c net.Conn, who region.Caller, tag, sizes uint64) {
	sq, cq, arena, err := ring.ParseHello(tag, sizes)
	if err != nil {
		ringAnswer(c, err)
		return
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		ringAnswer(c, fmt.Errorf("%w: a ring needs a Unix socket", errs.ErrFailedPrecondition))
		return
	}
	fd, reg, err := ring.Create(sq, cq, arena)
	if err != nil {
		ringAnswer(c, err)
		return
	}
	err = ringAnswerTo(uc, nil, fd)
	unix.Close(fd)
	if err != nil {
		reg.Close()
		return
	}
	rc := &ringConn{s: s, c: c, who: who, reg: reg, slots: make(chan struct{}, StreamInFlight), armed: make(chan struct{}, MaxArmed),
		inflight: map[uint64]context.CancelFunc{}, parkMax: int(cq) + StreamInFlight + MaxArmed + MaxWatches}
	rc.ctx, rc.cancel = context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { // the socket's end is the ring's
		defer close(watched)
		var b [64]byte
		for {
			if _, err := c.Read(b[:]); err != nil {
				break
			}
		}
		rc.cancel()
		reg.SQ.Wake()
	}()
	rc.consume()
	rc.cancel()
	c.Close()
	<-watched
	rc.wg.Wait()
	reg.Close()
}

// consume reads submission records until the ring ends.
func (rc *ringConn) consume() {
	var head uint32
	var rec [ring.RecLen]byte
	for rc.ctx.Err() == nil {
		n, err := rc.reg.SQ.Ready(head)
		if err != nil {
			rc.drop(err)
			return
		}
		if n == 0 {
			wait := ringIdle
			if rc.flush() {
				wait = ringParkPoll
			}
			// Let what the records just handled made runnable go first:
			// the futex wait below is a raw syscall that keeps this P,
			// and a goroutine queued globally (gRPC's writer after its
			// yield, with a note an armed transfer sent) would wait for
			// another P or sysmon. Prefill's fired "ready" note reached
			// the socket 54-70 us after its Send at the median (p75
			// 90-170) on the loaded 2-core host; 30-37 (p75 70) so.
			runtime.Gosched()
			rc.reg.SQ.Wait(head, ring.Spin(), wait)
			continue
		}
		for range n {
			copy(rec[:], rc.reg.SQ.Slot(head)) // decoded from this copy only
			req, err := ring.Decode(rec[:])
			var ids arenaIDs
			// What a record points at in the arena is copied out before
			// the head passes the record: the client may reuse the arena
			// space from then on.
			switch {
			case err == nil && req.Op == ring.OpBatch:
				ids.batch, err = req.BatchFromArena(rc.reg.Arena)
			case err == nil && req.Op == ring.OpNotify:
				ids.noteRegion, ids.note, err = req.NotifyFromArena(rc.reg.Arena)
			case err == nil && req.Op == ring.OpWatch:
				ids.noteRegion, err = req.WatchFromArena(rc.reg.Arena)
			case err == nil && req.Arena:
				ids.local, ids.remote, ids.note, err = req.FromArena(rc.reg.Arena)
				if err == nil && req.Armed {
					ids.trigRegion, ids.trigKey, err = req.TriggerFromArena(rc.reg.Arena)
				}
			}
			head++
			rc.reg.SQ.Consumed(head)
			rc.handle(req, err, ids)
		}
	}
}

// arenaIDs is what an arena record pointed at, copied out: a block
// record's ids and note, or a batch record's request.
type arenaIDs struct {
	local, remote, note []byte
	batch               ring.Batch
	trigRegion          string // an armed record's key-note trigger
	trigKey             []byte
	noteRegion          string // a notify record's region (its note in note)
}

// handle answers or starts req, as decoded (err: refused).
func (rc *ringConn) handle(req ring.Request, err error, ids arenaIDs) {
	if err != nil {
		rc.complete(fail(req.Tag, err))
		return
	}
	switch req.Op {
	case ring.OpPing:
		rc.complete(ring.Completion{Tag: req.Tag})
	case ring.OpCancel:
		rc.inMu.Lock()
		cancel, ok := rc.inflight[req.Target]
		rc.inMu.Unlock()
		if !ok {
			rc.complete(fail(req.Tag, fmt.Errorf("%w: ring cancel: no submit or watch in flight under tag %d", errs.ErrNotFound, req.Target)))
			return
		}
		cancel()
		rc.complete(ring.Completion{Tag: req.Tag})
	case ring.OpSubmit:
		rc.run(req, "submit", func(ctx context.Context) (batch.Result, error) {
			return rc.s.batches.Plans().SubmitByCaller(ctx, rc.who, req.Handle)
		})
	case ring.OpBlocks:
		local, remote, note := ids.local, ids.remote, ids.note
		if !req.Arena {
			local, remote = req.PackedIDs()
		}
		do := func(ctx context.Context) (batch.Result, error) {
			return rc.s.batches.Routes().TransferNote(ctx, rc.who, req.Handle, local, remote, note)
		}
		if req.Armed {
			rc.runArmed(req, do, &batch.Trigger{NoteRegion: ids.trigRegion, NoteKey: ids.trigKey})
			return
		}
		rc.run(req, "blocks", do)
	case ring.OpNotify:
		// At once, here: a local note costs a lookup and the hub's fan-out.
		n, err := rc.s.notifyRegion(rc.who, ids.noteRegion, ids.note)
		if err != nil {
			rc.complete(fail(req.Tag, err))
			return
		}
		rc.complete(ring.Completion{Tag: req.Tag, Blocks: uint64(n)}) // blocks: the watchers that got it
	case ring.OpWatch:
		rc.watch(req, ids.noteRegion)
	case ring.OpBatch:
		r := ringBatchRequest(ids.batch, rc.who)
		rc.run(req, "batch", func(ctx context.Context) (batch.Result, error) {
			return rc.s.batches.Transfer(ctx, r)
		})
	}
}

// runArmed runs an armed block transfer: it waits for its key note in
// the daemon, not in one of the StreamInFlight slots that the ring's
// running transfers take (a client arms one per request it expects), at
// most MaxArmed at once; more are refused, not queued. Without a deadline
// it gets the daemon's default, so that a note that never comes cannot
// hold it for ever.
func (rc *ringConn) runArmed(req ring.Request, do func(context.Context) (batch.Result, error), after *batch.Trigger) {
	gate, release, err := rc.s.batches.Arm(after, rc.who)
	if err != nil {
		rc.complete(fail(req.Tag, err))
		return
	}
	select {
	case rc.armed <- struct{}{}:
	default:
		release()
		rc.complete(fail(req.Tag, fmt.Errorf("%w: ring blocks armed on key notes: %d already wait, the limit per ring", errs.ErrResourceExhausted, MaxArmed)))
		return
	}
	if req.TimeoutMs == 0 {
		req.TimeoutMs = uint64(rc.s.batches.DefaultTimeout().Milliseconds())
	}
	if !rc.start(req, "blocks", rc.armed, gate(do)) {
		release() // refused: the gated run that lets go never ran
	}
}

// MaxArmed bounds the transfers one ring holds armed on key notes.
const MaxArmed = 4096

// run runs a submit or a block transfer (what) under req's tag, at most
// StreamInFlight at once, and completes it as its RPC would answer.
func (rc *ringConn) run(req ring.Request, what string, do func(context.Context) (batch.Result, error)) {
	select {
	case rc.slots <- struct{}{}:
	case <-rc.ctx.Done():
		return
	}
	rc.start(req, what, rc.slots, do)
}

// start runs do under req's tag, holding a place in slots (taken by the
// caller) until it ends; false: refused (a tag in flight), do never ran.
func (rc *ringConn) start(req ring.Request, what string, slots chan struct{}, do func(context.Context) (batch.Result, error)) bool {
	rc.inMu.Lock()
	if _, dup := rc.inflight[req.Tag]; dup {
		rc.inMu.Unlock()
		<-slots
		rc.complete(fail(req.Tag, fmt.Errorf("%w: ring %s tag %d is already in flight", errs.ErrInvalidArgument, what, req.Tag)))
		return false
	}
	left := time.Duration(req.TimeoutMs) * time.Millisecond
	ctx, cancel := rc.ctx, context.CancelFunc(nil)
	if left > 0 { // the caller's deadline, as a gRPC call's metadata sends it
		ctx, cancel = batch.CallerDeadline(ctx, time.Now().Add(left))
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	rc.inflight[req.Tag] = cancel
	rc.inMu.Unlock()
	rc.wg.Add(1)
	go func() {
		defer rc.wg.Done()
		entry := time.Now()
		res, err := do(ctx)
		if obs := rc.s.observeSubmit; obs != nil { // a submit, a batch or a block transfer
			var resp *b2bv1.BatchTransferResponse
			if err == nil {
				resp = transferResponse(res)
			}
			obs(resp, grpcstatus.ToStatus(err), time.Since(entry).Seconds())
		}
		rc.inMu.Lock()
		delete(rc.inflight, req.Tag)
		rc.inMu.Unlock()
		cancel()
		<-slots
		if err != nil {
			if left > 0 {
				err = passed(grpcstatus.ToStatus(err), left)
			}
			rc.complete(fail(req.Tag, err))
			return
		}
		ph := &res.Phases
		rc.complete(ring.Completion{Tag: req.Tag, Blocks: res.Blocks, Bytes: res.Bytes, Msg: string(res.Kind),
			Wire: int64(ph.Wire), Total: int64(ph.Total),
			TriggerSeen: int64(unixNs(ph.TriggerSeen)), Posted: int64(unixNs(ph.Posted)), Landed: int64(unixNs(ph.Landed)),
			Figures: true, Segments: res.Stats.Segments, WorkRequests: res.Stats.WorkRequests,
			Validate: int64(ph.Validate), Resolve: int64(ph.Resolve), Plan: int64(ph.Plan), Post: int64(ph.Post),
			Notify: int64(ph.Notify), Armed: int64(ph.Armed)})
	}()
	// The consumer spins on its P (Queue.Wait), so the goroutine just made
	// would wait for an idle thread to wake and steal it: a futex wake, about
	// 60 us on the GPU host. Yielding runs it here at once, until it blocks
	// on the wire. A 1 x 128 B ring submit went from 114 to 55 us there.
	runtime.Gosched()
	return true
}

// fail is the completion for err: the code and message SubmitTransfer gives.
func fail(tag uint64, err error) ring.Completion {
	st := status.Convert(grpcstatus.ToStatus(err))
	return ring.Completion{Tag: tag, Code: uint32(st.Code()), Msg: st.Message()}
}

// complete posts c, parking it while the completion ring is full; a client
// that lets too many park loses its ring.
func (rc *ringConn) complete(c ring.Completion) {
	rc.cqMu.Lock()
	defer rc.cqMu.Unlock()
	if rc.dead {
		return
	}
	rc.parked = append(rc.parked, c)
	if len(rc.parked) > rc.parkMax {
		rc.dropLocked(fmt.Errorf("%w: ring completions: %d parked, limit %d: the client stopped reading its completion ring",
			errs.ErrResourceExhausted, len(rc.parked), rc.parkMax))
		return
	}
	rc.flushLocked()
}

// flush moves parked completions into the ring; true while some remain.
func (rc *ringConn) flush() bool {
	rc.cqMu.Lock()
	defer rc.cqMu.Unlock()
	if rc.dead || len(rc.parked) == 0 {
		return false
	}
	rc.flushLocked()
	return len(rc.parked) > 0
}

func (rc *ringConn) flushLocked() {
	q := &rc.reg.CQ
	free, err := q.Free(rc.cqTail)
	if err != nil {
		rc.dropLocked(err)
		return
	}
	n := min(int(free), len(rc.parked))
	if n == 0 {
		return
	}
	rc.postLocked(rc.parked[:n])
	rc.parked = rc.parked[:copy(rc.parked, rc.parked[n:])]
}

// postLocked writes cs into the completion ring, which has room for them,
// and publishes them. rc.cqMu is held.
func (rc *ringConn) postLocked(cs []ring.Completion) {
	q := &rc.reg.CQ
	for _, c := range cs {
		c.Encode(q.Slot(rc.cqTail))
		rc.cqTail++
	}
	q.Publish(rc.cqTail)
}

func (rc *ringConn) drop(err error) {
	rc.cqMu.Lock()
	defer rc.cqMu.Unlock()
	rc.dropLocked(err)
}

// dropLocked ends the ring: the client hears why on the socket (if it
// still listens, briefly), then the socket closes, which ends the rest.
func (rc *ringConn) dropLocked(err error) {
	rc.dead = true
	rc.parked = nil
	rc.once.Do(func() {
		rc.s.cfg.Log.Warn("ring dropped", "uid", rc.who.UID, "error", err)
		rc.cancel()
		rc.c.SetWriteDeadline(time.Now().Add(time.Second))
		ringAnswer(rc.c, err)
		rc.c.Close()
	})
}

// ringAnswer writes a raw answer frame tagged ring.Hello carrying err.
func ringAnswer(c net.Conn, err error) {
	c.Write(ringFrame(err))
}

// ringAnswerTo writes the answer frame with fd attached.
func ringAnswerTo(uc *net.UnixConn, err error, fd int) error {
	_, _, werr := uc.WriteMsgUnix(ringFrame(err), unix.UnixRights(fd), nil)
	return werr
}

func ringFrame(err error) []byte {
	out := make([]byte, RawAnswerLen, RawAnswerLen+ring.MsgMax)
	le := binary.LittleEndian
	le.PutUint64(out[0:], ring.Hello)
	if err != nil {
		c := fail(ring.Hello, err)
		var rec [ring.CompLen]byte
		c.Encode(rec[:]) // the same bound and marker as a completion's
		n := le.Uint32(rec[12:])
		le.PutUint32(out[8:], c.Code)
		le.PutUint32(out[12:], n)
		out = append(out, rec[48:48+n]...)
	}
	return out
}

// MaxWatches bounds a ring's watches (OpWatch): more are refused. A
// connector in push mode watches each layer's first region: 256 covers
// the deepest models.
const MaxWatches = 256

// watch serves a watch record: regionID's notes come back as note records
// under req's tag (ring.OpWatch) until an OpCancel names the tag or the
// ring ends. The region must be the caller's and exported, as
// WatchNotifications wants.
func (rc *ringConn) watch(req ring.Request, regionID string) {
	id, err := rc.s.watchable(rc.who, regionID)
	if err != nil {
		rc.complete(fail(req.Tag, err))
		return
	}
	ctx, cancel := context.WithCancel(rc.ctx)
	rc.inMu.Lock()
	_, dup := rc.inflight[req.Tag]
	full := rc.watches >= MaxWatches
	if !dup && !full {
		rc.inflight[req.Tag] = cancel
		rc.watches++
	}
	rc.inMu.Unlock()
	switch {
	case dup:
		cancel()
		rc.complete(fail(req.Tag, fmt.Errorf("%w: ring watch tag %d is already in flight", errs.ErrInvalidArgument, req.Tag)))
		return
	case full:
		cancel()
		rc.complete(fail(req.Tag, fmt.Errorf("%w: ring watches: %d already, the limit per ring", errs.ErrResourceExhausted, MaxWatches)))
		return
	}
	w := rc.s.cfg.Notify.Subscribe(id)
	unwatch := func() {
		rc.s.cfg.Notify.Unsubscribe(w)
		rc.inMu.Lock()
		delete(rc.inflight, req.Tag)
		rc.watches--
		rc.inMu.Unlock()
		cancel()
	}
	// Released or unexported between the check and the subscription: the
	// hub's End came before it.
	if _, err := rc.s.watchable(rc.who, id); err != nil {
		unwatch()
		rc.complete(fail(req.Tag, err))
		return
	}
	rc.complete(ring.Completion{Tag: req.Tag, Code: ring.CodeNote}) // subscribed: an empty note record
	rc.wg.Add(1)
	go func() {
		defer rc.wg.Done()
		defer unwatch()
		var frame []byte
		var recs []ring.Completion
		var lost uint64 // notes too large for the whole completion ring, told in the next frame
		for {
			var n notify.Notification
			select {
			case <-ctx.Done():
				if rc.ctx.Err() == nil { // cancelled by the client, not the ring's end
					rc.complete(fail(req.Tag, fmt.Errorf("ring watch of region %s: %w", id, context.Canceled)))
				}
				return
			case n = <-w.C:
			case <-w.Done():
				select {
				case n = <-w.C: // what came before the end goes first
				default:
					rc.complete(fail(req.Tag, fmt.Errorf("ring watch ended: %w", w.Err())))
					return
				}
			}
			frame = ring.AppendNoteFrame(frame[:0], ring.NoteFrame{Sender: n.Sender, Region: n.Region, Dropped: n.Dropped + lost, Note: n.Notification})
			recs = ring.NoteRecords(recs[:0], req.Tag, frame, n.Blocks, n.Bytes)
			if uint32(len(recs)) > rc.reg.CQ.Entries() {
				lost++ // it could never be posted whole (a client that asked for a tiny ring)
				continue
			}
			lost = 0
			for wait := ringNoteRetry; !rc.completeAll(recs); wait = min(2*wait, ringNoteRetryMax) {
				// No room for every part: wait for the client to read,
				// while later notes wait in the watcher's queue.
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
				case <-t.C:
				}
				if ctx.Err() != nil {
					break
				}
			}
		}
	}()
}

// A note waits for room in a full completion ring ringNoteRetry, then
// twice as long each time up to ringNoteRetryMax: a client that stopped
// reading costs its watches little.
const (
	ringNoteRetry    = 200 * time.Microsecond
	ringNoteRetryMax = 10 * time.Millisecond
)

// completeAll posts cs together, in order and back to back, if the
// completion ring has room for all of them now and nothing is parked
// before them; false: none was posted. A dead ring takes them all.
func (rc *ringConn) completeAll(cs []ring.Completion) bool {
	rc.cqMu.Lock()
	defer rc.cqMu.Unlock()
	if rc.dead {
		return true
	}
	if len(rc.parked) > 0 {
		return false
	}
	q := &rc.reg.CQ
	free, err := q.Free(rc.cqTail)
	if err != nil {
		rc.dropLocked(err)
		return true
	}
	if int(free) < len(cs) {
		return false
	}
	rc.postLocked(cs)
	return true
}
