//go:build !cgo || !linux

package dl

import "unsafe"

// Library is an open shared library; in this build none can be opened.
type Library struct{ name string }

// Open always fails in this build: dynamic loading needs cgo on linux.
func Open(name string) (*Library, error) {
	return nil, &Error{Op: "dlopen", Library: name, Msg: "not supported in this build", Err: ErrUnsupported}
}

// OpenGlobal always fails in this build.
func OpenGlobal(name string) (*Library, error) { return Open(name) }

// Name is the name the library was opened with.
func (l *Library) Name() string { return l.name }

// Sym always fails in this build.
func (l *Library) Sym(symbol string) (unsafe.Pointer, error) {
	return nil, &Error{Op: "dlsym", Library: l.name, Symbol: symbol, Msg: "not supported in this build", Err: ErrUnsupported}
}

// Close does nothing in this build.
func (l *Library) Close() error { return nil }
