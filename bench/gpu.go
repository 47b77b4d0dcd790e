package bench

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unsafe"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/gpudirect"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// sourceMemory is the source region as the bench fills, stamps and samples
// it: mapped host memory, or GPU memory reached through its IPC handle.
type sourceMemory interface {
	ID() string
	Kind() b2bv1.MemoryKind
	// Fill writes fresh random data over [0, n).
	Fill(n, seed uint64) error
	// Stamp overwrites the first and last 8 bytes of every block (StampBlocks).
	Stamp(offsets []uint64, blockBytes, stamp uint64) error
	// Read copies [off, off+len(into)) into into.
	Read(off uint64, into []byte) error
	// Release unmaps what the bench mapped (the daemon keeps the region).
	Release() error
}

type hostSource struct{ r *client.HostRegion }

func (h hostSource) ID() string             { return h.r.GetId() }
func (h hostSource) Kind() b2bv1.MemoryKind { return h.r.GetKind() }
func (h hostSource) Fill(n, seed uint64) error {
	FillRandom(h.r.Bytes[:n], seed)
	return nil
}
func (h hostSource) Stamp(offsets []uint64, blockBytes, stamp uint64) error {
	StampBlocks(h.r.Bytes, offsets, blockBytes, stamp)
	return nil
}
func (h hostSource) Read(off uint64, into []byte) error {
	copy(into, h.r.Bytes[off:])
	return nil
}
func (h hostSource) Release() error { return h.r.Unmap() }

// cudaSource is a daemon-allocated GPU region opened here through its IPC
// handle. Filling and stamping use the copy engines only.
type cudaSource struct {
	id     string
	cuda   gpudirect.Interface
	dev    int
	base   uintptr // the IPC mapping
	ptr    uintptr // the region inside it
	size   uint64
	pinned []byte
	stream *gpudirect.Stream
	dsts   []uint64
	srcs   []uint64
	sizes  []uint64
}

const cudaPinned = 64 << 20

func openCUDASource(cuda gpudirect.Interface, r *b2bv1.Region) (*cudaSource, error) {
	h, err := gpudirect.ParseIPCHandle("region.cuda_ipc_handle", r.GetCudaIpcHandle())
	if err != nil {
		return nil, err
	}
	dev := int(r.GetCudaDevice())
	base, err := cuda.IPCOpenMemHandle(dev, h)
	if err != nil {
		return nil, fmt.Errorf("open the source region's IPC handle on cuda:%d: %w", dev, err)
	}
	s := &cudaSource{id: r.GetId(), cuda: cuda, dev: dev, base: base, ptr: base + uintptr(r.GetCudaIpcOffset()), size: r.GetSize()}
	if s.pinned, err = cuda.HostAlloc(dev, cudaPinned); err != nil {
		_ = cuda.IPCCloseMemHandle(dev, base)
		return nil, err
	}
	if s.stream, err = cuda.StreamCreate(dev); err != nil {
		_ = s.Release()
		return nil, err
	}
	return s, nil
}

func (c *cudaSource) ID() string             { return c.id }
func (c *cudaSource) Kind() b2bv1.MemoryKind { return b2bv1.MemoryKind_MEMORY_KIND_CUDA }

func (c *cudaSource) Fill(n, seed uint64) error {
	for off := uint64(0); off < n; off += cudaPinned {
		chunk := min(uint64(cudaPinned), n-off)
		FillRandom(c.pinned[:chunk], mix(seed, off))
		if err := c.cuda.MemcpyHtoDAsync(c.stream, c.ptr+uintptr(off), addr(c.pinned), chunk); err != nil {
			return err
		}
		if err := c.cuda.StreamSynchronize(c.stream); err != nil {
			return err
		}
	}
	return nil
}

// Stamp writes the same values StampBlocks would, with one batched copy.
func (c *cudaSource) Stamp(offsets []uint64, blockBytes, stamp uint64) error {
	if uint64(len(offsets))*16 > uint64(len(c.pinned)) {
		return fmt.Errorf("%d stamps do not fit the %d-byte pinned buffer", len(offsets), len(c.pinned))
	}
	c.dsts, c.srcs, c.sizes = c.dsts[:0], c.srcs[:0], c.sizes[:0]
	host := uint64(addr(c.pinned))
	for i, off := range offsets {
		s := mix(stamp, uint64(i))
		binary.LittleEndian.PutUint64(c.pinned[8*i:], splitmix64(&s))
		c.dsts, c.srcs, c.sizes = append(c.dsts, uint64(c.ptr)+off), append(c.srcs, host+8*uint64(i)), append(c.sizes, min(8, blockBytes))
		if blockBytes >= 16 {
			c.dsts, c.srcs, c.sizes = append(c.dsts, uint64(c.ptr)+off+blockBytes-8), append(c.srcs, host+8*uint64(i)), append(c.sizes, 8)
		}
	}
	if err := c.cuda.MemcpyBatchAsync(c.stream, c.dsts, c.srcs, c.sizes); err != nil {
		return err
	}
	return c.cuda.StreamSynchronize(c.stream)
}

func (c *cudaSource) Read(off uint64, into []byte) error {
	if len(into) > len(c.pinned) {
		return fmt.Errorf("read of %d bytes exceeds the pinned buffer", len(into))
	}
	if err := c.cuda.MemcpyDtoHAsync(c.stream, addr(c.pinned), c.ptr+uintptr(off), uint64(len(into))); err != nil {
		return err
	}
	if err := c.cuda.StreamSynchronize(c.stream); err != nil {
		return err
	}
	copy(into, c.pinned)
	return nil
}

func (c *cudaSource) Release() error {
	var errs []error
	if c.stream != nil {
		errs = append(errs, c.cuda.StreamDestroy(c.stream))
		c.stream = nil
	}
	if c.pinned != nil {
		errs = append(errs, c.cuda.HostFree(c.dev, c.pinned))
		c.pinned = nil
	}
	if c.base != 0 {
		errs = append(errs, c.cuda.IPCCloseMemHandle(c.dev, c.base))
		c.base = 0
	}
	return errors.Join(errs...)
}

// gpuBudget is what one GPU can hold for the run's regions: most of its
// memory, leaving room for the daemons' contexts and staging.
func gpuBudget(cuda gpudirect.Interface, src, dst int) (MemoryBudget, error) {
	info, err := cuda.DeviceInfo(src)
	if err != nil {
		return MemoryBudget{}, err
	}
	total := info.TotalMem
	if src != dst {
		di, err := cuda.DeviceInfo(dst)
		if err != nil {
			return MemoryBudget{}, err
		}
		total = min(total, di.TotalMem)
	}
	here := 1
	if src == dst {
		here = 2
	}
	b := MemoryBudget{MemAvailable: total, Headroom: max(uint64(4<<30), total/10), RegionsHere: here, Limit: "GPU memory less a tenth, at least 4 GiB"}
	if total > b.Headroom {
		b.Usable = total - b.Headroom
	}
	return b, nil
}

// ncuVerdict reads the Nsight Compute logs of the daemons: how many kernels
// it profiled, and whether it said outright that there were none.
type ncuVerdict struct {
	Kernels  int
	NoneSaid bool
	Logs     []string
}

var ncuProfiling = regexp.MustCompile(`==PROF== Profiling "`)

func readNCU(dir string) (ncuVerdict, error) {
	logs, err := filepath.Glob(filepath.Join(dir, "ncu-daemon-*.log"))
	if err != nil || len(logs) == 0 {
		return ncuVerdict{}, fmt.Errorf("no ncu logs in %s", dir)
	}
	v := ncuVerdict{Logs: logs, NoneSaid: true}
	for _, p := range logs {
		f, err := os.Open(p)
		if err != nil {
			return v, err
		}
		sc := bufio.NewScanner(f)
		none := false
		for sc.Scan() {
			line := sc.Text()
			if ncuProfiling.MatchString(line) {
				v.Kernels++
			}
			if strings.Contains(line, "No kernels were profiled") {
				none = true
			}
		}
		f.Close()
		v.NoneSaid = v.NoneSaid && none
	}
	return v, nil
}

// applyNCU sets every row's SM count from the ncu verdict: measured, not
// assumed. A kernel seen means SMs were used (how many is not attributed).
func applyNCU(rows []Row, v ncuVerdict) {
	for i := range rows {
		switch {
		case v.Kernels == 0 && v.NoneSaid:
			zero := 0
			rows[i].SMsUsed, rows[i].SMsUsedLabel = &zero, "0 (ncu: no kernel in either daemon)"
		case v.Kernels > 0:
			rows[i].SMsUsed, rows[i].SMsUsedLabel = nil, "≥1 (ncu: "+strconv.Itoa(v.Kernels)+" kernels)"
		default:
			rows[i].SMsUsed, rows[i].SMsUsedLabel = nil, "unknown (ncu gave no verdict)"
		}
	}
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
