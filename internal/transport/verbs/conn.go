package verbs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	ibv "github.com/b2bd/b2bd/verbs"
)

// qpState is one RC QP of a set with its chain scratch and credits.
type qpState struct {
	qp    *ibv.QP
	chain *ibv.Chain
	psn   uint32
	depth uint32
	// posted is the QP's WR sequence number: WRs ever posted. Only the
	// poster touches it (the writer holding sem on a sending set, the
	// poller on a receiving set).
	posted uint32
	// done is the sequence number of the last completed signaled WR; the
	// poller stores it, posters read it. posted-done WRs are in flight.
	done atomic.Uint32
}

// avail is the send-queue credits left.
func (q *qpState) avail() int { return int(q.depth) - int(q.posted-q.done.Load()) }

// rxSlot accounts one in-flight batch on a receiving set.
type rxSlot struct {
	active  bool
	meta    bool
	tag     uint32
	got     uint32 // immediates seen
	nqp     uint32
	blocks  uint64
	bytes   uint64
	metaQP  int
	release func()
	// reg/mr: the destination MR held from the meta to the ack, so a Rekey
	// retires it only once the batch is done.
	reg *registration
	mr  *mrRef
	// refused: the destination could not be pinned when the meta arrived;
	// the batch is acked with refuseBit and never accounted as landed.
	refused bool
	why     error
	// keys are a multi-region batch's destination rkeys (msgKeys), pins
	// what each holds from the meta to the ack; both keep their capacity
	// across batches (the poller allocates nothing once they have grown).
	keys []uint32
	pins []rxPin
}

// rxPin is one destination of a multi-region batch, held as reg/mr/release are.
type rxPin struct {
	reg     *registration
	mr      *mrRef
	release func()
}

// unpin releases what the slot holds: the registry's pins and the MRs.
func (sl *rxSlot) unpin() {
	if sl.release != nil {
		sl.release()
		sl.release = nil
	}
	if sl.mr != nil {
		sl.reg.done(sl.mr)
		sl.reg, sl.mr = nil, nil
	}
	for i := range sl.pins {
		pn := &sl.pins[i]
		if pn.release != nil {
			pn.release()
		}
		if pn.mr != nil {
			pn.reg.done(pn.mr)
		}
		*pn = rxPin{}
	}
	sl.pins = sl.pins[:0]
}

// qpSet is one connection's QPs, CQ and state, in either direction. A
// sending set is the transport.Conn returned by Connect.
type qpSet struct {
	transport.Handlers
	t      *Transport
	id     uint64
	peer   string
	sender bool
	cq     *ibv.CQ
	qps    []*qpState

	// sending side
	sem     chan struct{} // one token: Writes (and Close) are serialised
	tag     uint32
	rot     int
	cuts    []ibv.Pos // nq+1 range boundaries, preallocated
	rangeOn []bool
	ctlMem  *ibv.HostMem // the meta/bye message buffer (C memory)
	ctlMR   *ibv.MR
	ctl     transport.Signal // the peer's control plane, for DisconnectVerbs
	blk     blockState       // block requests' C templates and scratch (under sem)
	lastAck atomic.Uint32
	ackSig  chan struct{}
	credSig chan struct{}
	// rdAtomic: the QPs' max_rd_atomic (rdAtomicWith, at connect).
	rdAtomic int
	// metaTag is the write batch whose meta went out (on QP metaQ) and
	// that is not yet acknowledged: a stop after that tells the receiver.
	metaTag uint32
	metaQ   int
	// batchBytes is the batch in progress's bytes: what a stop may have
	// to wait for (stopWait).
	batchBytes uint64
	// readTag is the read batch in progress (0: none): a stop fences it at
	// once (fenceRead) instead of waiting for its READs.
	readTag uint32
	// readReg and readRef are the read in progress's destination and the
	// MR its READs land through (nil for a block read): fenceRead
	// deregisters it.
	readReg *registration
	readRef *mrRef
	// fenced: a cut read or write stopped the set (Close tears it down in
	// the background). Set by the batch's goroutine before the set fails.
	fenced bool
	// peerTold: the receiver was already asked to drop its half
	// (disconnect), so Close need not ask again.
	peerTold bool
	// stallTimer bounds each wait of a batch for progress (one per set,
	// reused: Writes are serialised, and the data path allocates nothing).
	stallTimer *time.Timer
	// postCut, postMu, posting and cutEarly stop a write still inside a
	// post call past its deadline from outside it (armPostCut); posting
	// counts the post calls under way (a prepared write's posters run
	// several at once).
	postCut  *time.Timer
	postMu   sync.Mutex
	posting  int
	cutEarly atomic.Bool
	broken   chan struct{}
	failOnce sync.Once
	err      atomic.Pointer[error]

	// receiving side (poller only)
	rx       [4]rxSlot
	lastRecv time.Time
	pingAt   time.Time
	pinging  bool

	destroyOnce sync.Once
	destroyErr  error
	closeOnce   sync.Once
}

var _ transport.Conn = (*qpSet)(nil)

// newSet creates n QPs on a fresh CQ, all in INIT. On failure nothing is
// left behind.
func (t *Transport) newSet(n int, sender bool, peer string, id uint64) (_ *qpSet, err error) {
	cfg := &t.cfg
	s := &qpSet{t: t, id: id, peer: peer, sender: sender, broken: make(chan struct{})}
	s.Handlers = transport.Handlers{Write: s.writeBatch, Read: s.readBatch, WriteBlocks: s.writeBlocks, ReadBlocks: s.readBlocks}
	t.live.sets.Add(1)
	defer func() {
		if err != nil {
			s.destroy()
		}
	}()
	// Room for every signaled or error completion of every QP plus every
	// SRQ receive that could complete here: the CQ can never overflow.
	cqe := n*cfg.SQDepth + cfg.SRQDepth + 16
	if s.cq, err = t.ctx.NewCQ(cqe, t.cch); err != nil {
		return nil, err
	}
	for k := 0; k < n; k++ {
		qc := ibv.QPConfig{SendCQ: s.cq, RecvCQ: s.cq, SRQ: t.srq, MaxSendWR: cfg.SQDepth, MaxSendSGE: t.maxSGE, MaxInline: t.inline}
		qp, err := t.pd.NewRCQP(qc)
		if err != nil && t.inline > 0 {
			// Some providers reject inline data; fall back once, for good.
			t.log.Warn("QP creation with inline data failed; disabling inline", "inline", t.inline, "error", err)
			t.inline = 0
			qc.MaxInline = 0
			qp, err = t.pd.NewRCQP(qc)
		}
		if err != nil {
			return nil, err
		}
		t.live.qps.Add(1)
		q := &qpState{qp: qp, psn: rand.Uint32() & 0xFFFFFF, depth: uint32(cfg.SQDepth)}
		s.qps = append(s.qps, q)
		if err := qp.ToInit(cfg.Port, ibv.AccessDefault); err != nil {
			return nil, err
		}
		if sender {
			if q.chain, err = ibv.NewChain(cfg.MaxChain, t.maxSGE); err != nil {
				return nil, err
			}
		}
	}
	if sender {
		s.sem = make(chan struct{}, 1)
		s.ackSig = make(chan struct{}, 1)
		s.credSig = make(chan struct{}, 1)
		s.stallTimer = time.NewTimer(time.Hour)
		s.stallTimer.Stop()
		s.postCut = time.AfterFunc(time.Hour, s.onPostCut)
		s.postCut.Stop()
		s.cuts = make([]ibv.Pos, n+1)
		s.rangeOn = make([]bool, n)
		if s.ctlMem, err = ibv.AllocHost(4096); err != nil {
			return nil, err
		}
		if s.ctlMR, err = t.pd.RegMR(s.ctlMem.Addr(), 4096, ibv.AccessLocalWrite); err != nil {
			return nil, err
		}
		t.live.mrs.Add(1)
	}
	s.lastRecv = time.Now()
	return s, nil
}

// connect moves every QP INIT → RTR → RTS against the peer's endpoints.
func (s *qpSet) connect(peer Port, eps []Endpoint, mtu ibv.MTU) error {
	t := s.t
	// RoCE routes by GRH (GID); InfiniBand within a subnet by LID.
	global := t.port.LinkLayer != ibv.LinkInfiniBand
	s.rdAtomic = rdAtomicWith(t.rdInit, peer.MaxDestRdAtomic)
	peerDest := peer.MaxDestRdAtomic
	if peerDest == 0 {
		peerDest = legacyPeerRdAtomic
	}
	t.lastRdAtomic.Store(uint32(s.rdAtomic) | min(peerDest, 0xFFFF)<<16)
	for k, q := range s.qps {
		ep := eps[k]
		if ep.QPN == 0 {
			return fmt.Errorf("endpoint %d has no QP number: %w", k, errs.ErrInvalidArgument)
		}
		err := q.qp.ToRTR(ibv.RTRAttr{
			Port: t.cfg.Port, RemoteQPN: ep.QPN, RemotePSN: ep.PSN, MTU: mtu,
			Global: global, RemoteGID: toGID(peer.GID), GIDIndex: t.gid.Index,
			RemoteLID: uint16(peer.LID), MinRNRTimer: 12, MaxDestRdAtomic: t.rdDest,
		})
		if err != nil {
			return err
		}
		if err := q.qp.ToRTS(ibv.RTSAttr{PSN: q.psn, Timeout: t.cfg.AckTimeout, RetryCount: t.cfg.RetryCount, RNRRetry: 7, MaxRdAtomic: s.rdAtomic}); err != nil {
			return err
		}
	}
	return nil
}

// Err is nil while the connection is usable.
func (s *qpSet) Err() error {
	if p := s.err.Load(); p != nil {
		return *p
	}
	return nil
}

// fail breaks the set once, with the first cause. hard marks an error (as
// opposed to a local Close), which is logged.
func (s *qpSet) fail(err error, hard bool) {
	s.failOnce.Do(func() {
		s.err.Store(&err)
		close(s.broken)
		if hard {
			s.t.log.Warn("verbs connection broken", "peer", s.peer, "conn", s.id, "sender", s.sender, "error", err)
		}
	})
}

func (s *qpSet) qpByNum(qpn uint32) *qpState {
	for _, q := range s.qps {
		if q.qp.Num() == qpn {
			return q
		}
	}
	return nil
}

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// acquireWrite waits for the set's one write at a time (what names the caller's
// write in errors); releaseWrite ends it. Nothing is posted before it returns
// nil, so a refusal leaves the connection usable.
//
// It returns how long the batch waited, which its Stats count as post (a
// batch queued behind another was handed over late; its wire is its own).
func (s *qpSet) acquireWrite(ctx context.Context, what string) (time.Duration, error) {
	t := time.Now()
	select {
	case s.sem <- struct{}{}:
	case <-s.broken: // broken while this batch waited its turn
		return 0, fmt.Errorf("%w: %w", transport.ErrNotSent, s.Err())
	case <-ctx.Done():
		return 0, fmt.Errorf("verbs: %s to %s not started: %w", what, s.peer, ctx.Err())
	}
	waited := time.Since(t)
	if err := s.Err(); err != nil {
		s.releaseWrite()
		return 0, fmt.Errorf("%w: %w", transport.ErrNotSent, err)
	}
	if err := ctx.Err(); err != nil {
		s.releaseWrite()
		return 0, fmt.Errorf("verbs: %s to %s not started: %w", what, s.peer, err)
	}
	return waited, nil
}

func (s *qpSet) releaseWrite() { <-s.sem }

// Write sends b from src into dst; see transport.Conn. It is serialised
// per connection and allocates nothing on success.
func (s *qpSet) writeBatch(ctx context.Context, src transport.Registration, dst transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	return s.transfer(ctx, src, dst, b, false)
}

// transfer is Write (read false: local is the source, remote the
// destination) or Read (the other way round): arguments checked, the
// set's turn taken, and the local MR held for the batch, so a Rekey of
// the local region retires it only once this batch stopped using it.
func (s *qpSet) transfer(ctx context.Context, local transport.Registration, remote transport.RemoteRegion, b *desc.Batch, read bool) (st transport.Stats, err error) {
	if err := s.Err(); err != nil {
		return st, fmt.Errorf("%w: %w", transport.ErrNotSent, err)
	}
	op, side := "write", "source"
	if read {
		op, side = "read", "destination"
	}
	reg, total, err := s.checkArgs(op, local, remote, b, read)
	if err != nil {
		return st, err
	}
	waited, err := s.acquireWrite(ctx, op)
	if err != nil {
		return st, err
	}
	defer s.releaseWrite()
	defer func() { st.Post += waited }()
	if read {
		ref, err := reg.useRead()
		if err != nil {
			return st, err
		}
		defer reg.done(ref)
		s.readReg, s.readRef = reg, ref
		defer func() { s.readReg, s.readRef = nil, nil }()
		return s.read(ctx, ref.mr, reg.mem, remote, b, total)
	}
	ref := reg.use()
	if ref == nil {
		return st, fmt.Errorf("verbs: %s: %s registration %s: %w", op, side, reg.unusable(), errs.ErrFailedPrecondition)
	}
	defer reg.done(ref)
	return s.write(ctx, ref.mr, reg.mem, remote, b, total)
}

// checkArgs checks a Write's, a Read's or a Prepare's arguments (op names
// which): the local registration is ours, the rkey and the remote range are
// sane, and every block lies inside both regions (with read, b.Src indexes
// the remote region and b.Dst the local one). It returns the batch's bytes.
func (s *qpSet) checkArgs(op string, local transport.Registration, remote transport.RemoteRegion, b *desc.Batch, read bool) (*registration, uint64, error) {
	side, rside := "source", "destination"
	if read {
		side, rside = rside, side
	}
	reg, ok := local.(*registration)
	if !ok || reg.t != s.t {
		return nil, 0, fmt.Errorf("verbs: %s: %s was not registered with this verbs transport: %w", op, side, errs.ErrInvalidArgument)
	}
	if remote.Key.Key > 0xFFFFFFFF {
		return nil, 0, fmt.Errorf("verbs: %s: bad rkey %#x: %w", op, remote.Key.Key, errs.ErrInvalidArgument)
	}
	if remote.Size > 0 && remote.Key.Addr+remote.Size < remote.Key.Addr {
		return nil, 0, fmt.Errorf("verbs: %s: %s [%#x, +%d) wraps: %w", op, rside, remote.Key.Addr, remote.Size, errs.ErrInvalidArgument)
	}
	srcLen, dstLen := reg.mem.Len, remote.Size
	if read {
		srcLen, dstLen = dstLen, srcLen
	}
	total, err := checkBatch(b, srcLen, dstLen)
	if err != nil {
		return nil, 0, err
	}
	return reg, total, nil
}

// waitCredit blocks until the poller returns credits, the set breaks, ctx
// ends, or the connection stalls (the last two break the set: WRs are in
// flight).
func (s *qpSet) waitCredit(ctx context.Context, tag uint32) error {
	return s.await(ctx, tag, s.credSig)
}

// await waits for sig. Every wait of a batch is bounded by StallTimeout of
// no progress (see progress); a connection that stalls is cut off like a
// batch past its deadline, and the caller retries on a fresh one.
func (s *qpSet) await(ctx context.Context, tag uint32, sig <-chan struct{}) error {
	p0 := s.progress()
	s.stallTimer.Reset(s.t.cfg.StallTimeout)
	defer s.stallTimer.Stop()
	for {
		select {
		case <-sig:
			return nil
		case <-s.broken:
			if s.cutEarly.Load() { // broken by the cut itself, past ctx's deadline
				<-ctx.Done()
				return s.abandon(ctx, tag)
			}
			return s.Err()
		case <-ctx.Done():
			return s.abandon(ctx, tag)
		case <-s.stallTimer.C:
			if p := s.progress(); p != p0 { // moved, though not for this wait yet
				p0 = p
				s.stallTimer.Reset(s.t.cfg.StallTimeout)
				continue
			}
			err := fmt.Errorf("verbs: batch %d to %s made no progress for %v (no work completion, good or failed, and no acknowledgement); QPs stopped and connection dropped: %w",
				tag, s.peer, s.t.cfg.StallTimeout, errs.ErrAborted)
			s.fail(err, true)
			s.halt()
			return err
		}
	}
}

// progress counts what a sending set sees move: completions on every QP
// and the receiver's acknowledgements.
func (s *qpSet) progress() uint64 {
	p := uint64(s.lastAck.Load())
	for _, q := range s.qps {
		p += uint64(q.done.Load())
	}
	return p
}

func (s *qpSet) write(ctx context.Context, src *ibv.MR, mem memory.Memory, dst transport.RemoteRegion, b *desc.Batch, total uint64) (transport.Stats, error) {
	var st transport.Stats
	t := s.t
	cfg := &t.cfg
	s.tag = nextTag(s.tag)
	tag := s.tag
	s.batchBytes = total

	nq := 0
	if total > 0 {
		want := int((total + uint64(cfg.MinQPBytes) - 1) / uint64(cfg.MinQPBytes))
		nq = splitBatch(b.Len, total, min(len(s.qps), want), s.cuts)
	}
	first := s.rot % len(s.qps)
	s.rot++

	if err := s.postMeta(ctx, &st, first, message{tag: tag, nqp: uint32(nq), rkey: uint32(dst.Key.Key), blocks: uint64(b.N()), bytes: total}); err != nil {
		return st, err
	}

	params := ibv.ChainParams{
		SrcBase: src.Addr(), DstBase: dst.Key.Addr, SrcLimit: mem.Len, DstLimit: dst.Size,
		LKey: src.LKey(), RKey: uint32(dst.Key.Key), MaxWR: cfg.MaxChain, MaxSGE: t.maxSGE,
		MaxWRBytes: t.wrBytes, MaxChainBytes: uint64(cfg.ChainBytes), SignalEvery: cfg.SignalEvery,
	}
	if mem.Kind == memory.Host {
		params.InlineMax = t.inline // the CPU reads inline data: never for GPU memory
	}
	if err := s.postChains(ctx, &st, tag, first, nq, &params, &chainSource{b: b}); err != nil {
		return st, err
	}
	return st, s.awaitAck(ctx, tag, &dst)
}

// postMeta posts the batch's meta message m on QP first, ahead of its
// data: the receiver then knows how many immediates make the batch, and
// what to account. It counts the WR and its time in st.
func (s *qpSet) postMeta(ctx context.Context, st *transport.Stats, first int, m message) error {
	q0 := s.qps[first]
	for q0.avail() < 1 {
		if err := s.waitCredit(ctx, m.tag); err != nil {
			return err
		}
	}
	t0 := time.Now()
	m.kind = msgMeta
	m.encode(s.ctlMem.Bytes())
	if err := s.sendCtl(q0, ibv.KindMeta, 0, msgLen, true); err != nil {
		s.fail(err, true)
		return err
	}
	s.metaTag, s.metaQ = m.tag, first
	st.Post += time.Since(t0)
	st.WorkRequests++
	return nil
}

// sendCtl posts n bytes at off of the control buffer on q as a SEND whose
// wr_id names kind; a refused post gives its credit back.
func (s *qpSet) sendCtl(q *qpState, kind int, off, n uint32, signaled bool) error {
	q.posted++
	if err := q.qp.PostSend(ibv.WRID(q.posted, kind, 0x0FFFFFFF), ibv.WRSend, 0, s.ctlMR.Addr()+uint64(off), n, s.ctlMR.LKey(), signaled); err != nil {
		q.posted--
		return err
	}
	return nil
}

// awaitAck waits for the receiver's acknowledgement of batch tag; a refusal
// is ErrNotFound.
func (s *qpSet) awaitAck(ctx context.Context, tag uint32, dst *transport.RemoteRegion) error {
	for {
		a := s.lastAck.Load()
		if a == tag {
			return nil
		}
		if a == tag|refuseBit {
			// Every immediate of the batch arrived, so nothing of it is left
			// in flight: the connection stays usable.
			return fmt.Errorf("verbs: batch %d to %s refused by the receiver: destination region %q (rkey %#x) is no longer registered or exported there (deregistered, un-exported, or its key revoked): %w",
				tag, s.peer, dst.Name, dst.Key.Key, errs.ErrNotFound)
		}
		if err := s.await(ctx, tag, s.ackSig); err != nil {
			return err
		}
	}
}

// Close tears the connection down: a Write in progress fails, the peer is
// told (when the QPs still work) so it frees its half at once, and every
// handle is destroyed. Safe to call twice.
func (s *qpSet) Close() error {
	s.closeOnce.Do(func() {
		s.fail(fmt.Errorf("verbs: connection to %s closed: %w", s.peer, errs.ErrAborted), false)
		if s.sender {
			s.sem <- struct{}{} // waits for a Write in progress to notice
			if !s.peerTold && !s.goodbye() && s.ctl != nil {
				s.t.disconnect(s.ctl, s.peer, s.id)
			}
		}
		if s.fenced {
			// A set a cut batch fenced is closed on that batch's answer path
			// (the batch layer drops a broken connection before it
			// answers): its teardown (QP destruction waits for rxe's tasks,
			// 30-130 ms in the VMs) goes to the background.
			s.t.bg.Add(1)
			go func() {
				defer s.t.bg.Done()
				s.t.detach(s, true)
				s.destroy()
			}()
			return
		}
		s.t.detach(s, true)
		s.destroy()
	})
	return s.destroyErr
}

// goodbye tells the receiver to drop its half, on the first QP still in
// RTS (after a failed completion the others usually are), waiting briefly
// for the SEND to complete so destroying the QP does not cut it off. It
// reports whether the goodbye was delivered.
func (s *qpSet) goodbye() bool {
	for _, q := range s.qps {
		if !s.qpOK(q) || q.avail() < 1 {
			continue
		}
		m := message{kind: msgBye}
		m.encode(s.ctlMem.Bytes())
		if err := s.sendCtl(q, ibv.KindBye, 0, msgLen, true); err != nil {
			continue
		}
		deadline := time.Now().Add(200 * time.Millisecond)
		for int32(q.posted-q.done.Load()) > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		// A completion alone does not say it succeeded: an error completion
		// also breaks the set.
		return int32(q.posted-q.done.Load()) <= 0 && s.qpOK(q)
	}
	return false
}

// qpOK: the QP is still in RTS (no error completion moved it out).
func (s *qpSet) qpOK(q *qpState) bool {
	st, err := q.qp.State()
	return err == nil && st == ibv.QPStateRTS
}

// destroy releases the set's handles, children first. The set must be
// detached (or never attached). Receive completions still in the CQ are
// returned to the SRQ, so its buffers are never lost.
func (s *qpSet) destroy() error {
	s.destroyOnce.Do(func() {
		t := s.t
		var errList []error
		for _, q := range s.qps {
			_ = q.qp.ToError() // flushes WRs, incl. SRQ receives this QP holds
		}
		if s.cq != nil && len(s.qps) > 0 {
			s.drainCQ(20 * time.Millisecond)
		}
		for _, q := range s.qps {
			errList = append(errList, q.qp.Close(), q.chain.Close())
		}
		if s.cq != nil {
			s.drainCQ(0)
		}
		for k := range s.rx {
			s.rx[k].unpin()
		}
		s.freeBlocks()
		errList = append(errList, s.cq.Close(), s.ctlMR.Close())
		s.ctlMem.Free()
		t.live.qps.Add(-int64(len(s.qps)))
		if s.ctlMR != nil {
			t.live.mrs.Add(-1)
		}
		t.live.sets.Add(-1)
		s.destroyErr = errors.Join(errList...)
		if s.destroyErr != nil {
			t.log.Warn("verbs connection teardown", "peer", s.peer, "conn", s.id, "error", s.destroyErr)
		}
	})
	return s.destroyErr
}

// isRecvID tells receive wr_ids (SRQ buffer indices) from send wr_ids,
// which always carry a kind in bits 28..31. Error completions leave the
// opcode undefined, so this is the only reliable test.
func isRecvID(id uint64) bool { return id>>28 == 0 }

// drainCQ polls the set's CQ until it stays empty for linger, reposting
// receive buffers found there.
func (s *qpSet) drainCQ(linger time.Duration) {
	t := s.t
	buf, err := ibv.NewWCBuf(64)
	if err != nil {
		return
	}
	defer buf.Close()
	var idx []uint32
	quiet := time.Now()
	for {
		n, err := s.cq.Poll(buf)
		if err != nil {
			break
		}
		for k := 0; k < n; k++ {
			w := buf.At(k)
			if isRecvID(w.WRID) {
				idx = append(idx, uint32(w.WRID))
			}
		}
		if n > 0 {
			quiet = time.Now()
			continue
		}
		if time.Since(quiet) >= linger {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if len(idx) > 0 {
		if err := t.srq.PostRecv(idx, t.rmr.Addr(), recvBufLen, t.rmr.LKey()); err != nil {
			t.log.Warn("repost receives after teardown", "error", err)
		}
	}
}
