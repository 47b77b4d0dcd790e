package bench

import (
	"encoding/binary"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// splitmix64 is a fast, well-mixed PRNG step (Steele, Lea, Flood 2014): one
// add and three multiply-xorshift rounds per 8 bytes, so filling gigabytes is
// bound by memory bandwidth, not by the generator.
func splitmix64(state *uint64) uint64 {
	*state += 0x9e3779b97f4a7c15
	z := *state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// mix derives an independent seed from a base seed and labels.
func mix(seed uint64, labels ...uint64) uint64 {
	s := seed
	for _, l := range labels {
		s ^= l + 0x632be59bd9b4e019
		s = splitmix64(&s)
	}
	return s
}

// fillChunk is the unit of parallel work: each chunk has its own generator
// seeded from its index, so the data does not depend on the worker count.
const fillChunk = 4 << 20

// FillRandom overwrites b with pseudo-random bytes derived from seed, using
// every CPU. The pages are faulted in first in one call (a region the bench
// just mapped has no page-table entries yet; faulting 4 KiB at a time costs
// more than the writing).
func FillRandom(b []byte, seed uint64) {
	_ = unix.Madvise(b, unix.MADV_POPULATE_WRITE) // best effort: older kernels lack it
	chunks := (len(b) + fillChunk - 1) / fillChunk
	workers := min(runtime.GOMAXPROCS(0), chunks)
	var next sync.Mutex
	c := 0
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				i := c
				c++
				next.Unlock()
				if i >= chunks {
					return
				}
				lo := i * fillChunk
				fillSeq(b[lo:min(lo+fillChunk, len(b))], mix(seed, uint64(i)))
			}
		}()
	}
	wg.Wait()
}

func fillSeq(b []byte, seed uint64) {
	s := seed
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], splitmix64(&s))
	}
	if i < len(b) {
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], splitmix64(&s))
		copy(b[i:], tail[:])
	}
}

// StampBlocks writes a value unique to (stamp, block) over the first and last
// 8 bytes of every block. Done before each batch, it makes the final
// checksum prove that the last batch, not only an earlier one, delivered
// every block, head and tail.
func StampBlocks(region []byte, offsets []uint64, blockBytes uint64, stamp uint64) {
	var v [8]byte
	for i, off := range offsets {
		s := mix(stamp, uint64(i))
		binary.LittleEndian.PutUint64(v[:], splitmix64(&s))
		block := region[off : off+blockBytes]
		copy(block, v[:])
		if blockBytes >= 16 {
			copy(block[blockBytes-8:], v[:])
		}
	}
}
