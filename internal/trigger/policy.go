package trigger

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// SpinMode says when the watcher may spin.
type SpinMode int

const (
	// SpinAuto spins while a CPU is free (CPUFree), else polls.
	SpinAuto SpinMode = iota
	// SpinAlways spins while any trigger is armed.
	SpinAlways
	// SpinNever always polls.
	SpinNever
)

// DefaultPoll is the poll period when no CPU is free to spin. Chosen by
// BenchmarkLag (figures in docs/kv.md, "Layer streaming"): the runtime's
// timers cannot sleep below about 1 ms, so a poll sleeps with nanosleep on
// the watcher's own thread, its timer slack set to 1 ns. At 20 µs the
// median lag was 25 µs on a loaded 2-core machine; 10 µs halves that for
// a third more CPU, and 50 µs doubles it.
const DefaultPoll = 20 * time.Microsecond

// Policy configures a Watcher.
type Policy struct {
	Spin SpinMode
	// Poll is the period of a scan when not spinning; 0: DefaultPoll.
	Poll time.Duration
	// CheckEvery is how often SpinAuto asks CPUFree again while armed;
	// 0: 10 ms.
	CheckEvery time.Duration
	// CPUFree reports whether a CPU is free for the watcher to spin on;
	// spinning says whether the watcher is spinning now (its own thread is
	// then one of the busy ones). nil: ProcsRunningFree.
	CPUFree func(spinning bool) bool
	// TimerSleep sleeps with the runtime's timers instead of nanosleep on
	// a locked thread (the benchmark's comparison).
	TimerSleep bool
}

func (p Policy) withDefaults() Policy {
	if p.Poll <= 0 {
		p.Poll = DefaultPoll
	}
	if p.CheckEvery <= 0 {
		p.CheckEvery = 10 * time.Millisecond
	}
	if p.CPUFree == nil {
		p.CPUFree = ProcsRunningFree
	}
	return p
}

// ProcsRunningFree reports whether this host has a CPU that no runnable
// thread wants: the kernel's count of runnable threads (the fourth field
// of /proc/loadavg, "running/total"), less the watcher's own thread when
// it is spinning, is below the CPUs this process may use. Unknown (no
// /proc): not free.
func ProcsRunningFree(spinning bool) bool {
	running, ok := procsRunning()
	if !ok {
		return false
	}
	if spinning {
		running--
	}
	return running < runtime.NumCPU()
}

func procsRunning() (int, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	return parseLoadavg(b)
}

// parseLoadavg reads the runnable count from /proc/loadavg's text, e.g.
// "0.52 0.58 0.59 3/1024 12345".
func parseLoadavg(b []byte) (int, bool) {
	f := bytes.Fields(b)
	if len(f) < 4 {
		return 0, false
	}
	r, _, ok := bytes.Cut(f[3], []byte("/"))
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(string(r))
	return n, err == nil && n >= 0
}

// run is the watcher's goroutine: it scans until no trigger is armed.
func (w *Watcher) run(stopped chan struct{}) {
	defer close(stopped)
	p := w.policy
	// A poll's nanosleep needs a thread of its own with a fine timer slack
	// (50 µs by default). The thread is locked only while polling: a
	// spinning goroutine that is locked would hand its thread over on every
	// Gosched that finds other work.
	var t pollThread
	defer t.release()
	var out []due
	spinning := false
	var checked time.Time
	for {
		var more bool
		out, more = w.scan(out)
		if !more {
			return
		}
		switch p.Spin {
		case SpinAlways:
			spinning = true
		case SpinNever:
			spinning = false
		default:
			if now := time.Now(); now.Sub(checked) >= p.CheckEvery {
				spinning, checked = p.CPUFree(spinning), now
			}
		}
		if spinning {
			t.release()
			w.spins.Add(1)
			runtime.Gosched()
			continue
		}
		if !p.TimerSleep {
			t.acquire()
		}
		w.polls.Add(1)
		w.sleep(p)
	}
}

// pollThread is the watcher's locked thread while it polls.
type pollThread struct{ locked bool }

func (t *pollThread) acquire() {
	if t.locked {
		return
	}
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	t.locked = true
}

// release gives the thread back with its default slack (0 restores it);
// if that fails the thread stays locked and dies with the goroutine.
func (t *pollThread) release() {
	if !t.locked {
		return
	}
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, 0, 0, 0, 0); err != nil {
		return
	}
	runtime.UnlockOSThread()
	t.locked = false
}

// sleep waits one poll period, or less when a trigger was armed.
func (w *Watcher) sleep(p Policy) {
	if p.TimerSleep || p.Poll >= time.Millisecond {
		t := time.NewTimer(p.Poll)
		select {
		case <-t.C:
		case <-w.wake:
			t.Stop()
		}
		return
	}
	ts := unix.NsecToTimespec(p.Poll.Nanoseconds())
	_ = unix.Nanosleep(&ts, nil)
}
