package rails

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/verbs"
)

// fabric joins fake rails: a connection writes straight into the memory the
// receiving rail's Inbound pins for the key, as a NIC would.
type fabric struct {
	mu    sync.Mutex
	rails map[string]*fakeRail // by device name, unique across daemons
}

// fault is what a fake rail does to the next writes.
type fault int

const (
	ok      fault = iota
	half          // place half of the share's bytes, then fail (QP error)
	refuse        // fail before placing anything (port down)
	stall         // place nothing and wait for the caller's deadline
	stallIn       // place nothing and wait until un-stalled
)

type fakeRail struct {
	transport.Quiet
	f     *fabric
	name  string
	ip    net.IP
	in    transport.Inbound
	fault atomic.Int32
	// writes counts Write calls; conns live connections.
	writes, conns, accepted atomic.Int64
	keys                    atomic.Uint32
	closed                  atomic.Bool
	failN                   atomic.Int32 // the next failN writes fail after half their share (transient)
	unstall                 chan struct{}
}

func (f *fabric) open(ips map[string]string) Open {
	return func(dev string, in transport.Inbound) (Rail, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.rails == nil {
			f.rails = map[string]*fakeRail{}
		}
		r := &fakeRail{f: f, name: dev, ip: net.ParseIP(ips[dev]), in: in, unstall: make(chan struct{})}
		r.keys.Store(uint32(len(f.rails)+1) << 8) // rkeys overlap between rails of one daemon, as on rxe
		f.rails[dev] = r
		return r, nil
	}
}

func (r *fakeRail) Kind() transport.Kind     { return transport.Verbs }
func (r *fakeRail) Describe() string         { return "fake " + r.name }
func (r *fakeRail) Status() transport.Status { return transport.Status{Resources: r.Resources()} }
func (r *fakeRail) Resources() transport.Resources {
	return transport.Resources{Connections: int(r.conns.Load())}
}
func (r *fakeRail) Port() verbs.Port {
	return verbs.Port{GID: r.ip.To16(), ActiveMTU: 1024, LinkLayer: "Ethernet", Device: r.name}
}
func (r *fakeRail) Close() error { r.closed.Store(true); return nil }

type fakeReg struct {
	transport.SingleKey
	mem memory.Memory
	key atomic.Uint64
	r   *fakeRail
}

func (g *fakeReg) Memory() memory.Memory { return g.mem }
func (g *fakeReg) Key() transport.RemoteKey {
	return transport.RemoteKey{Key: g.key.Load(), Addr: uint64(g.mem.Addr)}
}
func (g *fakeReg) Close() error { return nil }
func (g *fakeReg) Path() string { return "fake_reg_mr" }
func (g *fakeReg) Rekey() (transport.RemoteKey, error) {
	old := g.Key()
	g.key.Store(uint64(g.r.keys.Add(1)))
	return old, nil
}

func (r *fakeRail) Register(m memory.Memory) (transport.Registration, error) {
	g := &fakeReg{mem: m, r: r}
	g.key.Store(uint64(r.keys.Add(1)))
	return g, nil
}

func (r *fakeRail) AcceptVerbs(ctx context.Context, req verbs.ConnectRequest) (verbs.Accept, error) {
	r.accepted.Add(1)
	return verbs.Accept{Port: r.Port(), PathMTU: 1024, Endpoints: req.Endpoints}, nil
}
func (r *fakeRail) DisconnectVerbs(node string, id uint64) bool { return false }

// Connect asks the peer (through Signal, so the rails acceptor routes it)
// and finds the accepting rail by the device its port names.
func (r *fakeRail) Connect(ctx context.Context, p transport.Peer) (transport.Conn, error) {
	if fault(r.fault.Load()) == refuse {
		return nil, fmt.Errorf("fake %s: port down: %w", r.name, errs.ErrUnavailable)
	}
	acc, err := verbs.CallConnect(ctx, p.Signal, verbs.ConnectRequest{Node: "a", Port: r.Port(), Endpoints: []verbs.Endpoint{{QPN: 1}}})
	if err != nil {
		return nil, err
	}
	r.f.mu.Lock()
	to := r.f.rails[acc.Port.Device]
	r.f.mu.Unlock()
	r.conns.Add(1)
	return &fakeConn{from: r, to: to}, nil
}

type fakeConn struct {
	transport.NoPrepare
	from, to *fakeRail
	err      atomic.Pointer[error]
	once     sync.Once
}

// Post routes to Write (block ids: one Write per stretch); it cannot read.
func (c *fakeConn) Post(ctx context.Context, r *transport.Request) (transport.Stats, error) {
	h := transport.Handlers{Write: c.Write}
	return h.Post(ctx, r)
}

func (c *fakeConn) Err() error {
	if p := c.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *fakeConn) Close() error {
	c.once.Do(func() { c.from.conns.Add(-1) })
	return nil
}

func (c *fakeConn) Write(ctx context.Context, src transport.Registration, dst transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	c.from.writes.Add(1)
	if err := c.Err(); err != nil {
		return transport.Stats{}, err
	}
	g := src.(*fakeReg)
	if g.r != c.from {
		return transport.Stats{}, fmt.Errorf("source registered on %s, written on %s: %w", g.r.name, c.from.name, errs.ErrInvalidArgument)
	}
	breakIt := func(why string) (transport.Stats, error) {
		err := fmt.Errorf("fake %s: %s: %w", c.from.name, why, errs.ErrAborted)
		if ce := ctx.Err(); ce != nil {
			err = fmt.Errorf("%w (%w)", err, ce)
		}
		c.err.Store(&err)
		return transport.Stats{}, err
	}
	f := fault(c.from.fault.Load())
	if c.from.failN.Add(-1) >= 0 {
		f = half
	}
	switch f {
	case refuse:
		return breakIt("retry counter exceeded")
	case stall:
		<-ctx.Done()
		return breakIt("cut off by its deadline")
	case stallIn:
		select {
		case <-c.from.unstall:
		case <-ctx.Done():
			return breakIt("cut off by its deadline")
		}
	}
	m, release, err := c.to.in.Pin(transport.Verbs, dst.Key.Key)
	if err != nil {
		return transport.Stats{}, err
	}
	defer release()
	if dst.Key.Addr != uint64(m.Addr) {
		return transport.Stats{}, fmt.Errorf("fake: addr %#x for a region at %#x: %w", dst.Key.Addr, m.Addr, errs.ErrInvalidArgument)
	}
	n := b.N()
	if f == half {
		n /= 2
	}
	var bytes uint64
	for i := 0; i < n; i++ {
		copy(m.Host[b.Dst[i]:b.Dst[i]+b.Len[i]], g.mem.Host[b.Src[i]:b.Src[i]+b.Len[i]])
		bytes += b.Len[i]
	}
	if f == half {
		return breakIt("work completion failed: transport retry counter exceeded")
	}
	c.to.in.Landed(transport.Verbs, uint64(n), bytes)
	return transport.Stats{WorkRequests: uint64(n), Segments: uint64(n)}, nil
}

// registry is a receiving daemon's key index (the region registry's Pin).
type registry struct {
	transport.NoReads
	mu     sync.Mutex
	byKey  map[uint64]memory.Memory
	landed atomic.Uint64
	shares atomic.Uint64
}

func (g *registry) Pin(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.byKey[key]
	if !ok {
		return memory.Memory{}, nil, fmt.Errorf("fake registry: no region with key %#x: %w", key, errs.ErrNotFound)
	}
	return m, func() {}, nil
}

func (g *registry) Landed(k transport.Kind, blocks, bytes uint64) {
	g.landed.Add(bytes)
	g.shares.Add(1)
}

func (g *registry) add(key uint64, m memory.Memory) {
	g.mu.Lock()
	if g.byKey == nil {
		g.byKey = map[uint64]memory.Memory{}
	}
	g.byKey[key] = m
	g.mu.Unlock()
}

var _ = time.Second
