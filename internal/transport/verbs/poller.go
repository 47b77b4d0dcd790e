package verbs

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
	ibv "github.com/b2bd/b2bd/verbs"
)

// poller is the transport's one completion thread: it polls every set's CQ
// (a batch of WCs per cgo call), returns send credits, counts immediates,
// lands batches and sends their acks, reposts SRQ receives, and reacts to
// async events. It spins for PollSpin after the last completion, then arms
// the CQs, re-polls (a completion may have slipped in before arming), and
// sleeps on the completion channel: the test VMs have one or two vCPUs, so
// a poller that only spun would starve the writers and the kernel's rxe.
type poller struct {
	t       *Transport
	w       *ibv.Waiter
	wcs     *ibv.WCBuf
	wcCap   int
	list    atomic.Pointer[[]*qpSet]
	reqs    chan chan struct{}
	drops   chan *qpSet // receiving sets their senders disconnected
	quit    atomic.Bool
	started bool
	done    chan struct{}
	repost  []uint32
	async   [16]ibv.AsyncEvent
	dying   []*qpSet
	spin    time.Duration
	tick    time.Duration
	msg     message
	now     time.Time
}

func newPoller(t *Transport) (*poller, error) {
	w, err := ibv.NewWaiter(t.cch.FD(), t.ctx.AsyncFD())
	if err != nil {
		return nil, err
	}
	const wcCap = 64
	wcs, err := ibv.NewWCBuf(wcCap)
	if err != nil {
		w.Close()
		return nil, err
	}
	p := &poller{t: t, w: w, wcs: wcs, wcCap: wcCap, reqs: make(chan chan struct{}, 16), drops: make(chan *qpSet, 16), done: make(chan struct{}),
		repost: make([]uint32, 0, t.cfg.SRQDepth), spin: t.cfg.PollSpin}
	if runtime.GOMAXPROCS(0) < 2 {
		p.spin = 0 // spinning would hold the only P and starve everything else
	}
	p.tick = min(max(t.cfg.KeepAlive/4, 10*time.Millisecond), time.Second)
	empty := []*qpSet{}
	p.list.Store(&empty)
	return p, nil
}

func (p *poller) start() {
	p.started = true
	go p.run()
}

// stop ends the poller goroutine and waits for it.
func (p *poller) stop() {
	if !p.started || p.quit.Swap(true) {
		if p.started {
			<-p.done
		}
		return
	}
	p.w.Wake()
	<-p.done
}

// sync returns once the poller has finished the loop iteration it was in,
// so it no longer holds a set detached before the call.
func (p *poller) sync() {
	if !p.started || p.quit.Load() {
		return
	}
	ch := make(chan struct{})
	select {
	case p.reqs <- ch:
	case <-p.done:
		return
	}
	p.w.Wake()
	select {
	case <-ch:
	case <-p.done:
	}
}

func (p *poller) close() error {
	p.wcs.Close()
	return p.w.Close()
}

func (p *poller) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(p.done)
	t := p.t
	last := time.Now()
	for !p.quit.Load() {
		p.serve()
		// pollAll may reap (destroy) sets: each step below takes the list
		// afresh, never a snapshot that could still hold a destroyed CQ.
		if p.pollAll(*p.list.Load()) > 0 {
			last = p.now
			continue
		}
		if p.spin > 0 && time.Since(last) < p.spin {
			continue
		}
		sets := *p.list.Load()
		for _, s := range sets {
			if err := s.cq.Arm(); err != nil {
				p.setFailed(s, fmt.Errorf("%w (%w)", err, errs.ErrAborted))
			}
		}
		if p.pollAll(sets) > 0 { // completions that came before arming
			last = p.now
			continue
		}
		ready, err := p.w.Wait(p.tick)
		if err != nil {
			if p.quit.Load() {
				return
			}
			t.log.Error("verbs poller wait failed", "error", err)
			time.Sleep(10 * time.Millisecond)
		}
		if ready&ibv.ReadyCQ != 0 {
			t.cch.DrainEvents()
		}
		if ready&ibv.ReadyAsync != 0 {
			p.handleAsync()
		}
		p.housekeeping(*p.list.Load())
		last = time.Now()
	}
}

// serve acknowledges sync requests and drops disconnected sets.
func (p *poller) serve() {
	for {
		select {
		case ch := <-p.reqs:
			close(ch)
		case s := <-p.drops:
			p.t.log.Info("verbs connection closed by peer over the control plane", "peer", s.peer, "conn", s.id)
			p.setFailed(s, fmt.Errorf("verbs: connection closed by %s: %w", s.peer, errs.ErrAborted))
		default:
			return
		}
	}
}

// drop hands a receiving set to the poller to tear down.
func (p *poller) drop(s *qpSet) {
	select {
	case p.drops <- s:
		p.w.Wake()
	case <-p.done:
	}
}

// pollAll drains every CQ once; it returns the completions handled.
func (p *poller) pollAll(sets []*qpSet) int {
	total := 0
	p.now = time.Now()
	for _, s := range sets {
		for {
			n, err := s.cq.Poll(p.wcs)
			if err != nil {
				p.setFailed(s, fmt.Errorf("%w (%w)", err, errs.ErrAborted))
				break
			}
			for k := 0; k < n; k++ {
				w := p.wcs.At(k)
				p.handle(s, &w)
			}
			total += n
			if n < p.wcCap {
				break
			}
		}
	}
	if len(p.repost) > 0 {
		t := p.t
		if err := t.srq.PostRecv(p.repost, t.rmr.Addr(), recvBufLen, t.rmr.LKey()); err != nil {
			t.log.Error("verbs: reposting SRQ receives failed; receive capacity shrinks", "n", len(p.repost), "error", err)
		}
		p.repost = p.repost[:0]
	}
	if len(p.dying) > 0 {
		p.reap()
	}
	return total
}

func (p *poller) handle(s *qpSet, w *ibv.WC) {
	if isRecvID(w.WRID) {
		p.repost = append(p.repost, uint32(w.WRID))
		if w.Status != ibv.WCSuccess {
			p.setFailed(s, wcError(s, w))
			return
		}
		s.lastRecv = p.now
		switch {
		case w.Opcode == ibv.WCRecvRDMAWithIm:
			if !s.sender {
				p.onImm(s, w.Imm)
			}
		case w.HasImm():
			if w.Imm != pingImm && s.sender {
				s.lastAck.Store(w.Imm)
				notify(s.ackSig)
			}
		default:
			off := int(w.WRID) * recvBufLen
			if !p.msg.decode(p.t.rmem.Bytes()[off : off+recvBufLen]) {
				p.t.log.Warn("verbs: malformed control message ignored", "peer", s.peer, "bytes", w.ByteLen)
				return
			}
			p.onMsg(s, w.QPNum)
		}
		return
	}
	q := s.qpByNum(w.QPNum)
	seq, kind, _ := ibv.SplitWRID(w.WRID)
	if w.Status != ibv.WCSuccess {
		p.setFailed(s, wcError(s, w))
		if q != nil {
			q.done.Store(seq)
		}
		if s.sender {
			notify(s.credSig)
		}
		return
	}
	if q != nil {
		q.done.Store(seq)
	}
	if kind == ibv.KindPing {
		s.pinging = false
	}
	if s.sender {
		notify(s.credSig)
	}
}

// wcError describes a failed completion: status string, QP, and what the
// WR carried (the first block, for data).
func wcError(s *qpSet, w *ibv.WC) error {
	st := ibv.StatusString(w.Status)
	if isRecvID(w.WRID) {
		return fmt.Errorf("verbs: connection %s (%d): receive completion on QP %d failed: %s (status %d, vendor_err %#x): %w",
			s.peer, s.id, w.QPNum, st, w.Status, w.VendorErr, errs.ErrAborted)
	}
	seq, kind, blk := ibv.SplitWRID(w.WRID)
	var what string
	switch kind {
	case ibv.KindData:
		what = fmt.Sprintf("RDMA WRITE starting at batch block %d (WR #%d on the QP)", blk, seq)
	case ibv.KindRead:
		what = fmt.Sprintf("RDMA READ starting at batch block %d (WR #%d on the QP)", blk, seq)
	case ibv.KindMeta:
		what = fmt.Sprintf("batch meta SEND (WR #%d)", seq)
	case ibv.KindAck:
		what = fmt.Sprintf("batch ack SEND (WR #%d)", seq)
	case ibv.KindBye:
		what = "goodbye SEND"
	case ibv.KindPing:
		what = "keepalive SEND"
	default:
		what = fmt.Sprintf("wr_id %#x", w.WRID)
	}
	if kind == ibv.KindRead && w.Status == ibv.WCRemAccessErr {
		return fmt.Errorf("verbs: work completion on QP %d to %s failed: %s (status %d, vendor_err %#x) for %s: the source's rkey is not valid there for READ (region deregistered, its read grant narrowed and the key revoked, or a key that grants no READ); batch aborted: %w",
			w.QPNum, s.peer, st, w.Status, w.VendorErr, what, errs.ErrAborted)
	}
	if kind == ibv.KindData && w.Status == ibv.WCRemAccessErr {
		// Bounds are checked before posting, so the remote NIC refused the
		// rkey itself: deregistered, or revoked by a narrowed export. Still
		// Aborted (the connection broke; the peer manager forgets the
		// peer's resolved keys with it, so the next attempt resolves afresh).
		return fmt.Errorf("verbs: work completion on QP %d to %s failed: %s (status %d, vendor_err %#x) for %s: the destination's rkey is not valid there (region deregistered, or its export narrowed and the key revoked); batch aborted: %w",
			w.QPNum, s.peer, st, w.Status, w.VendorErr, what, errs.ErrAborted)
	}
	return fmt.Errorf("verbs: work completion on QP %d to %s failed: %s (status %d, vendor_err %#x) for %s; batch aborted: %w",
		w.QPNum, s.peer, st, w.Status, w.VendorErr, what, errs.ErrAborted)
}

// setFailed breaks a set; a receiving set is also torn down (its sender
// will reconnect), after the current poll round.
func (p *poller) setFailed(s *qpSet, err error) {
	first := s.Err() == nil
	s.fail(err, true)
	if !s.sender && first {
		p.dying = append(p.dying, s)
	}
}

// reap tears down receiving sets that failed or said goodbye.
func (p *poller) reap() {
	for _, s := range p.dying {
		p.t.detach(s, false)
		s.destroy()
	}
	p.dying = p.dying[:0]
}

func (p *poller) slot(s *qpSet, tag uint32) *rxSlot {
	sl := &s.rx[tag%uint32(len(s.rx))]
	if !sl.active || sl.tag != tag {
		sl.unpin() // a stale batch of an aborted sender
		keys, pins := sl.keys[:0], sl.pins[:0]
		*sl = rxSlot{active: true, tag: tag, keys: keys, pins: pins}
	}
	return sl
}

func (p *poller) onImm(s *qpSet, tag uint32) {
	sl := p.slot(s, tag)
	sl.got++
	p.maybeLand(s, sl)
}

func (p *poller) onMsg(s *qpSet, qpn uint32) {
	m := &p.msg
	switch m.kind {
	case msgBye:
		if !s.sender {
			p.t.log.Info("verbs connection closed by peer", "peer", s.peer, "conn", s.id)
			s.fail(fmt.Errorf("verbs: connection closed by %s: %w", s.peer, errs.ErrAborted), false)
			p.dying = append(p.dying, s)
		}
	case msgCancel:
		if !s.sender {
			p.onCancel(s, m.tag, qpn)
		}
	case msgKeys:
		if s.sender {
			return
		}
		sl := p.slot(s, m.tag)
		if int(m.first) != len(sl.keys) || len(sl.keys)+int(m.nkeys) > maxBatchKeys {
			if !sl.refused {
				sl.refused, sl.why = true, fmt.Errorf("keys message of batch %d starts at key %d, expected %d", m.tag, m.first, len(sl.keys))
			}
			return
		}
		sl.keys = append(sl.keys, m.keys[:m.nkeys]...)
	case msgMeta:
		if s.sender {
			return
		}
		sl := p.slot(s, m.tag)
		sl.meta = true
		sl.nqp, sl.blocks, sl.bytes = m.nqp, m.blocks, m.bytes
		sl.metaQP = 0
		for k, q := range s.qps {
			if q.qp.Num() == qpn {
				sl.metaQP = k
			}
		}
		if m.nkeys > 0 {
			p.pinKeys(sl, m.nkeys)
		} else if in := p.t.in; in != nil && sl.release == nil && !sl.refused {
			// The pin keeps the region registered from here to the ack (it
			// is released right before the ack is posted, so a sender that
			// saw the ack may deregister at once). A destination that cannot
			// be pinned (deregistered, un-exported, key revoked) refuses the
			// batch: the ack carries refuseBit and the sender fails it with
			// NotFound; it is never accounted or acked as landed.
			//
			// Ordering: the meta SEND goes first on one QP, but WRITEs on
			// the batch's other QPs may land before the poller sees it, so
			// the pin cannot cover them. The MR guards that window: while it
			// is registered, those bytes land in the region's own memory (a
			// batch then refused still reports failure, never success);
			// once it is deregistered (Deregister, or a revoked key whose
			// batches drained), the WRITEs fail at the NIC with a remote
			// access error and never land anywhere.
			//
			// The MR is held first, then the region pinned: a Rekey that
			// comes between makes the pin fail (the key left the registry),
			// and one that comes after finds the MR in use and keeps it
			// registered until this batch is acked.
			sl.reg, sl.mr = p.t.useRKey(m.rkey)
			if _, release, err := in.Pin(transport.Verbs, uint64(m.rkey)); err == nil {
				sl.release = release
			} else {
				sl.unpin()
				sl.refused, sl.why = true, err
			}
		}
		p.maybeLand(s, sl)
	}
}

// onCancel drops batch tag, which its sender stopped after every WR it
// posted had completed: nothing of it is accounted as landed, what it
// pinned is released, and the sender hears tag|refuseBit on the QP the
// cancel came on. A batch no longer active landed and was acked before the
// cancel arrived (its ack told the sender), so nothing is sent then.
func (p *poller) onCancel(s *qpSet, tag, qpn uint32) {
	sl := &s.rx[tag%uint32(len(s.rx))]
	if !sl.active || sl.tag != tag {
		return
	}
	sl.unpin()
	sl.active, sl.meta, sl.refused, sl.why = false, false, false, nil
	q := s.qpByNum(qpn)
	if q == nil {
		return
	}
	if q.avail() < 1 {
		p.setFailed(s, fmt.Errorf("verbs: no send credit to answer the cancel of batch %d from %s: %w", tag, s.peer, errs.ErrAborted))
		return
	}
	q.posted++
	if err := q.qp.PostSend(ibv.WRID(q.posted, ibv.KindAck, 0x0FFFFFFF), ibv.WRSendWithImm, tag|refuseBit, 0, 0, 0, true); err != nil {
		q.posted--
		p.setFailed(s, err)
	}
}

// pinKeys pins every destination of a multi-region batch (a block
// request), as a one-region meta pins its rkey: each MR held, then each
// region pinned. If any cannot be, the batch is refused, whichever it was,
// and nothing stays pinned.
func (p *poller) pinKeys(sl *rxSlot, nkeys uint32) {
	if sl.refused || len(sl.pins) > 0 {
		return
	}
	if len(sl.keys) != int(nkeys) {
		sl.refused, sl.why = true, fmt.Errorf("batch %d names %d destination keys, %d arrived", sl.tag, nkeys, len(sl.keys))
		return
	}
	in := p.t.in
	if in == nil {
		return
	}
	for _, k := range sl.keys {
		var pn rxPin
		pn.reg, pn.mr = p.t.useRKey(k)
		_, release, err := in.Pin(transport.Verbs, uint64(k))
		if err != nil {
			if pn.mr != nil {
				pn.reg.done(pn.mr)
			}
			sl.unpin()
			sl.refused, sl.why = true, err
			return
		}
		pn.release = release
		sl.pins = append(sl.pins, pn)
	}
}

// maybeLand completes a batch once its meta and every QP's immediate are
// in: account it, unpin, and ack the sender with the tag.
func (p *poller) maybeLand(s *qpSet, sl *rxSlot) {
	if !sl.meta || sl.got < sl.nqp {
		return
	}
	imm := sl.tag
	if sl.refused {
		imm |= refuseBit
		p.t.log.Info("verbs: batch refused: its destination cannot be pinned", "peer", s.peer, "conn", s.id, "tag", sl.tag, "error", sl.why)
	} else if in := p.t.in; in != nil {
		in.Landed(transport.Verbs, sl.blocks, sl.bytes)
	}
	sl.unpin()
	sl.active, sl.why = false, nil
	q := s.qps[sl.metaQP]
	if q.avail() < 1 {
		p.setFailed(s, fmt.Errorf("verbs: no send credit for the ack of batch %d to %s: %w", sl.tag, s.peer, errs.ErrAborted))
		return
	}
	q.posted++
	if err := q.qp.PostSend(ibv.WRID(q.posted, ibv.KindAck, 0x0FFFFFFF), ibv.WRSendWithImm, imm, 0, 0, 0, true); err != nil {
		q.posted--
		p.setFailed(s, err)
	}
}

func (p *poller) handleAsync() {
	t := p.t
	n := t.ctx.DrainAsync(p.async[:])
	for k := 0; k < n; k++ {
		ev := p.async[k]
		switch ev.Type {
		case ibv.EventQPFatal, ibv.EventQPReqErr, ibv.EventQPAccessErr:
			if s := t.setByQPN(ev.QPNum); s != nil {
				p.setFailed(s, fmt.Errorf("verbs: async event %q on QP %d to %s: %w", ibv.EventString(ev.Type), ev.QPNum, s.peer, errs.ErrAborted))
			}
		case ibv.EventDeviceFatal:
			t.log.Error("verbs: device fatal error; every connection fails")
			for _, s := range *p.list.Load() {
				p.setFailed(s, fmt.Errorf("verbs: device %s reported a fatal error: %w", t.ctx.Name(), errs.ErrAborted))
			}
		case ibv.EventPortErr:
			t.log.Warn("verbs: port went down", "port", ev.Port)
		case ibv.EventPortActive:
			t.log.Info("verbs: port active", "port", ev.Port)
		default:
			t.log.Debug("verbs async event", "event", ibv.EventString(ev.Type), "qp", ev.QPNum)
		}
	}
}

// housekeeping probes idle receiving sets so those of a vanished sender
// are found (the probe fails with a retry error) and freed. A set that
// holds a half-landed batch's pin is probed once idle for StallTimeout
// (when shorter than KeepAlive): its sender tells it when it gives up (a
// goodbye, or a disconnect over the control plane), but when neither can
// reach it (the sender's process died, or its control channel was closed
// under the disconnect) the destination region would stay pinned, and
// underegistrable, for a whole keepalive period.
func (p *poller) housekeeping(sets []*qpSet) {
	ka := p.t.cfg.KeepAlive
	pinIdle := p.t.cfg.StallTimeout
	if pinIdle <= 0 || pinIdle > ka {
		pinIdle = ka
	}
	now := time.Now()
	for _, s := range sets {
		if s.sender || s.pinging || s.Err() != nil {
			continue
		}
		if idle := now.Sub(s.lastRecv); idle < ka && (idle < pinIdle || !s.holdsPins()) {
			continue
		}
		q := s.qps[0]
		if q.avail() < 1 {
			continue
		}
		q.posted++
		if err := q.qp.PostSend(ibv.WRID(q.posted, ibv.KindPing, 0x0FFFFFFF), ibv.WRSendWithImm, pingImm, 0, 0, 0, true); err != nil {
			q.posted--
			p.setFailed(s, err)
			continue
		}
		s.pinging = true
		s.lastRecv = now
	}
	if len(p.dying) > 0 {
		p.reap()
	}
}

// holdsPins: some batch of the receiving set holds its destination (from
// its meta to its ack).
func (s *qpSet) holdsPins() bool {
	for i := range s.rx {
		if sl := &s.rx[i]; sl.active && (sl.release != nil || sl.mr != nil || len(sl.pins) > 0) {
			return true
		}
	}
	return false
}
