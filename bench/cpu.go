package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CPUMeter reads the CPU time (user plus system) that a set of processes have
// used, from /proc/PID/stat.
type CPUMeter struct {
	PIDs  []int
	Scope string // what the PIDs are, for the report: "both daemons", "source daemon only"
	tick  float64
}

// NewCPUMeter measures pids; with none, Seconds reports that it cannot.
func NewCPUMeter(scope string, pids ...int) *CPUMeter {
	return &CPUMeter{PIDs: pids, Scope: scope, tick: clockTicksPerSecond()}
}

// errNoCPU: the daemons' processes are not visible from here.
var errNoCPU = errors.New("daemon CPU time is not measurable from here")

// Seconds is the processes' total CPU time so far.
func (m *CPUMeter) Seconds() (float64, error) {
	if m == nil || len(m.PIDs) == 0 {
		return 0, errNoCPU
	}
	var ticks uint64
	for _, pid := range m.PIDs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, fmt.Errorf("daemon CPU time: %w", err)
		}
		t, err := ParseProcStatCPU(string(b))
		if err != nil {
			return 0, fmt.Errorf("daemon CPU time of pid %d: %w", pid, err)
		}
		ticks += t
	}
	return float64(ticks) / m.tick, nil
}

// ParseProcStatCPU returns utime+stime (fields 14 and 15, in clock ticks) of
// a /proc/PID/stat line. The command name (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func ParseProcStatCPU(stat string) (uint64, error) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, fmt.Errorf("stat line has no command name: %q", stat)
	}
	// After ")" come fields 3 (state), 4, ...: utime is field 14, index 11.
	f := strings.Fields(stat[end+1:])
	const utimeIdx, stimeIdx = 14 - 3, 15 - 3
	if len(f) <= stimeIdx {
		return 0, fmt.Errorf("stat line has %d fields after the command name, want at least %d", len(f), stimeIdx+1)
	}
	u, err := strconv.ParseUint(f[utimeIdx], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("utime %q: %w", f[utimeIdx], err)
	}
	s, err := strconv.ParseUint(f[stimeIdx], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stime %q: %w", f[stimeIdx], err)
	}
	return u + s, nil
}

// clockTicksPerSecond is the unit of /proc/PID/stat times (sysconf
// _SC_CLK_TCK), read from the auxiliary vector since Go has no sysconf
// without cgo; 100 is what Linux uses everywhere in practice.
func clockTicksPerSecond() float64 {
	const atClkTck = 17
	b, err := os.ReadFile("/proc/self/auxv")
	if err == nil {
		for i := 0; i+16 <= len(b); i += 16 {
			key, val := binary.NativeEndian.Uint64(b[i:]), binary.NativeEndian.Uint64(b[i+8:])
			if key == atClkTck && val > 0 {
				return float64(val)
			}
		}
	}
	return 100
}

// unixSocketPeerPID returns the PID of the process serving a Unix socket
// (SO_PEERCRED), so the CPU time of a daemon the bench did not start can be
// read when it runs on this host.
func unixSocketPeerPID(path string) (int, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return 0, fmt.Errorf("dial %s: %w", path, err)
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("socket %s: %w", path, err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, fmt.Errorf("socket %s: %w", path, err)
	}
	if credErr != nil {
		return 0, fmt.Errorf("SO_PEERCRED on %s: %w", path, credErr)
	}
	if cred.Pid <= 0 {
		return 0, fmt.Errorf("SO_PEERCRED on %s: the server's pid is not visible (another pid namespace?)", path)
	}
	return int(cred.Pid), nil
}

// unixSocketPath returns the file of a Unix-socket API address, or "".
func unixSocketPath(api string) string {
	switch {
	case strings.HasPrefix(api, "unix://"):
		return strings.TrimPrefix(api, "unix://")
	case strings.HasPrefix(api, "/"):
		return api
	}
	return ""
}

// HostCPU is the whole machine's CPU time so far, from /proc/stat, with the
// bench's own, so that what other processes used can be told apart.
type HostCPU struct {
	Busy  float64 // user, nice and system time of all CPUs
	Steal float64 // time the hypervisor ran something else instead
	Self  float64 // this process
}

// ReadHostCPU samples the machine and this process.
func ReadHostCPU() (HostCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return HostCPU{}, fmt.Errorf("host CPU time: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	busy, steal, err := ParseProcStatTotals(line)
	if err != nil {
		return HostCPU{}, fmt.Errorf("host CPU time: %w", err)
	}
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return HostCPU{}, fmt.Errorf("own CPU time: %w", err)
	}
	self := float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	tick := clockTicksPerSecond()
	return HostCPU{Busy: float64(busy) / tick, Steal: float64(steal) / tick, Self: self}, nil
}

// ParseProcStatTotals reads the aggregate "cpu" line of /proc/stat: user
// nice system idle iowait irq softirq steal ..., in clock ticks. Busy leaves
// out irq and softirq time: loopback TCP's receive path runs there on behalf
// of the daemons without being charged to them, so counting it would blame
// the daemons' own network work on "other processes". Guest time is already
// inside user and nice.
func ParseProcStatTotals(line string) (busy, steal uint64, err error) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: first line %q is not the aggregate cpu line", line)
	}
	var v [8]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: field %d %q: %w", i+1, f[i+1], err)
		}
	}
	const user, nice, system, stealIdx = 0, 1, 2, 7
	return v[user] + v[nice] + v[system], v[stealIdx], nil
}
