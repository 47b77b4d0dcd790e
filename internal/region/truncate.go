package region

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"unsafe"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// A host region's file may be truncated under it by its client. Over tcp
// and the same-host path the daemon copies on the CPU and catches the fault
// (internal/memguard), but an RDMA MR pins the pages: the NIC would keep
// serving READs of the pre-truncation bytes (even after the file grew back
// and was rewritten) and place WRITEs in pages no longer the file's. So the
// registry watches each host region's file (inotify, one watcher per
// daemon) and looks at its size again whenever the region is resolved or
// used (fstat): a file shorter than the region's end fails the region. Its
// keys are withdrawn (Registration.Withdraw: no NIC reads or writes it any
// more; a READ in flight meets a remote access error and its puller
// re-resolves), and every resolve, pin and local use answers DataLoss
// naming it, for good: the old MR's pages stay what they were, so only a
// new registration is the file again.

// watchEvents are the inotify events after which a region's file is
// looked at: a truncation is IN_MODIFY; the others are cheap insurance.
const watchEvents = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE

// fileGuard is that watch: it owns the inotify watcher and decides, from
// the kinds' key capabilities, which regions a shrunk file fails. Its
// state and the regions' file fields are guarded by mu, the registry's
// lock, which the watcher's reader takes to check a region.
type fileGuard struct {
	mu  *sync.Mutex
	log hclog.Logger
	// keyCaps: what each kind's registrations do beyond Key (Caps.Keys).
	keyCaps map[transport.Kind]transport.KeyCaps
	watch   *watcher // nil: no inotify
}

// watcher is the guard's inotify instance.
type watcher struct {
	f    *os.File                       // the inotify fd (non-blocking: Close ends the reader)
	fd   int                            // f's number (f.Fd would make it blocking)
	byWD map[int32]map[*Region]struct{} // regions per watch (two imports of one file share it)
	done chan struct{}                  // closed when the reader returned
}

// start starts the guard's watcher; without inotify (a seccomp profile, a
// limit) the regions are still checked at resolve time.
func (g *fileGuard) start() {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		g.log.Warn("no inotify: a truncated region file is seen only when the region is next resolved or used", "error", err)
		return
	}
	g.watch = &watcher{f: os.NewFile(uintptr(fd), "inotify"), fd: fd, byWD: map[int32]map[*Region]struct{}{}, done: make(chan struct{})}
	go g.readEvents(g.watch)
}

// stop ends the watcher and waits for its reader.
func (g *fileGuard) stop() {
	if g.watch == nil {
		return
	}
	_ = g.watch.f.Close()
	<-g.watch.done
}

// readEvents reads inotify events until the fd is closed, and checks the
// regions of each watch an event names.
func (g *fileGuard) readEvents(w *watcher) {
	defer close(w.done)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				g.log.Warn("inotify read failed: truncated region files are now seen only at resolve time", "error", err)
			}
			return
		}
		var wds []int32
		overflow := false // events were lost: every watched file is looked at
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			wds = append(wds, ev.Wd)
			overflow = overflow || ev.Mask&unix.IN_Q_OVERFLOW != 0
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
		g.mu.Lock()
		if overflow {
			for _, rs := range w.byWD {
				for r := range rs {
					_ = g.check(r)
				}
			}
		}
		for _, wd := range wds {
			for r := range w.byWD[wd] {
				_ = g.check(r)
			}
		}
		g.mu.Unlock()
	}
}

// add watches r.file, the open file of host region r, kept to fstat
// (forget or drop closes it). g.mu held.
func (g *fileGuard) add(r *Region) {
	f := r.file
	if g.watch == nil {
		return
	}
	// The open file itself (its /proc link), not its path: a client may
	// have put another file at the path already.
	wd, err := unix.InotifyAddWatch(g.watch.fd, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), watchEvents)
	if err != nil {
		g.log.Warn("cannot watch a region's file: its truncation is seen only when the region is next resolved or used", "id", r.ID, "path", r.ShmPath, "error", err)
		return
	}
	r.wd = int32(wd)
	if g.watch.byWD[r.wd] == nil {
		g.watch.byWD[r.wd] = map[*Region]struct{}{}
	}
	g.watch.byWD[r.wd][r] = struct{}{}
}

// drop is forget for a region being released, taking the lock.
func (g *fileGuard) drop(r *Region) {
	g.mu.Lock()
	g.forget(r)
	g.mu.Unlock()
}

// forget stops watching r's file and closes it. g.mu held.
func (g *fileGuard) forget(r *Region) {
	g.unwatch(r)
	if r.file != nil {
		_ = r.file.Close()
		r.file = nil
	}
}

// check fails r when its file is now shorter than the region's end
// and a registration of r pins its pages, and returns r's failure, if
// any: DataLoss naming r. g.mu held. A region no registration pins (tcp,
// local: CPU copies through the mapping) is not failed: a copy that
// touches a page past the end faults and is refused (internal/memguard),
// and once the file grew back the mapping sees its new pages, so a client
// that rewrites the file with O_TRUNC and write loses nothing.
func (g *fileGuard) check(r *Region) error {
	if r.truncated == nil && r.file != nil && !r.closing && g.pinsPages(r) {
		var st unix.Stat_t
		if err := unix.Fstat(int(r.file.Fd()), &st); err == nil && uint64(st.Size) < r.ShmOff+r.Mem.Len {
			g.fail(r, uint64(st.Size))
		}
	}
	if r.truncated == nil {
		return nil
	}
	return r.truncated
}

// pinsPages: some transport registered r's pages with a device (an RDMA
// MR), which keeps the pages it pinned whatever happens to the file: its
// Caps.Keys.Withdraw says so.
func (g *fileGuard) pinsPages(r *Region) bool {
	for k := range r.regs {
		if g.keyCaps[k].Withdraw {
			return true
		}
	}
	return false
}

// TruncatedError is the failure of a region whose file was truncated below
// its end. It wraps errs.ErrDataLoss.
type TruncatedError struct {
	ID, Export, Path string
	Size, End        uint64
}

func (e *TruncatedError) Error() string {
	name := ""
	if e.Export != "" {
		name = fmt.Sprintf(" (exported as %q)", e.Export)
	}
	return fmt.Sprintf("%v: region %s%s: its file %s was truncated to %d bytes, below the region's end %d; its transport keys were withdrawn, and it stays failed even if the file grows back: deregister it and register it again",
		errs.ErrDataLoss, e.ID, name, e.Path, e.Size, e.End)
}

func (e *TruncatedError) Unwrap() error { return errs.ErrDataLoss }

// fail marks r truncated to size and withdraws its keys. g.mu held.
func (g *fileGuard) fail(r *Region, size uint64) {
	r.truncated = &TruncatedError{ID: r.ID, Export: r.Export, Path: r.ShmPath, Size: size, End: r.ShmOff + r.Mem.Len}
	g.log.Warn("region's file truncated below its end: keys withdrawn, region failed until re-registered",
		"id", r.ID, "export", r.Export, "path", r.ShmPath, "size", size, "end", r.ShmOff+r.Mem.Len)
	for k, reg := range r.regs {
		err := reg.Withdraw()
		if errors.Is(err, errs.ErrUnimplemented) {
			continue // its keys are refused here (Pin), and the CPU copy catches the fault
		}
		if err != nil {
			g.log.Warn("withdrawing a truncated region's keys failed", "id", r.ID, "transport", k, "error", err)
		}
	}
	// Once failed, the region is never looked at again.
	g.unwatch(r)
}

// unwatch stops watching r's file but keeps it open. g.mu held.
func (g *fileGuard) unwatch(r *Region) {
	if g.watch == nil || r.wd == 0 {
		return
	}
	if rs := g.watch.byWD[r.wd]; rs != nil {
		delete(rs, r)
		if len(rs) == 0 {
			delete(g.watch.byWD, r.wd)
			_, _ = unix.InotifyRmWatch(g.watch.fd, uint32(r.wd))
		}
	}
	r.wd = 0
}
