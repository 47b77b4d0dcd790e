package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// linkGrace extends a flap's window past the link coming back: TCP
// retransmits what the outage held back on a timer that doubled through
// it, so the wire may stay silent up to the outage's length after it.
const linkGrace = 2 * time.Second

// remoteChaosLoop is chaosLoop's two-host form: kill -9 and restart a
// local daemon, kill a worker, or take this host's wire down and up.
func (s *soak) remoteChaosLoop(ctx context.Context, ph *peerHost, workers []*rworker, r *rand.Rand) {
	var wg sync.WaitGroup
	defer wg.Wait()
	busy := make([]atomic.Bool, len(s.daemons))
	var linkBusy atomic.Bool
	for {
		sleep(ctx, time.Duration(float64(s.cfg.Every)*(0.5+r.Float64())))
		if ctx.Err() != nil {
			return
		}
		action := s.cfg.Chaos[r.IntN(len(s.cfg.Chaos))]
		switch action {
		case ChaosKill:
			i := s.cfg.Stable + r.IntN(len(s.daemons)-s.cfg.Stable)
			if !busy[i].CompareAndSwap(false, true) {
				continue
			}
			pause := time.Duration(100+r.IntN(900)) * time.Millisecond
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer busy[i].Store(false)
				s.killRestartLinked(s.daemons[i], ph, pause/2)
			}()
		case ChaosWorker:
			workers[r.IntN(len(workers))].kill()
		case ChaosLink:
			if !linkBusy.CompareAndSwap(false, true) {
				continue
			}
			outage := time.Duration(200+r.IntN(1300)) * time.Millisecond
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer linkBusy.Store(false)
				if err := s.flap(ph, outage); err != nil {
					s.chaosMu.Lock()
					s.restartErrs = append(s.restartErrs, "link: "+err.Error())
					s.chaosMu.Unlock()
				}
			}()
		}
		s.chaosMu.Lock()
		s.chaosCounts[action]++
		s.chaosMu.Unlock()
	}
}

// killRestartLinked is killRestart for a daemon whose transport needs the
// link: b2bd --transport verbs refuses to start while its RDMA port is
// down, so the kill may come during a flap, the restart only once the link
// is back (and no flap starts during the start-up).
func (s *soak) killRestartLinked(d *daemon, ph *peerHost, pause time.Duration) {
	d.beginChaos()
	defer d.endChaos()
	d.kill9()
	time.Sleep(pause)
	ph.linkMu.Lock()
	defer ph.linkMu.Unlock()
	var err error
	for try := 0; try < 3; try++ {
		if s.cfg.Netdev != "" {
			if err = waitLink(s.cfg.Netdev, s.cfg.RDMADevice, 30*time.Second); err != nil {
				break
			}
		}
		if err = d.start(context.Background()); err == nil {
			return
		}
		s.chaosMu.Lock()
		s.restartErrs = append(s.restartErrs, fmt.Sprintf("%s: %v", d.name, err))
		s.chaosMu.Unlock()
		d.kill9()
	}
	s.crashMu.Lock()
	s.crashes = append(s.crashes, Crash{Daemon: d.name, Exit: "restart failed: " + err.Error(), At: time.Now().UTC().Format(time.RFC3339Nano)})
	s.crashMu.Unlock()
}

// flap takes the wire down for outage, brings it up, pins the peer's
// neighbour entry again and waits until the wire and the RDMA port are
// back (30 s at most).
func (s *soak) flap(ph *peerHost, outage time.Duration) error {
	ph.linkMu.Lock()
	defer ph.linkMu.Unlock()
	ph.wireChaos.Add(1)
	ph.wireEpoch.Add(1)
	ph.flaps.Add(1)
	defer time.AfterFunc(linkGrace, func() { ph.wireEpoch.Add(1); ph.wireChaos.Add(-1) })
	ph.down.Store(true)
	if err := setLinkUp(s.cfg.Netdev, false); err != nil {
		ph.down.Store(false)
		return fmt.Errorf("down: %w", err)
	}
	time.Sleep(outage)
	if err := setLinkUp(s.cfg.Netdev, true); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	ph.down.Store(false)
	if s.cfg.Neigh != "" {
		ip, mac, _ := strings.Cut(s.cfg.Neigh, "=")
		if out, err := exec.Command("ip", "neigh", "replace", ip, "lladdr", mac, "dev", s.cfg.Netdev, "nud", "permanent").CombinedOutput(); err != nil {
			s.log.Warn("could not pin the peer's neighbour entry again", "err", err, "out", string(out))
		}
	}
	return waitLink(s.cfg.Netdev, s.cfg.RDMADevice, 30*time.Second)
}

// setLinkUp sets or clears IFF_UP on netdev, as `ip link set` does, without
// forking a process (which takes 100 ms or more under emulation).
func setLinkUp(netdev string, up bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(netdev)
	if err != nil {
		return fmt.Errorf("netdev %q: %w", netdev, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS %s: %w", netdev, err)
	}
	flags := ifr.Uint16()
	if up {
		flags |= unix.IFF_UP
	} else {
		flags &^= unix.IFF_UP
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS %s: %w", netdev, err)
	}
	return nil
}

// waitLink waits until netdev has its carrier and rdev's port is ACTIVE.
func waitLink(netdev, rdev string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		cr, _ := os.ReadFile(filepath.Join("/sys/class/net", netdev, "carrier"))
		ok := strings.TrimSpace(string(cr)) == "1"
		if ok && rdev != "" {
			st, _ := os.ReadFile(filepath.Join("/sys/class/infiniband", rdev, "ports/1/state"))
			ok = strings.Contains(string(st), "ACTIVE")
		}
		if ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s (%s) not back within %v", netdev, rdev, limit)
}
