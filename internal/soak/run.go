package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// ErrInvariant is returned when an invariant count is not zero.
var ErrInvariant = errors.New("soak: invariants broken")

// warmup runs traffic without chaos before the baseline is taken, so that
// the daemons' peer connections (which stay open) are part of it.
const warmup = 3 * time.Second

// soak is one run's shared state.
type soak struct {
	cfg     Config
	log     hclog.Logger
	stats   *stats
	sched   *schedMonitor
	daemons []*daemon
	runID   int
	mid     map[string]Sample // a third into the run

	crashMu sync.Mutex
	crashes []Crash

	chaosMu     sync.Mutex
	chaosCounts map[string]int
	restartErrs []string
}

// Run starts the daemons, warms up, takes the baseline, runs the traffic
// and the chaos for cfg.Duration, checks the end state and returns the
// report; the error wraps ErrInvariant when an invariant broke.
func Run(ctx context.Context, cfg Config, log hclog.Logger) (*Report, error) {
	if cfg.RemoteAPI != "" {
		return runRemote(ctx, cfg, log)
	}
	s := &soak{cfg: cfg, log: log, stats: newStats(), sched: newSchedMonitor(), runID: os.Getpid(), chaosCounts: map[string]int{}}
	rep := &Report{Seed: cfg.Seed, Daemons: cfg.Daemons, Stable: cfg.Stable, Workers: cfg.Workers, Chaos: cfg.Chaos,
		ChaosEvery: cfg.Every.String(), LoadStart: loadAvg()}
	stateDir, err := os.MkdirTemp("", "b2b-soak-")
	if err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	shmDir, err := os.MkdirTemp(shmParent(), "b2b-soak-")
	if err != nil {
		return nil, fmt.Errorf("shm directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(shmDir) }()
	rep.StateDir = stateDir
	s.daemons = newDaemons(cfg.B2BD, stateDir, shmDir, cfg.Daemons, cfg.NewPorts, log.Named("daemons"), &s.crashes, &s.crashMu)
	stopped := false
	defer func() {
		for _, d := range s.daemons {
			if stopped {
				break
			}
			if err := d.stop(); err != nil {
				s.crashMu.Lock()
				s.crashes = append(s.crashes, Crash{Daemon: d.name, Exit: err.Error(), At: time.Now().UTC().Format(time.RFC3339Nano)})
				s.crashMu.Unlock()
			}
		}
	}()
	for _, d := range s.daemons {
		if err := d.start(ctx); err != nil {
			return nil, err
		}
	}
	sctx, stopSched := context.WithCancel(context.Background())
	defer stopSched()
	go s.sched.run(sctx)
	pctx, stopPing := context.WithCancel(sctx)
	defer stopPing()
	var pingers sync.WaitGroup
	for _, d := range s.daemons {
		d.ping = newSeries(s.sched.start)
		pingers.Add(1)
		go func() { defer pingers.Done(); d.pinger(pctx) }()
	}

	log.Info("warm-up", "for", warmup)
	s.traffic(ctx, warmup, false)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	s.stats = newStats() // the warm-up does not count
	base := s.settle(ctx, nil, nil)
	rep.Baseline = base

	log.Info("soak", "for", cfg.Duration, "daemons", cfg.Daemons, "workers", cfg.Workers, "chaos", strings.Join(cfg.Chaos, ","))
	t0 := time.Now()
	hung := s.traffic(ctx, cfg.Duration, true)
	rep.Seconds = time.Since(t0).Seconds()
	rep.HungWorkers = hung

	// Every daemon back up before the end state is read.
	for _, d := range s.daemons {
		if d.frozen.Load() {
			_ = d.signal(sigCont)
			d.frozen.Store(false)
		}
	}
	// Leases are per client process: with every connection of this one
	// closed, what a killed worker left (a registration whose answer its
	// closed connection never got) goes too, as it would with the process.
	stopPing()
	pingers.Wait()
	// Not ctx: an interrupted run still reads and reports the end state.
	end := s.settle(context.Background(), base, s.mid)
	rep.End = end
	for _, d := range s.daemons {
		if d.restart > 0 {
			rep.Restarted = append(rep.Restarted, d.name)
		}
	}
	rep.Leaks = leaks(base, s.mid, end, s.daemons)
	rep.Plateau = s.mid
	rep.LoadEnd = loadAvg()
	stopped = true
	for _, d := range s.daemons {
		if err := d.stop(); err != nil {
			s.crashMu.Lock()
			s.crashes = append(s.crashes, Crash{Daemon: d.name, Exit: err.Error(), At: time.Now().UTC().Format(time.RFC3339Nano)})
			s.crashMu.Unlock()
		}
	}
	s.fill(rep)
	if rep.failed() {
		return rep, fmt.Errorf("%w: %s", ErrInvariant, rep.summary())
	}
	if !cfg.Keep {
		_ = os.RemoveAll(stateDir)
		rep.StateDir = ""
	}
	return rep, nil
}

func shmParent() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// traffic runs fresh workers (and the chaos loop, when chaos) for d, then
// stops them, each after its transfer in flight; it returns how many did
// not stop within a minute (a hang).
func (s *soak) traffic(ctx context.Context, d time.Duration, chaos bool) int {
	r := rand.New(rand.NewPCG(s.cfg.Seed, uint64(time.Now().UnixNano())))
	n := len(s.daemons)
	var pairs [][2]int
	for i := range n {
		for j := range n {
			if i != j {
				pairs = append(pairs, [2]int{i, j})
			}
		}
	}
	workers := make([]*worker, s.cfg.Workers)
	stopCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for k := range workers {
		p := pairs[k%len(pairs)]
		seed := r.Uint64()
		var key [32]byte
		for i := range key {
			key[i] = byte(r.Uint32())
		}
		w := &worker{id: k, s: s, a: s.daemons[p[0]], b: s.daemons[p[1]], r: rand.New(rand.NewPCG(seed, uint64(k))),
			fill: rand.NewChaCha8(key), log: s.log.Named("workers").With("worker", k)}
		if (k/len(pairs))%2 == 1 {
			w.transport = b2bv1.TransportKind_TRANSPORT_KIND_TCP
		}
		workers[k] = w
		wg.Add(1)
		go func() { defer wg.Done(); w.run(stopCtx) }()
	}
	chaosDone := make(chan struct{})
	cctx, stopChaos := context.WithCancel(ctx)
	go func() {
		defer close(chaosDone)
		if chaos && len(s.cfg.Chaos) > 0 {
			s.chaosLoop(cctx, workers, r)
		}
	}()
	go s.progress(cctx, chaos)
	if chaos {
		// The plateau sample: memory the traffic grew by a third of the run
		// is pools and caches, not a leak; growth after it is.
		sleep(ctx, d/3)
		s.mid = map[string]Sample{}
		for _, dm := range s.daemons {
			s.mid[dm.name] = dm.sample(ctx)
		}
		d -= d / 3
	}
	sleep(ctx, d)
	stopChaos()
	<-chaosDone
	stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return 0
	case <-time.After(time.Minute):
		s.log.Error("workers did not stop within a minute")
		return len(workers)
	}
}

func (s *soak) progress(ctx context.Context, chaos bool) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	t0 := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, sum := s.stats.kindReports()
		s.log.Info("progress", "chaos", chaos, "transfers", sum.Transfers, "per_s", fmt.Sprintf("%.0f", float64(sum.Transfers)/time.Since(t0).Seconds()),
			"false_successes", s.stats.falseSuccess.Load(), "late_bytes", s.stats.lateBytes.Load(), "overruns", s.stats.overruns.Load()+s.stats.overrunsPeerChaos.Load())
	}
}
