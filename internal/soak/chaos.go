package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)

// chaosLoop draws an action every cfg.Every on average until ctx ends, and
// returns once the actions in progress finished (every daemon up again).
func (s *soak) chaosLoop(ctx context.Context, workers []*worker, r *rand.Rand) {
	var wg sync.WaitGroup
	defer wg.Wait()
	busy := make([]atomic.Bool, len(s.daemons))
	for {
		sleep(ctx, time.Duration(float64(s.cfg.Every)*(0.5+r.Float64())))
		if ctx.Err() != nil {
			return
		}
		action := s.cfg.Chaos[r.IntN(len(s.cfg.Chaos))]
		switch action {
		case ChaosKill, ChaosStop:
			lo := 0
			if action == ChaosKill {
				lo = s.cfg.Stable // the stable daemons are never killed
			}
			i := lo + r.IntN(len(s.daemons)-lo)
			if !busy[i].CompareAndSwap(false, true) {
				continue
			}
			pause := time.Duration(100+r.IntN(900)) * time.Millisecond
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer busy[i].Store(false)
				if action == ChaosKill {
					s.killRestart(s.daemons[i], pause/2)
				} else {
					s.freeze(s.daemons[i], pause)
				}
			}()
		case ChaosWorker:
			workers[r.IntN(len(workers))].kill()
		case ChaosTruncate:
			workers[r.IntN(len(workers))].pending.Or(eventTruncate)
		case ChaosLayout:
			workers[r.IntN(len(workers))].pending.Or(eventLayout)
		case ChaosNarrow:
			workers[r.IntN(len(workers))].pending.Or(eventNarrow)
		}
		s.chaosMu.Lock()
		s.chaosCounts[action]++
		s.chaosMu.Unlock()
	}
}

// killRestart kill -9s d and starts it again after pause, with the same
// socket and shm directory (new ports: the workers learn the new peer
// address when they set up again).
func (s *soak) killRestart(d *daemon, pause time.Duration) {
	d.beginChaos()
	defer d.endChaos()
	d.kill9()
	time.Sleep(pause)
	for try := 0; ; try++ {
		err := d.start(context.Background())
		if err == nil {
			return
		}
		s.chaosMu.Lock()
		s.restartErrs = append(s.restartErrs, fmt.Sprintf("%s: %v", d.name, err))
		s.chaosMu.Unlock()
		s.crashMu.Lock()
		s.crashes = append(s.crashes, Crash{Daemon: d.name, Exit: "restart failed: " + err.Error(), At: time.Now().UTC().Format(time.RFC3339Nano)})
		s.crashMu.Unlock()
		if try >= 2 {
			return
		}
		d.kill9()
	}
}

// freeze SIGSTOPs d for pause, then SIGCONTs it.
func (s *soak) freeze(d *daemon, pause time.Duration) {
	if !d.up.Load() {
		return
	}
	d.beginChaos()
	defer d.endChaos()
	d.frozen.Store(true)
	d.freezes.Add(1)
	if err := d.signal(sigStop); err != nil {
		d.frozen.Store(false)
		return
	}
	time.Sleep(pause)
	_ = d.signal(sigCont)
	d.frozen.Store(false)
}
