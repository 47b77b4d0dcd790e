package batch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/region"
)

// Async transfers (docs/kv.md, "Async handles"). A started transfer runs the
// same synchronous path as its RPC (Transfer, Submit, TransferBlocks) in a
// goroutine, under a context of its own: Cancel cancels that context and
// waits for the run to return, and every transport returns from a cut-off
// Write only once no byte of it can land any more (verbs: QPs moved to error
// and drained; tcp: the receiver fenced; local: the copiers stopped). So
// once a cancel or a failure is reported, the transfer's bytes are all
// where they will ever be.
//
// A transfer belongs to the client that started it (its connection
// tracking's client id): another client's id is unknown to it (NotFound).
// Its outcome is kept until it is reported once, by Wait, Poll, Cancel or a
// watcher, whichever is first; then the id is freed. Entries (running, or
// ended and unreported) are bounded per client.

// DefaultMaxTransfers is --max-transfers-per-client's default.
const DefaultMaxTransfers = 4096

// MaxPollIDs bounds the ids of one Poll.
const MaxPollIDs = 1 << 16

// State is where an async transfer stands.
type State int

const (
	Running   State = iota + 1
	Done            // every byte landed and was acknowledged
	Failed          // Err says why
	Cancelled       // by Cancel or its client going away; Err says where it was cut
)

func (s State) String() string {
	switch s {
	case Running:
		return "running"
	case Done:
		return "done"
	case Failed:
		return "failed"
	case Cancelled:
		return "cancelled"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Outcome is what a transfer came to (State Running: not yet).
type Outcome struct {
	ID     uint64
	State  State
	Result Result // Done
	Err    error  // Failed and Cancelled
}

// RunFunc runs one transfer under ctx.
type RunFunc func(ctx context.Context) (Result, error)

type asyncEntry struct {
	id, client uint64
	cancel     context.CancelFunc
	done       chan struct{} // closed once out is set
	cancelled  bool          // guarded by Transfers.mu
	out        Outcome       // set before done is closed
}

// Transfers is the table of async transfers.
type Transfers struct {
	mu       sync.Mutex
	next     uint64
	max      int
	byID     map[uint64]*asyncEntry
	held     map[uint64]int // entries per client
	running  int
	watchers map[uint64][]*Watcher
	closed   bool
	wg       sync.WaitGroup
}

// NewTransfers returns a table holding at most max entries per client
// (0: DefaultMaxTransfers).
func NewTransfers(max int) *Transfers {
	if max <= 0 {
		max = DefaultMaxTransfers
	}
	return &Transfers{max: max, next: firstTransferID(), byID: map[uint64]*asyncEntry{}, held: map[uint64]int{}, watchers: map[uint64][]*Watcher{}}
}

// firstTransferID is where a daemon's transfer ids start counting: at
// random, so that a restarted daemon's ids are not its last run's. A
// client's handles outlive the daemon (its channel reconnects to the same
// socket, and a client on the socket is its pid), and with ids counting
// from 1 in every run a handle of a transfer the dead daemon never ended
// was answered with the outcome of the new daemon's transfer of the same
// id: "done" for bytes that never moved. Below 2^53, so that every id is
// exact in a JSON number (b2bctl --json, JavaScript).
func firstTransferID() uint64 { return 1<<32 + rand.Uint64N(1<<52-1<<33) }

// Counts says how many transfers run and how many entries the table holds
// (running, or ended and not yet reported).
func (t *Transfers) Counts() (running, held int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.running, len(t.byID)
}

// Start runs run in its own goroutine for client, under a context of its
// own with timeout (0: none here; the run applies the daemon's default), and
// returns its id at once.
func (t *Transfers) Start(client uint64, timeout time.Duration, run RunFunc) (uint64, error) {
	ctx, cancel := context.WithCancel(context.Background())
	if timeout > 0 {
		ctx, cancel = withTimeout(ctx, cancel, timeout)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		cancel()
		return 0, fmt.Errorf("%w: the daemon is shutting down", errs.ErrUnavailable)
	}
	if n := t.held[client]; n >= t.max {
		t.mu.Unlock()
		cancel()
		return 0, fmt.Errorf("%w: this client holds %d transfers (running, or ended and not yet reported), the limit (--max-transfers-per-client) is %d: wait for, poll or cancel some", errs.ErrResourceExhausted, n, t.max)
	}
	t.next++
	e := &asyncEntry{id: t.next, client: client, cancel: cancel, done: make(chan struct{}), out: Outcome{ID: t.next, State: Running}}
	t.byID[e.id] = e
	t.held[client]++
	t.running++
	t.wg.Add(1)
	t.mu.Unlock()
	go t.run(ctx, e, run)
	return e.id, nil
}

// withTimeout layers a timeout on ctx; the returned cancel ends both.
func withTimeout(ctx context.Context, cancel context.CancelFunc, d time.Duration) (context.Context, context.CancelFunc) {
	tctx, tcancel := context.WithTimeout(ctx, d)
	return tctx, func() { tcancel(); cancel() }
}

func (t *Transfers) run(ctx context.Context, e *asyncEntry, run RunFunc) {
	defer t.wg.Done()
	res, err := run(ctx)
	e.cancel()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err == nil:
		e.out.State, e.out.Result = Done, res
	case e.cancelled:
		e.out.State, e.out.Err = Cancelled, err
	default:
		e.out.State, e.out.Err = Failed, err
	}
	t.running--
	close(e.done)
	// A watcher of its client reports it at once.
	if ws := t.watchers[e.client]; len(ws) > 0 {
		ws[0].push(t.takeLocked(e))
	}
}

// lookupLocked is client's entry id, or NotFound naming field.
func (t *Transfers) lookupLocked(client, id uint64, field string) (*asyncEntry, error) {
	e := t.byID[id]
	if e == nil || e.client != client {
		return nil, fmt.Errorf("%w: %s %d is not a transfer of this client (never started, already reported, or another client's)", errs.ErrNotFound, field, id)
	}
	return e, nil
}

// takeLocked reports e's outcome: its id is freed.
func (t *Transfers) takeLocked(e *asyncEntry) Outcome {
	delete(t.byID, e.id)
	if t.held[e.client]--; t.held[e.client] <= 0 {
		delete(t.held, e.client)
	}
	return e.out
}

// ended is e's outcome, taken, if it ended and was not yet reported.
func (t *Transfers) ended(e *asyncEntry) (Outcome, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID[e.id] != e {
		return Outcome{}, fmt.Errorf("%w: transfer_id %d was reported meanwhile (by another Wait, Poll or watcher)", errs.ErrNotFound, e.id)
	}
	return t.takeLocked(e), nil
}

// Wait waits until client's transfer id ended, timeout passed (0: no
// limit) or ctx ended, and returns its outcome; State Running when it has
// not ended. An ended outcome is reported here, once.
func (t *Transfers) Wait(ctx context.Context, client, id uint64, timeout time.Duration) (Outcome, error) {
	t.mu.Lock()
	e, err := t.lookupLocked(client, id, "transfer_id")
	t.mu.Unlock()
	if err != nil {
		return Outcome{}, err
	}
	var expired <-chan time.Time
	if timeout > 0 {
		tm := time.NewTimer(timeout)
		defer tm.Stop()
		expired = tm.C
	}
	select {
	case <-e.done:
		// Both may be ready at once: a caller that went away does not take
		// the outcome, which is reported once, from the next asker.
		if err := ctx.Err(); err != nil {
			return Outcome{}, fmt.Errorf("wait for transfer %d: %w", id, err)
		}
		return t.ended(e)
	case <-expired:
		return Outcome{ID: id, State: Running}, nil
	case <-ctx.Done():
		return Outcome{}, fmt.Errorf("wait for transfer %d: %w", id, ctx.Err())
	}
}

// Poll returns each transfer's outcome without waiting; ended ones are
// reported here, once. An unknown id refuses the whole poll, reporting
// none.
func (t *Transfers) Poll(client uint64, ids []uint64) ([]Outcome, error) {
	if len(ids) > MaxPollIDs {
		return nil, fmt.Errorf("%w: transfer_ids has %d ids, the limit is %d", errs.ErrResourceExhausted, len(ids), MaxPollIDs)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	es := make([]*asyncEntry, len(ids))
	seen := make(map[uint64]int, len(ids))
	for i, id := range ids {
		e, err := t.lookupLocked(client, id, fmt.Sprintf("transfer_ids[%d]", i))
		if err != nil {
			return nil, err
		}
		if j, dup := seen[id]; dup {
			return nil, fmt.Errorf("%w: transfer_ids[%d] = %d repeats transfer_ids[%d]", errs.ErrInvalidArgument, i, id, j)
		}
		seen[id] = i
		es[i] = e
	}
	out := make([]Outcome, len(ids))
	for i, e := range es {
		select {
		case <-e.done:
			out[i] = t.takeLocked(e)
		default:
			out[i] = Outcome{ID: e.id, State: Running}
		}
	}
	return out, nil
}

// Cancel cancels client's transfer id and waits for its run to return:
// then no byte of it lands any more. It reports the outcome (a transfer
// that had already ended keeps its own). If ctx ends first, the transfer is
// still cancelled and its outcome is left to Wait or Poll.
func (t *Transfers) Cancel(ctx context.Context, client, id uint64) (Outcome, error) {
	t.mu.Lock()
	e, err := t.lookupLocked(client, id, "transfer_id")
	if err == nil {
		select {
		case <-e.done:
		default:
			e.cancelled = true
		}
	}
	t.mu.Unlock()
	if err != nil {
		return Outcome{}, err
	}
	e.cancel()
	select {
	case <-e.done:
		return t.ended(e)
	case <-ctx.Done():
		return Outcome{}, fmt.Errorf("cancel transfer %d: it is cancelled, but the caller left before it stopped: %w", id, ctx.Err())
	}
}

// ReleaseClient cancels every transfer of client (it is gone), waits for
// them to stop and frees their ids; it returns how many it freed.
func (t *Transfers) ReleaseClient(client uint64) int {
	t.mu.Lock()
	var es []*asyncEntry
	for _, e := range t.byID {
		if e.client == client {
			e.cancelled = true
			es = append(es, e)
		}
	}
	t.mu.Unlock()
	for _, e := range es {
		e.cancel()
	}
	for _, e := range es {
		<-e.done
		t.mu.Lock()
		if t.byID[e.id] == e {
			t.takeLocked(e)
		}
		t.mu.Unlock()
	}
	return len(es)
}

// Close cancels every transfer, waits for them, and refuses new ones;
// safe to call twice.
func (t *Transfers) Close() {
	t.mu.Lock()
	t.closed = true
	for _, e := range t.byID {
		e.cancelled = true
		e.cancel()
	}
	t.mu.Unlock()
	t.wg.Wait()
}

// Watcher receives the outcomes of one client's transfers as they end.
type Watcher struct {
	t      *Transfers
	client uint64
	mu     sync.Mutex
	queue  []Outcome
	// C is signalled when outcomes are queued; Next takes them.
	C chan struct{}
}

// Watch subscribes to client's outcomes: those already ended and not yet
// reported at once, then each as it ends (reported to this watcher, not
// to Wait or Poll). Call Unwatch when done.
func (t *Transfers) Watch(client uint64) *Watcher {
	w := &Watcher{t: t, client: client, C: make(chan struct{}, 1)}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.watchers[client] = append(t.watchers[client], w)
	for _, e := range t.byID {
		if e.client != client {
			continue
		}
		select {
		case <-e.done:
			w.push(t.takeLocked(e))
		default:
		}
	}
	return w
}

func (w *Watcher) push(o Outcome) {
	w.mu.Lock()
	w.queue = append(w.queue, o)
	w.mu.Unlock()
	select {
	case w.C <- struct{}{}:
	default:
	}
}

// Next takes the queued outcomes.
func (w *Watcher) Next() []Outcome {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.queue
	w.queue = nil
	return q
}

// Unwatch ends the subscription.
func (t *Transfers) Unwatch(w *Watcher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ws := t.watchers[w.client]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(t.watchers, w.client)
	} else {
		t.watchers[w.client] = ws
	}
}

// Transfers is the service's table of async transfers.
func (s *Service) Transfers() *Transfers { return s.async }

// SubmitRequest names a prepared plan to submit: Owner's plan Handle.
type SubmitRequest struct {
	Owner  Owner
	Handle uint64
}

// StartRequest is one async transfer as the caller gave it: one of Batch,
// Submit and Blocks (none: refused).
type StartRequest struct {
	Client  uint64        // whose transfer it is (Transfers)
	Caller  region.Caller // who asks: a trigger's counter region must be theirs
	Timeout time.Duration // from the start; 0: none here (a triggered one's is DefaultTimeout)
	After   *Trigger      // nil: it runs at once
	Batch   *Request
	Submit  *SubmitRequest
	Blocks  *BlocksRequest
	// Bad is set by the RPC layer when it could not convert the transfer;
	// it is reported after the trigger's checks.
	Bad error
}

// Start starts r's transfer in the table of async transfers and returns
// its id. A triggered one (After) holds its counter from here, and waits
// for it in the trigger watcher just before it posts. A batch is planned
// now (its fields, source region and descriptors checked, the source
// held): bad input is refused here, not reported later as a failed
// transfer.
func (s *Service) Start(r StartRequest) (uint64, error) {
	gate, release, err := s.triggers.arm(r.After, r.Caller)
	if err != nil {
		return 0, err
	}
	timeout := r.Timeout
	if timeout == 0 && r.After != nil {
		// So that a counter that never comes cannot hold it forever.
		timeout = s.cfg.DefaultTimeout
	}
	var id uint64
	switch {
	case r.Bad != nil:
		err = r.Bad
	case r.Batch != nil:
		var p *Plan
		if p, err = s.Plan(*r.Batch); err != nil {
			break
		}
		peer, dst := r.Batch.Peer, r.Batch.Dst
		run := gate(func(ctx context.Context) (Result, error) {
			return s.bounded(ctx, func(ctx context.Context) (Result, error) {
				res, err := s.Run(ctx, p)
				res.Phases.Validate, res.Phases.Plan = p.validate, res.Phases.Plan+p.merge
				return res, err
			}, "batch failed", "peer", peer, "dst", dst)
		})
		id, err = s.async.Start(r.Client, timeout, s.observed(func(ctx context.Context) (Result, error) {
			defer p.Close()
			return run(ctx)
		}))
		if err != nil {
			p.Close()
		}
	case r.Submit != nil:
		o, h := r.Submit.Owner, r.Submit.Handle
		id, err = s.async.Start(r.Client, timeout, s.observed(gate(func(ctx context.Context) (Result, error) { return s.plans.Submit(ctx, o, h) })))
	case r.Blocks != nil:
		br := *r.Blocks
		id, err = s.async.Start(r.Client, timeout, s.observed(gate(func(ctx context.Context) (Result, error) { return s.TransferBlocks(ctx, br) })))
	default:
		err = fmt.Errorf("%w: transfer is not set: give batch, submit or blocks", errs.ErrInvalidArgument)
	}
	if err != nil {
		release() // the run never started: let go of the counter
	}
	return id, err
}

// observed wraps a started transfer's run so that the observer (if any)
// is told how it ended.
func (s *Service) observed(run RunFunc) RunFunc {
	return func(ctx context.Context) (Result, error) {
		start := time.Now()
		res, err := run(ctx)
		if fn := s.observe.Load(); fn != nil {
			(*fn)(res, err, time.Since(start))
		}
		return res, err
	}
}
