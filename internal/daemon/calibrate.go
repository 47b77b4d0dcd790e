package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Calibration (--calibrate start): once serving, the daemon times batches
// to itself over each kind it runs, as a client of its own API socket, for
// every memory route it can make and four block sizes, and hands the
// result to the peer layer, where --transport auto gives a peer on this
// host the kind measured fastest for a batch's route and block size
// (transport.Calibration). Until it is done, auto goes by rank. With
// --calibration-file the result is kept there and reused by a later start
// on the same host, build, transports and GPUs.

// calibrationSizes are the measured block sizes and blocks per batch: the
// founding benchmark's 10,000 blocks where their gapped slots fit in a
// calibration region, 64 MiB of blocks above (fewer blocks change the
// choice: GPU to host 4 KiB blocks went faster over tcp at 4,096 blocks
// and over local at 10,000), so that the whole measurement takes about a
// second.
var calibrationSizes = []struct {
	block  uint64
	blocks int
}{{128, 10000}, {4 << 10, 10000}, {64 << 10, 1024}, {2 << 20, 32}}

const (
	calibrationRegion = 128 << 20 // each route's source and destination
	calibrationRounds = 8         // timed batches per kind, after one warm
	// calibrationBatch bounds one measured batch: a kind that hangs on
	// this host is marked failed for the route, not waited for.
	calibrationBatch = 5 * time.Second
	// calibrationBudget bounds the whole measurement (3 s on an H200 host).
	calibrationBudget = 30 * time.Second
)

// calibrator runs the measurement and holds its latest state.
type calibrator struct {
	state atomic.Pointer[transport.Calibration]
	done  chan struct{}
}

// Calibration is the daemon's latest calibration state, for Status.
func (d *Daemon) Calibration() *transport.Calibration { return d.calib.state.Load() }

// startCalibration measures in the background (or loads the cached
// result), unless --calibrate off; Serve's end waits for it.
func (d *Daemon) startCalibration(ctx context.Context) {
	d.calib.done = make(chan struct{})
	off := func(why string) {
		d.calib.state.Store(&transport.Calibration{State: why})
		close(d.calib.done)
	}
	if d.cfg.Calibrate != "start" {
		off("off")
		return
	}
	if kinds := d.peers.Ranked(); len(kinds) < 2 {
		off(fmt.Sprintf("off: one transport (%v), nothing to choose", kinds))
		return
	}
	if d.cfg.Socket == "" {
		off("off: it needs the API socket (--socket)")
		return
	}
	log := d.log.Named("calibrate")
	fp := d.fingerprint()
	if c, err := readCalibration(d.cfg.CalibrationFile, fp); err == nil {
		c.State, c.File = "cached", d.cfg.CalibrationFile
		d.useCalibration(c)
		log.Info("auto's choices read from the calibration file", "file", d.cfg.CalibrationFile, "rows", len(c.Rows))
		close(d.calib.done)
		return
	} else if d.cfg.CalibrationFile != "" && !errors.Is(err, os.ErrNotExist) {
		log.Info("calibration file not used; measuring", "file", d.cfg.CalibrationFile, "reason", err)
	}
	d.calib.state.Store(&transport.Calibration{State: "measuring", File: d.cfg.CalibrationFile})
	go func() {
		defer close(d.calib.done)
		t0 := time.Now()
		c, err := d.measure(ctx, log)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("calibration failed; auto goes by rank", "error", err)
			}
			d.calib.state.Store(&transport.Calibration{State: "failed: " + err.Error(), File: d.cfg.CalibrationFile})
			return
		}
		c.State, c.Elapsed, c.File = "done", time.Since(t0), d.cfg.CalibrationFile
		d.useCalibration(c)
		for _, r := range c.Rows {
			log.Info("auto's choice", "route", r.Route.String(), "block_bytes", r.BlockBytes, "chosen", r.Chosen, "why", r.Why, "median", medians(r.Median))
		}
		if d.cfg.CalibrationFile != "" {
			if err := writeCalibration(d.cfg.CalibrationFile, fp, c); err != nil {
				log.Warn("keep the calibration", "file", d.cfg.CalibrationFile, "error", err)
			}
		}
	}()
}

// useCalibration decides c's rows for this daemon's kinds and hands it to
// Status and to auto.
func (d *Daemon) useCalibration(c *transport.Calibration) {
	c.Decide(d.peers.Ranked())
	d.calib.state.Store(c)
	d.peers.SetCalibration(c)
}

func medians(m map[transport.Kind]time.Duration) string {
	var s []string
	for k, t := range m {
		s = append(s, fmt.Sprintf("%s=%s", k, t.Round(time.Microsecond)))
	}
	slices.Sort(s)
	return strings.Join(s, " ")
}

// calibRoute is one route and the memory of its two regions.
type calibRoute struct {
	route    transport.Route
	src, dst *b2bv1.RegisterRegionRequest
	// appDst: the destination is an application's allocation on this
	// device (appalloc.go), where one can be made; else dst.
	appDst int
}

// routes are the routes this host can make: host to host, and with a GPU,
// host and device 0 both ways, device 0 to itself, and to device 1.
func (d *Daemon) routes() []calibRoute {
	host := func() *b2bv1.RegisterRegionRequest {
		return &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: calibrationRegion}}}
	}
	gpu := func(dev int32) *b2bv1.RegisterRegionRequest {
		return &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_CudaAlloc{CudaAlloc: &b2bv1.CudaAlloc{Device: dev, Size: calibrationRegion}}}
	}
	out := []calibRoute{{transport.Route{From: memory.Host, To: memory.Host}, host(), host(), -1}}
	if d.cuda == nil || d.cuda.DeviceCount() == 0 {
		return out
	}
	out = append(out,
		calibRoute{transport.Route{From: memory.Host, To: memory.CUDA}, host(), gpu(0), -1},
		calibRoute{transport.Route{From: memory.CUDA, To: memory.Host}, gpu(0), host(), -1},
		calibRoute{transport.Route{From: memory.CUDA, To: memory.CUDA, SameDevice: true}, gpu(0), gpu(0), -1})
	if d.cuda.DeviceCount() > 1 {
		out = append(out, calibRoute{transport.Route{From: memory.CUDA, To: memory.CUDA}, gpu(0), gpu(1), 1})
	}
	return out
}

// measure times every route and size over every kind this daemon runs.
func (d *Daemon) measure(ctx context.Context, log hclog.Logger) (*transport.Calibration, error) {
	cc, err := grpc.NewClient("passthrough:///unix", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", d.cfg.Socket)
		}))
	if err != nil {
		return nil, fmt.Errorf("dial the API socket %s: %w", d.cfg.Socket, err)
	}
	defer cc.Close()
	api := b2bv1.NewB2BClient(cc)
	self, err := loopbackOf(d.peerAddr)
	if err != nil {
		return nil, err
	}
	kinds := d.peers.Ranked()
	out := &transport.Calibration{}
	var skipped []string
	// A slow host (an emulated VM, a loaded machine) gets what fit in the
	// budget: the routes measured by then; the others go by rank.
	mctx, cancel := context.WithTimeout(ctx, calibrationBudget)
	defer cancel()
	for i, r := range d.routes() {
		stop := func() {}
		if r.appDst >= 0 {
			h, stopHelper, err := appAlloc(mctx, r.appDst, calibrationRegion)
			if err != nil {
				log.Warn("no application allocation for the route: its destination is the daemon's own, reached by peer access, slower at small blocks than an application's", "route", r.route.String(), "error", err)
			} else {
				stop = stopHelper
				r.dst = &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_CudaIpc{CudaIpc: &b2bv1.CudaIpc{Device: int32(r.appDst), IpcHandle: h[:], Size: calibrationRegion}}}
			}
		}
		rows, err := measureRoute(mctx, api, self, fmt.Sprintf("b2bd-calibrate-%d-%d", os.Getpid(), i), r, kinds)
		stop() // the route's regions are deregistered by now
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if mctx.Err() != nil {
			log.Warn("calibration out of time; the routes left go by rank", "budget", calibrationBudget, "measured", len(out.Rows))
			skipped = append(skipped, fmt.Sprintf("out of time (%s) at %s", calibrationBudget, r.route))
			break
		}
		if err != nil { // that route goes by rank; the others are measured
			log.Warn("calibration route skipped", "route", r.route.String(), "error", err)
			skipped = append(skipped, fmt.Sprintf("%s: %v", r.route, err))
			continue
		}
		out.Rows = append(out.Rows, rows...)
	}
	if len(out.Rows) == 0 {
		return nil, fmt.Errorf("no route measured: %s", strings.Join(skipped, "; "))
	}
	return out, nil
}

// loopbackOf is the peer listener's address as this daemon dials itself:
// the address itself, or 127.0.0.1 where it listens on every address.
func loopbackOf(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("peer address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// measureRoute registers the route's two regions (the destination
// exported as name), times each size over each kind, interleaving the
// kinds round by round (in alternating order) so that a host's drift and
// one kind's aftermath fall on all of them, and deregisters them.
func measureRoute(ctx context.Context, api b2bv1.B2BClient, self, name string, r calibRoute, kinds []transport.Kind) ([]transport.CalibrationRow, error) {
	src, err := api.RegisterRegion(ctx, r.src)
	if err != nil {
		return nil, fmt.Errorf("register the source: %w", err)
	}
	defer api.DeregisterRegion(context.WithoutCancel(ctx), &b2bv1.DeregisterRegionRequest{RegionId: src.GetRegion().GetId()})
	r.dst.ExportName = name
	dst, err := api.RegisterRegion(ctx, r.dst)
	if err != nil {
		return nil, fmt.Errorf("register the destination: %w", err)
	}
	defer api.DeregisterRegion(context.WithoutCancel(ctx), &b2bv1.DeregisterRegionRequest{RegionId: dst.GetRegion().GetId()})
	var rows []transport.CalibrationRow
	failed := map[transport.Kind]string{} // a kind failed once fails the route
	for _, sz := range calibrationSizes {
		// Gapped slots (no two blocks merge) in a fixed shuffled order, as
		// an engine's block ids come.
		rng := rand.New(rand.NewPCG(sz.block, 1))
		srcOffs, dstOffs := make([]uint64, sz.blocks), make([]uint64, sz.blocks)
		for i, p := range rng.Perm(sz.blocks) {
			srcOffs[i] = uint64(p) * 2 * sz.block
		}
		for i, p := range rng.Perm(sz.blocks) {
			dstOffs[i] = uint64(p) * 2 * sz.block
		}
		req := &b2bv1.BatchTransferRequest{SrcRegionId: src.GetRegion().GetId(), Peer: self, DstRegion: name,
			Descriptors: &b2bv1.Descriptors{SrcOffsets: desc.Pack(srcOffs), DstOffsets: desc.Pack(dstOffs), BlockLength: sz.block}}
		row := transport.CalibrationRow{Route: r.route, BlockBytes: sz.block, Blocks: sz.blocks,
			Median: map[transport.Kind]time.Duration{}}
		times := map[transport.Kind][]time.Duration{}
		order := make([]transport.Kind, len(kinds))
		for round := 0; round <= calibrationRounds; round++ {
			// Forward, then backward: each kind follows the other as often
			// (a batch after a TCP batch runs measurably slower).
			copy(order, kinds)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, k := range order {
				if _, no := failed[k]; no {
					continue
				}
				req.TransportName = string(k)
				bctx, cancel := context.WithTimeout(ctx, calibrationBatch)
				t0 := time.Now()
				_, err := api.BatchTransfer(bctx, req)
				cancel()
				if err != nil {
					if ctx.Err() != nil {
						return nil, ctx.Err()
					}
					failed[k] = err.Error()
					delete(times, k)
					continue
				}
				if round > 0 { // round 0 warms the path
					times[k] = append(times[k], time.Since(t0))
				}
			}
		}
		for k, ts := range times {
			slices.Sort(ts)
			row.Median[k] = ts[len(ts)/2]
		}
		row.Failed = maps.Clone(failed)
		rows = append(rows, row)
	}
	return rows, nil
}

// fingerprint names what a cached calibration holds for: this build, this
// host, the kinds the daemon runs and the GPUs it sees.
func (d *Daemon) fingerprint() string {
	host, _ := os.Hostname()
	var kinds []string
	for _, k := range d.peers.Ranked() {
		kinds = append(kinds, string(k))
	}
	gpus := "no GPU"
	if d.cuda != nil {
		var names []string
		for i := 0; i < d.cuda.DeviceCount(); i++ {
			if info, err := d.cuda.DeviceInfo(i); err == nil {
				names = append(names, fmt.Sprintf("%d:%s", i, info.Name))
			}
		}
		gpus = fmt.Sprintf("driver %d %v", d.cuda.DriverVersion(), names)
	}
	return fmt.Sprintf("b2bd %s; host %s, %d CPUs; kinds %s; %s", Version, host, runtime.NumCPU(), strings.Join(kinds, ","), gpus)
}

// calibrationFile is --calibration-file's content.
type calibrationFile struct {
	Fingerprint string           `json:"fingerprint"`
	Measured    time.Time        `json:"measured"`
	ElapsedNS   int64            `json:"elapsed_ns"`
	Rows        []calibrationRow `json:"rows"`
}

type calibrationRow struct {
	From       string            `json:"from"`
	To         string            `json:"to"`
	SameDevice bool              `json:"same_device"`
	BlockBytes uint64            `json:"block_bytes"`
	Blocks     int               `json:"blocks"`
	MedianNS   map[string]int64  `json:"median_ns"`
	Failed     map[string]string `json:"failed,omitempty"`
}

// maxCalibrationFile bounds what readCalibration reads.
const maxCalibrationFile = 1 << 20

// readCalibration reads a calibration kept by writeCalibration, refusing
// one made for another fingerprint or that does not parse as one.
func readCalibration(path, fp string) (*transport.Calibration, error) {
	if path == "" {
		return nil, os.ErrNotExist
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseCalibration(b, fp)
}

// parseCalibration is readCalibration's parser: every row must name known
// memory kinds, a block size, blocks and positive times by valid kind
// names.
func parseCalibration(b []byte, fp string) (*transport.Calibration, error) {
	if len(b) > maxCalibrationFile {
		return nil, fmt.Errorf("%w: %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(b), maxCalibrationFile)
	}
	var f calibrationFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%w: %w", errs.ErrInvalidArgument, err)
	}
	if f.Fingerprint != fp {
		return nil, fmt.Errorf("%w: made for %q, this daemon is %q", errs.ErrFailedPrecondition, f.Fingerprint, fp)
	}
	c := &transport.Calibration{Elapsed: time.Duration(f.ElapsedNS)}
	for i, r := range f.Rows {
		from, err1 := memoryKindOf(r.From)
		to, err2 := memoryKindOf(r.To)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("rows[%d]: %w", i, err)
		}
		if r.BlockBytes == 0 || r.Blocks <= 0 || len(r.MedianNS) == 0 {
			return nil, fmt.Errorf("%w: rows[%d]: block_bytes %d, blocks %d and %d medians: each must be above 0", errs.ErrInvalidArgument, i, r.BlockBytes, r.Blocks, len(r.MedianNS))
		}
		row := transport.CalibrationRow{Route: transport.Route{From: from, To: to, SameDevice: r.SameDevice}, BlockBytes: r.BlockBytes, Blocks: r.Blocks,
			Median: map[transport.Kind]time.Duration{}, Failed: map[transport.Kind]string{}}
		for k, ns := range r.MedianNS {
			if err := transport.CheckName(k); err != nil || k == transport.Auto || ns <= 0 {
				return nil, fmt.Errorf("%w: rows[%d].median_ns[%q] = %d: a transport's name and a time above 0", errs.ErrInvalidArgument, i, k, ns)
			}
			row.Median[transport.Kind(k)] = time.Duration(ns)
		}
		for k, why := range r.Failed {
			row.Failed[transport.Kind(k)] = why
		}
		c.Rows = append(c.Rows, row)
	}
	return c, nil
}

func memoryKindOf(s string) (memory.Kind, error) {
	switch s {
	case memory.Host.String():
		return memory.Host, nil
	case memory.CUDA.String():
		return memory.CUDA, nil
	}
	return 0, fmt.Errorf("%w: memory kind %q is neither host nor cuda", errs.ErrInvalidArgument, s)
}

// writeCalibration keeps c at path for a later start (written whole, then
// renamed into place).
func writeCalibration(path, fp string, c *transport.Calibration) error {
	f := calibrationFile{Fingerprint: fp, Measured: time.Now().UTC(), ElapsedNS: int64(c.Elapsed)}
	for _, r := range c.Rows {
		row := calibrationRow{From: r.Route.From.String(), To: r.Route.To.String(), SameDevice: r.Route.SameDevice, BlockBytes: r.BlockBytes, Blocks: r.Blocks,
			MedianNS: map[string]int64{}, Failed: map[string]string{}}
		for k, t := range r.Median {
			row.MedianNS[string(k)] = int64(t)
		}
		for k, why := range r.Failed {
			row.Failed[string(k)] = why
		}
		f.Rows = append(f.Rows, row)
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
