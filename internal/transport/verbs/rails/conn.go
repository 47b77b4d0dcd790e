package rails

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/verbs"
)

// pair is one of our rails connected to one of the peer's.
type pair struct {
	r      *rail
	remote int // the peer's rail index

	mu       sync.Mutex
	c        transport.Conn // nil while down
	err      error          // why it went down
	isDown   bool           // counted in r.downPairs
	retrying bool
}

// up is the pair's connection, nil while it is down (or its port is).
func (p *pair) up() transport.Conn {
	if p.r.portDown.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.c
}

// conn is a data path to one peer over every paired rail.
type conn struct {
	transport.Handlers  // writes only: rails cannot read (Caps.Ops)
	transport.NoPrepare // nor prepare (Caps.Prepared)
	t                   *Transport
	peer                transport.Peer
	pairs               []*pair // by our rail index; nil where a rail has no partner

	closeOnce sync.Once
	closed    chan struct{}
	bg        sync.WaitGroup
	// work feeds one worker goroutine per pair with the shares of striped
	// batches beyond their first (which the caller writes itself): no
	// goroutine, and so no allocation, per batch. enq (read-held while
	// queueing) lets Close stop the queueing before the workers drain.
	work []chan jobRef
	enq  sync.RWMutex
	shut bool
}

// jobRef is one share of a Write for a worker.
type jobRef struct {
	ws *writeState
	k  int
}

// worker writes the shares queued for one pair until the conn closes, then
// the ones still queued (their Writes fail at once on closed connections).
func (c *conn) worker(ch chan jobRef) {
	defer c.bg.Done()
	for {
		select {
		case r := <-ch:
			runJob(r.ws, r.k, true)
		case <-c.closed:
			for {
				select {
				case r := <-ch:
					runJob(r.ws, r.k, true)
				default:
					return
				}
			}
		}
	}
}

var _ transport.Conn = (*conn)(nil)

// reachable: our rail r can reach the peer's rail pr (the configured map
// decides where it names r; else the link layers match and the peer's GID
// is in one of r's subnets (RoCE) or shares r's GID prefix (InfiniBand);
// a rail whose subnets are unknown is tried).
func (t *Transport) reachable(r *rail, pr verbs.RailAdvert) bool {
	if want, ok := t.cfg.Map[r.name]; ok {
		return pr.Port.Device == want
	}
	mine := r.t.Port()
	if pr.Port.LinkLayer != "" && mine.LinkLayer != "" && pr.Port.LinkLayer != mine.LinkLayer {
		return false
	}
	if len(pr.Port.GID) != 16 {
		return false
	}
	if mine.LinkLayer == "InfiniBand" {
		return len(mine.GID) == 16 && bytes.Equal(mine.GID[:8], pr.Port.GID[:8])
	}
	if len(r.nets) == 0 {
		return true
	}
	ip := net.IP(pr.Port.GID)
	for _, n := range r.nets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// pairRails matches our rails with the peer's: each of ours takes a
// reachable rail of the peer's not taken yet (its own index first), else
// shares one. A peer that advertises no rails has one device: our first
// rail that the map allows pairs with it.
func (t *Transport) pairRails(peer []verbs.RailAdvert) []*pair {
	out := make([]*pair, len(t.rails))
	if len(peer) == 0 {
		for _, r := range t.rails {
			if _, mapped := t.cfg.Map[r.name]; !mapped || r.idx == 0 {
				out[r.idx] = &pair{r: r, remote: 0}
				break
			}
		}
		return out
	}
	taken := map[int]bool{}
	for _, r := range t.rails {
		best, bestScore := -1, -1
		for _, pr := range peer {
			if pr.Index < 0 || pr.Index >= maxRails || !t.reachable(r, pr) {
				continue
			}
			score := 0
			if !taken[pr.Index] {
				score += 2
			}
			if pr.Index == r.idx {
				score++
			}
			if score > bestScore {
				best, bestScore = pr.Index, score
			}
		}
		if best >= 0 {
			taken[best] = true
			out[r.idx] = &pair{r: r, remote: best}
		}
	}
	return out
}

// Connect pairs the rails and connects every pair on its own rail, in
// parallel. Pairs that fail (or whose port is down) are retried in the
// background; Connect fails only when none connects.
func (t *Transport) Connect(ctx context.Context, p transport.Peer) (transport.Conn, error) {
	if p.Signal == nil {
		return nil, fmt.Errorf("rails: connect %s: no control client: %w", p.Address, errs.ErrInvalidArgument)
	}
	peerRails, err := verbs.ParseAdvert(p.Advert)
	if err != nil {
		return nil, fmt.Errorf("rails: connect %s: %w", p.Address, err)
	}
	c := &conn{t: t, peer: p, pairs: t.pairRails(peerRails), closed: make(chan struct{})}
	c.Handlers = transport.Handlers{Write: c.write, WriteBlocks: c.writeBlocks}
	c.work = make([]chan jobRef, len(c.pairs))
	for i, pr := range c.pairs {
		if pr != nil {
			c.work[i] = make(chan jobRef, 64)
			c.bg.Add(1)
			go c.worker(c.work[i])
		}
	}
	var wg sync.WaitGroup
	errl := make([]error, len(c.pairs))
	for i, pr := range c.pairs {
		if pr == nil {
			continue
		}
		if pr.r.portDown.Load() {
			errl[i] = fmt.Errorf("port %d of %s is not ACTIVE: %w", t.cfg.Port, pr.r.name, errs.ErrUnavailable)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pr.c, errl[i] = c.dial(ctx, pr)
		}()
	}
	wg.Wait()
	var desc []string
	ok := 0
	for i, pr := range c.pairs {
		switch {
		case pr == nil:
			desc = append(desc, fmt.Sprintf("rail %d (%s): no reachable peer rail", i, t.rails[i].name))
		case errl[i] != nil:
			desc = append(desc, fmt.Sprintf("rail %d (%s) -> peer rail %d: %v", i, pr.r.name, pr.remote, errl[i]))
			if ctx.Err() == nil {
				c.down(pr, nil, errl[i])
			}
		default:
			ok++
			desc = append(desc, fmt.Sprintf("rail %d (%s) -> peer rail %d", i, pr.r.name, pr.remote))
		}
	}
	if ok == 0 {
		c.Close()
		err := fmt.Errorf("rails: no rail connects to %s: %s: %w", p.Address, strings.Join(desc, "; "), errs.ErrUnavailable)
		if ce := ctx.Err(); ce != nil {
			err = fmt.Errorf("%w (%w)", err, ce)
		}
		return nil, err
	}
	t.log.Info("rails connected", "peer", p.Address, "up", ok, "pairs", strings.Join(desc, "; "))
	return c, nil
}

func (c *conn) dial(ctx context.Context, p *pair) (transport.Conn, error) {
	q := c.peer
	q.Advert = nil
	q.Signal = verbs.WithRail(c.peer.Signal, p.remote) // the peer routes the connect to that rail
	return p.r.t.Connect(ctx, q)
}

// down takes pair p out (when its connection is still old), closes old in
// the background and starts reconnecting.
func (c *conn) down(p *pair, old transport.Conn, why error) {
	p.mu.Lock()
	select {
	case <-c.closed: // Close dropped every pair already
		p.mu.Unlock()
		if old != nil {
			_ = old.Close()
		}
		return
	default:
	}
	if p.c != old {
		p.mu.Unlock()
		return // already replaced
	}
	p.c, p.err = nil, why
	start := !p.retrying
	p.retrying = true
	if !p.isDown {
		p.isDown = true
		p.r.pairDown(why)
	}
	p.mu.Unlock()
	c.t.log.Warn("rail down for this peer; retrying in the background", "peer", c.peer.Address, "rail", p.r.idx, "device", p.r.name, "error", why)
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		if old != nil {
			_ = old.Close()
		}
		if start {
			c.retry(p)
		}
	}()
}

// retry reconnects p until it works (here, or in a batch's revive) or the
// conn is closed.
func (c *conn) retry(p *pair) {
	wait := c.t.cfg.Retry
	for {
		select {
		case <-c.closed:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 16*c.t.cfg.Retry)
		p.mu.Lock()
		if p.c != nil { // a batch's revive brought it back
			p.retrying = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		if p.r.portDown.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		nc, err := c.dial(ctx, p)
		cancel()
		if err != nil {
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
			continue
		}
		c.install(p, nc, true)
		return
	}
}

// reviveWait bounds a batch's own reconnect attempt when no rail is left.
const reviveWait = 3 * time.Second

// revive reconnects, in parallel and within ctx (at most reviveWait), every
// pair that is down while its port is ACTIVE; it returns how many are up.
func (c *conn) revive(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, reviveWait)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for _, p := range c.pairs {
		if p == nil || p.r.portDown.Load() || p.up() != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, err := c.dial(ctx, p)
			if err != nil {
				p.mu.Lock()
				p.err = err
				p.mu.Unlock()
				return
			}
			if c.install(p, nc, false) {
				mu.Lock()
				n++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return n
}

// install makes nc p's connection if p is still down and the conn open;
// else it closes nc. It reports whether nc was installed. The retry
// goroutine (fromRetry) ends its duty under the same lock, so a pair that
// goes down again right after starts a new one.
func (c *conn) install(p *pair, nc transport.Conn, fromRetry bool) bool {
	p.mu.Lock()
	if fromRetry {
		p.retrying = false
	}
	select {
	case <-c.closed:
		p.mu.Unlock()
		_ = nc.Close()
		return false
	default:
	}
	if p.c != nil {
		p.mu.Unlock()
		_ = nc.Close()
		return false
	}
	p.c, p.err = nc, nil
	if p.isDown {
		p.isDown = false
		p.r.pairUp()
	}
	p.mu.Unlock()
	p.r.reconnects.Add(1)
	c.t.log.Info("rail back for this peer", "peer", c.peer.Address, "rail", p.r.idx, "device", p.r.name)
	return true
}

// Err is nil until the conn is closed. A conn whose every rail is down
// stays: its rails reconnect in the background, and meanwhile a batch fails
// at once with Unavailable naming them (noRail), instead of a retry on a
// fresh connection that would wait on the same dead wires (with the control
// plane on one of them, until the caller's deadline).
func (c *conn) Err() error {
	select {
	case <-c.closed:
		return fmt.Errorf("rails: connection to %s closed: %w", c.peer.Address, errs.ErrAborted)
	default:
	}
	return nil
}

// Close closes every pair and stops the reconnects; safe twice.
func (c *conn) Close() error {
	var el []error
	c.closeOnce.Do(func() {
		c.enq.Lock()
		c.shut = true
		c.enq.Unlock()
		close(c.closed)
		for _, p := range c.pairs {
			if p == nil {
				continue
			}
			p.mu.Lock()
			pc := p.c
			p.c = nil
			if p.isDown {
				p.isDown = false
				p.r.pairUp()
			}
			p.mu.Unlock()
			if pc != nil {
				el = append(el, pc.Close())
			}
		}
		c.bg.Wait()
	})
	return errors.Join(el...)
}

// writeState is one Write's scratch, pooled.
type writeState struct {
	sc     [2]scratch // shares of this round and of the one before
	pick   []*pair
	conns  []transport.Conn
	jobs   []job
	redo   []desc.Batch
	failed []string
	// for the jobs of a round
	wg  sync.WaitGroup
	ctx context.Context
	reg *registration
	dst transport.RemoteRegion
}

// job is one share on one pair.
type job struct {
	p     *pair
	c     transport.Conn
	b     desc.Batch
	req   transport.Request // the share's write on the rail, kept here so a post allocates nothing
	bytes uint64
	st    transport.Stats
	err   error
}

// Write stripes b over the source's preferred rails that are up, and moves
// the share of a rail that fails to the rails left; see the package doc.
func (c *conn) write(ctx context.Context, src transport.Registration, dst transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	var st transport.Stats
	reg, ok := src.(*registration)
	if !ok || reg.t != c.t {
		return st, fmt.Errorf("rails: write: source was not registered with this transport: %w", errs.ErrInvalidArgument)
	}
	ws := c.t.pool.Get().(*writeState)
	defer c.t.pool.Put(ws)
	ws.failed = ws.failed[:0]
	total := b.Bytes()
	round := 0
	ws.sc[0].reset()
	ws.redo = append(ws.redo[:0], *b)
	revived := false
	for len(ws.redo) > 0 {
		c.pick(ws, reg)
		if len(ws.pick) == 0 {
			// Every rail failed (on an emulated testbed both may NAK or time
			// out at once under load): reconnect those whose port is ACTIVE,
			// once, as a retry on a fresh connection would.
			if !revived && ctx.Err() == nil && c.revive(ctx) > 0 {
				revived = true
				continue
			}
			return st, c.noRail(ws, ctx)
		}
		n := len(ws.pick)
		if total < c.t.cfg.StripeMin {
			n = 1
		}
		sc := &ws.sc[round%2]
		sc.reset()
		ws.jobs = ws.jobs[:0]
		for _, rb := range ws.redo {
			if n == 1 { // one share: the batch (or failed share) itself
				by := total
				if round > 0 {
					by = rb.Bytes()
				}
				ws.jobs = append(ws.jobs, job{p: ws.pick[0], c: ws.conns[0], b: rb, bytes: by})
				continue
			}
			shares, sizes := sc.split(&rb, rb.Bytes(), n)
			for k := range shares {
				ws.jobs = append(ws.jobs, job{p: ws.pick[k], c: ws.conns[k], b: shares[k], bytes: sizes[k]})
			}
		}
		c.run(ctx, ws, reg, dst)
		ws.redo = ws.redo[:0]
		var stop error
		for k := range ws.jobs {
			j := &ws.jobs[k]
			st.WorkRequests += j.st.WorkRequests
			st.Segments += j.st.Segments
			st.Plan += j.st.Plan
			st.Post += j.st.Post
			if j.err == nil {
				j.p.r.sent.Add(j.bytes)
				continue
			}
			if ctx.Err() != nil || !railFault(j.c, j.err) {
				if stop == nil {
					stop = j.err
				}
				continue
			}
			// The rail failed: its share goes again, whole, on the others.
			c.down(j.p, j.c, j.err)
			j.p.r.failovers.Add(1)
			ws.failed = append(ws.failed, fmt.Sprintf("rail %d (%s): %v", j.p.r.idx, j.p.r.name, j.err))
			c.t.log.Warn("rail failed under a batch; its share goes to the rails left", "peer", c.peer.Address, "rail", j.p.r.idx,
				"device", j.p.r.name, "share_bytes", j.bytes, "error", j.err)
			ws.redo = append(ws.redo, j.b)
		}
		if stop != nil {
			if len(ws.failed) > 0 {
				return st, fmt.Errorf("%w (after moving shares off failed rails: %s)", stop, strings.Join(ws.failed, "; "))
			}
			return st, stop
		}
		round++
	}
	return st, nil
}

// railFault: a share's failure says its rail (connection, port, path) is
// bad, not the request: the connection broke, or the error is Aborted or
// Unavailable.
func railFault(c transport.Conn, err error) bool {
	if c.Err() != nil {
		return true
	}
	k := errs.Class(err)
	return k == errs.ErrAborted || k == errs.ErrUnavailable
}

// pick fills ws.pick with the pairs a round stripes over: the source's
// preferred rails that are up, else its other rails that are up, in
// preference order, at most MaxRails.
func (c *conn) pick(ws *writeState, reg *registration) {
	ws.pick, ws.conns = ws.pick[:0], ws.conns[:0]
	for pass := 0; pass < 2 && len(ws.pick) == 0; pass++ {
		lo, hi := 0, reg.npref
		if pass == 1 {
			lo, hi = reg.npref, len(reg.order)
		}
		for _, i := range reg.order[lo:hi] {
			p := c.pairs[i]
			if p == nil {
				continue
			}
			if pc := p.up(); pc != nil {
				ws.pick, ws.conns = append(ws.pick, p), append(ws.conns, pc)
				if c.t.cfg.MaxRails > 0 && len(ws.pick) == c.t.cfg.MaxRails {
					return
				}
			}
		}
	}
}

// noRail is the batch's error when no rail is left.
func (c *conn) noRail(ws *writeState, ctx context.Context) error {
	var el []string
	el = append(el, ws.failed...)
	for _, p := range c.pairs {
		if p == nil {
			continue
		}
		p.mu.Lock()
		why := p.err
		p.mu.Unlock()
		if p.r.portDown.Load() {
			why = fmt.Errorf("port %d of %s is not ACTIVE", c.t.cfg.Port, p.r.name)
		}
		if why != nil {
			el = append(el, fmt.Sprintf("rail %d (%s) down: %v", p.r.idx, p.r.name, why))
		}
	}
	err := fmt.Errorf("rails: no rail left to %s: %s: %w", c.peer.Address, strings.Join(el, "; "), errs.ErrUnavailable)
	if ce := ctx.Err(); ce != nil {
		err = fmt.Errorf("%w (%w)", err, ce)
	}
	return err
}

// run writes every job, all but the first on their own goroutines, and
// waits for all of them. What the jobs share lives in ws (pooled), so a
// striped batch allocates nothing here.
func (c *conn) run(ctx context.Context, ws *writeState, reg *registration, dst transport.RemoteRegion) {
	ws.ctx, ws.reg, ws.dst = ctx, reg, dst
	c.enq.RLock()
	for k := 1; k < len(ws.jobs); k++ {
		ws.wg.Add(1)
		if !c.shut {
			select {
			case c.work[ws.jobs[k].p.r.idx] <- jobRef{ws, k}:
				continue
			default:
			}
		}
		go runJob(ws, k, true) // queue full, or closed: a goroutine of its own
	}
	c.enq.RUnlock()
	runJob(ws, 0, false)
	ws.wg.Wait()
	ws.ctx, ws.reg = nil, nil
}

func runJob(ws *writeState, k int, async bool) {
	if async {
		defer ws.wg.Done()
	}
	j := &ws.jobs[k]
	dst := ws.dst
	d := dst
	switch {
	case dst.Devices != nil && j.p.remote < len(dst.Devices):
		d.Key, d.Devices = dst.Devices[j.p.remote], nil
	case dst.Devices == nil && j.p.remote == 0:
	default:
		j.err = fmt.Errorf("rails: destination %q has no key for peer rail %d: %w", dst.Name, j.p.remote, errs.ErrFailedPrecondition)
		return
	}
	j.req = transport.Request{Op: transport.OpWrite, Local: ws.reg.regs[j.p.r.idx], Remote: d, Batch: &j.b}
	j.st, j.err = j.c.Post(ws.ctx, &j.req)
	j.req = transport.Request{}
}
