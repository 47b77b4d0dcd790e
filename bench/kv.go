package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Workloads (--workload).
const (
	WorkloadSweep = "sweep"
	WorkloadKV    = "kv"
)

// Paths of the sweep's calls (--path).
const (
	PathGRPC = "grpc"
	PathRing = "ring"
)

// --kv-regions values.
const (
	KVRegionsSegment = "segment" // one region per segment (vLLM's per-layer tensors)
	KVRegionsOne     = "one"     // one region holding every segment
)

// The KV request's defaults: Llama-70B at TP=4 (80 layers x K, V; 8 KiB
// blocks), an 8k-token prompt at 16 tokens per block.
const (
	DefaultKVSegments = 160
	DefaultKVBlock    = 8 << 10
	DefaultKVPool     = 1024
	DefaultKVRequest  = 512
	DefaultKVRepeat   = 10
)

// KV modes: the same request as today's descriptors, or as block ids.
const (
	KVModeDescriptors = "descriptors"
	KVModeBlocks      = "blocks"
)

// kvMaxBlocks is the daemon's limit on ids x segments per request
// (internal/layout's MaxRequestBlocks).
const kvMaxBlocks = 1 << 22

// KVShape is one KV request's geometry. Segment s of a pool is Pool blocks
// of Block bytes, laid end to end (stride = block); in a one-region pool
// segment s starts at s*SegmentBytes.
type KVShape struct {
	Segments, Pool, Request int
	Block                   uint64
	// PerSegmentRegions: each segment is its own region (else one region
	// holds them all).
	PerSegmentRegions bool
}

// SegmentBytes is one segment's size.
func (s KVShape) SegmentBytes() uint64 { return s.Block * uint64(s.Pool) }

// PoolBytes is one side's size: every segment.
func (s KVShape) PoolBytes() uint64 { return s.SegmentBytes() * uint64(s.Segments) }

// Blocks is what one request moves: every id in every segment.
func (s KVShape) Blocks() int { return s.Segments * s.Request }

// RegionsLabel says how the pool is split into regions.
func (s KVShape) RegionsLabel() string {
	if s.PerSegmentRegions {
		return fmt.Sprintf("%s: one region per segment (%d regions per side, as vLLM's per-layer tensors)", KVRegionsSegment, s.Segments)
	}
	return fmt.Sprintf("%s: one region holding all %d segments", KVRegionsOne, s.Segments)
}

// Validate checks the shape against what a request may be.
func (s KVShape) Validate() error {
	switch {
	case s.Segments < 1 || s.Segments > 4096:
		return fmt.Errorf("--kv-segments %d: want 1 to 4096", s.Segments)
	case s.Block == 0:
		return errors.New("--kv-block: need at least one byte")
	case s.Pool < 1 || s.Pool > 1<<24:
		return fmt.Errorf("--kv-pool %d: want 1 to %d blocks per segment", s.Pool, 1<<24)
	case s.Request < 1 || s.Request > s.Pool:
		return fmt.Errorf("--kv-request %d: want 1 to --kv-pool (%d): ids are drawn without repeats", s.Request, s.Pool)
	case s.Blocks() > kvMaxBlocks:
		return fmt.Errorf("--kv-segments %d x --kv-request %d = %d blocks, over the daemon's limit of %d per request", s.Segments, s.Request, s.Blocks(), kvMaxBlocks)
	case s.PoolBytes()/uint64(s.Segments)/uint64(s.Pool) != s.Block || s.PoolBytes() > 1<<40:
		return fmt.Errorf("--kv-segments %d x --kv-pool %d x --kv-block %d: over 1 TiB per side", s.Segments, s.Pool, s.Block)
	}
	return nil
}

// KVRequest is one request's ids: block Local[i] of every source segment
// goes to block Remote[i] of the matching destination segment.
type KVRequest struct {
	Local, Remote []uint32
}

// NewKVRequest draws n distinct ids below pool for each side, from seed:
// two independent draws, so local and remote ids differ as they do between
// a prefill and a decode engine's block tables.
func NewKVRequest(pool, n int, seed uint64) (KVRequest, error) {
	if n < 1 || n > pool {
		return KVRequest{}, fmt.Errorf("request of %d ids from a pool of %d: want 1 to %d (no repeats)", n, pool, pool)
	}
	draw := func(label uint64) []uint32 {
		rng := rand.New(rand.NewPCG(mix(seed, label), 0))
		// A partial Fisher-Yates shuffle: n distinct ids in random order.
		all := make([]uint32, pool)
		for i := range all {
			all[i] = uint32(i)
		}
		for i := 0; i < n; i++ {
			j := i + rng.IntN(pool-i)
			all[i], all[j] = all[j], all[i]
		}
		return all[:n:n]
	}
	return KVRequest{Local: draw(1), Remote: draw(2)}, nil
}

// Descriptors is the request as today's BatchTransfer sends it over one
// region spanning each side's pool: segment-major, as the daemon expands
// block ids.
func (q KVRequest) Descriptors(s KVShape) (src, dst []uint64) {
	n := s.Blocks()
	src, dst = make([]uint64, 0, n), make([]uint64, 0, n)
	seg := s.SegmentBytes()
	for k := 0; k < s.Segments; k++ {
		base := uint64(k) * seg
		for i := range q.Local {
			src = append(src, base+uint64(q.Local[i])*s.Block)
			dst = append(dst, base+uint64(q.Remote[i])*s.Block)
		}
	}
	return src, dst
}

// kvSide is one daemon's pool: a region spanning every segment (what
// descriptors mode moves from or into) and, with PerSegmentRegions, one
// region per segment (what the blocks layout names). Where the bench can
// import a file into the daemon (its Unix socket), the segments' regions
// are slices of the span's file: both modes move the same memory.
// Elsewhere (a remote daemon) they are separate allocations.
type kvSide struct {
	c          *client.Client
	span       *b2bv1.Region
	spanExport string
	segs       []*b2bv1.Region // nil: the layout's segments are in span
	segExports []string
	aliased    bool
	file       string // the span's file, when the bench made it
	// spanMem and segMem are the bench's mappings (the source side only).
	spanMem []byte
	segMem  [][]byte // nil when aliased or one region
	unmaps  []func() error
	layout  string // the registered layout's name ("": none yet)
	export  string // its export name (destination)
}

// segRegion is the region id and offset of segment k in the blocks layout.
func (p *kvSide) segRegion(s KVShape, k int) (string, uint64) {
	if p.segs != nil {
		return p.segs[k].GetId(), 0
	}
	return p.span.GetId(), uint64(k) * s.SegmentBytes()
}

// memory is segment k as mode moves it (the source side only).
func (p *kvSide) memory(s KVShape, mode string, k int) []byte {
	if mode == KVModeBlocks && p.segMem != nil {
		return p.segMem[k]
	}
	seg := s.SegmentBytes()
	return p.spanMem[uint64(k)*seg : uint64(k+1)*seg]
}

// kvPools is both sides.
type kvPools struct {
	shape    KVShape
	src, dst *kvSide
}

// shmDirOf finds the daemon's shm directory from a probe region's file;
// "" where it has none.
func shmDirOf(ctx context.Context, c *client.Client) (string, error) {
	probe, err := c.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: 4096}},
	})
	if err != nil {
		return "", fmt.Errorf("register a probe region: %w", err)
	}
	dir := ""
	if path := probe.GetRegion().GetShmPath(); path != "" {
		dir = filepath.Dir(path)
	}
	if err := c.Deregister(ctx, probe.GetRegion().GetId()); err != nil {
		return "", fmt.Errorf("release the probe region: %w", err)
	}
	return dir, nil
}

// allocKVSide registers one side's pool. mapHere maps it into the bench
// (the local side, which the bench fills). exportPrefix, when set, exports
// every region (the remote side), readable by readers.
func allocKVSide(ctx context.Context, c *client.Client, s KVShape, name, exportPrefix string, readers []string, mapHere bool) (_ *kvSide, err error) {
	p := &kvSide{c: c}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.release(ctx))
		}
	}()
	exp := func(suffix string) string {
		if exportPrefix == "" {
			return ""
		}
		return exportPrefix + suffix
	}
	p.spanExport = exp("-span")
	register := func(req *b2bv1.RegisterRegionRequest, what string) (*b2bv1.Region, error) {
		resp, err := c.API().RegisterRegion(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("%s: register %s: %w", name, what, err)
		}
		return resp.GetRegion(), nil
	}
	hostAlloc := func(size uint64, export string) *b2bv1.RegisterRegionRequest {
		req := &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: size}}, ExportName: export}
		if export != "" {
			req.Readers = readers
		}
		return req
	}
	mapRegion := func(r *b2bv1.Region) ([]byte, error) {
		h, err := c.MapHostRegion(ctx, r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (the bench must run on the source daemon's host)", name, err)
		}
		p.unmaps = append(p.unmaps, h.Unmap)
		return h.Bytes, nil
	}
	seg := s.SegmentBytes()
	if s.PerSegmentRegions && seg%uint64(os.Getpagesize()) == 0 {
		// Try one file, imported whole and per segment.
		if dir, derr := shmDirOf(ctx, c); derr == nil && dir != "" {
			if ferr := p.importFile(ctx, s, dir, name, exp, readers); ferr == nil {
				p.aliased = true
			}
		}
	}
	if p.span == nil {
		if p.span, err = register(hostAlloc(s.PoolBytes(), p.spanExport), "the span region"); err != nil {
			return nil, err
		}
		if s.PerSegmentRegions {
			for k := 0; k < s.Segments; k++ {
				r, err := register(hostAlloc(seg, exp(fmt.Sprintf("-seg%d", k))), fmt.Sprintf("segment %d's region", k))
				if err != nil {
					return nil, err
				}
				p.segs, p.segExports = append(p.segs, r), append(p.segExports, exp(fmt.Sprintf("-seg%d", k)))
			}
		}
	}
	if mapHere {
		if p.spanMem, err = mapRegion(p.span); err != nil {
			return nil, err
		}
		if p.segs != nil && !p.aliased {
			for _, r := range p.segs {
				b, err := mapRegion(r)
				if err != nil {
					return nil, err
				}
				p.segMem = append(p.segMem, b)
			}
		}
	}
	return p, nil
}

// importFile makes a file of the pool's size in the daemon's shm directory
// and imports it whole (the span) and per segment. Any failure (a remote
// daemon refuses host_file) undoes what it did.
func (p *kvSide) importFile(ctx context.Context, s KVShape, dir, name string, exp func(string) string, readers []string) (err error) {
	path := filepath.Join(dir, fmt.Sprintf("kvbench-%d-%s", os.Getpid(), name))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	terr := f.Truncate(int64(s.PoolBytes()))
	f.Close()
	p.file = path
	defer func() {
		if err != nil {
			for _, r := range append([]*b2bv1.Region{p.span}, p.segs...) {
				if r != nil {
					_ = p.c.Deregister(context.WithoutCancel(ctx), r.GetId())
				}
			}
			p.span, p.segs, p.segExports = nil, nil, nil
			_ = os.Remove(path)
			p.file = ""
		}
	}()
	if terr != nil {
		return terr
	}
	imp := func(off, size uint64, export string) (*b2bv1.Region, error) {
		req := &b2bv1.RegisterRegionRequest{
			Source: &b2bv1.RegisterRegionRequest_HostFile{HostFile: &b2bv1.HostFile{Path: path, Offset: off, Size: size}}, ExportName: export,
		}
		if export != "" {
			req.Readers = readers
		}
		resp, err := p.c.API().RegisterRegion(ctx, req)
		return resp.GetRegion(), err
	}
	if p.span, err = imp(0, s.PoolBytes(), p.spanExport); err != nil {
		return err
	}
	seg := s.SegmentBytes()
	for k := 0; k < s.Segments; k++ {
		e := exp(fmt.Sprintf("-seg%d", k))
		r, err := imp(uint64(k)*seg, seg, e)
		if err != nil {
			return err
		}
		p.segs, p.segExports = append(p.segs, r), append(p.segExports, e)
	}
	return nil
}

// registerLayout registers the side's blocks layout, exported as export
// when set, readable by readers.
func (p *kvSide) registerLayout(ctx context.Context, s KVShape, name, export string, readers []string) error {
	l := client.Layout{Name: name, NumBlocks: uint64(s.Pool), Export: export}
	if export != "" {
		l.Readers = readers
	}
	for k := 0; k < s.Segments; k++ {
		id, off := p.segRegion(s, k)
		l.Segments = append(l.Segments, client.Segment{RegionID: id, Offset: off, BlockLen: s.Block, Stride: s.Block})
	}
	if _, err := p.c.RegisterLayout(ctx, l); err != nil {
		return fmt.Errorf("register layout %q: %w", name, err)
	}
	p.layout, p.export = name, export
	return nil
}

// release deregisters the layout, then the regions, and removes the file.
func (p *kvSide) release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var errs []error
	if p.layout != "" {
		if err := p.c.DeregisterLayout(ctx, p.layout); err != nil {
			errs = append(errs, fmt.Errorf("deregister layout %q: %w", p.layout, err))
		}
		p.layout = ""
	}
	for _, u := range p.unmaps {
		if err := u(); err != nil {
			errs = append(errs, err)
		}
	}
	p.unmaps = nil
	for _, r := range append([]*b2bv1.Region{p.span}, p.segs...) {
		if r == nil {
			continue
		}
		if err := p.c.Deregister(ctx, r.GetId()); err != nil {
			errs = append(errs, fmt.Errorf("deregister region %s: %w", r.GetId(), err))
		}
	}
	p.span, p.segs = nil, nil
	if p.file != "" {
		if err := os.Remove(p.file); err != nil {
			errs = append(errs, err)
		}
		p.file = ""
	}
	return errors.Join(errs...)
}

// fillKV writes fresh pseudo-random data, unique to seed, into every
// source block the request moves in mode, and returns each block's CRC32C
// (segment-major, as Descriptors orders them): what the destination must
// hold afterwards. A block left over from an earlier request cannot match.
func fillKV(p *kvSide, s KVShape, mode string, q KVRequest, seed uint64) []uint64 {
	want := make([]uint64, s.Blocks())
	workers := min(runtime.GOMAXPROCS(0), s.Segments)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := w; k < s.Segments; k += workers {
				mem := p.memory(s, mode, k)
				for i, id := range q.Local {
					b := mem[uint64(id)*s.Block : uint64(id+1)*s.Block]
					fillSeq(b, mix(seed, uint64(k), uint64(i)))
					want[k*len(q.Local)+i] = uint64(crc32.Checksum(b, castagnoli))
				}
			}
		}()
	}
	wg.Wait()
	return want
}

// KVMismatchError names the first destination block whose digest differs
// from what the bench wrote at the source.
type KVMismatchError struct {
	Mode               string
	Segment, Entry     int
	LocalID, RemoteID  uint32
	Want, Got          uint64
	Mismatched, Blocks int
}

func (e *KVMismatchError) Error() string {
	return fmt.Sprintf("%s: segment %d, entry %d (local id %d -> remote id %d): the destination's CRC32C %#x, the source block's %#x; %d of %d blocks differ",
		e.Mode, e.Segment, e.Entry, e.LocalID, e.RemoteID, e.Got, e.Want, e.Mismatched, e.Blocks)
}

// compareKV checks the destination's per-block digests (segment-major)
// against what the bench wrote.
func compareKV(mode string, q KVRequest, want, got []uint64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: the destination daemon returned %d block digests for %d blocks", mode, len(got), len(want))
	}
	var first *KVMismatchError
	n := len(q.Local)
	for j := range want {
		if want[j] == got[j] {
			continue
		}
		if first == nil {
			first = &KVMismatchError{Mode: mode, Segment: j / n, Entry: j % n, LocalID: q.Local[j%n], RemoteID: q.Remote[j%n], Want: want[j], Got: got[j], Blocks: len(want)}
		}
		first.Mismatched++
	}
	if first != nil {
		return first
	}
	return nil
}

// verifyKV reads the destination daemon's CRC32C of every block the request
// wrote, in every segment, from the regions mode wrote into, and compares
// them with the source blocks' digests the bench computed as it filled them.
func verifyKV(ctx context.Context, p *kvSide, s KVShape, mode string, q KVRequest, want []uint64, timeout time.Duration) error {
	return verifyKVSide(ctx, p, s, mode, q, want, timeout, false)
}

// verifyKVSide checks a request's destination blocks against want: the
// remote side's (ids q.Remote) after a write, or with local, the local
// side's (ids q.Local) after a read.
func verifyKVSide(ctx context.Context, p *kvSide, s KVShape, mode string, q KVRequest, want []uint64, timeout time.Duration, local bool) error {
	ids := q.Remote
	if local {
		ids = q.Local
	}
	vctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	alg := b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C
	got := make([]uint64, 0, len(want))
	if mode == KVModeDescriptors || p.segs == nil {
		// One call over the span: the segment-major destination offsets.
		src, dst := q.Descriptors(s)
		if local {
			dst = src
		}
		cs, err := p.c.Checksum(vctx, p.span.GetId(), dst, nil, s.Block, alg, true)
		if err != nil {
			return fmt.Errorf("%s: destination checksum: %w", mode, err)
		}
		got = append(got, client.Unpack(cs.GetBlockDigests())...)
	} else {
		offs := make([]uint64, len(ids))
		for i, id := range ids {
			offs[i] = uint64(id) * s.Block
		}
		for k := 0; k < s.Segments; k++ {
			cs, err := p.c.Checksum(vctx, p.segs[k].GetId(), offs, nil, s.Block, alg, true)
			if err != nil {
				return fmt.Errorf("%s: destination checksum of segment %d: %w", mode, k, err)
			}
			got = append(got, client.Unpack(cs.GetBlockDigests())...)
		}
	}
	return compareKV(mode, q, want, got)
}

// kvNonWire sums the phases that are the daemon's own work on a request:
// decode, validate, resolve, plan and post. Wire (waiting for bytes and
// acks) and notify (none is sent) are left out.
func kvNonWire(ph *b2bv1.PhaseTimings) time.Duration {
	return time.Duration(ph.GetDecodeNs() + ph.GetValidateNs() + ph.GetResolveNs() + ph.GetPlanNs() + ph.GetPostNs())
}

// kvControl is kvNonWire less post: over tcp and local, post is the CPU
// moving the payload (a NIC's DMA over verbs), which both modes pay alike.
func kvControl(ph *b2bv1.PhaseTimings) time.Duration {
	return time.Duration(ph.GetDecodeNs() + ph.GetValidateNs() + ph.GetResolveNs() + ph.GetPlanNs())
}
