//go:build cgo && linux

package verbs

/*
#cgo CFLAGS: -O2 -Wall -Wno-unused-function
#include "b2bv.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/b2bd/b2bd/internal/dl"
)

// libNames are tried in order; the unversioned name is the development
// symlink, present where only libibverbs-dev is installed.
var libNames = []string{"libibverbs.so.1", "libibverbs.so"}

var (
	loadOnce sync.Once
	loadErr  error
	lib      *dl.Library // held for the life of the process
)

// Load loads libibverbs once, through internal/dl like gpudirect loads
// libcuda: dlopen, then dlsym of every entry point b2bv_* calls, whose
// pointers go into the C table (load.c). The data-path verbs are inline
// functions of <infiniband/verbs.h> that call through the context's ops
// table (see b2bv.h), so there is nothing to resolve for them. It returns
// an error wrapping ErrUnavailable when the library or a required symbol
// is missing.
func Load() error {
	loadOnce.Do(func() { loadErr = load() })
	return loadErr
}

func load() error {
	var first error
	for _, name := range libNames {
		// RTLD_GLOBAL as before: libibverbs dlopens its providers
		// (librxe, libmlx5), which bind to its symbols.
		l, err := dl.OpenGlobal(name)
		if err == nil {
			lib = l
			break
		}
		if first == nil {
			first = err
		}
	}
	if lib == nil {
		return fmt.Errorf("verbs: %w (install rdma-core/libibverbs1): %w", first, ErrUnavailable)
	}
	n := int(C.b2bv_nsyms())
	for k := 0; k < n; k++ {
		var req C.int
		name := C.GoString(C.b2bv_sym_name(C.int(k), &req))
		p, err := lib.Sym(name)
		if err != nil {
			if req == 0 {
				continue // optional (ibv_reg_dmabuf_mr): the table keeps NULL
			}
			return fmt.Errorf("verbs: %w: %w", err, ErrUnavailable)
		}
		if rc := C.b2bv_set_sym(C.int(k), p); rc != 0 {
			return callErr(rc, 0, fmt.Sprintf("set symbol %s", name), "", ErrUnavailable)
		}
	}
	return nil
}

// Compiled reports whether this binary has the cgo verbs implementation.
func Compiled() bool { return true }

// callErr is the one place a C result (0 or -errno, see b2bv.h) becomes an
// error: "verbs: <call>: <errno>[ (provider returned <raw>)]<hint>",
// wrapping the syscall.Errno and class (when not nil). call names the verb
// and its arguments. raw is the provider's own return value (0: none).
func callErr(rc, raw C.int, call, hint string, class error) error {
	if rc == 0 {
		return nil
	}
	errno := syscall.Errno(-rc)
	note := ""
	if raw != 0 && raw != -rc {
		note = fmt.Sprintf(" (provider returned %d)", int(raw))
	}
	if class == nil {
		return fmt.Errorf("verbs: %s: %w%s%s", call, errno, note, hint)
	}
	return fmt.Errorf("verbs: %s: %w%s%s: %w", call, errno, note, hint, class)
}

// errClosed is what every method of a closed or nil handle returns.
func errClosed(what string) error {
	return fmt.Errorf("verbs: %s: %w", what, ErrClosed)
}

// children counts open child handles so a parent refuses to close first.
type children struct{ n atomic.Int32 }

func (c *children) busy(what string) error {
	if n := c.n.Load(); n > 0 {
		return fmt.Errorf("verbs: close %s: %d child handle(s) still open (close QPs, CQs, SRQs, MRs first): %w",
			what, n, ErrFailedPrecondition)
	}
	return nil
}

// EventString names an async event type.
func EventString(t int) string {
	if Load() != nil {
		return fmt.Sprintf("event(%d)", t)
	}
	return C.GoString(C.b2bv_event_type_str(C.int(t)))
}

// StatusString is ibv_wc_status_str.
func StatusString(s WCStatus) string {
	if Load() != nil {
		return fmt.Sprintf("status(%d)", uint32(s))
	}
	return C.GoString(C.b2bv_wc_status_str(C.int(s)))
}
