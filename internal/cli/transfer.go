package cli

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// MaxFileBlocks bounds a descriptor file (the daemon's own --max-descriptors
// is usually lower and is checked by the daemon).
const MaxFileBlocks = 1 << 24

// Blocks is a descriptor list: block i copies Len[i] bytes from Src[i] to Dst[i].
type Blocks struct {
	Src, Dst, Len []uint64
}

// Uniform returns the common length when every block has it, else 0.
func (b Blocks) Uniform() uint64 {
	if len(b.Len) == 0 {
		return 0
	}
	for _, l := range b.Len[1:] {
		if l != b.Len[0] {
			return 0
		}
	}
	return b.Len[0]
}

// Bytes is the sum of the lengths.
func (b Blocks) Bytes() uint64 {
	var n uint64
	for _, l := range b.Len {
		n += l
	}
	return n
}

// Generate lays out n blocks of size bytes, each followed by gap bytes, at
// the same offsets in both regions.
func Generate(n int, size, gap uint64) (Blocks, error) {
	if n <= 0 || size == 0 {
		return Blocks{}, fmt.Errorf("%w: --blocks and --size must be > 0 (got %d and %d)", ErrUsage, n, size)
	}
	if n > MaxFileBlocks {
		return Blocks{}, fmt.Errorf("%w: --blocks %d is over the limit of %d", ErrUsage, n, MaxFileBlocks)
	}
	stride := size + gap
	if stride < size || (uint64(n) > 0 && stride > ^uint64(0)/uint64(n)) {
		return Blocks{}, fmt.Errorf("%w: --blocks %d x (--size %d + --gap %d) overflows 64 bits", ErrUsage, n, size, gap)
	}
	b := Blocks{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
	for i := range n {
		off := uint64(i) * stride
		b.Src[i], b.Dst[i], b.Len[i] = off, off, size
	}
	return b, nil
}

// ParseDescriptors reads "SRC_OFFSET DST_OFFSET LENGTH" lines (decimal or
// 0x hex; '#' starts a comment; blank lines are skipped). name is used in
// errors, which give the line.
func ParseDescriptors(r io.Reader, name string) (Blocks, error) {
	var b Blocks
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<16)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if i := bytes.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(string(line))
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return Blocks{}, fmt.Errorf("%w: descriptors %s line %d: want 3 fields (src_offset dst_offset length), got %d", ErrUsage, name, n, len(f))
		}
		var v [3]uint64
		for k, s := range f {
			x, err := strconv.ParseUint(s, 0, 64)
			if err != nil {
				return Blocks{}, fmt.Errorf("%w: descriptors %s line %d: field %s %q is not an unsigned 64-bit number", ErrUsage, name, n, [3]string{"src_offset", "dst_offset", "length"}[k], s)
			}
			v[k] = x
		}
		if v[2] == 0 {
			return Blocks{}, fmt.Errorf("%w: descriptors %s line %d: length is 0", ErrUsage, name, n)
		}
		if len(b.Src) == MaxFileBlocks {
			return Blocks{}, fmt.Errorf("%w: descriptors %s: more than %d blocks", ErrUsage, name, MaxFileBlocks)
		}
		b.Src, b.Dst, b.Len = append(b.Src, v[0]), append(b.Dst, v[1]), append(b.Len, v[2])
	}
	if err := sc.Err(); err != nil {
		return Blocks{}, fmt.Errorf("%w: descriptors %s: %v", ErrUsage, name, err)
	}
	if len(b.Src) == 0 {
		return Blocks{}, fmt.Errorf("%w: descriptors %s: no blocks", ErrUsage, name)
	}
	return b, nil
}

// blockFlags are the ways to give a descriptor list.
type blockFlags struct {
	n           int
	size, gap   uint64
	descriptors string
}

func (bf *blockFlags) register(fs *pflag.FlagSet) {
	fs.IntVar(&bf.n, "blocks", 0, "generate this many blocks")
	fs.Uint64Var(&bf.size, "size", 0, "bytes per generated block")
	fs.Uint64Var(&bf.gap, "gap", 0, "bytes between generated blocks (0: contiguous, which the daemon merges)")
	fs.StringVar(&bf.descriptors, "descriptors", "", `file of "src_offset dst_offset length" lines ("-": stdin)`)
}

func (bf *blockFlags) load(stdin io.Reader) (Blocks, error) {
	switch {
	case bf.descriptors != "" && bf.n != 0:
		return Blocks{}, fmt.Errorf("%w: give --descriptors or --blocks/--size, not both", ErrUsage)
	case bf.descriptors == "-":
		return ParseDescriptors(stdin, "stdin")
	case bf.descriptors != "":
		f, err := os.Open(bf.descriptors)
		if err != nil {
			return Blocks{}, fmt.Errorf("descriptors: %w", err)
		}
		defer f.Close()
		return ParseDescriptors(f, bf.descriptors)
	}
	return Generate(bf.n, bf.size, bf.gap)
}

// TransferResult is what transfer prints.
type TransferResult struct {
	Op             string  `json:"op"` // write (push) or read (pull)
	Batches        int     `json:"batches"`
	BlocksPerBatch uint64  `json:"blocks_per_batch"`
	BytesPerBatch  uint64  `json:"bytes_per_batch"`
	Transport      string  `json:"transport"`
	Segments       uint64  `json:"segments"`
	WorkRequests   uint64  `json:"work_requests"`
	WallSeconds    float64 `json:"wall_seconds"`
	// BatchMedianSeconds and BatchP99Seconds are over the --repeat batches,
	// each timed from the call to its response (WallSeconds is the total).
	BatchMedianSeconds float64 `json:"batch_median_seconds"`
	BatchP99Seconds    float64 `json:"batch_p99_seconds"`
	DataPathSeconds    float64 `json:"data_path_seconds"`
	GBps               float64 `json:"gb_per_s"`
	Verified           *bool   `json:"verified,omitempty"`
	Digest             string  `json:"digest,omitempty"`
	Mismatched         int     `json:"mismatched_blocks,omitempty"`
}

func runTransfer(fs *pflag.FlagSet) runner {
	var bf blockFlags
	bf.register(fs)
	src := fs.String("src", "", "local source region ID (required)")
	peer := fs.String("peer", "", "the destination daemon's peer address, host:port (required)")
	dst := fs.String("dst", "", "the destination's export name (required)")
	repeat := fs.Int("repeat", 1, "send the batch this many times; the report gives each batch's median and p99 time, and the total")
	tr := fs.String("transport", transport.Auto, "data path: "+transport.NamesList()+" (auto: the daemons choose; local: same host only)")
	timeout := fs.Duration("timeout", time.Minute, "deadline per batch")
	verify := fs.Bool("verify", false, "compare every block's checksum on both sides (needs --dst-socket or --dst-api)")
	dstSocket := fs.String("dst-socket", "", "--verify: the destination daemon's API socket")
	dstAPI := fs.String("dst-api", "", "--verify: the destination daemon's API address, host:port (TLS with --tls-* off loopback)")
	note := fs.String("notify", "", "notification delivered to the destination's watchers after the last batch")
	opName := fs.String("op", "write", "write: push --src's blocks into the peer's --dst; read: pull the peer's --dst blocks into --src (the export must list this daemon in its readers)")
	return func(ctx context.Context, g *globals, args []string) error {
		var missing []string
		for _, m := range []struct{ name, v string }{{"--src", *src}, {"--peer", *peer}, {"--dst", *dst}} {
			if m.v == "" {
				missing = append(missing, m.name)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%w: transfer: %s required", ErrUsage, strings.Join(missing, ", "))
		}
		if *repeat < 1 {
			return fmt.Errorf("%w: transfer: --repeat %d must be >= 1", ErrUsage, *repeat)
		}
		if *timeout <= 0 {
			return fmt.Errorf("%w: transfer: --timeout %v must be > 0 (it is each batch's deadline)", ErrUsage, *timeout)
		}
		kind, err := transportKind(*tr)
		if err != nil {
			return fmt.Errorf("%w: transfer: --%v", ErrUsage, err)
		}
		var op b2bv1.TransferOp
		switch *opName {
		case "write":
		case "read":
			op = b2bv1.TransferOp_TRANSFER_OP_READ
		default:
			return fmt.Errorf("%w: transfer: --op %q: want write or read", ErrUsage, *opName)
		}
		if *verify && (*dstSocket == "") == (*dstAPI == "") {
			return fmt.Errorf("%w: transfer: --verify needs exactly one of --dst-socket and --dst-api", ErrUsage)
		}
		blocks, err := bf.load(os.Stdin)
		if err != nil {
			return err
		}
		c, err := g.dial()
		if err != nil {
			return err
		}
		perBatch := make([]time.Duration, 0, *repeat)
		t := client.Transfer{SrcRegion: *src, Peer: *peer, DstRegion: *dst, Transport: kind, Op: op, Blocks: client.Descriptors{Src: blocks.Src, Dst: blocks.Dst}}
		if u := blocks.Uniform(); u != 0 {
			t.Blocks.BlockLength = u
		} else {
			t.Blocks.Len = blocks.Len
		}
		res := TransferResult{Op: *opName, Batches: *repeat, BlocksPerBatch: uint64(len(blocks.Src)), BytesPerBatch: blocks.Bytes()}
		bar := newBar(g.Stderr, *repeat)
		start := time.Now()
		var dataNS uint64
		for i := 0; i < *repeat; i++ {
			if i == *repeat-1 && *note != "" {
				t.Notification = []byte(*note)
			}
			bctx, cancel := context.WithTimeout(ctx, *timeout)
			t0 := time.Now()
			r, err := c.BatchTransfer(bctx, t)
			perBatch = append(perBatch, time.Since(t0))
			cancel()
			if err != nil {
				bar.done()
				return fmt.Errorf("transfer: batch %d of %d: %w", i+1, *repeat, err)
			}
			dataNS += r.GetElapsedNs()
			res.Transport, res.Segments, res.WorkRequests = kindName(r.GetTransportName(), r.GetTransport()), r.GetSegments(), r.GetWorkRequests()
			bar.step(i+1, float64(uint64(i+1)*res.BytesPerBatch)/time.Since(start).Seconds())
		}
		bar.done()
		res.WallSeconds = time.Since(start).Seconds()
		res.DataPathSeconds = float64(dataNS) / 1e9
		res.BatchMedianSeconds, res.BatchP99Seconds = percentile(perBatch, 50).Seconds(), percentile(perBatch, 99).Seconds()
		if res.WallSeconds > 0 {
			res.GBps = float64(res.BytesPerBatch) * float64(*repeat) / res.WallSeconds / 1e9
		}
		if *verify {
			ok, digest, bad, err := verifyBlocks(ctx, c, *src, *dst, *dstSocket, *dstAPI, g.tlsCert, g.tlsKey, g.tlsCA, blocks)
			if err != nil {
				return err
			}
			res.Verified, res.Digest, res.Mismatched = &ok, fmt.Sprintf("%#016x", digest), bad
		}
		if g.json {
			if err := g.emit(res); err != nil {
				return err
			}
		} else {
			rows := [][]string{{fmt.Sprint(res.Batches), fmt.Sprint(res.BlocksPerBatch), human(res.BytesPerBatch), res.Transport,
				fmt.Sprint(res.Segments), fmt.Sprint(res.WorkRequests), ms(res.BatchMedianSeconds), ms(res.BatchP99Seconds),
				fmt.Sprintf("%.3fs", res.WallSeconds), fmt.Sprintf("%.3f", res.GBps), verifiedStr(res)}}
			if err := table(g.Stdout, []string{"BATCHES", "BLOCKS", "BYTES/BATCH", "TRANSPORT", "SEGMENTS", "WRS", "MEDIAN/BATCH", "P99/BATCH", "TOTAL", "GB/s", "VERIFIED"}, rows); err != nil {
				return err
			}
		}
		if res.Verified != nil && !*res.Verified {
			return fmt.Errorf("transfer: verification failed: %d of %d blocks differ", res.Mismatched, len(blocks.Src))
		}
		return nil
	}
}

// transportKind is the batch's transport for a name of transport.Names.
func transportKind(name string) (b2bv1.TransportKind, error) {
	if err := transport.CheckName(name); err != nil {
		return 0, err
	}
	switch name {
	case string(transport.TCP):
		return b2bv1.TransportKind_TRANSPORT_KIND_TCP, nil
	case string(transport.Verbs):
		return b2bv1.TransportKind_TRANSPORT_KIND_VERBS, nil
	case string(transport.Local):
		return b2bv1.TransportKind_TRANSPORT_KIND_LOCAL, nil
	}
	return b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED, nil // auto
}

// percentile is the p-th percentile of d (nearest rank), 0 for none.
func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := (p*len(s) + 99) / 100 // ceil(p/100 * n), 1-based
	return s[max(rank, 1)-1]
}

func ms(sec float64) string { return fmt.Sprintf("%.3fms", sec*1e3) }

func verifiedStr(r TransferResult) string {
	switch {
	case r.Verified == nil:
		return "-"
	case *r.Verified:
		return "yes " + r.Digest
	}
	return fmt.Sprintf("NO (%d blocks differ)", r.Mismatched)
}

// dialDst connects to the destination daemon's API.
func dialDst(socket, api, cert, key, ca string) (*client.Client, error) {
	if socket != "" {
		return client.Dial(socket)
	}
	return dialAPI("--dst-api", api, cert, key, ca)
}

// verifyBlocks checksums every block at both ends; digest is the source's
// whole-list digest, bad the number of blocks whose digests differ.
func verifyBlocks(ctx context.Context, c *client.Client, src, export, dstSocket, dstAPI, cert, key, ca string, b Blocks) (ok bool, digest uint64, bad int, err error) {
	d, err := dialDst(dstSocket, dstAPI, cert, key, ca)
	if err != nil {
		return false, 0, 0, err
	}
	defer d.Close()
	regions, err := d.Regions(ctx)
	if err != nil {
		return false, 0, 0, fmt.Errorf("verify: list the destination's regions: %w", err)
	}
	dstID := ""
	for _, r := range regions {
		if r.GetExportName() == export {
			dstID = r.GetId()
		}
	}
	if dstID == "" {
		return false, 0, 0, fmt.Errorf("verify: the destination daemon has no region exported as %q (is --dst-socket/--dst-api the daemon behind --peer?)", export)
	}
	const alg = b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_XXH64
	lens, bl := b.Len, uint64(0)
	if u := b.Uniform(); u != 0 {
		lens, bl = nil, u
	}
	a, err := c.Checksum(ctx, src, b.Src, lens, bl, alg, true)
	if err != nil {
		return false, 0, 0, fmt.Errorf("verify: checksum the source: %w", err)
	}
	z, err := d.Checksum(ctx, dstID, b.Dst, lens, bl, alg, true)
	if err != nil {
		return false, 0, 0, fmt.Errorf("verify: checksum the destination: %w", err)
	}
	da, dz := client.Unpack(a.GetBlockDigests()), client.Unpack(z.GetBlockDigests())
	if len(da) != len(b.Src) || len(dz) != len(b.Src) {
		return false, 0, 0, fmt.Errorf("verify: got %d and %d block digests for %d blocks", len(da), len(dz), len(b.Src))
	}
	for i := range da {
		if da[i] != dz[i] {
			bad++
		}
	}
	return bad == 0 && a.GetDigest() == z.GetDigest(), a.GetDigest(), bad, nil
}

func runChecksum(fs *pflag.FlagSet) runner {
	var bf blockFlags
	bf.register(fs)
	region := fs.String("region", "", "local region ID (required)")
	column := fs.String("column", "src", "with --descriptors: hash the src or the dst offsets")
	alg := fs.String("algorithm", "xxh64", "xxh64 or crc32c")
	perBlock := fs.Bool("per-block", false, "print every block's digest too")
	return func(ctx context.Context, g *globals, args []string) error {
		if *region == "" {
			return fmt.Errorf("%w: checksum: --region is required", ErrUsage)
		}
		// Without --blocks and --descriptors the whole region is hashed; a
		// --blocks 0, --size or --gap given then would be silently ignored.
		if bf.n == 0 && bf.descriptors == "" && (fs.Changed("blocks") || fs.Changed("size") || fs.Changed("gap")) {
			return fmt.Errorf("%w: checksum: --blocks %d must be >= 1 with --size or --gap (leave --blocks, --size and --gap out to hash the whole region)", ErrUsage, bf.n)
		}
		a, ok := map[string]b2bv1.ChecksumAlgorithm{"xxh64": b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_XXH64, "crc32c": b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C}[*alg]
		if !ok {
			return fmt.Errorf("%w: checksum: --algorithm %q: want xxh64 or crc32c", ErrUsage, *alg)
		}
		c, err := g.dial()
		if err != nil {
			return err
		}
		var offs, lens []uint64
		var bl uint64
		if bf.n == 0 && bf.descriptors == "" {
			// The whole region, as one block.
			rs, err := c.Regions(ctx)
			if err != nil {
				return fmt.Errorf("checksum: %w", err)
			}
			for _, r := range rs {
				if r.GetId() == *region {
					offs, bl = []uint64{0}, r.GetSize()
				}
			}
			if offs == nil {
				return fmt.Errorf("checksum: no region %q", *region)
			}
		} else {
			b, err := bf.load(os.Stdin)
			if err != nil {
				return err
			}
			offs = b.Src
			if *column == "dst" {
				offs = b.Dst
			} else if *column != "src" {
				return fmt.Errorf("%w: checksum: --column %q: want src or dst", ErrUsage, *column)
			}
			if bl = b.Uniform(); bl == 0 {
				lens = b.Len
			}
		}
		r, err := c.Checksum(ctx, *region, offs, lens, bl, a, *perBlock)
		if err != nil {
			return fmt.Errorf("checksum: %w", err)
		}
		out := map[string]any{"algorithm": *alg, "digest": fmt.Sprintf("%#016x", r.GetDigest()), "blocks": r.GetBlocks(), "bytes": r.GetBytes()}
		var per []string
		for _, d := range client.Unpack(r.GetBlockDigests()) {
			per = append(per, fmt.Sprintf("%#016x", d))
		}
		if *perBlock {
			out["block_digests"] = per
		}
		if g.json {
			return g.emit(out)
		}
		fmt.Fprintf(g.Stdout, "%s %#016x  %d blocks, %s\n", *alg, r.GetDigest(), r.GetBlocks(), human(r.GetBytes()))
		for i, d := range per {
			fmt.Fprintf(g.Stdout, "%8d %s\n", i, d)
		}
		return nil
	}
}

// bar is a progress bar on stderr, drawn only when stderr is a terminal.
type bar struct {
	w     io.Writer
	on    bool
	total int
}

func newBar(w io.Writer, total int) *bar {
	b := &bar{w: w, total: total}
	if f, ok := w.(*os.File); ok && total > 1 && term.IsTerminal(int(f.Fd())) {
		b.on = true
	}
	return b
}

func (b *bar) step(n int, bytesPerSec float64) {
	if !b.on {
		return
	}
	const width = 30
	fill := width * n / b.total
	fmt.Fprintf(b.w, "\r[%s%s] %d/%d batches  %.2f GB/s", strings.Repeat("=", fill), strings.Repeat(" ", width-fill), n, b.total, bytesPerSec/1e9)
}

func (b *bar) done() {
	if b.on {
		fmt.Fprintln(b.w)
		b.on = false
	}
}
