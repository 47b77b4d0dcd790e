package transport

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/layout"
)

// Blocks is a validated block-id request (docs/kv.md) as a Conn moves it:
// block IDs.Src[i] of every segment of Pair.Src() to block IDs.Dst[i] of
// the matching segment of Pair.Dst(). The pair's source side is Local for
// a write and Remote for a read. The daemon has validated the ids against
// the pair (layout.Planner.Validate) and the layouts against the regions'
// sizes; a transport still checks every run against the memory it really
// moves. Nothing in it may be retained after the call: IDs alias a pooled
// Planner's scratch.
type Blocks struct {
	Pair *layout.Pair
	IDs  layout.IDs
	// Local are our regions' registrations with this Conn's kind, Remote
	// the peer's regions' keys, each by the Regions() index of its side of
	// Pair (a write: Local by Pair.Src(), Remote by Pair.Dst(); a read the
	// other way round).
	Local  []Registration
	Remote []RemoteRegion
}

// BlockScratch is a block write's reusable memory: one per caller at a
// time (the daemon pools them), so that a request allocates nothing once
// it has grown to the request's size.
type BlockScratch struct {
	Runs          []layout.Run
	Src, Dst, Len []uint64
}

// Expand fills sc.Runs with b's runs and sc.Src, Dst and Len with their
// offsets and lengths (desc.Batch arrays), allocating only to grow.
func (sc *BlockScratch) Expand(b *Blocks) {
	sc.Runs = b.Pair.Expand(sc.Runs[:0], b.IDs)
	n := len(sc.Runs)
	if cap(sc.Src) < n {
		sc.Src, sc.Dst, sc.Len = make([]uint64, n), make([]uint64, n), make([]uint64, n)
	}
	sc.Src, sc.Dst, sc.Len = sc.Src[:n], sc.Dst[:n], sc.Len[:n]
	for i := range sc.Runs {
		r := &sc.Runs[i]
		sc.Src[i], sc.Dst[i], sc.Len[i] = r.SrcOff, r.DstOff, r.Len
	}
}

// StretchEnd is the end of the stretch starting at run from: the runs
// sharing its (source region, destination region) pair.
func (sc *BlockScratch) StretchEnd(from int) int {
	sr, dr := sc.Runs[from].SrcRegion, sc.Runs[from].DstRegion
	to := from + 1
	for to < len(sc.Runs) && sc.Runs[to].SrcRegion == sr && sc.Runs[to].DstRegion == dr {
		to++
	}
	return to
}

// StretchError is a block write's failure in one stretch: a run of group
// Group (Pair.Group) from source region SrcRegion to destination region
// DstRegion (indices into the layouts' Regions).
type StretchError struct {
	Group, SrcRegion, DstRegion uint32
	Err                         error
}

func (e *StretchError) Error() string { return e.Err.Error() }
func (e *StretchError) Unwrap() error { return e.Err }

// MaxConcurrentStretches bounds the Writes WriteStretches issues at once.
const MaxConcurrentStretches = 8

// stretch is runs[from:to], one (source region, destination region) pair.
type stretch struct{ from, to int }

// WriteStretches is a block-id write for a kind that does not move one in
// one go (and for one falling back, GPU memory, say): it expands b into
// sc, cuts the runs into stretches and writes them with write, up to
// MaxConcurrentStretches at a time (a Conn that serialises its writes
// takes them one after the other). On the first failure the other writes
// are cancelled, and it returns once all have returned, so the
// no-byte-after-failure rule of a write carries over. Stats are summed
// over the writes (Plan includes the expansion).
func WriteStretches(ctx context.Context, write Descriptors, b *Blocks, sc *BlockScratch) (Stats, error) {
	t0 := time.Now()
	sc.Expand(b)
	plan := time.Since(t0)
	return runStretches(ctx, sc, plan, func(ctx context.Context, r *layout.Run, d *desc.Batch) (Stats, error) {
		if int(r.SrcRegion) >= len(b.Local) || int(r.DstRegion) >= len(b.Remote) {
			return Stats{}, fmt.Errorf("transport: block write: region index (source %d, destination %d) beyond the %d sources and %d destinations given", r.SrcRegion, r.DstRegion, len(b.Local), len(b.Remote))
		}
		return write(ctx, b.Local[r.SrcRegion], b.Remote[r.DstRegion], d)
	})
}

// ReadStretches is WriteStretches for a kind that pulls but not a
// block-id request in one go: one read per stretch, with its rules.
func ReadStretches(ctx context.Context, read Descriptors, b *Blocks, sc *BlockScratch) (Stats, error) {
	t0 := time.Now()
	sc.Expand(b)
	plan := time.Since(t0)
	return runStretches(ctx, sc, plan, func(ctx context.Context, run *layout.Run, d *desc.Batch) (Stats, error) {
		if int(run.SrcRegion) >= len(b.Remote) || int(run.DstRegion) >= len(b.Local) {
			return Stats{}, fmt.Errorf("transport: block read: region index (source %d, destination %d) beyond the %d sources and %d destinations given", run.SrcRegion, run.DstRegion, len(b.Remote), len(b.Local))
		}
		return read(ctx, b.Local[run.DstRegion], b.Remote[run.SrcRegion], d)
	})
}

// runStretches cuts sc's expanded runs into stretches and runs one per
// stretch, up to MaxConcurrentStretches at a time. On the first failure
// the others are cancelled, and it returns once all have returned, so the
// no-byte-after-failure rule of each call carries over. Stats are summed
// (Plan includes plan, the expansion).
func runStretches(ctx context.Context, sc *BlockScratch, plan time.Duration, call func(context.Context, *layout.Run, *desc.Batch) (Stats, error)) (Stats, error) {
	var stretches []stretch
	for from := 0; from < len(sc.Runs); {
		to := sc.StretchEnd(from)
		stretches = append(stretches, stretch{from, to})
		from = to
	}
	one := func(ctx context.Context, s stretch) (Stats, error) {
		r := &sc.Runs[s.from]
		b := desc.Batch{Src: sc.Src[s.from:s.to], Dst: sc.Dst[s.from:s.to], Len: sc.Len[s.from:s.to]}
		st, err := call(ctx, r, &b)
		if err != nil {
			err = &StretchError{Group: r.Group, SrcRegion: r.SrcRegion, DstRegion: r.DstRegion, Err: err}
		}
		return st, err
	}
	if len(stretches) == 0 {
		return Stats{Plan: plan}, nil
	}
	if len(stretches) == 1 {
		st, err := one(ctx, stretches[0])
		st.Plan += plan
		return st, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		total = Stats{Plan: plan}
		first error
		next  int
		wg    sync.WaitGroup
	)
	work := func() {
		defer wg.Done()
		for {
			mu.Lock()
			if first != nil || next == len(stretches) {
				mu.Unlock()
				return
			}
			s := stretches[next]
			next++
			mu.Unlock()
			st, err := one(ctx, s)
			mu.Lock()
			total.Segments += st.Segments
			total.WorkRequests += st.WorkRequests
			total.Plan += st.Plan
			total.Post += st.Post
			if err != nil && first == nil {
				first = err
				cancel() // the others stop; each call honours ctx
			}
			mu.Unlock()
		}
	}
	k := min(len(stretches), MaxConcurrentStretches)
	wg.Add(k)
	for i := 0; i < k; i++ {
		go work()
	}
	wg.Wait()
	return total, first
}

// ExpandChunk fills sc.Runs with at most limit runs of ids from c on, and
// sc.Src, Dst and Len with their offsets and lengths, allocating only to
// grow: a transport that copies chunk by chunk expands the request as it
// goes, not all of it before the first byte.
func (sc *BlockScratch) ExpandChunk(p *layout.Pair, ids layout.IDs, c *layout.Cursor, limit int) desc.Batch {
	sc.Runs = p.ExpandFrom(sc.Runs[:0], ids, c, limit)
	n := len(sc.Runs)
	if cap(sc.Src) < n {
		sc.Src, sc.Dst, sc.Len = make([]uint64, n), make([]uint64, n), make([]uint64, n)
	}
	sc.Src, sc.Dst, sc.Len = sc.Src[:n], sc.Dst[:n], sc.Len[:n]
	for i := range sc.Runs {
		r := &sc.Runs[i]
		sc.Src[i], sc.Dst[i], sc.Len[i] = r.SrcOff, r.DstOff, r.Len
	}
	return desc.Batch{Src: sc.Src, Dst: sc.Dst, Len: sc.Len}
}
