package doctor

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

const capIPCLock = 14

// hasCap reports whether /proc/self/status lists cap in CapEff.
func (h *host) hasCap(cap uint) bool {
	s, err := h.env.read("proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<cap) != 0
		}
	}
	return false
}

// minMemlock is the least memlock limit worth calling workable: RDMA
// registration pins every byte of every region.
const minMemlock = 1 << 30

func (h *host) checkMemlock() Result {
	const c = "memlock"
	const fix = "run b2bd with LimitMEMLOCK=infinity (systemd), --ulimit memlock=-1 (docker), or '* - memlock unlimited' in /etc/security/limits.conf"
	lim, err := h.env.Memlock()
	if err != nil {
		return res(c, Warn, fix, "cannot read the memlock limit: %v", err)
	}
	if lim == Unlimited {
		return res(c, Pass, "", "RLIMIT_MEMLOCK unlimited (this process; the daemon's comes from its unit)")
	}
	if h.hasCap(capIPCLock) {
		return res(c, Pass, "", "RLIMIT_MEMLOCK %s, but this process has CAP_IPC_LOCK, so no limit applies to pinning", bytesStr(lim))
	}
	if lim < minMemlock {
		return res(c, Warn, fix, "RLIMIT_MEMLOCK is %s: RDMA registration pins every region, so regions beyond that fail (ibv_reg_mr: ENOMEM)", bytesStr(lim))
	}
	return res(c, Warn, fix, "RLIMIT_MEMLOCK is %s, not unlimited: registered regions may total at most that", bytesStr(lim))
}

func bytesStr(n uint64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift {
			v := float64(n) / float64(uint64(1)<<u.shift)
			if n%(1<<u.shift) == 0 {
				return fmt.Sprintf("%d %s", n>>u.shift, u.name)
			}
			return fmt.Sprintf("%.1f %s", v, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// meminfo reads /proc/meminfo values in kB (or counts).
func (h *host) meminfo() (map[string]uint64, error) {
	s, err := h.env.read("proc/meminfo")
	if err != nil {
		return nil, err
	}
	m := map[string]uint64{}
	for _, l := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		if n, err := strconv.ParseUint(f[0], 10, 64); err == nil {
			m[strings.TrimSpace(k)] = n
		}
	}
	return m, nil
}

func (h *host) checkHugepages() Result {
	const c = "hugepages"
	m, err := h.meminfo()
	if err != nil {
		return res(c, Warn, "run doctor where /proc is mounted", "cannot read /proc/meminfo: %v", err)
	}
	thp, _ := h.env.read("sys/kernel/mm/transparent_hugepage/enabled")
	total, size, memTotal := m["HugePages_Total"], m["Hugepagesize"], m["MemTotal"]
	reserved := total * size // kB
	d := fmt.Sprintf("HugePages_Total %d of %d kB (%s reserved), transparent hugepages %s; b2bd's host regions are tmpfs files under --shm-dir and do not use hugetlb pages",
		total, size, bytesStr(reserved<<10), thpMode(thp))
	if memTotal > 0 && reserved*2 > memTotal {
		return res(c, Warn, "lower vm.nr_hugepages (sysctl -w vm.nr_hugepages=N) unless another program needs them",
			"%s; more than half of memory (%s) is reserved as hugetlb pages, which shm regions cannot use", d, bytesStr(memTotal<<10))
	}
	return res(c, Pass, "", "%s", d)
}

// thpMode picks the bracketed choice of "always [madvise] never".
func thpMode(s string) string {
	if i := strings.Index(s, "["); i >= 0 {
		if j := strings.Index(s[i:], "]"); j > 0 {
			return s[i+1 : i+j]
		}
	}
	if s == "" {
		return "unknown"
	}
	return s
}

// resolveGroup turns --group into a gid exactly as the daemon does
// (internal/daemon resolveGroup): a decimal number is a gid and need not be
// in /etc/group (a container image rarely lists the pod's supplemental
// group); anything else is a group name looked up with lookup.
func resolveGroup(spec string, lookup func(string) (int, error)) (int, error) {
	if _, err := strconv.ParseUint(spec, 10, 32); err == nil {
		gid, err := strconv.ParseUint(spec, 10, 31)
		if err != nil {
			return 0, fmt.Errorf("--group %q is not a gid: %w", spec, err)
		}
		return int(gid), nil
	}
	gid, err := lookup(spec)
	if err != nil {
		return 0, fmt.Errorf("look up group %q: %w", spec, err)
	}
	return gid, nil
}

// minShmFree is the free space under which the shm check warns.
const minShmFree = 1 << 30

func (h *host) checkShm() Result {
	const c = "shm-dir"
	dir := h.env.ShmDir
	path := h.env.p(dir)
	var notes []string
	gid, gerr := resolveGroup(h.env.Group, h.env.LookupGroup)
	if gerr != nil {
		notes = append(notes, fmt.Sprintf("no group %s (only root can use the socket and %s): %v", h.env.Group, dir, gerr))
	}
	st, err := os.Stat(path)
	switch {
	case os.IsNotExist(err):
		notes = append(notes, "does not exist yet (the daemon creates it at start)")
	case err != nil:
		return res(c, Fail, "check the path and this user's access to it", "%s: %v", dir, err)
	case !st.IsDir():
		return res(c, Fail, fmt.Sprintf("remove %s or point --shm-dir at a directory on tmpfs", dir), "%s is not a directory", dir)
	default:
		mode := st.Mode()
		if mode.Perm()&0o007 != 0 {
			return res(c, Fail, fmt.Sprintf("chmod 2770 %s (the daemon sets drwxrws--- at start; something changed it)", dir),
				"%s is %s: other users can open every host region's memory", dir, mode)
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && gerr == nil && int(sys.Gid) != gid {
			notes = append(notes, fmt.Sprintf("group is gid %d, not %s (%d)", sys.Gid, h.env.Group, gid))
		}
		notes = append(notes, "mode "+mode.String())
	}
	fs, err := h.env.Statfs(path)
	if err != nil {
		return res(c, Warn, "check that the directory (or its parent) exists and is readable", "cannot statfs %s: %v", dir, err)
	}
	if fs.Type != Tmpfs {
		return res(c, Warn, "point --shm-dir at tmpfs (/dev/shm/b2bd) so region memory is RAM, not a disk file, and can be pinned for host-GPU copies (the kernel refuses to pin disk-file pages: such batches then run pageable, on the SMs)",
			"%s is not on tmpfs (statfs type %#x): %s", dir, fs.Type, strings.Join(notes, "; "))
	}
	if fs.Free < minShmFree {
		return res(c, Warn, "grow the tmpfs (mount -o remount,size=64G /dev/shm; in Kubernetes an emptyDir with medium: Memory and a sizeLimit) or set --shm-dir elsewhere",
			"only %s free of %s on the tmpfs holding %s: host regions larger than that fail", bytesStr(fs.Free), bytesStr(fs.Total), dir)
	}
	d := fmt.Sprintf("%s on tmpfs, %s free of %s", dir, bytesStr(fs.Free), bytesStr(fs.Total))
	if len(notes) > 0 {
		d += "; " + strings.Join(notes, "; ")
	}
	for _, n := range notes {
		if strings.HasPrefix(n, "no group") || strings.HasPrefix(n, "group is") {
			return res(c, Warn, fmt.Sprintf("groupadd --system %s (and add the users of b2bd to it), or give the daemon --group; it sets the group at start", h.env.Group), "%s", d)
		}
	}
	return res(c, Pass, "", "%s", d)
}
