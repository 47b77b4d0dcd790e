package ring

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
)

// The mapping: a header page, then the submission records, then the
// completion records, then the id arena (arena.go). Each index and sleep
// flag has a cache line of its own.
const (
	hdrLen     = 4096
	magic      = 0x3147_4e52 // "RNG1"
	offMagic   = 0
	offSQN     = 4
	offCQN     = 8
	offArena   = 12 // the arena's size in bytes
	offSQHead  = 64
	offSQTail  = 128
	offSQSleep = 192
	offCQHead  = 256
	offCQTail  = 320
	offCQSleep = 384

	// MaxEntries bounds either ring; entries are a power of two.
	MaxEntries     = 4096
	DefaultEntries = 256
)

// Size is the mapping's length for sq and cq entries and an arena of
// arena bytes.
func Size(sq, cq uint32, arena uint64) int {
	return hdrLen + int(sq)*RecLen + int(cq)*CompLen + int(arena)
}

// CheckEntries refuses ring sizes that are not a power of two in [2, MaxEntries].
func CheckEntries(field string, n uint32) error {
	if n < 2 || n > MaxEntries || n&(n-1) != 0 {
		return fmt.Errorf("%w: ring %s %d: want a power of two from 2 to %d", errs.ErrInvalidArgument, field, n, MaxEntries)
	}
	return nil
}

// Region is one ring pair mapped into this process.
type Region struct {
	mem    []byte
	SQ, CQ Queue
	// Arena is the id arena: the client writes it, the daemon only copies
	// out of it (Request.FromArena).
	Arena []byte
}

// Queue is one direction: records, the consumer's head, the producer's tail
// and the consumer's sleep flag. Indices run free (mod 2^32); entries is a
// power of two.
type Queue struct {
	head, tail, sleep *uint32
	recs              []byte
	n, recLen         uint32
}

// Create makes a sealed memfd holding an empty ring pair and maps it: the
// daemon's side. The caller sends fd to the client and closes it.
func Create(sq, cq uint32, arena uint64) (fd int, r *Region, err error) { // arena 0: none
	if err := CheckEntries("submission entries", sq); err != nil {
		return -1, nil, err
	}
	if err := CheckEntries("completion entries", cq); err != nil {
		return -1, nil, err
	}
	if arena != 0 { // 0: a ring without an arena, for a client that asked with Hello
		if err := CheckArena(arena); err != nil {
			return -1, nil, err
		}
	}
	fd, err = unix.MemfdCreate("b2b-ring", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("%w: ring memfd: %w", errs.ErrResourceExhausted, err)
	}
	size := Size(sq, cq, arena)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("%w: ring memfd size %d: %w", errs.ErrResourceExhausted, size, err)
	}
	// Sealed, the client cannot shrink the file under the daemon's mapping
	// (which would fault the daemon on its next access).
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("ring memfd seals: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("%w: ring mmap %d bytes: %w", errs.ErrResourceExhausted, size, err)
	}
	*u32(mem, offSQN), *u32(mem, offCQN), *u32(mem, offArena) = sq, cq, uint32(arena)
	atomic.StoreUint32(u32(mem, offMagic), magic)
	return fd, newRegion(mem, sq, cq, arena), nil
}

// Map maps the ring pair in fd: the client's side.
func Map(fd int) (*Region, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("ring fd: %w", err)
	}
	if max := int64(Size(MaxEntries, MaxEntries, MaxArena)); st.Size < hdrLen || st.Size > max {
		return nil, fmt.Errorf("ring fd is %d bytes, want %d to %d", st.Size, hdrLen, max)
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("ring mmap: %w", err)
	}
	sq, cq, arena := *u32(mem, offSQN), *u32(mem, offCQN), uint64(*u32(mem, offArena))
	err = CheckEntries("submission entries", sq)
	if err == nil {
		err = CheckEntries("completion entries", cq)
	}
	if err == nil && arena != 0 {
		err = CheckArena(arena)
	}
	if err == nil && (*u32(mem, offMagic) != magic || Size(sq, cq, arena) != len(mem)) {
		err = fmt.Errorf("ring header magic %#x, %d+%d entries and %d arena bytes in %d bytes: not a ring", *u32(mem, offMagic), sq, cq, arena, len(mem))
	}
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	return newRegion(mem, sq, cq, arena), nil
}

func newRegion(mem []byte, sq, cq uint32, arena uint64) *Region {
	sqEnd := hdrLen + int(sq)*RecLen
	cqEnd := sqEnd + int(cq)*CompLen
	return &Region{mem: mem,
		SQ:    Queue{head: u32(mem, offSQHead), tail: u32(mem, offSQTail), sleep: u32(mem, offSQSleep), recs: mem[hdrLen:sqEnd], n: sq, recLen: RecLen},
		CQ:    Queue{head: u32(mem, offCQHead), tail: u32(mem, offCQTail), sleep: u32(mem, offCQSleep), recs: mem[sqEnd:cqEnd], n: cq, recLen: CompLen},
		Arena: mem[cqEnd : cqEnd+int(arena) : cqEnd+int(arena)],
	}
}

// Head is the consumer's head as it stands (a producer's view: the
// records before it were taken).
func (q *Queue) Head() uint32 { return atomic.LoadUint32(q.head) }

// Close unmaps the region; nothing may touch it afterwards.
func (r *Region) Close() error {
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem = nil
	return err
}

func u32(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }

// Slot is the record at index i.
func (q *Queue) Slot(i uint32) []byte {
	off := (i & (q.n - 1)) * q.recLen
	return q.recs[off : off+q.recLen : off+q.recLen]
}

// Ready is how many records wait for a consumer at head (its own copy): the
// producer's tail is read once. A tail behind head or more than the ring
// ahead is corruption.
func (q *Queue) Ready(head uint32) (uint32, error) {
	t := atomic.LoadUint32(q.tail)
	if d := t - head; d > q.n {
		return 0, fmt.Errorf("%w: ring tail %d against head %d of %d entries: moved backwards or beyond the ring", errs.ErrInvalidArgument, t, head, q.n)
	}
	return t - head, nil
}

// Consumed publishes the consumer's head: the records before it are free.
func (q *Queue) Consumed(head uint32) { atomic.StoreUint32(q.head, head) }

// Entries is the queue's size in records.
func (q *Queue) Entries() uint32 { return q.n }

// Free is how many records a producer at tail (its own copy) may write: the
// consumer's head is read once. A head ahead of tail or more than the ring
// behind is corruption.
func (q *Queue) Free(tail uint32) (uint32, error) {
	h := atomic.LoadUint32(q.head)
	if d := tail - h; d > q.n {
		return 0, fmt.Errorf("%w: ring head %d against tail %d of %d entries: moved past the tail or backwards", errs.ErrInvalidArgument, h, tail, q.n)
	}
	return q.n - (tail - h), nil
}

// Publish makes the records before tail visible and wakes the consumer if it
// sleeps.
func (q *Queue) Publish(tail uint32) {
	atomic.StoreUint32(q.tail, tail)
	if atomic.SwapUint32(q.sleep, 0) != 0 {
		futexWake(q.tail)
	}
}

// Wake wakes whoever sleeps on the queue, e.g. to notice teardown.
func (q *Queue) Wake() { futexWake(q.tail) }

// Tail is the producer's tail as it stands.
func (q *Queue) Tail() uint32 { return atomic.LoadUint32(q.tail) }

// Spin is how long a consumer busy-waits before it sleeps on the futex:
// 200 us, whose futex wake-up it saves (50-100 us on a loaded host), where
// the process may run on more than 2 CPUs; none on a smaller host, where
// the spinning side would take the very core that the producer and the
// transfers need (a disaggregated engine's pushes on 2 cores waited 10-30
// ms on the wire against 0.3-1 ms without the spin).
func Spin() time.Duration {
	if runtime.GOMAXPROCS(0) > 2 {
		return 200 * time.Microsecond
	}
	return 0
}

// Wait returns once the tail differs from seen, after spinning for up to
// spin and then sleeping for up to timeout (spurious returns are fine: the
// caller rechecks).
func (q *Queue) Wait(seen uint32, spin, timeout time.Duration) {
	if spin > 0 {
		end := time.Now().Add(spin)
		for i := 0; ; i++ {
			if atomic.LoadUint32(q.tail) != seen {
				return
			}
			if i&15 == 15 {
				if time.Now().After(end) {
					break
				}
				// Yield the CPU, not just the goroutine: on an
				// oversubscribed host the other side may be waiting
				// for this very core.
				unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			}
		}
	}
	// The producer stores its tail, then reads the flag; the consumer stores
	// the flag, then reads the tail: one of them sees the other.
	atomic.StoreUint32(q.sleep, 1)
	if atomic.LoadUint32(q.tail) != seen {
		return
	}
	futexWait(q.tail, seen, timeout)
}

// futexWait sleeps while *addr == val, up to timeout. Not FUTEX_PRIVATE:
// the other side is another process.
func futexWait(addr *uint32, val uint32, timeout time.Duration) {
	ts := unix.NsecToTimespec(int64(timeout))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 0 /* FUTEX_WAIT */, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 1 /* FUTEX_WAKE */, uintptr(1<<31-1), 0, 0, 0)
}
