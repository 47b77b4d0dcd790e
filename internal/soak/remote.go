package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/auth"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// peerHost is the remote daemon of the two-host form, driven over its API
// (mutual TLS) across the wire that the link chaos takes down.
type peerHost struct {
	name string
	api  string
	opts []grpc.DialOption
	peer string // its peer address, from its Status
	ping *series

	linkMu    sync.Mutex    // a flap, or a local daemon's start-up (which needs the link up)
	wireChaos atomic.Int32  // link flaps in progress (with their grace)
	wireEpoch atomic.Uint64 // moves at each flap's start and end
	flaps     atomic.Uint64
	down      atomic.Bool
}

func (p *peerHost) dial() (*client.Client, error) {
	c, err := client.Dial(p.api, p.opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.name, err)
	}
	return c, nil
}

// wireMark is the wire's state at a call's start.
type wireMark struct{ epoch, flaps uint64 }

func (p *peerHost) mark() wireMark { return wireMark{p.wireEpoch.Load(), p.flaps.Load()} }

// flappedSince: a link flap overlapped the call started at m.
func (p *peerHost) flappedSince(m wireMark) bool {
	return p.wireChaos.Load() > 0 || p.wireEpoch.Load() != m.epoch
}

// status is the remote daemon's resources (no /proc across the wire: its
// open fds come from its own count; no RSS).
func (p *peerHost) sample(ctx context.Context, c *client.Client) Sample {
	var s Sample
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	s.Goroutines, s.Regions, s.LeaseHolders = st.GetGoroutines(), st.GetRegions(), st.GetLeaseHolders()
	s.TransfersInFlight, s.TransfersHeld, s.PeersConnected = st.GetTransfersInFlight(), st.GetTransfersHeld(), st.GetPeersConnected()
	s.FDs = int(st.GetOpenFds())
	return s
}

// pinger measures the remote daemon's Ping latency across the wire while
// no flap is on it (reported; the deadlines are the local daemons').
func (p *peerHost) pinger(ctx context.Context, c *client.Client) {
	for ctx.Err() == nil {
		sleep(ctx, 200*time.Millisecond)
		if p.wireChaos.Load() > 0 {
			continue
		}
		m := p.mark()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		t0 := time.Now()
		err := c.Ping(pctx)
		cancel()
		if err == nil && !p.flappedSince(m) {
			p.ping.record(time.Now(), time.Since(t0))
		}
	}
}

// runRemote is Run's two-host form: cfg.Daemons local daemons over
// cfg.Transport, workers pushing to and pulling from the remote daemon,
// and the kill, worker and link chaos.
func runRemote(ctx context.Context, cfg Config, log hclog.Logger) (*Report, error) {
	s := &soak{cfg: cfg, log: log, stats: newStats(), sched: newSchedMonitor(), runID: os.Getpid(), chaosCounts: map[string]int{}}
	rep := &Report{Seed: cfg.Seed, Daemons: cfg.Daemons, Stable: cfg.Stable, Workers: cfg.Workers, Chaos: cfg.Chaos,
		ChaosEvery: cfg.Every.String(), LoadStart: loadAvg(), Mode: "two-host " + cfg.Transport}
	tl, err := auth.LoadPeerTLS(cfg.TLSCert, cfg.TLSKey, cfg.TLSCA)
	if err != nil {
		return nil, fmt.Errorf("TLS identity: %w", err)
	}
	ph := &peerHost{name: "remote", api: cfg.RemoteAPI}
	if !auth.IsLoopback(cfg.RemoteAPI) {
		// A daemon serves its API off its host over mutual TLS only, and on
		// loopback in plaintext (a rehearsal of the form on one host).
		ph.opts = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tl.Client))}
	}
	mon, err := ph.dial()
	if err != nil {
		return nil, err
	}
	defer mon.Close()
	sctxStatus, cancelStatus := context.WithTimeout(ctx, 60*time.Second)
	st, err := waitStatus(sctxStatus, mon)
	cancelStatus()
	if err != nil {
		return nil, fmt.Errorf("remote daemon %s: %w", cfg.RemoteAPI, err)
	}
	ph.peer, ph.name = st.GetPeerAddress(), "remote:"+st.GetNodeName()
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
	s.daemons = newRemoteDaemons(cfg, stateDir, shmDir, log.Named("daemons"), &s.crashes, &s.crashMu)
	stopped := false
	defer func() {
		if cfg.Netdev != "" && ph.down.Load() {
			_ = setLinkUp(cfg.Netdev, true)
		}
		for _, d := range s.daemons {
			if stopped {
				break
			}
			_ = d.stop()
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
	ph.ping = newSeries(s.sched.start)
	pingers.Add(1)
	go func() { defer pingers.Done(); ph.pinger(pctx, mon) }()

	log.Info("warm-up", "up to", remoteWarmup, "remote", ph.name, "peer", ph.peer, "transport", cfg.Transport)
	s.remoteTraffic(ctx, ph, remoteWarmup, false)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	s.stats = newStats()
	base := s.settleRemote(ctx, ph, mon, nil)
	rep.Baseline = base

	log.Info("soak", "for", cfg.Duration, "daemons", cfg.Daemons, "workers", cfg.Workers, "chaos", strings.Join(cfg.Chaos, ","))
	t0 := time.Now()
	rep.HungWorkers = s.remoteTraffic(ctx, ph, cfg.Duration, true)
	rep.Seconds = time.Since(t0).Seconds()
	stopPing()
	pingers.Wait()
	end := s.settleRemote(context.Background(), ph, mon, base)
	rep.End = end
	for _, d := range s.daemons {
		if d.restart > 0 {
			rep.Restarted = append(rep.Restarted, d.name)
		}
	}
	rep.Leaks = remoteLeaks(base, s.mid, end, s.daemons, ph.name)
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
	rep.Detail.PingMaxMS[ph.name] = ms(ph.ping.maxDelay())
	if rep.failed() {
		return rep, fmt.Errorf("%w: %s", ErrInvariant, rep.summary())
	}
	if !cfg.Keep {
		_ = os.RemoveAll(stateDir)
		rep.StateDir = ""
	}
	return rep, nil
}

func waitStatus(ctx context.Context, c *client.Client) (st *b2bv1.StatusResponse, err error) {
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, e := c.Status(cctx)
		cancel()
		if e == nil {
			return r, nil
		}
		err = e
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// newRemoteDaemons lays out the local daemons of the two-host form: TLS
// peers on this host's wire address, the given transport and device.
func newRemoteDaemons(cfg Config, stateDir, shmDir string, log hclog.Logger, crashes *[]Crash, crashMu *sync.Mutex) []*daemon {
	ds := make([]*daemon, cfg.Daemons)
	for i := range ds {
		name := "soak" + strconv.Itoa(i)
		d := &daemon{
			name: name, socket: filepath.Join(stateDir, name+".sock"), shm: filepath.Join(shmDir, name),
			logPath: filepath.Join(stateDir, name+".log"), log: log.Named(name), crashes: crashes, crashMu: crashMu,
		}
		d.args = []string{cfg.B2BD, "--node-name", name, "--socket", d.socket, "--shm-dir", d.shm,
			"--peer-listen", freePortOn(cfg.Self), "--data-listen", freePortOn(cfg.Self), "--transport", cfg.Transport,
			"--tls-cert", cfg.TLSCert, "--tls-key", cfg.TLSKey, "--tls-ca", cfg.TLSCA, "--log-level", "warn"}
		if cfg.RDMADevice != "" {
			d.args = append(d.args, "--rdma-device", cfg.RDMADevice)
		}
		ds[i] = d
	}
	return ds
}

func freePortOn(host string) string {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return net.JoinHostPort(host, "0")
	}
	defer l.Close()
	return l.Addr().String()
}

// remoteTraffic is traffic's two-host form: fresh remote workers, each on
// one local daemon against the remote one, and the chaos loop.
func (s *soak) remoteTraffic(ctx context.Context, ph *peerHost, d time.Duration, chaos bool) int {
	r := rand.New(rand.NewPCG(s.cfg.Seed, uint64(time.Now().UnixNano())))
	workers := make([]*rworker, s.cfg.Workers)
	stopCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for k := range workers {
		var key [32]byte
		for i := range key {
			key[i] = byte(r.Uint32())
		}
		w := &rworker{id: k, s: s, a: s.daemons[k%len(s.daemons)], b: ph, r: rand.New(rand.NewPCG(r.Uint64(), uint64(k))),
			fill: rand.NewChaCha8(key), log: s.log.Named("workers").With("worker", k)}
		workers[k] = w
		wg.Add(1)
		go func() { defer wg.Done(); w.run(stopCtx) }()
	}
	chaosDone := make(chan struct{})
	cctx, stopChaos := context.WithCancel(ctx)
	go func() {
		defer close(chaosDone)
		if chaos && len(s.cfg.Chaos) > 0 {
			s.remoteChaosLoop(cctx, ph, workers, r)
		}
	}()
	go s.progress(cctx, chaos)
	if chaos {
		sleep(ctx, d/3)
		s.mid = map[string]Sample{}
		for _, dm := range s.daemons {
			s.mid[dm.name] = dm.sample(ctx)
		}
		d -= d / 3
		sleep(ctx, d)
	} else {
		// The warm-up lasts until every worker has set up (a seed push of
		// 2 MiB takes seconds between emulated hosts) and moved blocks,
		// so that the baseline holds the data paths the run keeps.
		stopAt := time.Now().Add(d)
		for ctx.Err() == nil && time.Now().Before(stopAt) && !allWarm(workers) {
			sleep(ctx, 200*time.Millisecond)
		}
		sleep(ctx, time.Second)
	}
	stopChaos()
	<-chaosDone
	stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return 0
	case <-time.After(2 * time.Minute):
		s.log.Error("workers did not stop within two minutes")
		return len(workers)
	}
}

// remoteWarmup bounds the two-host form's warm-up (allWarm ends it).
const remoteWarmup = time.Minute

func allWarm(ws []*rworker) bool {
	for _, w := range ws {
		if w.moved.Load() < 2 {
			return false
		}
	}
	return true
}

// settleRemote is settle's two-host form: the local daemons as settle
// reads them, and the remote one under ph.name (its regions and transfers
// back to the baseline, not to zero: it may hold others' regions).
func (s *soak) settleRemote(ctx context.Context, ph *peerHost, mon *client.Client, base map[string]Sample) map[string]Sample {
	deadline := time.Now().Add(s.cfg.Settle)
	var prev map[string]Sample
	for {
		cur := map[string]Sample{}
		for _, d := range s.daemons {
			cur[d.name] = d.sample(ctx)
		}
		cur[ph.name] = ph.sample(ctx, mon)
		if base != nil && len(remoteLeaks(base, s.mid, cur, s.daemons, ph.name)) == 0 {
			return cur
		}
		if base == nil && quietRemote(prev, cur, ph.name) {
			return cur
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return cur
		}
		prev = cur
		sleep(ctx, time.Second)
	}
}

func quietRemote(prev, cur map[string]Sample, remote string) bool {
	if prev == nil {
		return false
	}
	for k, c := range cur {
		p := prev[k]
		if c.Err != "" || c.TransfersHeld != 0 || c.TransfersInFlight != 0 || c.Goroutines != p.Goroutines || c.FDs != p.FDs || c.Regions != p.Regions {
			return false
		}
		if k != remote && c.Regions != 0 {
			return false
		}
	}
	return true
}

// remoteLeaks is leaks plus the remote daemon's counts (never restarted by
// the soak; no RSS across the wire).
func remoteLeaks(base, mid, end map[string]Sample, ds []*daemon, remote string) []Leak {
	out := leaks(base, mid, end, ds)
	b, e := base[remote], end[remote]
	if e.Err != "" {
		return append(out, Leak{Daemon: remote, Resource: "status: " + e.Err})
	}
	be := resources(b)
	for res, ev := range resources(e) {
		if res == "rss_anon_kib" {
			continue
		}
		if allowed := tolerance(res, be[res]); ev > allowed {
			out = append(out, Leak{Daemon: remote, Resource: res, Baseline: be[res], End: ev, Allowed: allowed})
		}
	}
	return out
}
