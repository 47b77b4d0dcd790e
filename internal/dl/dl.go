//go:build cgo && linux

package dl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

// dlerror is thread-local, and a goroutine may move between OS threads
// between two cgo calls, so each wrapper reads it in the same call.
static void *b2bdl_dlopen(const char *name, int flags, const char **err) {
	dlerror();
	void *h = dlopen(name, flags);
	if (h == NULL) *err = dlerror();
	return h;
}

static void *b2bdl_dlsym(void *h, const char *sym, const char **err) {
	dlerror();
	void *p = dlsym(h, sym);
	if (p == NULL) *err = dlerror();
	return p;
}

static int b2bdl_dlclose(void *h, const char **err) {
	dlerror();
	int rc = dlclose(h);
	if (rc != 0) *err = dlerror();
	return rc;
}
*/
import "C"

import (
	"sync"
	"unsafe"
)

// Library is an open shared library. Its methods are safe for concurrent use.
type Library struct {
	name string

	mu     sync.Mutex
	handle unsafe.Pointer // nil once closed
}

// Open loads the named library with RTLD_NOW|RTLD_LOCAL (every symbol is
// resolved now, nothing leaks into the global namespace). name is searched
// the usual way (LD_LIBRARY_PATH, ld.so.cache, ...).
func Open(name string) (*Library, error) { return open(name, C.RTLD_NOW|C.RTLD_LOCAL) }

// OpenGlobal loads the named library with RTLD_NOW|RTLD_GLOBAL: its symbols
// join the global namespace, for a library whose plugins bind to it by name
// (libibverbs and its providers).
func OpenGlobal(name string) (*Library, error) { return open(name, C.RTLD_NOW|C.RTLD_GLOBAL) }

func open(name string, flags C.int) (*Library, error) {
	if name == "" {
		return nil, &Error{Op: "dlopen", Library: name, Msg: "empty library name"}
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var cerr *C.char
	h := C.b2bdl_dlopen(cname, flags, &cerr)
	if h == nil {
		return nil, &Error{Op: "dlopen", Library: name, Msg: errText(cerr)}
	}
	return &Library{name: name, handle: h}, nil
}

// Name is the name the library was opened with.
func (l *Library) Name() string { return l.name }

// Sym looks a symbol up. A symbol whose value is NULL counts as missing.
func (l *Library) Sym(symbol string) (unsafe.Pointer, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.handle == nil {
		return nil, &Error{Op: "dlsym", Library: l.name, Symbol: symbol, Msg: "library is closed"}
	}
	csym := C.CString(symbol)
	defer C.free(unsafe.Pointer(csym))
	var cerr *C.char
	p := C.b2bdl_dlsym(l.handle, csym, &cerr)
	if p == nil {
		return nil, &Error{Op: "dlsym", Library: l.name, Symbol: symbol, Msg: errText(cerr)}
	}
	return p, nil
}

// Close unloads the library (dlclose). It is safe to call twice; the second
// call does nothing. Pointers from Sym must not be used afterwards.
func (l *Library) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.handle == nil {
		return nil
	}
	h := l.handle
	l.handle = nil
	var cerr *C.char
	if C.b2bdl_dlclose(h, &cerr) != 0 {
		return &Error{Op: "dlclose", Library: l.name, Msg: errText(cerr)}
	}
	return nil
}

func errText(p *C.char) string {
	if p == nil {
		return "unknown error (dlerror returned NULL)"
	}
	return C.GoString(p)
}
