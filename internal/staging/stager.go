package staging

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
)

// DefaultBuffer is the pinned buffer size of one stager.
const DefaultBuffer = 64 << 20

// Stager owns one pinned host buffer and one stream on a device. It is not
// safe for concurrent use; take one per connection or from a Pool.
type Stager struct {
	cuda   gpudirect.Interface
	dev    int
	buf    []byte
	stream *gpudirect.Stream
	plan   Plan
	dsts   []uint64
	srcs   []uint64
	sizes  []uint64
}

// New allocates a stager with a pinned buffer of size bytes on dev.
func New(cuda gpudirect.Interface, dev int, size int) (*Stager, error) {
	if cuda == nil {
		return nil, fmt.Errorf("%w: staging: no CUDA driver", errs.ErrFailedPrecondition)
	}
	buf, err := cuda.HostAlloc(dev, size)
	if err != nil {
		return nil, DomainError(fmt.Errorf("staging: pinned buffer of %d bytes on device %d: %w", size, dev, err))
	}
	st, err := cuda.StreamCreate(dev)
	if err != nil {
		_ = cuda.HostFree(dev, buf)
		return nil, DomainError(fmt.Errorf("staging: stream on device %d: %w", dev, err))
	}
	return &Stager{cuda: cuda, dev: dev, buf: buf, stream: st}, nil
}

// Close frees the buffer and stream; safe twice.
func (s *Stager) Close() error {
	if s == nil || s.buf == nil {
		return nil
	}
	err := s.cuda.StreamDestroy(s.stream)
	if ferr := s.cuda.HostFree(s.dev, s.buf); err == nil {
		err = ferr
	}
	s.buf = nil
	return DomainError(err)
}

// Buffer is the pinned buffer.
func (s *Stager) Buffer() []byte { return s.buf }

// Read copies the leading blocks of (off, lens) of mem into the buffer, as
// many as fit, and returns how many, with each block's offset in Buffer().
func (s *Stager) Read(mem memory.Memory, off, lens []uint64) (int, []uint64, error) {
	n := PlanRead(&s.plan, off, lens, uint64(len(s.buf)))
	if n == 0 {
		return 0, nil, fmt.Errorf("%w: staging: a %d-byte block does not fit the %d-byte pinned buffer", errs.ErrResourceExhausted, lens[0], len(s.buf))
	}
	return n, s.plan.HostOff, s.run(mem, true)
}

// Write copies blocks already in the buffer at hostOff[i] to mem at off[i].
func (s *Stager) Write(mem memory.Memory, off, lens, hostOff []uint64) error {
	s.plan.Reset()
	for i := range off {
		s.plan.Ops = append(s.plan.Ops, Op{Dev: off[i], Host: hostOff[i], Len: lens[i]})
	}
	return s.run(mem, false)
}

// run issues the plan's copies in one batched call and waits.
func (s *Stager) run(mem memory.Memory, toHost bool) error {
	s.dsts, s.srcs, s.sizes = s.dsts[:0], s.srcs[:0], s.sizes[:0]
	host := uint64(addrOf(s.buf))
	for _, op := range s.plan.Ops {
		d, h := uint64(mem.Addr)+op.Dev, host+op.Host
		if toHost {
			s.dsts, s.srcs = append(s.dsts, h), append(s.srcs, d)
		} else {
			s.dsts, s.srcs = append(s.dsts, d), append(s.srcs, h)
		}
		s.sizes = append(s.sizes, op.Len)
	}
	if len(s.sizes) == 0 {
		return nil
	}
	if err := s.cuda.MemcpyBatchAsync(s.stream, s.dsts, s.srcs, s.sizes); err != nil {
		return DomainError(fmt.Errorf("staging: %d copies on device %d: %w", len(s.sizes), s.dev, err))
	}
	if err := s.cuda.StreamSynchronize(s.stream); err != nil {
		return DomainError(fmt.Errorf("staging: synchronise device %d: %w", s.dev, err))
	}
	return nil
}

// Pool keeps stagers per device so that the data path reuses pinned buffers.
// Pinned host memory is slow to allocate (cuMemHostAlloc of 64 MiB takes
// tens to hundreds of milliseconds), so the transports Reserve what a
// device's batches need when a region on it registers: a batch's first run
// then allocates nothing.
type Pool struct {
	CUDA gpudirect.Interface
	Size int
	mu   sync.Mutex
	free map[int][]*Stager
	all  []*Stager
	// made counts the stagers allocated, for tests and Status.
	made atomic.Int64
}

// Allocations is how many stagers (pinned buffers) the pool has allocated.
func (p *Pool) Allocations() int64 { return p.made.Load() }

// Reserve makes sure the pool holds at least n stagers for dev (free or in
// use), allocating the missing ones now, so that Get on the data path finds
// one ready. Safe to call again: a device already holding n allocates
// nothing.
func (p *Pool) Reserve(dev, n int) error {
	for {
		p.mu.Lock()
		have := 0
		for _, s := range p.all {
			if s.dev == dev {
				have++
			}
		}
		p.mu.Unlock()
		if have >= n {
			return nil
		}
		s, err := p.alloc(dev)
		if err != nil {
			return fmt.Errorf("reserve %d pinned staging buffers on device %d (%d held): %w", n, dev, have, err)
		}
		p.Put(s)
	}
}

// alloc makes a stager and records it.
func (p *Pool) alloc(dev int) (*Stager, error) {
	size := p.Size
	if size <= 0 {
		size = DefaultBuffer
	}
	s, err := New(p.CUDA, dev, size)
	if err != nil {
		return nil, err
	}
	p.made.Add(1)
	p.mu.Lock()
	p.all = append(p.all, s)
	p.mu.Unlock()
	return s, nil
}

// Get returns a stager for dev.
func (p *Pool) Get(dev int) (*Stager, error) {
	p.mu.Lock()
	if l := p.free[dev]; len(l) > 0 {
		s := l[len(l)-1]
		p.free[dev] = l[:len(l)-1]
		p.mu.Unlock()
		return s, nil
	}
	p.mu.Unlock()
	return p.alloc(dev)
}

// Put returns s for reuse.
func (p *Pool) Put(s *Stager) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.free == nil {
		p.free = map[int][]*Stager{}
	}
	p.free[s.dev] = append(p.free[s.dev], s)
}

// Close frees every stager.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var first error
	for _, s := range p.all {
		if err := s.Close(); err != nil && first == nil {
			first = err
		}
	}
	p.all, p.free = nil, nil
	return first
}
