package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/gpudirect"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// WorkloadPaths measures what --transport auto chooses on one host: for
// every memory route the host can make (host and GPU, both ways, one GPU to
// itself, and to another) and each block size, batches over auto and over
// every transport the source daemon runs, interleaved round by round on
// the same regions, every transport's last batch verified block by block.
// Auto's batch against the fastest transport's is the figure: the daemon's
// calibration should make it 1.0.
const WorkloadPaths = "paths"

// pathsRegionBytes bounds each route's two regions: blocks above what fits
// are dropped from the batch (Row.Blocks says how many ran).
const pathsRegionBytes = 1 << 30

// PathsReport is a --workload paths run, as written to --json.
type PathsReport struct {
	Workload string      `json:"workload"` // "paths"
	Host     HostOut     `json:"host"`
	Seed     uint64      `json:"seed"`
	Iters    int         `json:"iterations"`
	Rows     []PathsRow  `json:"rows"`
	Summary  []PathsBest `json:"summary"`
	// Calibration is the source daemon's, as its Status says it.
	Calibration json.RawMessage `json:"calibration,omitempty"`
	Complete    bool            `json:"complete"`
	Error       string          `json:"error,omitempty"`
}

// PathsRow is one route, size and transport ("auto" included).
type PathsRow struct {
	Workload   string  `json:"workload"` // "paths"
	Route      string  `json:"route"`
	BlockBytes uint64  `json:"block_bytes"`
	Blocks     int     `json:"blocks"`
	Transport  string  `json:"transport"`
	Carried    string  `json:"carried_by"` // the kind the daemon used (auto's choice)
	MedianMS   float64 `json:"median_ms"`
	P99MS      float64 `json:"p99_ms"`
	Verified   bool    `json:"verified"`
	Error      string  `json:"error,omitempty"`
}

// PathsBest is one route and size: the fastest named transport and auto's
// median over it.
type PathsBest struct {
	Route        string  `json:"route"`
	BlockBytes   uint64  `json:"block_bytes"`
	AutoChose    string  `json:"auto_chose"`
	Best         string  `json:"best"`
	AutoOverBest float64 `json:"auto_over_best"`
}

// pathsRoute is one route's memory: each side's kind and GPU.
type pathsRoute struct {
	name             string
	srcCUDA, dstCUDA bool
	srcDev, dstDev   int32
}

func runPaths(ctx context.Context, cfg Config, stdout io.Writer) error {
	host, _ := os.Hostname()
	rep := &PathsReport{Workload: WorkloadPaths, Host: HostOut{Hostname: host, CPUs: runtime.NumCPU()}, Seed: cfg.Seed, Iters: cfg.Iters,
		Rows: []PathsRow{}, Summary: []PathsBest{}}
	err := pathsRun(ctx, cfg, rep, stdout)
	rep.Complete = err == nil
	if err != nil {
		rep.Error = err.Error()
	}
	if cfg.JSONPath != "" {
		b, jerr := json.MarshalIndent(rep, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(cfg.JSONPath, append(b, '\n'), 0o644)
		}
		err = errors.Join(err, jerr)
	}
	return err
}

func pathsRun(ctx context.Context, cfg Config, rep *PathsReport, out io.Writer) error {
	// Only the source daemon measures: the destination's calibration would
	// load the same host while the source's runs.
	pair, err := startEmbeddedWith(ctx, cfg.B2BD, cfg.DaemonArgs, []string{"--calibrate", "off"}, "", false)
	if err != nil {
		return fmt.Errorf("embedded daemons: %w", err)
	}
	defer pair.stop()
	src, dst, peer := pair.src.client, pair.dst.client, pair.dst.peer
	st, err := waitCalibrated(ctx, src)
	if err != nil {
		return err
	}
	if b, err := json.Marshal(st.GetCalibration()); err == nil {
		rep.Calibration = b
	}
	var kinds []string
	for _, t := range st.GetTransports() {
		if t.GetAvailable() {
			kinds = append(kinds, t.GetKindName())
		}
	}
	var cuda gpudirect.Interface
	routes := []pathsRoute{{name: "host→host"}}
	if st.GetCudaAvailable() {
		if cuda, err = gpudirect.Load(); err != nil {
			return fmt.Errorf("the daemon has CUDA but the bench cannot load it: %w", err)
		}
		defer cuda.Close()
		routes = append(routes, pathsRoute{name: "host→cuda", dstCUDA: true}, pathsRoute{name: "cuda→host", srcCUDA: true},
			pathsRoute{name: "cuda→cuda (one GPU)", srcCUDA: true, dstCUDA: true})
		if cuda.DeviceCount() > 1 {
			routes = append(routes, pathsRoute{name: "cuda→cuda (two GPUs)", srcCUDA: true, dstCUDA: true, dstDev: 1})
		}
	}
	fmt.Fprintf(out, "auto against every transport (%v), %d timed batches each per size, interleaved; calibration: %s\n",
		kinds, cfg.Iters, st.GetCalibration().GetState())
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "route\tblock\tblocks\tauto chose\tauto ms\t")
	for _, k := range kinds {
		fmt.Fprintf(tw, "%s ms\t", k)
	}
	fmt.Fprintln(tw, "auto/best\tverified\t")
	defer tw.Flush()
	for ri, r := range routes {
		if err := pathsRunRoute(ctx, cfg, rep, tw, cuda, src, dst, peer, r, ri, kinds); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
	}
	return nil
}

// waitCalibrated waits until the daemon's calibration is no longer
// measuring.
func waitCalibrated(ctx context.Context, c *client.Client) (*b2bv1.StatusResponse, error) {
	for {
		st, err := c.Status(ctx)
		if err != nil {
			return nil, err
		}
		if st.GetCalibration().GetState() != "measuring" {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func pathsRunRoute(ctx context.Context, cfg Config, rep *PathsReport, tw *tabwriter.Writer, cuda gpudirect.Interface, src, dst *client.Client, peer string, r pathsRoute, ri int, kinds []string) error {
	alloc := func(isCUDA bool, dev int32, export string) *b2bv1.RegisterRegionRequest {
		req := &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: pathsRegionBytes}}, ExportName: export}
		if isCUDA {
			req.Source = &b2bv1.RegisterRegionRequest_CudaAlloc{CudaAlloc: &b2bv1.CudaAlloc{Device: dev, Size: pathsRegionBytes}}
		}
		return req
	}
	sresp, err := src.API().RegisterRegion(ctx, alloc(r.srcCUDA, r.srcDev, ""))
	if err != nil {
		return fmt.Errorf("source region: %w", err)
	}
	defer src.Deregister(context.WithoutCancel(ctx), sresp.GetRegion().GetId())
	var mem sourceMemory
	if r.srcCUDA {
		mem, err = openCUDASource(cuda, sresp.GetRegion())
	} else {
		var h *client.HostRegion
		if h, err = src.MapHostRegion(ctx, sresp.GetRegion()); err == nil {
			mem = hostSource{h}
		}
	}
	if err != nil {
		return fmt.Errorf("source region: %w", err)
	}
	defer mem.Release()
	export := fmt.Sprintf("bench-paths-%d", ri)
	dresp, err := dst.API().RegisterRegion(ctx, alloc(r.dstCUDA, r.dstDev, export))
	if err != nil {
		return fmt.Errorf("destination region: %w", err)
	}
	defer dst.Deregister(context.WithoutCancel(ctx), dresp.GetRegion().GetId())
	srcID, dstID := sresp.GetRegion().GetId(), dresp.GetRegion().GetId()

	transports := append([]string{"auto"}, kinds...)
	for _, size := range cfg.Sizes {
		n := min(cfg.Blocks, int(pathsRegionBytes/SlotBytes(size)))
		sl := NewLayout(n, size, rand.New(rand.NewPCG(mix(cfg.Seed, size, 11), 0)))
		dl := NewLayout(n, size, rand.New(rand.NewPCG(mix(cfg.Seed, size, 12), 0)))
		if err := mem.Fill(sl.RegionBytes, mix(cfg.Seed, size, 13)); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
		t := client.Transfer{SrcRegion: srcID, Peer: peer, DstRegion: export, Blocks: client.Descriptors{Src: sl.Offsets, Dst: dl.Offsets, BlockLength: size}}
		samples := make([][]time.Duration, len(transports))
		carried := make([]string, len(transports))
		rows := make([]PathsRow, len(transports))
		for i, k := range transports {
			rows[i] = PathsRow{Workload: WorkloadPaths, Route: r.name, BlockBytes: size, Blocks: n, Transport: k}
		}
		orders := permutations(len(transports))
		for round := 0; round <= cfg.Iters; round++ {
			// Each round runs the transports in the next of every order:
			// a batch runs slower after a CPU-heavy one (TCP's), so each
			// transport must follow each other one as often.
			for _, i := range orders[round%len(orders)] {
				if rows[i].Error != "" {
					continue
				}
				t.TransportName = transports[i]
				if t.TransportName == "auto" {
					t.TransportName = ""
				}
				bctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
				t0 := time.Now()
				resp, err := src.BatchTransfer(bctx, t)
				d := time.Since(t0)
				cancel()
				if err != nil {
					rows[i].Error = err.Error()
					continue
				}
				carried[i] = resp.GetTransportName()
				if round > 0 {
					samples[i] = append(samples[i], d)
				}
			}
		}
		// Every transport's own batch, verified: fresh stamps in the
		// source's blocks, one batch, then each block's CRC on both sides.
		for i, k := range transports {
			if rows[i].Error != "" {
				continue
			}
			rows[i].Carried = carried[i]
			st := Summarize(samples[i])
			rows[i].MedianMS, rows[i].P99MS = st.Median.Seconds()*1e3, st.P99.Seconds()*1e3
			if err := mem.Stamp(sl.Offsets, size, mix(cfg.Seed, size, 20+uint64(i))); err != nil {
				return fmt.Errorf("stamp: %w", err)
			}
			t.TransportName = k
			if k == "auto" {
				t.TransportName = ""
			}
			if _, err := src.BatchTransfer(ctx, t); err != nil {
				rows[i].Error = "verification batch: " + err.Error()
				continue
			}
			ok, err := sameCRCs(ctx, src, dst, srcID, dstID, sl.Offsets, dl.Offsets, size)
			if err != nil {
				return err
			}
			rows[i].Verified = ok
		}
		rep.Rows = append(rep.Rows, rows...)
		best := PathsBest{Route: r.name, BlockBytes: size, AutoChose: rows[0].Carried}
		for i := 1; i < len(rows); i++ {
			if rows[i].Error == "" && (best.Best == "" || rows[i].MedianMS < bestMS(rows, best.Best)) {
				best.Best = rows[i].Transport
			}
		}
		if best.Best != "" && rows[0].Error == "" {
			best.AutoOverBest = rows[0].MedianMS / bestMS(rows, best.Best)
		}
		rep.Summary = append(rep.Summary, best)
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.3f\t", r.name, FormatBytes(size), n, best.AutoChose, rows[0].MedianMS)
		for _, row := range rows[1:] {
			if row.Error != "" {
				fmt.Fprint(tw, "failed\t")
				continue
			}
			fmt.Fprintf(tw, "%.3f\t", row.MedianMS)
		}
		verified := true
		for _, row := range rows {
			verified = verified && (row.Verified || row.Error != "")
		}
		fmt.Fprintf(tw, "%.3f\t%v\t\n", best.AutoOverBest, verified)
		if !verified {
			return fmt.Errorf("%s: a batch's blocks differ from the source's", FormatBytes(size))
		}
	}
	return nil
}

// permutations are every order of 0..n-1.
func permutations(n int) [][]int {
	if n <= 1 {
		return [][]int{make([]int, n)}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for at := 0; at <= len(p); at++ {
			q := append(append(append([]int{}, p[:at]...), n-1), p[at:]...)
			out = append(out, q)
		}
	}
	return out
}

func bestMS(rows []PathsRow, k string) float64 {
	for _, r := range rows {
		if r.Transport == k {
			return r.MedianMS
		}
	}
	return 0
}

// sameCRCs says whether each block at srcOffs of srcID (on src) has the
// CRC32C of the block at dstOffs of dstID (on dst).
func sameCRCs(ctx context.Context, src, dst *client.Client, srcID, dstID string, srcOffs, dstOffs []uint64, size uint64) (bool, error) {
	alg := b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C
	a, err := src.Checksum(ctx, srcID, srcOffs, nil, size, alg, true)
	if err != nil {
		return false, fmt.Errorf("checksum the source: %w", err)
	}
	b, err := dst.Checksum(ctx, dstID, dstOffs, nil, size, alg, true)
	if err != nil {
		return false, fmt.Errorf("checksum the destination: %w", err)
	}
	return a.GetBlocks() == uint64(len(srcOffs)) && bytes.Equal(a.GetBlockDigests(), b.GetBlockDigests()), nil
}
