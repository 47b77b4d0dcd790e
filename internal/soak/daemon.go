package soak

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/loopport"
)

const (
	readyTimeout = 30 * time.Second
	stopTimeout  = 45 * time.Second
	// chaosGrace extends a chaos window past its end: a resumed or restarted
	// daemon first drains what queued while it was away.
	chaosGrace = 500 * time.Millisecond
)

// daemon is one b2bd the soak runs, across its restarts.
type daemon struct {
	name, socket, shm, logPath string
	submit                     string // the raw submit socket, where clients ask for a ring
	args                       []string
	log                        hclog.Logger

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	peer     string        // peer address of the current incarnation
	bidden   bool          // the soak asked this incarnation to exit
	gen      atomic.Uint64 // incarnation number; workers re-register when it moves
	up       atomic.Bool   // serving (not killed, not restarting)
	epoch    atomic.Uint64 // moves at each chaos action's start and end
	chaos    atomic.Int32  // chaos actions in progress on it
	frozen   atomic.Bool
	freezes  atomic.Uint64 // SIGSTOPs so far
	kills    atomic.Uint64 // kill -9s so far
	restart  int           // restarts so far
	newPorts bool
	ping     *series // Ping latency, for the deadline slack

	crashes *[]Crash
	crashMu *sync.Mutex
}

// Crash is a daemon that exited without being asked to.
type Crash struct {
	Daemon string `json:"daemon"`
	Exit   string `json:"exit"`
	At     string `json:"at"`
	Log    string `json:"log_tail"`
}

func (d *daemon) start(ctx context.Context) error {
	if d.restart > 0 && d.newPorts {
		for i, a := range d.args {
			if a == "--peer-listen" || a == "--data-listen" {
				d.args[i+1] = freePort()
			}
		}
	}
	logFile, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: log file: %w", d.name, err)
	}
	defer logFile.Close()
	cmd := exec.Command(d.args[0], d.args[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: start: %w", d.name, err)
	}
	exited := make(chan struct{})
	d.mu.Lock()
	d.cmd, d.exited, d.bidden = cmd, exited, false
	d.mu.Unlock()
	go func() {
		werr := cmd.Wait()
		d.mu.Lock()
		bidden := d.bidden && d.cmd == cmd
		d.mu.Unlock()
		d.up.Store(false)
		if !bidden {
			d.log.Error("daemon exited unbidden", "err", werr)
			d.crashMu.Lock()
			*d.crashes = append(*d.crashes, Crash{Daemon: d.name, Exit: fmt.Sprint(werr), At: time.Now().UTC().Format(time.RFC3339Nano), Log: logTail(d.logPath)})
			d.crashMu.Unlock()
		}
		close(exited)
	}()
	return d.waitReady(ctx, cmd, exited)
}

func (d *daemon) waitReady(ctx context.Context, cmd *exec.Cmd, exited chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("%s exited during start-up:%s", d.name, logTail(d.logPath))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if _, err := os.Stat(d.socket); err != nil {
			last = err
			continue
		}
		c, err := client.Dial(d.socket)
		if err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := c.Status(sctx)
		cancel()
		if err != nil {
			_ = c.Close()
			last = err
			continue
		}
		_ = c.Close() // a connection kept open would keep this process's leases
		d.mu.Lock()
		d.peer = st.GetPeerAddress()
		d.mu.Unlock()
		d.gen.Add(1)
		d.up.Store(true)
		return nil
	}
	return fmt.Errorf("%s did not answer on %s within %v (last error: %v)", d.name, d.socket, readyTimeout, last)
}

// current is the incarnation's peer address and generation.
func (d *daemon) current() (peer string, gen uint64, up bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.peer, d.gen.Load(), d.up.Load()
}

func (d *daemon) pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.cmd.Process == nil {
		return 0
	}
	return d.cmd.Process.Pid
}

// monitor dials the daemon for one look; the caller closes it.
func (d *daemon) monitor() *client.Client {
	if !d.up.Load() {
		return nil
	}
	c, err := client.Dial(d.socket)
	if err != nil {
		return nil
	}
	return c
}

// beginChaos and endChaos bracket a chaos action on d: calls through d that
// overlap it are classified apart.
func (d *daemon) beginChaos() { d.chaos.Add(1); d.epoch.Add(1) }
func (d *daemon) endChaos() {
	time.AfterFunc(chaosGrace, func() { d.epoch.Add(1); d.chaos.Add(-1) })
}

// mark is d's chaos state at a call's start, to compare at its end.
type mark struct{ epoch, freezes, kills uint64 }

func (d *daemon) mark() mark { return mark{d.epoch.Load(), d.freezes.Load(), d.kills.Load()} }

// what names the chaos on d since m: "frozen", "killed" or both.
func (d *daemon) what(m mark) string {
	var w []string
	if d.freezes.Load() != m.freezes || d.frozen.Load() {
		w = append(w, "frozen")
	}
	if d.kills.Load() != m.kills || !d.up.Load() {
		w = append(w, "killed")
	}
	if len(w) == 0 {
		return "resuming"
	}
	return strings.Join(w, "+")
}

// state names the chaos on d since m, "calm" when there was none.
func (d *daemon) state(m mark) string {
	if !d.disturbedSince(m) {
		return "calm"
	}
	return d.what(m)
}

// disturbedSince: a chaos action on d overlapped the call started at m.
func (d *daemon) disturbedSince(m mark) bool {
	return d.chaos.Load() > 0 || d.epoch.Load() != m.epoch
}

// kill9 kills the incarnation and waits for it to be gone.
func (d *daemon) kill9() {
	d.mu.Lock()
	cmd, exited := d.cmd, d.exited
	d.bidden = true
	d.mu.Unlock()
	d.kills.Add(1)
	d.up.Store(false)
	if d.frozen.Load() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		d.frozen.Store(false)
	}
	_ = cmd.Process.Kill()
	<-exited
	d.mu.Lock()
	d.restart++
	d.mu.Unlock()
}

func (d *daemon) signal(sig syscall.Signal) error {
	d.mu.Lock()
	cmd := d.cmd
	d.mu.Unlock()
	return cmd.Process.Signal(sig)
}

// stop sends SIGTERM and waits; an exit other than 0 is reported.
func (d *daemon) stop() error {
	d.mu.Lock()
	cmd, exited := d.cmd, d.exited
	d.bidden = true
	d.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if d.frozen.Load() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: SIGTERM: %w", d.name, err)
	}
	select {
	case <-exited:
	case <-time.After(stopTimeout):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("%s did not exit within %v of SIGTERM", d.name, stopTimeout)
	}
	if cmd.ProcessState != nil && !cmd.ProcessState.Success() {
		return fmt.Errorf("%s exited with %v after SIGTERM:%s", d.name, cmd.ProcessState, logTail(d.logPath))
	}
	return nil
}

func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	const keep = 1500
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	return "\n" + strings.TrimRight(string(b), "\n")
}

// newDaemons lays out n daemons under stateDir and shmDir; the first half
// force TCP, the others let the daemons choose (the same-host path).
func newDaemons(binary, stateDir, shmDir string, n int, newPorts bool, log hclog.Logger, crashes *[]Crash, crashMu *sync.Mutex) []*daemon {
	ds := make([]*daemon, n)
	for i := range ds {
		name := "soak" + strconv.Itoa(i)
		d := &daemon{
			name: name, socket: filepath.Join(stateDir, name+".sock"), submit: filepath.Join(stateDir, name+".submit.sock"), shm: filepath.Join(shmDir, name),
			logPath: filepath.Join(stateDir, name+".log"), log: log.Named(name), crashes: crashes, crashMu: crashMu,
		}
		transport := "auto"
		if i < n/2 {
			transport = "tcp"
		}
		// Fixed ports, kept across restarts as a production daemon's are
		// (newPorts: fresh ones at each restart, as a peer that moved).
		d.args = []string{binary, "--insecure", "--node-name", name, "--socket", d.socket, "--submit-socket", d.submit, "--shm-dir", d.shm,
			"--peer-listen", freePort(), "--data-listen", freePort(), "--transport", transport, "--log-level", "warn"}
		d.newPorts = newPorts
		ds[i] = d
	}
	return ds
}

// freePort is a loopback address with a port that was just free, below
// the ephemeral range (internal/loopport), so that no connection of the
// soak's own traffic takes it while its daemon restarts; a daemon
// restarted on it is what a production restart looks like.
func freePort() string {
	addr, err := loopport.Free()
	if err != nil {
		return "127.0.0.1:0"
	}
	return addr
}

// pinger measures d's Ping latency every 50 ms (while it is up and no chaos
// action is on it): an answer can come no sooner than the daemon answers
// its cheapest call.
func (d *daemon) pinger(ctx context.Context) {
	var c *client.Client
	var gen uint64
	defer func() {
		if c != nil {
			_ = c.Close()
		}
	}()
	for ctx.Err() == nil {
		sleep(ctx, 50*time.Millisecond)
		_, g, up := d.current()
		if !up || d.chaos.Load() > 0 {
			continue
		}
		if c == nil || g != gen {
			if c != nil {
				_ = c.Close()
			}
			var err error
			if c, err = client.Dial(d.socket); err != nil {
				c = nil
				continue
			}
			gen = g
		}
		m := d.mark()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		t0 := time.Now()
		err := c.Ping(pctx)
		cancel()
		if err == nil && !d.disturbedSince(m) {
			d.ping.record(time.Now(), time.Since(t0))
		}
	}
}
