// Package doctor checks a host (and optionally a peer) for what b2bd needs:
// RDMA devices and ports, a RoCE v2 GID, MTUs, the memlock limit, the verbs
// providers, GPU peer memory (nvidia-peermem or dma-buf), the IOMMU and ACS,
// the GPU–NIC PCIe distance, hugepages and the shm directory. Each check
// returns pass, warn or fail with a one-line fix. Host checks read sysfs,
// procfs and /dev through Env.Root, so tests run them against fake trees.
package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
)

// Status is a check's verdict.
type Status string

const (
	Pass Status = "pass"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Result is one check's outcome.
type Result struct {
	Check  string `json:"check"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// FS is what statfs says about a filesystem.
type FS struct {
	Type        int64 // f_type magic
	Free, Total uint64
}

// Tmpfs is the statfs magic of tmpfs (and of /dev/shm).
const Tmpfs = 0x01021994

// Unlimited is an RLIM_INFINITY memlock limit.
const Unlimited = math.MaxUint64

// Env is where and how the checks look.
type Env struct {
	// Root is prepended to every sysfs, procfs, /etc, /usr, /boot and shm
	// path ("/" when empty).
	Root string
	// ShmDir is the daemon's --shm-dir (default /dev/shm/b2bd).
	ShmDir string
	// Group owns the socket and ShmDir (default b2bd).
	Group string
	// Device and NetDev restrict the RDMA checks, as --rdma-device and
	// --rdma-netdev do for the daemon; empty: every device.
	Device, NetDev string
	// Memlock returns this process's RLIMIT_MEMLOCK soft limit (Unlimited
	// for infinity). Default: getrlimit.
	Memlock func() (uint64, error)
	// Statfs describes the filesystem holding path. Default: statfs(2).
	Statfs func(path string) (FS, error)
	// LookupGroup returns a group's gid. Default: os/user.
	LookupGroup func(name string) (int, error)
	// PortMTU returns an RDMA port's active MTU in bytes as ibv_query_port
	// reports it (sysfs does not show it); nil: derived from the netdev MTU.
	PortMTU func(dev string, port int) (int, error)
}

func (e *Env) defaults() {
	if e.Root == "" {
		e.Root = "/"
	}
	if e.ShmDir == "" {
		e.ShmDir = "/dev/shm/b2bd"
	}
	if e.Group == "" {
		e.Group = "b2bd"
	}
	if e.Memlock == nil {
		e.Memlock = memlock
	}
	if e.Statfs == nil {
		e.Statfs = statfs
	}
	if e.LookupGroup == nil {
		e.LookupGroup = func(name string) (int, error) {
			g, err := user.LookupGroup(name)
			if err != nil {
				return 0, err
			}
			return strconv.Atoi(g.Gid)
		}
	}
}

// p is a path under the root.
func (e *Env) p(parts ...string) string {
	return filepath.Join(append([]string{e.Root}, parts...)...)
}

func (e *Env) read(parts ...string) (string, error) {
	b, err := os.ReadFile(e.p(parts...))
	return strings.TrimSpace(string(b)), err
}

func (e *Env) exists(parts ...string) bool {
	_, err := os.Stat(e.p(parts...))
	return err == nil
}

// host is what several checks share, read once.
type host struct {
	env     *Env
	ports   []port
	rdmaErr error // reading /sys/class/infiniband failed (not: it is absent)
	gpus    []pciDev
}

// Run runs every host check.
func Run(env Env) []Result {
	env.defaults()
	h := &host{env: &env}
	h.ports, h.rdmaErr = readPorts(&env)
	h.gpus = readGPUs(&env)
	return []Result{
		h.checkRDMA(),
		h.checkGID(),
		h.checkMTU(),
		h.checkProviders(),
		h.checkMemlock(),
		h.checkPeerMemory(),
		h.checkIOMMU(),
		h.checkACS(),
		h.checkDistance(),
		h.checkHugepages(),
		h.checkShm(),
	}
}

// Summary counts results by status.
type Summary struct {
	Pass int `json:"pass"`
	Warn int `json:"warn"`
	Fail int `json:"fail"`
}

// Summarize counts rs.
func Summarize(rs []Result) Summary {
	var s Summary
	for _, r := range rs {
		switch r.Status {
		case Pass:
			s.Pass++
		case Warn:
			s.Warn++
		case Fail:
			s.Fail++
		}
	}
	return s
}

// Report is the --json document.
type Report struct {
	Root    string   `json:"root"`
	Checks  []Result `json:"checks"`
	Summary Summary  `json:"summary"`
}

// WriteJSON writes rs as a Report.
func WriteJSON(w io.Writer, root string, rs []Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(Report{Root: root, Checks: rs, Summary: Summarize(rs)}); err != nil {
		return fmt.Errorf("doctor: write json: %w", err)
	}
	return nil
}

// WriteText writes rs for people: one line per check, its fix below.
func WriteText(w io.Writer, rs []Result) error {
	width := 0
	for _, r := range rs {
		width = max(width, len(r.Check))
	}
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%-4s  %-*s  %s\n", strings.ToUpper(string(r.Status)), width, r.Check, r.Detail)
		if r.Fix != "" && r.Status != Pass {
			fmt.Fprintf(&b, "      %-*s  fix: %s\n", width, "", r.Fix)
		}
	}
	s := Summarize(rs)
	fmt.Fprintf(&b, "%d pass, %d warn, %d fail\n", s.Pass, s.Warn, s.Fail)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("doctor: write: %w", err)
	}
	return nil
}

func res(check string, st Status, fix, format string, a ...any) Result {
	return Result{Check: check, Status: st, Detail: fmt.Sprintf(format, a...), Fix: fix}
}
