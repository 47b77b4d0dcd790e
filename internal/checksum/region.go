package checksum

import (
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
)

// Source is the memory of one region to hash, with the names its errors use.
type Source struct {
	Mem  memory.Memory
	ID   string // the region's ID
	Path string // its shared-memory file, for host memory
}

// Region hashes the blocks (off[i], lens[i]) of src into out: host memory in
// place (a fault on it is an error, see Blocks), device memory staged
// through pool's pinned host buffers, in rounds, with the copy engines only.
// pool is nil on a host without CUDA.
func Region(a Algorithm, src Source, pool *staging.Pool, off, lens, out []uint64) error {
	if src.Mem.Kind == memory.Host {
		if err := Blocks(a, src.Mem.Host, off, lens, out); err != nil {
			return fmt.Errorf("checksum of region %s (%s): %w", src.ID, src.Path, err)
		}
		return nil
	}
	mem := src.Mem
	if pool == nil {
		return fmt.Errorf("%w: region is %s memory and this daemon has no CUDA driver", errs.ErrFailedPrecondition, mem.Kind)
	}
	st, err := pool.Get(mem.Device)
	if err != nil {
		return err
	}
	defer pool.Put(st)
	for lo := 0; lo < len(off); {
		n, hostOff, err := st.Read(mem, off[lo:], lens[lo:])
		if err != nil {
			return err
		}
		if err := Blocks(a, st.Buffer(), hostOff[:n], lens[lo:lo+n], out[lo:lo+n]); err != nil {
			return fmt.Errorf("checksum of staged %s memory: %w", mem.Kind, err)
		}
		lo += n
	}
	return nil
}
