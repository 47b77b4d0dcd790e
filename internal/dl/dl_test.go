//go:build cgo && linux

package dl

import (
	"errors"
	"strings"
	"testing"
)

func TestOpen(t *testing.T) {
	tests := []struct {
		name    string
		lib     string
		wantErr string // substring; "" means success
	}{
		{"libc", "libc.so.6", ""},
		{"missing", "libb2bd-no-such-library.so.1", "libb2bd-no-such-library.so.1"},
		{"empty", "", "empty library name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := Open(tt.lib)
			if tt.wantErr == "" {
				g, gerr := OpenGlobal(tt.lib)
				if gerr != nil {
					t.Fatalf("OpenGlobal(%q): %v", tt.lib, gerr)
				}
				if err := g.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
			}
			if tt.wantErr != "" {
				if err == nil {
					l.Close()
					t.Fatalf("Open(%q) succeeded, want error", tt.lib)
				}
				var de *Error
				if !errors.As(err, &de) || de.Op != "dlopen" {
					t.Fatalf("Open(%q) error %v is not a dlopen *Error", tt.lib, err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Open(%q) error %q does not mention %q", tt.lib, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open(%q): %v", tt.lib, err)
			}
			if err := l.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		})
	}
}

func TestSymAndClose(t *testing.T) {
	l, err := Open("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		sym string
		ok  bool
	}{
		{"getpid", true},
		{"dlopen", true},
		{"b2bd_no_such_symbol", false},
	}
	for _, tt := range tests {
		p, err := l.Sym(tt.sym)
		if tt.ok && (err != nil || p == nil) {
			t.Errorf("Sym(%q) = %v, %v; want a pointer", tt.sym, p, err)
		}
		if !tt.ok {
			var de *Error
			if err == nil || !errors.As(err, &de) || de.Op != "dlsym" || de.Symbol != tt.sym || de.Msg == "" {
				t.Errorf("Sym(%q) error = %v; want a dlsym *Error with dlerror text", tt.sym, err)
			}
		}
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Sym("getpid"); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Sym after Close = %v; want a 'closed' error", err)
	}
}
