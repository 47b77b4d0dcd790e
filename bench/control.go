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
	"path/filepath"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/b2bd/b2bd/client"
)

// WorkloadControl measures the control path: an empty request and prepared
// submits, over gRPC and over the shared-memory ring, on the same daemons
// in one run, calls of the two paths interleaved so that load hits both.
const WorkloadControl = "control"

// Calls per row of --workload control (each path), after ControlWarmup.
const (
	ControlPingCalls   = 2000
	ControlSubmitCalls = 1000
	ControlBigCalls    = 200 // submits of ControlBigBlocks
	ControlWarmup      = 50
	ControlBigBlocks   = 10_000
	ControlBlockBytes  = 128
)

// submitSocketName is the source daemon's raw submit socket in its state
// directory (embedded mode).
const submitSocketName = "bench-src-submit.sock"

// ControlReport is a --workload control run, as written to --json.
type ControlReport struct {
	Workload string       `json:"workload"` // "control"
	Mode     string       `json:"mode"`
	Host     HostOut      `json:"host"`
	Rows     []ControlRow `json:"rows"`
	// RingOverGRPCPing is the ring's median empty round trip over gRPC's.
	RingOverGRPCPing *float64 `json:"ratio_ring_over_grpc_ping,omitempty"`
	Complete         bool     `json:"complete"`
	Error            string   `json:"error,omitempty"`
}

// ControlRow is one op over one path.
type ControlRow struct {
	Workload     string  `json:"workload"` // "control"
	Path         string  `json:"path"`     // "grpc" or "ring"
	Client       string  `json:"client"`   // "go" or "python" (client/python/bench_control.py)
	Op           string  `json:"op"`       // "ping", "ping_idle" (after ControlIdleGap), "submit", "blocks" (1 id, ControlBlockSegments segments), "start_poll" or "start_batch64" (control_async.go)
	Blocks       int     `json:"blocks,omitempty"`
	BlockBytes   uint64  `json:"block_bytes,omitempty"`
	Calls        int     `json:"calls"`
	UsPerRequest UsStats `json:"us_per_request"`
}

// UsStats are microseconds.
type UsStats struct {
	Median float64 `json:"median"`
	P99    float64 `json:"p99"`
}

func runControl(ctx context.Context, cfg Config, stdout io.Writer) error {
	host, _ := os.Hostname()
	rep := &ControlReport{Workload: WorkloadControl, Mode: "embedded", Host: HostOut{Hostname: host, CPUs: runtime.NumCPU()}, Rows: []ControlRow{}}
	start := time.Now()
	err := controlRun(ctx, cfg, rep, stdout)
	rep.Complete = err == nil
	if err != nil {
		rep.Error = err.Error()
	}
	if cfg.JSONPath != "" {
		b, jerr := json.MarshalIndent(rep, "", "  ")
		if jerr == nil {
			jerr = writeFileAtomic(cfg.JSONPath, append(b, '\n'))
		}
		if jerr != nil {
			err = errors.Join(err, jerr)
		} else {
			fmt.Fprintf(stdout, "\nwrote %s\n", cfg.JSONPath)
		}
	}
	if cfg.PlotPath != "" {
		fmt.Fprintf(stdout, "note: --plot %s not drawn: --workload control has no size sweep to plot\n", cfg.PlotPath)
	}
	fmt.Fprintf(stdout, "total time %s\n", time.Since(start).Round(100*time.Millisecond))
	return err
}

func controlRun(ctx context.Context, cfg Config, rep *ControlReport, out io.Writer) (err error) {
	eps, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := eps.close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	if eps.pair == nil {
		return errors.New("--workload control: embedded mode only (the ring needs the source daemon's submit socket)")
	}
	ring, err := client.DialRing(filepath.Join(eps.pair.stateDir, submitSocketName))
	if err != nil {
		return fmt.Errorf("--workload control: %w (a b2bd without rings?)", err)
	}
	defer ring.Close()
	fmt.Fprintf(out, "control    %s; go client, gRPC and ring calls interleaved\n", eps.describe)

	size := uint64(ControlBigBlocks * ControlBlockBytes)
	src, err := eps.src.RegisterHost(ctx, size, "")
	if err != nil {
		return fmt.Errorf("register source: %w", err)
	}
	defer eps.src.Deregister(context.WithoutCancel(ctx), src.Id)
	export := fmt.Sprintf("b2b-bench-control-%d", os.Getpid())
	dst, err := eps.dst.RegisterHost(ctx, size, export)
	if err != nil {
		return fmt.Errorf("register destination: %w", err)
	}
	defer eps.dst.Deregister(context.WithoutCancel(ctx), dst.Id)

	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "op\tblocks\tpath\tcalls\tmedian\tp99")
	add := func(op string, blocks int, grpcS, ringS []time.Duration) {
		for _, p := range []struct {
			path string
			s    []time.Duration
		}{{"grpc", grpcS}, {"ring", ringS}} {
			sum := Summarize(p.s)
			row := ControlRow{Workload: WorkloadControl, Path: p.path, Client: "go", Op: op, Calls: len(p.s),
				UsPerRequest: UsStats{Median: us(sum.Median), P99: us(sum.P99)}}
			if blocks > 0 {
				row.Blocks, row.BlockBytes = blocks, ControlBlockBytes
			}
			rep.Rows = append(rep.Rows, row)
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%.1f us\t%.1f us\n", op, blocks, p.path, len(p.s), row.UsPerRequest.Median, row.UsPerRequest.P99)
		}
	}

	gp, rp, err := interleave(ControlPingCalls, func() error { return eps.src.Ping(ctx) }, ring.Ping)
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	add("ping", 0, gp, rp)
	if g, r := Summarize(gp).Median, Summarize(rp).Median; g > 0 {
		ratio := float64(r) / float64(g)
		rep.RingOverGRPCPing = &ratio
	}

	gi, ri, err := interleaveGap(ControlIdleCalls, ControlIdleGap, func() error { return eps.src.Ping(ctx) }, ring.Ping)
	if err != nil {
		return fmt.Errorf("idle ping: %w", err)
	}
	add("ping_idle", 0, gi, ri)

	for _, shape := range []struct{ blocks, calls int }{{1, ControlSubmitCalls}, {ControlBigBlocks, ControlBigCalls}} {
		off := make([]uint64, shape.blocks)
		for i := range off {
			off[i] = uint64(i) * ControlBlockBytes
		}
		plan, err := eps.src.Prepare(ctx, client.Transfer{SrcRegion: src.Id, Peer: eps.dstPeer, DstRegion: export,
			Blocks: client.Descriptors{Src: off, Dst: off, BlockLength: ControlBlockBytes}})
		if err != nil {
			return fmt.Errorf("prepare %d blocks: %w", shape.blocks, err)
		}
		n := uint64(shape.blocks) * ControlBlockBytes
		r := rand.New(rand.NewPCG(cfg.Seed, uint64(shape.blocks)))
		check := func(what string) error { // the last submit's bytes landed
			if !bytes.Equal(src.Bytes[:n], dst.Bytes[:n]) {
				return fmt.Errorf("submit of %d blocks over %s: the destination differs from the source", shape.blocks, what)
			}
			return nil
		}
		for i := range src.Bytes[:n] {
			src.Bytes[i] = byte(r.Uint32())
		}
		gs, rs, err := interleave(shape.calls, func() error { _, err := plan.Submit(ctx); return err },
			func() error { _, err := ring.Submit(plan); return err })
		if err == nil {
			err = check("both paths")
		}
		for i := range src.Bytes[:n] { // and the ring alone moves fresh bytes
			src.Bytes[i] = byte(r.Uint32())
		}
		if err == nil {
			_, err = ring.Submit(plan)
		}
		if err == nil {
			err = check("the ring")
		}
		_ = plan.Release(context.WithoutCancel(ctx))
		if err != nil {
			return fmt.Errorf("submit %d blocks: %w", shape.blocks, err)
		}
		add("submit", shape.blocks, gs, rs)
	}
	if err := controlBlocks(ctx, cfg, eps, ring, src, dst, export, add); err != nil {
		return err
	}
	if err := controlAsync(ctx, cfg, eps, ring, src, dst, export, add); err != nil {
		return err
	}
	tw.Flush()
	if rep.RingOverGRPCPing != nil {
		fmt.Fprintf(out, "ring/gRPC ping median ratio %.3f\n", *rep.RingOverGRPCPing)
	}
	return controlPyRows(ctx, eps, rep, out)
}

// interleave times n calls of a and of b after ControlWarmup of each, in
// alternating runs of controlChunk back-to-back calls: load hits both paths
// alike, and each path is measured busy (a ring's consumer spins while
// requests keep coming; see ControlIdleGap for an idle one).
func interleave(n int, a, b func() error) (as, bs []time.Duration, err error) {
	return interleaveGap(n, 0, a, b)
}

// controlChunk is the run length of interleave.
const controlChunk = 100

// ControlIdleGap is the pause before each call of the ping_idle rows: long
// enough that the ring's consumer sleeps, so the row prices its wake-up.
const ControlIdleGap = 2 * time.Millisecond

// ControlIdleCalls is the ping_idle rows' calls per path.
const ControlIdleCalls = 200

func interleaveGap(n int, gap time.Duration, a, b func() error) (as, bs []time.Duration, err error) {
	total := ControlWarmup + n
	for i0 := 0; i0 < total; i0 += controlChunk {
		for k, f := range []func() error{a, b} {
			for i := i0; i < min(i0+controlChunk, total); i++ {
				if gap > 0 {
					time.Sleep(gap)
				}
				t := time.Now()
				if err := f(); err != nil {
					return nil, nil, fmt.Errorf("%s call %d: %w", [2]string{"grpc", "ring"}[k], i, err)
				}
				if d := time.Since(t); i >= ControlWarmup {
					if k == 0 {
						as = append(as, d)
					} else {
						bs = append(bs, d)
					}
				}
			}
		}
	}
	return as, bs, nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
