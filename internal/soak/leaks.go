package soak

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Sample is a daemon's resources at one moment.
type Sample struct {
	Goroutines        uint32 `json:"goroutines"`
	FDs               int    `json:"fds"` // /proc/PID/fd
	Regions           uint32 `json:"regions"`
	LeaseHolders      uint32 `json:"lease_holders"`
	TransfersInFlight uint32 `json:"transfers_in_flight"`
	TransfersHeld     uint32 `json:"transfers_held"`
	PeersConnected    uint32 `json:"peers_connected"`
	RSSAnonKiB        uint64 `json:"rss_anon_kib"`
	Err               string `json:"error,omitempty"`
}

// Leak is a resource above its baseline (beyond the tolerance) at the end.
type Leak struct {
	Daemon   string `json:"daemon"`
	Resource string `json:"resource"`
	Baseline uint64 `json:"baseline"`
	End      uint64 `json:"end"`
	Allowed  uint64 `json:"allowed"`
}

func (d *daemon) sample(ctx context.Context) Sample {
	var s Sample
	c := d.monitor()
	if c == nil {
		s.Err = "down"
		return s
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	s.Goroutines, s.Regions, s.LeaseHolders = st.GetGoroutines(), st.GetRegions(), st.GetLeaseHolders()
	s.TransfersInFlight, s.TransfersHeld, s.PeersConnected = st.GetTransfersInFlight(), st.GetTransfersHeld(), st.GetPeersConnected()
	pid := d.pid()
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		s.FDs = len(ents)
	}
	s.RSSAnonKiB = rssAnon(pid)
	return s
}

func rssAnon(pid int) uint64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "RssAnon:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// tolerance is what a resource may reach at the end from its baseline: a
// few goroutines and fds for connections in their last moments, and 25% +
// 64 MiB of anonymous memory over the larger of the baseline and the
// plateau sample (a third into the run): the Go heap's own slack and the
// scavenger's lag; a leak over a long run grows past it.
func tolerance(resource string, base uint64) uint64 {
	switch resource {
	case "goroutines":
		return base + 10 + base/10
	case "fds":
		return base + 6
	case "rss_anon_kib":
		return base + base/4 + 64<<10
	default: // regions, lease holders, transfers: exactly back
		return base
	}
}

func resources(s Sample) map[string]uint64 {
	return map[string]uint64{
		"goroutines": uint64(s.Goroutines), "fds": uint64(s.FDs), "regions": uint64(s.Regions),
		"lease_holders": uint64(s.LeaseHolders), "transfers_in_flight": uint64(s.TransfersInFlight),
		"transfers_held": uint64(s.TransfersHeld), "rss_anon_kib": s.RSSAnonKiB,
	}
}

// settle samples every daemon; with a baseline it waits (up to
// cfg.Settle) until the never-restarted ones are within tolerance, without
// one until regions and transfers are back to zero and the counts hold
// still (the baseline itself).
func (s *soak) settle(ctx context.Context, base, mid map[string]Sample) map[string]Sample {
	deadline := time.Now().Add(s.cfg.Settle)
	var prev map[string]Sample
	for {
		cur := map[string]Sample{}
		for _, d := range s.daemons {
			cur[d.name] = d.sample(ctx)
		}
		if base != nil && len(leaks(base, mid, cur, s.daemons)) == 0 {
			return cur
		}
		if base == nil && quiet(prev, cur) {
			return cur
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return cur
		}
		prev = cur
		sleep(ctx, 500*time.Millisecond)
	}
}

func quiet(prev, cur map[string]Sample) bool {
	if prev == nil {
		return false
	}
	for k, c := range cur {
		p := prev[k]
		if c.Regions != 0 || c.TransfersHeld != 0 || c.TransfersInFlight != 0 || c.Goroutines != p.Goroutines || c.FDs != p.FDs {
			return false
		}
	}
	return true
}

// leaks compares the never-restarted daemons' end state with the baseline.
func leaks(base, mid, end map[string]Sample, ds []*daemon) []Leak {
	var out []Leak
	for _, d := range ds {
		if d.restart > 0 {
			continue
		}
		b, e := base[d.name], end[d.name]
		if e.Err != "" {
			out = append(out, Leak{Daemon: d.name, Resource: "status: " + e.Err})
			continue
		}
		be := resources(b)
		if m, ok := mid[d.name]; ok && m.Err == "" {
			be["rss_anon_kib"] = max(be["rss_anon_kib"], m.RSSAnonKiB)
		}
		for res, ev := range resources(e) {
			if allowed := tolerance(res, be[res]); ev > allowed {
				out = append(out, Leak{Daemon: d.name, Resource: res, Baseline: be[res], End: ev, Allowed: allowed})
			}
		}
	}
	return out
}

// loadAvg is /proc/loadavg's first three figures.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
