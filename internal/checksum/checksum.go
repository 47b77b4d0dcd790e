// Package checksum hashes the listed blocks of host memory, in parallel, for
// end-to-end verification of transfers.
package checksum

import (
	"encoding/binary"
	"hash/crc32"
	"runtime"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/b2bd/b2bd/internal/memguard"
)

// Algorithm selects the hash.
type Algorithm int

const (
	CRC32C Algorithm = iota
	XXH64
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Block hashes one block.
func Block(a Algorithm, b []byte) uint64 {
	if a == XXH64 {
		return xxhash.Sum64(b)
	}
	return uint64(crc32.Checksum(b, castagnoli))
}

// Blocks hashes mem[off[i]:off[i]+len[i]] for every i into out (len(off)
// entries), in parallel for large lists. mem may be a client's shared
// mapping: a fault on it (the client truncated the backing file) is returned
// as an error wrapping memguard.ErrFault, in whichever worker it happened,
// instead of killing the process.
func Blocks(a Algorithm, mem []byte, off, lens []uint64, out []uint64) error {
	n := len(off)
	workers := min(runtime.GOMAXPROCS(0), 1+n/64)
	var total uint64
	for _, l := range lens {
		total += l
	}
	if total < 4<<20 {
		workers = 1
	}
	hash := func(lo, hi int) error {
		// SetPanicOnFault is per goroutine: every worker guards itself.
		return memguard.Do(memguard.Unknown, func() {
			for i := lo; i < hi; i++ {
				out[i] = Block(a, mem[off[i]:off[i]+lens[i]])
			}
		})
	}
	if workers == 1 {
		return hash(0, n)
	}
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	per := (n + workers - 1) / workers
	for w := 0; w < workers; w++ {
		lo, hi := w*per, min(n, (w+1)*per)
		if lo >= hi {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := hash(lo, hi); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc // the first fault, or nil
}

// Combine is the batch digest: the same hash over the per-block digests
// packed as little-endian uint64s, so that blocks hash in parallel and one
// number still covers every byte and the order.
func Combine(a Algorithm, digests []uint64) uint64 {
	packed := make([]byte, 8*len(digests))
	for i, v := range digests {
		binary.LittleEndian.PutUint64(packed[8*i:], v)
	}
	return Block(a, packed)
}
