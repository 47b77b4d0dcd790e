package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/b2bd/b2bd/client"
)

// daemonReadyTimeout bounds how long a started daemon may take to answer.
const daemonReadyTimeout = 20 * time.Second

// daemonStopTimeout bounds how long a daemon may take to exit after SIGTERM;
// its regions are already released, so it has nothing to wait for.
const daemonStopTimeout = 45 * time.Second

// daemonProc is one b2bd the bench started.
type daemonProc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	socket  string
	peer    string // its peer address, as it reported it
	client  *client.Client
	exited  chan struct{} // closed when Wait returns
	waitErr error
	// underNCU: cmd is ncu and the daemon its child; signals go to the child
	// so that ncu outlives it and writes its verdict.
	underNCU bool
}

// pid is the daemon's own process ID. Under ncu the process started is
// ncu, and the daemon somewhere below it: the kernel names the process
// listening on the daemon's socket.
func (d *daemonProc) pid() int {
	if d.underNCU {
		if p, err := unixSocketPeerPID(d.socket); err == nil {
			return p
		}
	}
	return d.cmd.Process.Pid
}

// embeddedPair is two daemons on this machine, each with its own socket,
// ports (the kernel picks free ones), shm directory and log.
type embeddedPair struct {
	stateDir string // sockets and logs
	shmDir   string // the regions' files, on tmpfs
	src, dst *daemonProc
}

// shmParent is where the daemons' region files go: on tmpfs like a
// production daemon's, so the memory budget and timings are representative.
func shmParent() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// startEmbedded starts two daemons from binary and waits until both answer.
// With submit, the source daemon also serves a raw submit socket
// (submitSocketName in the state directory).
func startEmbedded(ctx context.Context, binary string, extraArgs []string, ncuDir string, submit bool) (_ *embeddedPair, err error) {
	return startEmbeddedWith(ctx, binary, extraArgs, nil, ncuDir, submit)
}

// startEmbeddedWith is startEmbedded with dstArgs given to the destination
// daemon only; with dstArgs, the destination starts first, so that what
// the source measures as it starts (its calibration) runs beside an idle
// peer, not beside another daemon's start.
func startEmbeddedWith(ctx context.Context, binary string, extraArgs, dstArgs []string, ncuDir string, submit bool) (_ *embeddedPair, err error) {
	path, err := exec.LookPath(binary)
	if err != nil {
		return nil, fmt.Errorf("b2bd binary %q: %w (build it with `make build`, or give --b2bd)", binary, err)
	}
	p := &embeddedPair{}
	defer func() {
		if err != nil {
			_ = p.stop()
		}
	}()
	if p.stateDir, err = os.MkdirTemp("", "b2b-bench-"); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if p.shmDir, err = os.MkdirTemp(shmParent(), "b2b-bench-"); err != nil {
		return nil, fmt.Errorf("shm directory: %w", err)
	}
	args := extraArgs
	if wantsInsecure(extraArgs) && daemonHasFlag(ctx, path, "insecure") {
		args = append([]string{"--insecure"}, extraArgs...)
	}
	srcArgs := args
	if submit {
		srcArgs = append([]string{"--submit-socket", filepath.Join(p.stateDir, submitSocketName)}, args...)
	}
	startDst := func() (err error) {
		p.dst, err = startDaemon(ctx, path, "bench-dst", p.stateDir, p.shmDir, append(slices.Clone(args), dstArgs...), ncuDir)
		return err
	}
	if dstArgs != nil {
		if err := startDst(); err != nil {
			return nil, err
		}
	}
	if p.src, err = startDaemon(ctx, path, "bench-src", p.stateDir, p.shmDir, srcArgs, ncuDir); err != nil {
		return nil, err
	}
	if dstArgs == nil {
		if err := startDst(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// wantsInsecure: the embedded daemons talk plaintext on 127.0.0.1 unless the
// user chose TLS (or said --insecure) through --daemon-arg; the daemon
// refuses both at once.
func wantsInsecure(extraArgs []string) bool {
	for _, a := range extraArgs {
		name := strings.TrimLeft(a, "-")
		if strings.HasPrefix(name, "tls-") || strings.HasPrefix(name, "insecure") {
			return false
		}
	}
	return true
}

// daemonHasFlag asks the binary's usage whether it knows --name, so the bench
// works with daemons built before and after a flag appeared.
func daemonHasFlag(ctx context.Context, binary, name string) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, binary, "-h").CombinedOutput() // -h exits non-zero
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.TrimLeft(f[0], "-") == name {
			return true
		}
	}
	return false
}

func startDaemon(ctx context.Context, binary, name, stateDir, shmDir string, extraArgs []string, ncuDir string) (*daemonProc, error) {
	d := &daemonProc{
		name:    name,
		socket:  filepath.Join(stateDir, name+".sock"),
		logPath: filepath.Join(stateDir, name+".log"),
		exited:  make(chan struct{}),
	}
	logFile, err := os.Create(d.logPath)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", name, err)
	}
	defer logFile.Close() // the child keeps its own descriptor
	args := append([]string{
		"--node-name", name,
		"--socket", d.socket,
		"--peer-listen", "127.0.0.1:0", // port 0: the kernel picks a free port, no race
		"--data-listen", "127.0.0.1:0",
		"--shm-dir", filepath.Join(shmDir, name),
		"--log-level", "warn",
	}, extraArgs...)
	// Not exec.CommandContext: a cancelled run must still stop the daemons
	// with SIGTERM and check their exit, not SIGKILL them.
	d.cmd = exec.Command(binary, args...)
	if ncuDir != "" {
		if err := os.MkdirAll(ncuDir, 0o755); err != nil {
			return nil, fmt.Errorf("%s: --ncu dir: %w", name, err)
		}
		ncuArgs := append([]string{"--target-processes", "all", "--log-file", filepath.Join(ncuDir, "ncu-daemon-"+name+".log"), binary}, args...)
		d.cmd, d.underNCU = exec.Command("ncu", ncuArgs...), true
	}
	d.cmd.Stdout, d.cmd.Stderr = logFile, logFile
	// Should the bench die without cleaning up, the daemons go with it.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", name, binary, err)
	}
	go func() {
		d.waitErr = d.cmd.Wait()
		close(d.exited)
	}()
	if err := d.waitReady(ctx); err != nil {
		_ = d.stop()
		return nil, err
	}
	return d, nil
}

// waitReady polls the daemon's Status until it answers, and learns the peer
// address it bound.
func (d *daemonProc) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(daemonReadyTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-d.exited:
			return fmt.Errorf("%s exited during start-up (%v)%s", d.name, d.waitErr, d.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if _, err := os.Stat(d.socket); err != nil {
			lastErr = err
			continue
		}
		if d.client == nil {
			c, err := client.Dial(d.socket)
			if err != nil {
				return fmt.Errorf("%s: %w", d.name, err)
			}
			d.client = c
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := d.client.Status(sctx)
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		d.peer = st.GetPeerAddress()
		return nil
	}
	return fmt.Errorf("%s did not answer on %s within %v (last error: %v)%s", d.name, d.socket, daemonReadyTimeout, lastErr, d.logTail())
}

// stop sends SIGTERM and waits; a daemon that does not exit 0 is an error.
func (d *daemonProc) stop() error {
	if d == nil || d.cmd == nil || d.cmd.Process == nil {
		return nil
	}
	if d.client != nil {
		_ = d.client.Close()
		d.client = nil
	}
	select {
	case <-d.exited:
	default:
		if err := syscall.Kill(d.pid(), syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("%s: SIGTERM: %w", d.name, err)
		}
		select {
		case <-d.exited:
		case <-time.After(daemonStopTimeout):
			_ = d.cmd.Process.Kill()
			<-d.exited
			return fmt.Errorf("%s did not exit within %v of SIGTERM and was killed%s", d.name, daemonStopTimeout, d.logTail())
		}
	}
	if d.waitErr != nil {
		return fmt.Errorf("%s exited with %v%s", d.name, d.waitErr, d.logTail())
	}
	return nil
}

// logTail is the end of the daemon's log, to explain a failure.
func (d *daemonProc) logTail() string {
	b, err := os.ReadFile(d.logPath)
	if err != nil || len(b) == 0 {
		return ""
	}
	const keep = 2000
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	return "\n--- " + d.logPath + " (end) ---\n" + strings.TrimRight(string(b), "\n")
}

// stop stops both daemons, then removes the temporary directories; every
// failure is reported.
func (p *embeddedPair) stop() error {
	var errs []error
	for _, d := range []*daemonProc{p.src, p.dst} {
		if err := d.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	// Keep the logs when something went wrong: the error names their path.
	if len(errs) == 0 && p.stateDir != "" {
		_ = os.RemoveAll(p.stateDir)
	}
	if p.shmDir != "" {
		_ = os.RemoveAll(p.shmDir)
	}
	return errors.Join(errs...)
}

// pids lists the daemons' process IDs.
func (p *embeddedPair) pids() []int {
	return []int{p.src.pid(), p.dst.pid()}
}
