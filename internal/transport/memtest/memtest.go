// Package memtest is a test-only in-memory transport: a batch is copied
// straight into the memory the receiving transport's Inbound pins. It
// proves that a new kind is one folder plus one registration line (init
// below) and that the conformance suite is enough to hold it to the
// contract. Nothing in the daemon imports it.
package memtest

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// Kind is the test-only kind.
const Kind transport.Kind = "memtest"

func init() {
	_ = transport.Register(transport.Driver{Kind: Kind, New: func(env transport.Env) (transport.Transport, error) { return New(env.Inbound), nil },
		Caps: transport.Caps{Rank: -1, SameHostOnly: true, Memory: []memory.Kind{memory.Host}, Ops: transport.OpWrite, Blocks: true, Keys: transport.KeyCaps{Rekey: true}}})
}

// Transport is one daemon's in-memory data plane.
type Transport struct {
	transport.Quiet
	in     transport.Inbound
	closed atomic.Bool
}

// New starts a transport whose receiving side is in.
func New(in transport.Inbound) *Transport { return &Transport{in: in} }

func (t *Transport) Kind() transport.Kind { return Kind }
func (t *Transport) Close() error         { t.closed.Store(true); return nil }

type registration struct {
	transport.SingleKey
	mem memory.Memory
	key atomic.Uint64
}

func (r *registration) Memory() memory.Memory    { return r.mem }
func (r *registration) Key() transport.RemoteKey { return transport.RemoteKey{Key: r.key.Load()} }
func (r *registration) Close() error             { return nil }

// Rekey: the receiver pins through the registry's index, which follows
// the new key, so the old one is refused from now on.
func (r *registration) Rekey() (transport.RemoteKey, error) {
	return transport.RemoteKey{Key: r.key.Swap(newKey())}, nil
}

func newKey() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}

func (t *Transport) Register(m memory.Memory) (transport.Registration, error) {
	if m.Kind != memory.Host || m.Host == nil {
		return nil, fmt.Errorf("%w: memtest: %s memory", errs.ErrFailedPrecondition, m.Kind)
	}
	r := &registration{mem: m}
	r.key.Store(newKey())
	return r, nil
}

// Peer.Address names the receiving transport in a process-wide table.
var peers sync.Map // address -> *Transport

// Listen makes t reachable at addr; the returned func withdraws it.
func (t *Transport) Listen(addr string) func() {
	peers.Store(addr, t)
	return func() { peers.Delete(addr) }
}

func (t *Transport) Connect(ctx context.Context, p transport.Peer) (transport.Conn, error) {
	v, ok := peers.Load(p.Address)
	if !ok {
		return nil, fmt.Errorf("%w: memtest: no transport listens at %q", errs.ErrUnavailable, p.Address)
	}
	return newConn(v.(*Transport)), nil
}

// newConn is a conn to the transport to, with its handlers set.
func newConn(to *Transport) *conn {
	c := &conn{to: to}
	c.Handlers = transport.Handlers{Write: c.write, WriteBlocks: c.writeBlocks}
	return c
}

type conn struct {
	transport.Handlers // writes only (Caps.Ops)
	transport.NoPrepare
	to     *Transport
	closed atomic.Bool
	bs     blockState
}

func (c *conn) Err() error {
	if c.closed.Load() {
		return fmt.Errorf("%w: memtest: connection closed", errs.ErrUnavailable)
	}
	return nil
}

func (c *conn) Close() error { c.closed.Store(true); return nil }

// Write pins the destination (the receiver may stall there: the cut-off
// is checked before a byte is placed), copies every block, then reports
// the landing.
func (c *conn) write(ctx context.Context, src transport.Registration, dst transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	if err := c.Err(); err != nil {
		return transport.Stats{}, err
	}
	sm := src.Memory().Host
	if err := bounds(b.Src, b.Len, uint64(len(sm)), "source"); err != nil {
		return transport.Stats{}, err
	}
	if err := bounds(b.Dst, b.Len, dst.Size, "destination"); err != nil {
		return transport.Stats{}, err
	}
	type pinned struct {
		m       memory.Memory
		release func()
		err     error
	}
	done := make(chan pinned, 1)
	go func() {
		m, release, err := c.to.in.Pin(Kind, dst.Key.Key)
		done <- pinned{m, release, err}
	}()
	var p pinned
	select {
	case p = <-done:
	case <-ctx.Done():
		// The pin may come later: release it then, place nothing.
		go func() {
			if p := <-done; p.err == nil {
				p.release()
			}
		}()
		return transport.Stats{}, fmt.Errorf("memtest: waiting for the receiver: %w", ctx.Err())
	}
	if p.err != nil {
		return transport.Stats{}, fmt.Errorf("memtest: destination %q: %w", dst.Name, p.err)
	}
	defer p.release()
	if err := bounds(b.Dst, b.Len, p.m.Len, "destination region"); err != nil {
		return transport.Stats{}, err
	}
	for i := range b.Src {
		copy(p.m.Host[b.Dst[i]:b.Dst[i]+b.Len[i]], sm[b.Src[i]:b.Src[i]+b.Len[i]])
	}
	c.to.in.Landed(Kind, uint64(b.N()), b.Bytes())
	return transport.Stats{Segments: uint64(b.N()), WorkRequests: 1}, nil
}

func bounds(off, lens []uint64, size uint64, what string) error {
	for i := range off {
		if off[i] > size || lens[i] > size-off[i] {
			return fmt.Errorf("%w: memtest: block %d [%d,+%d) is outside the %d-byte %s", errs.ErrInvalidArgument, i, off[i], lens[i], size, what)
		}
	}
	return nil
}
