package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/b2bd/b2bd/internal/metrics"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
)

// buildObservability opens --metrics-listen and --health-listen (so that a
// bad address fails at start) and builds the metrics over the daemon's
// state. d.registry and d.transports are built by now.
func (d *Daemon) buildObservability() error {
	if d.cfg.MetricsListen != "" {
		ts := slices.Clone(d.transports)
		reg := d.registry
		d.metrics = metrics.New(metrics.Sources{
			Version: Version,
			Received: func() (uint64, uint64) {
				return d.counters.BatchesReceived.Load(), d.counters.BytesReceived.Load()
			},
			Regions:    func() []metrics.RegionStats { return regionStats(reg) },
			Transports: func() []metrics.TransportStats { return transportStats(ts) },
			Phases:     phaseObserver(d.cfg.Phases),
		})
		ln, err := net.Listen("tcp", d.cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen %s: %w", d.cfg.MetricsListen, err)
		}
		d.metricsLn = ln
		mux := http.NewServeMux()
		mux.Handle("/metrics", d.metrics.Handler())
		mux.Handle("/healthz", d.health.HTTPHandler())
		d.metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	}
	if d.cfg.HealthListen != "" {
		ln, err := net.Listen("tcp", d.cfg.HealthListen)
		if err != nil {
			return fmt.Errorf("--health-listen %s: %w", d.cfg.HealthListen, err)
		}
		d.healthLn = ln
		d.healthSrv = d.health.NewHTTPServer()
	}
	return nil
}

// regionStats sums the registered regions by memory kind.
func regionStats(reg *region.Registry) []metrics.RegionStats {
	if reg == nil {
		return nil
	}
	var out []metrics.RegionStats
	for _, r := range reg.List(region.Root) {
		kind := r.Mem.Kind.String()
		i := slices.IndexFunc(out, func(s metrics.RegionStats) bool { return s.Kind == kind })
		if i < 0 {
			out = append(out, metrics.RegionStats{Kind: kind})
			i = len(out) - 1
		}
		out[i].Regions++
		out[i].Bytes += r.Mem.Len
	}
	return out
}

// transportStats reads the transports' handles; a running verbs transport
// counts as one rail up (it drives one port today).
func transportStats(ts []transport.Transport) []metrics.TransportStats {
	out := make([]metrics.TransportStats, 0, len(ts))
	for _, t := range ts {
		s := metrics.TransportStats{Kind: string(t.Kind())}
		r := t.Status().Resources
		s.Connections, s.QueuePairs, s.MemoryRegions = r.Connections, r.QueuePairs, r.MemoryRegions
		if t.Kind() == transport.Verbs {
			s.RailsUp = 1
		}
		out = append(out, s)
	}
	return out
}

// serveHTTP serves the optional metrics and health-only listeners.
func (d *Daemon) serveHTTP() {
	for _, p := range []struct {
		name string
		srv  *http.Server
		ln   net.Listener
	}{{"metrics", d.metricsSrv, d.metricsLn}, {"health", d.healthSrv, d.healthLn}} {
		if p.srv == nil {
			continue
		}
		go func() {
			if err := p.srv.Serve(p.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.log.Warn("serve "+p.name, "address", p.ln.Addr(), "error", err)
			}
		}()
	}
}

// stopHTTP stops the metrics and health-only listeners (idempotent). They
// stop last, so that probes see NOT_SERVING for the whole drain.
func (d *Daemon) stopHTTP() {
	for _, srv := range []*http.Server{d.metricsSrv, d.healthSrv} {
		if srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = srv.Shutdown(ctx)
			cancel()
			_ = srv.Close()
		}
	}
	for _, ln := range []net.Listener{d.metricsLn, d.healthLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// phaseObserver defaults to the responses' own phases message.
func phaseObserver(o metrics.PhaseObserver) metrics.PhaseObserver {
	if o == nil {
		return metrics.ProtoPhases
	}
	return o
}
