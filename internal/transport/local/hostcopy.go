package local

// The CPU copy of host batches: shares, chunks, the worker pool.

import (
	"context"
	"fmt"
	"sync"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/memguard"
)

// shareEnd returns the end of the share starting at lo that carries about
// want bytes (at least one block, leaving at least one for later shares).
func shareEnd(sizes []uint64, lo int, want uint64) int {
	var acc uint64
	i := lo
	for i < len(sizes)-1 {
		acc += sizes[i]
		i++
		if acc >= want {
			break
		}
	}
	return i
}

// hostChunk is how many bytes the CPU copies between looks at the deadline.
const hostChunk = 4 << 20

// copyHost copies every block with the CPU; a fault on either mapping (a
// file shrunk under it) fails the batch instead of the process, and the
// caller's deadline is looked at every hostChunk bytes, so a slow copy (a
// destination whose pages are first touched, memory pressure) ends with
// DeadlineExceeded instead of holding both regions past it.
func copyHost(ctx context.Context, dst, src []byte, b *desc.Batch, lo, hi int) error {
	var cerr error
	ferr := memguard.DoCopy(dst, src, func() {
		var since uint64
		for i := lo; i < hi; i++ {
			n, s, d := b.Len[i], b.Src[i], b.Dst[i]
			for n > 0 {
				k := min(n, hostChunk)
				copy(dst[d:d+k], src[s:s+k])
				s, d, n = s+k, d+k, n-k
				if since += k; since >= hostChunk {
					since = 0
					if cerr = ctx.Err(); cerr != nil {
						return
					}
				}
			}
		}
	})
	if ferr != nil {
		return ferr
	}
	if cerr != nil {
		return fmt.Errorf("samehost: host copy cut off: %w", cerr)
	}
	return nil
}

// hostPool is a connection's CPU copy workers: a batch is cut into shares
// of about equal bytes (blocks whole), each copied by one worker under its
// own memguard. Batches on a Conn are serialised, so one set of tasks is
// reused and a batch allocates nothing.
type hostPool struct {
	work  chan *hostTask
	tasks []hostTask
	wg    sync.WaitGroup
}

type hostTask struct {
	ctx      context.Context
	dst, src []byte
	b        *desc.Batch
	lo, hi   int
	err      error
	wg       *sync.WaitGroup
}

func newHostPool(n int) *hostPool {
	p := &hostPool{work: make(chan *hostTask, n), tasks: make([]hostTask, n)}
	for i := 0; i < n; i++ {
		go func() {
			for t := range p.work {
				t.err = copyHost(t.ctx, t.dst, t.src, t.b, t.lo, t.hi)
				t.wg.Done()
			}
		}()
	}
	return p
}

// run copies b in k shares (k ≤ the pool's size) and returns the first
// share's error, after every share ended.
func (p *hostPool) run(ctx context.Context, dst, src []byte, b *desc.Batch, k int) error {
	k = min(k, len(p.tasks))
	want := b.Bytes() / uint64(k)
	lo, n := 0, 0
	for j := 0; j < k && lo < b.N(); j++ {
		hi := b.N()
		if j < k-1 {
			hi = shareEnd(b.Len, lo, want)
		}
		p.tasks[j] = hostTask{ctx: ctx, dst: dst, src: src, b: b, lo: lo, hi: hi, wg: &p.wg}
		lo, n = hi, n+1
	}
	p.wg.Add(n)
	for j := 0; j < n; j++ {
		p.work <- &p.tasks[j]
	}
	p.wg.Wait()
	var err error
	for j := 0; j < n; j++ {
		if err == nil {
			err = p.tasks[j].err
		}
		p.tasks[j] = hostTask{} // drop the references to the batch and the regions
	}
	return err
}

// close stops the workers; safe on nil.
func (p *hostPool) close() {
	if p != nil {
		close(p.work)
	}
}
