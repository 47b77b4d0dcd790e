package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/callerdeadline"
	"github.com/b2bd/b2bd/internal/ring"
)

// Ring submits prepared plans through a shared-memory ring the daemon hands
// out on its raw submit socket (b2bd --submit-socket): no syscall per
// request while both sides are busy. Plans are prepared and released
// through the Client as usual; the ring runs the plans of the same user.
// Safe for concurrent use.
type Ring struct {
	c      *net.UnixConn
	reg    *ring.Region
	life   sync.RWMutex // held (read) by every operation; Close unmaps under the write lock
	closed bool         // under life

	tag atomic.Uint64

	sqMu   sync.Mutex
	sqTail uint32
	arena  arena // under sqMu

	cqMu    sync.Mutex
	cqHead  uint32
	pending map[uint64]bool // started, not yet waited for
	done    map[uint64]ring.Completion

	dead    atomic.Pointer[error]
	watched chan struct{}
}

const (
	ringNap = 50 * time.Millisecond
)

// ErrRingClosed is the error of an operation on a closed Ring (closed
// here, or dropped by its daemon: killed, restarted). Its gRPC code
// (status.Code) is Unavailable, as for a call to a daemon that is gone.
var ErrRingClosed error = ringClosed{}

type ringClosed struct{}

func (ringClosed) Error() string { return "b2b client: ring is closed" }

func (e ringClosed) GRPCStatus() *status.Status { return status.New(codes.Unavailable, e.Error()) }

// DialRing asks the daemon's raw submit socket at path for a ring of the
// default size.
func DialRing(path string) (*Ring, error) { return DialRingWith(path, RingOptions{}) }

// RingOptions are the sizes a ring is asked for; zero fields take the
// daemon's defaults (256 entries each way, a 1 MiB id arena).
type RingOptions struct {
	SubmitEntries, CompleteEntries uint32 // powers of two, 2 to ring.MaxEntries
	// ArenaBytes holds the ids and notifications of block records beyond
	// ring.MaxInlineIDs pairs: a multiple of 4 KiB up to ring.MaxArena.
	ArenaBytes uint64
}

// DialRingWith asks the daemon's raw submit socket at path for a ring of
// the given sizes. A size outside its range is refused (InvalidArgument,
// with the daemon's message) before dialling: the Hello frame's fields
// are 16 bits wide, so one would otherwise reach the daemon as another
// size (an arena of 100 bytes as the default 1 MiB, 300 MiB as 44 MiB).
func DialRingWith(path string, o RingOptions) (*Ring, error) {
	if err := o.check(); err != nil {
		return nil, status.Error(codes.InvalidArgument, "b2b client: "+err.Error())
	}
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("b2b client: dial submit socket %s: %w", path, err)
	}
	r, err := openRing(uc, ring.HelloSizes(o.SubmitEntries, o.CompleteEntries, o.ArenaBytes))
	if err != nil {
		uc.Close()
		return nil, err
	}
	return r, nil
}

// check refuses the sizes the daemon would refuse (0: its default).
func (o RingOptions) check() error {
	if o.SubmitEntries != 0 {
		if err := ring.CheckEntries("submission entries", o.SubmitEntries); err != nil {
			return err
		}
	}
	if o.CompleteEntries != 0 {
		if err := ring.CheckEntries("completion entries", o.CompleteEntries); err != nil {
			return err
		}
	}
	if o.ArenaBytes != 0 {
		return ring.CheckArena(o.ArenaBytes)
	}
	return nil
}

func openRing(uc *net.UnixConn, sizes uint64) (*Ring, error) {
	var hello [16]byte
	le := binary.LittleEndian
	le.PutUint64(hello[0:], ring.HelloArena)
	le.PutUint64(hello[8:], sizes)
	if _, err := uc.Write(hello[:]); err != nil {
		return nil, fmt.Errorf("b2b client: ring hello: %w", err)
	}
	var ans [48]byte
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := uc.ReadMsgUnix(ans[:], oob)
	if err != nil {
		return nil, fmt.Errorf("b2b client: ring answer: %w", err)
	}
	fd := -1
	if cms, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil && len(cms) == 1 {
		if fds, perr := unix.ParseUnixRights(&cms[0]); perr == nil && len(fds) == 1 {
			fd = fds[0]
		}
	}
	if fd >= 0 {
		defer unix.Close(fd)
	}
	if _, err := io.ReadFull(uc, ans[n:]); err != nil {
		return nil, fmt.Errorf("b2b client: ring answer: %w", err)
	}
	if err := answerErr(uc, ans[:]); err != nil {
		return nil, err
	}
	if fd < 0 {
		return nil, fmt.Errorf("b2b client: ring answer carried no memfd")
	}
	reg, err := ring.Map(fd)
	if err != nil {
		return nil, fmt.Errorf("b2b client: %w", err)
	}
	r := &Ring{c: uc, reg: reg, arena: arena{mem: reg.Arena}, pending: map[uint64]bool{}, done: map[uint64]ring.Completion{}, watched: make(chan struct{})}
	go r.watch()
	return r, nil
}

// answerErr is the error a raw answer frame tagged ring.Hello carries.
func answerErr(c net.Conn, ans []byte) error {
	le := binary.LittleEndian
	if tag := le.Uint64(ans[0:]); tag != ring.Hello {
		return fmt.Errorf("b2b client: ring answer tag %#x, want %#x", tag, ring.Hello)
	}
	code, n := le.Uint32(ans[8:]), le.Uint32(ans[12:])
	if code == 0 && n == 0 {
		return nil
	}
	if n > ring.MsgReadMax {
		return fmt.Errorf("b2b client: ring answer message of %d bytes, limit %d", n, ring.MsgReadMax)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(c, msg); err != nil {
		return fmt.Errorf("b2b client: ring answer: %w", err)
	}
	return status.Error(codes.Code(code), string(msg))
}

// watch waits for the daemon to drop the ring (or for Close) and wakes the
// waiters.
func (r *Ring) watch() {
	defer close(r.watched)
	var ans [48]byte
	err := ErrRingClosed
	if _, rerr := io.ReadFull(r.c, ans[:]); rerr == nil {
		if aerr := answerErr(r.c, ans[:]); aerr != nil {
			err = fmt.Errorf("b2b client: the daemon dropped the ring: %w", aerr)
		}
	}
	r.dead.CompareAndSwap(nil, &err)
	r.reg.CQ.Wake()
}

func (r *Ring) deadErr() error {
	if e := r.dead.Load(); e != nil {
		return *e
	}
	return nil
}

// Close ends the ring; operations in progress return ErrRingClosed. Safe
// to call twice.
func (r *Ring) Close() error {
	err := ErrRingClosed
	r.dead.CompareAndSwap(nil, &err)
	cerr := r.c.Close()
	<-r.watched
	r.life.Lock()
	defer r.life.Unlock()
	if !r.closed {
		r.closed = true
		r.reg.Close()
	}
	if errors.Is(cerr, net.ErrClosed) {
		return nil
	}
	return cerr
}

// Ping is one empty round trip through the daemon.
func (r *Ring) Ping() error {
	tag, err := r.post(ring.Request{Op: ring.OpPing})
	if err != nil {
		return err
	}
	_, err = r.Wait(tag)
	return err
}

// Submit runs p and returns once every byte landed, like Plan.Submit; a
// refusal is a gRPC status error with the code SubmitTransfer would give.
func (r *Ring) Submit(p *Plan) (RawResult, error) {
	tag, err := r.Start(p)
	if err != nil {
		return RawResult{}, err
	}
	return r.Wait(tag)
}

// Start posts a submit of p and returns its tag for Wait (or Cancel). Every
// tag must be waited for.
func (r *Ring) Start(p *Plan) (uint64, error) {
	return r.post(ring.Request{Op: ring.OpSubmit, Handle: p.Handle})
}

// SubmitContext is Submit under ctx. Its deadline travels in the record,
// so the daemon cuts the transfer at it and answers as SubmitTransfer
// would (DeadlineExceeded, the transfer stopped); a cancel of ctx cancels
// the submit through the ring, and the answer is the daemon's.
func (r *Ring) SubmitContext(ctx context.Context, p *Plan) (RawResult, error) {
	ms, err := ringTimeoutMs(ctx)
	if err != nil {
		return RawResult{}, err
	}
	return r.postWait(ctx, ring.Request{Op: ring.OpSubmit, Handle: p.Handle, TimeoutMs: ms})
}

// postWait posts req and waits for its completion; a cancel of ctx cancels
// it through the ring (its deadline, in req, is the daemon's to keep).
func (r *Ring) postWait(ctx context.Context, req ring.Request) (RawResult, error) {
	return r.postWaitArena(ctx, req, nil)
}

func (r *Ring) postWaitArena(ctx context.Context, req ring.Request, p *arenaPayload) (RawResult, error) {
	tag, err := r.postArena(req, p)
	if err != nil {
		return RawResult{}, err
	}
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			_ = r.Cancel(tag)
		}
	})
	defer stop()
	// The daemon answers at the deadline the record carries, and soon
	// after a cancel; only a daemon that stopped (SIGSTOP) or hangs lets
	// the grace pass too, as a gRPC transfer call's grace does.
	var end time.Time
	if dl, ok := ctx.Deadline(); ok {
		end = dl.Add(callerdeadline.Grace)
	}
	res, answered, err := r.waitUntil(tag, end, ctx.Done())
	if answered {
		return res, err
	}
	r.abandon(tag)
	if errors.Is(ctx.Err(), context.Canceled) {
		return RawResult{}, status.Errorf(codes.Canceled, "b2b client: the caller cancelled, and the daemon did not answer ring record %d's cancel within %v: it is stopped or hung", tag, callerdeadline.Grace)
	}
	return RawResult{}, status.Errorf(codes.DeadlineExceeded, "b2b client: the daemon did not answer ring record %d within the caller's deadline and %v more: it is stopped or hung", tag, callerdeadline.Grace)
}

// abandon gives up on tag (its daemon did not answer in time): it posts
// tag's cancel if the submission ring has room now (never waiting for
// room), so that a daemon that resumes stops the record rather than runs
// it, and forgets tag; the cancel's own completion is not waited for.
func (r *Ring) abandon(tag uint64) {
	defer r.forget(tag)
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed || r.deadErr() != nil {
		return
	}
	q := &r.reg.SQ
	r.sqMu.Lock()
	defer r.sqMu.Unlock()
	if free, err := q.Free(r.sqTail); err != nil || free == 0 {
		return
	}
	req := ring.Request{Op: ring.OpCancel, Target: tag, Tag: r.tag.Add(1)}
	req.Encode(q.Slot(r.sqTail))
	r.sqTail++
	q.Publish(r.sqTail)
}

// ringTimeoutMs is ctx's deadline as a submit record carries it: whole
// milliseconds from now, rounded up (0: no deadline, the daemon's default).
func ringTimeoutMs(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, status.FromContextError(err).Err()
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return 0, nil
	}
	left := time.Until(dl)
	if left <= 0 {
		return 0, status.Error(codes.DeadlineExceeded, "b2b client: the caller's deadline passed before the submit was posted")
	}
	ms := uint64((left + time.Millisecond - 1) / time.Millisecond)
	return min(ms, ring.MaxTimeoutMs), nil
}

// Cancel asks the daemon to stop the request under tag, and returns once
// the daemon took the cancel, not once the request stopped: nil says the
// tag was in flight (NotFound: it was not). Its Wait reports how it ended:
// Canceled, or its success when it finished before the cancel reached it
// (a small submit often does), as CancelTransfer keeps an ended
// transfer's outcome. No byte of it lands after that Wait returns.
func (r *Ring) Cancel(tag uint64) error {
	t, err := r.post(ring.Request{Op: ring.OpCancel, Target: tag})
	if err != nil {
		return err
	}
	_, err = r.Wait(t)
	return err
}

func (r *Ring) post(req ring.Request) (uint64, error) { return r.postArena(req, nil) }

// postArena posts req; a non-nil p (an arena blocks record's ids and
// note, as arenaPayload lays them out) is first written to the arena,
// and req points at it.
func (r *Ring) postArena(req ring.Request, p *arenaPayload) (uint64, error) {
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return 0, ErrRingClosed
	}
	req.Tag = r.tag.Add(1)
	r.cqMu.Lock()
	r.pending[req.Tag] = true
	r.cqMu.Unlock()
	r.drain() // a caller that starts much before it waits must not overrun the completions
	q := &r.reg.SQ
	r.sqMu.Lock()
	defer r.sqMu.Unlock()
	for {
		if err := r.deadErr(); err != nil {
			r.forget(req.Tag)
			return 0, err
		}
		free, err := q.Free(r.sqTail)
		if err != nil {
			r.forget(req.Tag)
			return 0, fmt.Errorf("b2b client: %w", err)
		}
		if free > 0 && (p == nil || r.arena.place(&req, p, r.sqTail, q.Head())) {
			break
		}
		r.drain() // the daemon may wait for room in ours
		time.Sleep(20 * time.Microsecond)
	}
	req.Encode(q.Slot(r.sqTail))
	r.sqTail++
	q.Publish(r.sqTail)
	return req.Tag, nil
}

func (r *Ring) forget(tag uint64) {
	r.cqMu.Lock()
	delete(r.pending, tag)
	r.cqMu.Unlock()
}

// drain moves completions out of the ring, if no one else is at it.
func (r *Ring) drain() {
	if r.cqMu.TryLock() {
		r.drainLocked()
		r.cqMu.Unlock()
	}
}

func (r *Ring) drainLocked() uint32 {
	q := &r.reg.CQ
	tail := q.Tail()
	for ; r.cqHead != tail; r.cqHead++ {
		c, err := ring.DecodeCompletion(q.Slot(r.cqHead))
		if err != nil {
			c.Code, c.Msg = uint32(codes.Internal), err.Error()
		}
		if r.pending[c.Tag] {
			r.done[c.Tag] = c
		}
	}
	q.Consumed(r.cqHead)
	return tail
}

// Wait returns the outcome of the request posted under tag.
func (r *Ring) Wait(tag uint64) (RawResult, error) {
	res, _, err := r.waitUntil(tag, time.Time{}, nil)
	return res, err
}

// waitUntil is Wait giving up at end (zero: never), and at most
// callerdeadline.Grace after done closes (nil: never): answered is false
// when it gave up (tag stays in flight).
func (r *Ring) waitUntil(tag uint64, end time.Time, done <-chan struct{}) (res RawResult, answered bool, err error) {
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return RawResult{}, true, ErrRingClosed
	}
	for {
		r.cqMu.Lock()
		if !r.pending[tag] {
			r.cqMu.Unlock()
			return RawResult{}, true, fmt.Errorf("b2b client: ring tag %d is not in flight", tag)
		}
		c, ok := r.done[tag]
		if !ok {
			seen := r.drainLocked()
			c, ok = r.done[tag]
			if !ok {
				r.cqMu.Unlock()
				if err := r.deadErr(); err != nil {
					r.forget(tag)
					return RawResult{}, true, err
				}
				nap := ringNap
				if done != nil {
					select {
					case <-done:
						if g := time.Now().Add(callerdeadline.Grace); end.IsZero() || g.Before(end) {
							end = g
						}
						done = nil
					default:
					}
				}
				if !end.IsZero() {
					left := time.Until(end)
					if left <= 0 {
						return RawResult{}, false, nil
					}
					nap = min(nap, left)
				}
				r.reg.CQ.Wait(seen, ring.Spin(), nap)
				continue
			}
		}
		delete(r.done, tag)
		delete(r.pending, tag)
		r.cqMu.Unlock()
		if c.Code != 0 {
			return RawResult{}, true, status.Error(codes.Code(c.Code), c.Msg)
		}
		return RawResult{Blocks: c.Blocks, Bytes: c.Bytes, Wire: time.Duration(c.Wire), Total: time.Duration(c.Total), Transport: c.Msg,
			Posted: unixTime(c.Posted), Landed: unixTime(c.Landed), Segments: c.Segments, WorkRequests: c.WorkRequests}, true, nil
	}
}
