package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// DefaultBlocks is the number of blocks per batch the sweep aims for.
const DefaultBlocks = 10000

// DefaultIters is the number of timed batches per size.
const DefaultIters = 5

// Config is everything the bench is told on its command line.
type Config struct {
	Sizes     []uint64 // block sizes in bytes, ascending
	Blocks    int      // blocks per batch requested (before the memory cap)
	Iters     int      // timed batches per size (after one warm-up)
	Full      bool     // ignore the memory cap
	Transport string   // auto | tcp | verbs
	// Path is how the sweep's calls reach the source daemon: PathGRPC
	// (BatchTransfer, SubmitTransfer) or PathRing (the shared-memory ring's
	// batch and submit records; embedded mode).
	Path         string
	Timeout      time.Duration
	Seed         uint64 // 0: pick one from the clock
	JSONPath     string
	PlotPath     string
	PerftestPath string

	// Embedded mode: the daemon binary to start twice, and extra flags for it.
	B2BD       string
	DaemonArgs []string

	// Two-host mode: running daemons to use instead.
	SrcAPI, DstAPI, DstPeer string

	// TLS for a remote daemon's API in two-host mode (its certificate must
	// chain to TLSCA; ours is presented for mutual TLS).
	TLSCert, TLSKey, TLSCA string

	// Memory is where the blocks live: host or cuda (GPU regions allocated
	// by the daemons on SrcDevice and DstDevice).
	Memory               string
	SrcDevice, DstDevice int
	// NCUDir, in embedded mode, runs both daemons under Nsight Compute with
	// their logs here, and takes sms_used from what ncu saw.
	NCUDir string

	// AdHoc runs each batch as one BatchTransfer (a Config with neither
	// mode set runs ad hoc only) (descriptors sent, decoded,
	// validated and planned every time). PreparedUpTo runs sizes up to it
	// also as PrepareTransfer once + SubmitTransfer per batch (0: never).
	AdHoc        bool
	PreparedUpTo uint64
	// Breakdown prints the daemon's per-phase medians after the table.
	Breakdown bool
	// Cold skips the warm-up (WarmTransfer) after the regions are
	// registered, so that each size's first batch shows a cold pair.
	Cold bool
	// Yardsticks are the TCP yardsticks to measure: YardstickStream,
	// YardstickCached, or none.
	Yardsticks []string
	// PingCalls is how many empty Ping calls measure the floor.
	PingCalls int
	// ProjectCX7 is a bench JSON to turn into the ConnectX-7 projection
	// table (no daemons are started).
	ProjectCX7 string

	// Ops are what each batch does: OpWrite (push), OpRead (pull), or both,
	// interleaved in the same rounds; nil: write only.
	Ops []string

	// Workload is what is measured: WorkloadSweep (the block-size sweep) or
	// WorkloadKV (a KV-cache request, descriptors against block ids).
	Workload string
	// KV is the --workload kv request's shape; Repeat its timed requests.
	KV     KVShape
	Repeat int

	// afterBatch, when set, runs after each sweep batch (op, iter: 0 the
	// warm-up) and before the verification that follows the last (tests:
	// corrupt a block and see verification catch it).
	afterBatch func(ctx context.Context, eps *endpoints, regions *regionPair, op string, iter int, src, dst Layout) error
	// yardstickBytes overrides the yardstick's stream length (tests).
	yardstickBytes uint64
	// kvAfterRequest, when set, runs after each KV request and before its
	// verification (tests: corrupt a block and see verification catch it).
	kvAfterRequest func(ctx context.Context, eps *endpoints, pools *kvPools, mode string, req KVRequest) error
}

// DefaultPreparedUpTo: by default prepared runs next to ad hoc up to 64 KiB.
// Above it the call's fixed cost is under a few percent of the batch (a
// 10,000 x 128 KiB batch moves 1.3 GB), so a second column there would only
// double the run's longest rows.
const DefaultPreparedUpTo = 64 << 10

// DefaultPingCalls is the number of empty calls whose median is the floor.
const DefaultPingCalls = 200

// ParseModes reads --mode: a comma-separated subset of adhoc and prepared.
// It returns whether ad hoc runs and the largest size prepared runs at.
// Both given explicitly run at every size; "" is the default (ad hoc
// everywhere, prepared up to DefaultPreparedUpTo).
func ParseModes(s string) (adHoc bool, preparedUpTo uint64, err error) {
	if strings.TrimSpace(s) == "" {
		return true, DefaultPreparedUpTo, nil
	}
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "adhoc", "ad-hoc":
			adHoc = true
		case "prepared":
			preparedUpTo = math.MaxUint64
		case "":
		default:
			return false, 0, fmt.Errorf("%q: want adhoc, prepared or both, comma-separated", f)
		}
	}
	if !adHoc && preparedUpTo == 0 {
		return false, 0, fmt.Errorf("%q names no mode", s)
	}
	return adHoc, preparedUpTo, nil
}

// Ops: what a batch does.
const (
	OpWrite = "write" // push: the local region is the source
	OpRead  = "read"  // pull: the local region is the destination
)

// ParseOps reads --op: write, read or both (write and read interleaved in
// the same rounds, write first).
func ParseOps(s string) ([]string, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case OpWrite, "":
		return []string{OpWrite}, nil
	case OpRead:
		return []string{OpRead}, nil
	case "both":
		return []string{OpWrite, OpRead}, nil
	}
	return nil, fmt.Errorf("%q: want write, read or both", s)
}

// ops is the run's ops, write alone by default.
func (c Config) ops() []string {
	if len(c.Ops) == 0 {
		return []string{OpWrite}
	}
	return c.Ops
}

// opKind is an op's protobuf value.
func opKind(op string) b2bv1.TransferOp {
	if op == OpRead {
		return b2bv1.TransferOp_TRANSFER_OP_READ
	}
	return b2bv1.TransferOp_TRANSFER_OP_WRITE
}

// opName is a protobuf op's name in rows.
func opName(op b2bv1.TransferOp) string {
	if op == b2bv1.TransferOp_TRANSFER_OP_READ {
		return OpRead
	}
	return OpWrite
}

// ParseYardsticks reads --yardstick: stream, cached, both comma-separated,
// or none.
func ParseYardsticks(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		switch f = strings.TrimSpace(f); f {
		case YardstickStream, YardstickCached, YardstickRaw:
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		case "none":
			if s != "none" {
				return nil, fmt.Errorf("%q: none cannot be combined", s)
			}
			return nil, nil
		default:
			return nil, fmt.Errorf("%q: want stream, cached, raw (GPU memory), comma-separated, or none", f)
		}
	}
	return out, nil
}

// TwoHost reports whether the bench uses running daemons instead of starting its own.
func (c Config) TwoHost() bool { return c.SrcAPI != "" }

// DefaultSizes is every power of two from 128 B to 2 MiB (15 sizes).
func DefaultSizes() []uint64 {
	var s []uint64
	for b := uint64(128); b <= 2<<20; b *= 2 {
		s = append(s, b)
	}
	return s
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// ParseFlags parses the command line. It returns flag.ErrHelp after printing
// usage for -h.
func ParseFlags(args []string, usageOut io.Writer) (Config, error) {
	cfg := Config{}
	fs := flag.NewFlagSet("b2b-bench", flag.ContinueOnError)
	fs.SetOutput(usageOut)
	sizes := fs.String("sizes", "", "comma-separated block sizes in bytes, K/M suffixes allowed (default: 128 B to 2 MiB, doubling)")
	fs.IntVar(&cfg.Blocks, "blocks", DefaultBlocks, "blocks per batch (capped to fit RAM unless --full)")
	fs.IntVar(&cfg.Iters, "iters", DefaultIters, "timed batches per size, after one warm-up batch (below 5 only for quick runs)")
	fs.BoolVar(&cfg.Full, "full", false, "use --blocks at every size even where both regions do not fit in RAM")
	fs.StringVar(&cfg.Transport, "transport", "auto", "transport asked for in each batch: auto, tcp, verbs or local")
	fs.DurationVar(&cfg.Timeout, "timeout", 2*time.Minute, "deadline of each batch")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "random seed for layouts and data (0: from the clock; printed so a run can be repeated)")
	fs.StringVar(&cfg.JSONPath, "json", "", "write results as JSON to this path")
	fs.StringVar(&cfg.PlotPath, "plot", "", "write an SVG plot of GB/s and Mblocks/s to this path")
	fs.StringVar(&cfg.PerftestPath, "perftest", "", `JSON object {"<block bytes>": ib_write_bw GB/s, ...} to compare against`)
	fs.StringVar(&cfg.B2BD, "b2bd", "b2bd", "embedded mode: the b2bd binary to start twice")
	daemonArgs := stringList{}
	fs.Var(&daemonArgs, "daemon-arg", "embedded mode: extra flag for both daemons, e.g. --daemon-arg=--tcp-streams=8 (repeatable)")
	fs.StringVar(&cfg.SrcAPI, "src-api", "", "two-host mode: the source daemon's local API (socket path, unix:///path or host:port); the bench must run on its host")
	fs.StringVar(&cfg.DstAPI, "dst-api", "", "two-host mode: the destination daemon's local API, reachable from here (host:port)")
	fs.StringVar(&cfg.DstPeer, "dst-peer", "", "two-host mode: the destination daemon's peer address as the source daemon reaches it (host:port)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "two-host mode: certificate to present to a remote daemon's API (mutual TLS)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "two-host mode: key of --tls-cert")
	fs.StringVar(&cfg.TLSCA, "tls-ca", "", "two-host mode: CA the remote daemon's certificate must chain to")
	fs.StringVar(&cfg.Memory, "memory", "host", "where the blocks live: host or cuda")
	fs.IntVar(&cfg.SrcDevice, "src-device", 0, "--memory cuda: the source region's GPU")
	fs.IntVar(&cfg.DstDevice, "dst-device", 0, "--memory cuda: the destination region's GPU")
	fs.StringVar(&cfg.NCUDir, "ncu", "", "embedded mode: run both daemons under Nsight Compute, logs in this directory; sms_used then comes from the kernels ncu saw")
	op := fs.String("op", OpWrite, "write (push), read (pull the peer's blocks into the local region) or both (interleaved in the same rounds); rows carry op")
	modes := fs.String("mode", "", "adhoc, prepared, or adhoc,prepared (default: ad hoc at every size, prepared too up to 64 KiB; naming both runs both everywhere)")
	fs.StringVar(&cfg.Path, "path", PathGRPC, "sweep: how the calls reach the source daemon: grpc (BatchTransfer, SubmitTransfer) or ring (the shared-memory ring's batch and submit records; embedded mode; the daemon's phases then show only wire and total)")
	fs.BoolVar(&cfg.Cold, "cold", false, "skip the warm-up (WarmTransfer) that follows registering the regions, as an engine's handshake would: the first batch then pays for the connection and, on the same host, mapping the destination")
	fs.BoolVar(&cfg.Breakdown, "breakdown", false, "print the daemon's per-phase medians (decode, validate, resolve, plan, post, wire, notify) per size and mode")
	yard := fs.String("yardstick", "stream,cached", "yardsticks: stream (TCP from and into regions as large as the bench's), cached (TCP, 4 MiB buffers), raw (--memory cuda: one cuMemcpyBatchAsync of each batch's own blocks from the bench, interleaved), comma-separated, or none")
	fs.IntVar(&cfg.PingCalls, "ping-calls", DefaultPingCalls, "empty Ping calls whose median is the floor printed in the header (0: skip)")
	fs.StringVar(&cfg.Workload, "workload", WorkloadSweep, "sweep (block sizes, the default), kv (one KV-cache request moved as descriptors and as block ids; see --kv-*) control (empty requests and prepared submits over gRPC and over the shared-memory ring) or paths (auto against every transport on this host, per memory route and size)")
	fs.IntVar(&cfg.KV.Segments, "kv-segments", DefaultKVSegments, "--workload kv: segments (per-layer K and V tensors) per layout")
	kvBlock := fs.String("kv-block", "8KiB", "--workload kv: bytes per block of a segment (K, M suffixes allowed)")
	fs.IntVar(&cfg.KV.Pool, "kv-pool", DefaultKVPool, "--workload kv: blocks per segment (the pool's num_blocks)")
	fs.IntVar(&cfg.KV.Request, "kv-request", DefaultKVRequest, "--workload kv: block ids per request, drawn at random without repeats (seeded), local and remote drawn apart")
	kvRegions := fs.String("kv-regions", KVRegionsSegment, "--workload kv: segment (one region per segment, as vLLM's per-layer tensors) or one (one region holding every segment)")
	fs.IntVar(&cfg.Repeat, "repeat", DefaultKVRepeat, "--workload kv: timed requests per mode (medians of these), after one warm-up each")
	fs.StringVar(&cfg.ProjectCX7, "project-cx7", "", "print the ConnectX-7 projection table (markdown) from this bench JSON and exit; starts no daemons")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	var err error
	if cfg.AdHoc, cfg.PreparedUpTo, err = ParseModes(*modes); err != nil {
		return Config{}, fmt.Errorf("--mode %w", err)
	}
	if cfg.Ops, err = ParseOps(*op); err != nil {
		return Config{}, fmt.Errorf("--op %w", err)
	}
	if cfg.Yardsticks, err = ParseYardsticks(*yard); err != nil {
		return Config{}, fmt.Errorf("--yardstick %w", err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments %q (flags only)", fs.Args())
	}
	cfg.DaemonArgs = daemonArgs
	if cfg.KV.Block, err = parseByteCount(*kvBlock); err != nil {
		return Config{}, fmt.Errorf("--kv-block: %w", err)
	}
	switch *kvRegions {
	case KVRegionsSegment:
		cfg.KV.PerSegmentRegions = true
	case KVRegionsOne:
	default:
		return Config{}, fmt.Errorf("--kv-regions %q: want %s or %s", *kvRegions, KVRegionsSegment, KVRegionsOne)
	}
	cfg.Sizes = DefaultSizes()
	if *sizes != "" {
		s, err := ParseSizes(*sizes)
		if err != nil {
			return Config{}, fmt.Errorf("--sizes: %w", err)
		}
		cfg.Sizes = s
	}
	return cfg, cfg.Validate()
}

// Validate checks flag combinations.
func (c Config) Validate() error {
	switch {
	case c.Blocks < 1:
		return fmt.Errorf("--blocks %d: need at least 1", c.Blocks)
	case c.Iters < 1:
		return fmt.Errorf("--iters %d: need at least 1 timed batch", c.Iters)
	case c.Memory != "" && c.Memory != "host" && c.Memory != "cuda":
		return fmt.Errorf("--memory %q: want host or cuda", c.Memory)
	case slices.Contains(c.Yardsticks, YardstickRaw) && c.Memory != "cuda":
		return errors.New("--yardstick raw: GPU memory only (--memory cuda): it is the copy engines' batch call")
	case slices.Contains(c.Yardsticks, YardstickRaw) && c.TwoHost():
		return errors.New("--yardstick raw: embedded mode only (both regions must be on this host)")
	case c.NCUDir != "" && c.TwoHost():
		return fmt.Errorf("--ncu wraps the daemons the bench starts: it needs embedded mode")
	case c.PingCalls < 0:
		return fmt.Errorf("--ping-calls %d: want 0 or more", c.PingCalls)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout %v: need a positive deadline", c.Timeout)
	case len(c.Sizes) == 0:
		return errors.New("--sizes: no sizes given")
	}
	switch c.Workload {
	case "", WorkloadSweep:
	case WorkloadKV:
		if c.Repeat < 1 {
			return fmt.Errorf("--repeat %d: need at least 1 timed request", c.Repeat)
		}
		if c.Memory == "cuda" {
			return errors.New("--workload kv: host memory only (--memory cuda is not supported yet)")
		}
		if err := c.KV.Validate(); err != nil {
			return err
		}
	case WorkloadControl:
	case WorkloadPaths:
		if c.TwoHost() {
			return fmt.Errorf("--workload paths: embedded mode only (it measures this host's paths)")
		}
	default:
		return fmt.Errorf("--workload %q: want %s, %s, %s or %s", c.Workload, WorkloadSweep, WorkloadKV, WorkloadControl, WorkloadPaths)
	}
	switch c.Path {
	case "", PathGRPC:
	case PathRing:
		if c.TwoHost() {
			return fmt.Errorf("--path ring: embedded mode only (the ring needs the source daemon's submit socket, on this host)")
		}
	default:
		return fmt.Errorf("--path %q: want %s or %s", c.Path, PathGRPC, PathRing)
	}
	switch c.Transport {
	case "auto", "tcp", "verbs", "local":
	default:
		return fmt.Errorf("--transport %q: want auto, tcp, verbs or local", c.Transport)
	}
	given := 0
	for _, v := range []string{c.SrcAPI, c.DstAPI, c.DstPeer} {
		if v != "" {
			given++
		}
	}
	if given != 0 && given != 3 {
		return errors.New("two-host mode needs all of --src-api, --dst-api and --dst-peer")
	}
	if given == 0 && c.B2BD == "" {
		return errors.New("embedded mode needs --b2bd (the daemon binary)")
	}
	return nil
}

// ParseSizes parses "128,4096,64K,2MiB" into ascending, distinct byte counts.
func ParseSizes(s string) ([]uint64, error) {
	seen := map[uint64]bool{}
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := parseByteCount(f)
		if err != nil {
			return nil, err
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%q lists no sizes", s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

func parseByteCount(f string) (uint64, error) {
	mult := uint64(1)
	num := f
	lower := strings.ToLower(f)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"b", 1}} {
		if strings.HasSuffix(lower, u.suffix) {
			mult, num = u.mult, strings.TrimSpace(f[:len(f)-len(u.suffix)])
			break
		}
	}
	v, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: not a whole number of bytes (suffixes K, M, G allowed)", f)
	}
	if v == 0 {
		return 0, fmt.Errorf("size %q: blocks need at least one byte", f)
	}
	if v > (1<<40)/mult {
		return 0, fmt.Errorf("size %q: over 1 TiB", f)
	}
	return v * mult, nil
}

// FormatBytes writes a byte count in the largest binary unit that divides it
// exactly ("128 B", "4 KiB", "2 MiB"), else in bytes.
func FormatBytes(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	default:
		return fmt.Sprintf("%d B", n)
	}
}

// formatGiB writes a byte count with one decimal in GiB, or MiB below 1 GiB,
// for notes.
func formatGiB(n uint64) string {
	if n < 1<<30 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}
