package server

import (
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestKindOf: a request names its data path by transport_name or by the
// deprecated enum; a name wins over an unset enum, the two must agree when
// both are set, and a bad name is refused naming the field and the choices.
func TestKindOf(t *testing.T) {
	const (
		unset = b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED
		tcp   = b2bv1.TransportKind_TRANSPORT_KIND_TCP
		local = b2bv1.TransportKind_TRANSPORT_KIND_LOCAL
	)
	for _, tc := range []struct {
		enum b2bv1.TransportKind
		name string
		want transport.Kind
		bad  string // a piece of the refusal; "" for none
	}{
		{unset, "", "", ""},
		{tcp, "", transport.TCP, ""},
		{unset, "verbs", transport.Verbs, ""},
		{unset, "auto", "", ""},
		{local, "local", transport.Local, ""},
		{tcp, "local", "", `transport_name "local" and transport tcp disagree`},
		{tcp, "auto", "", `transport_name "auto" and transport tcp disagree`},
		{unset, "rdma", "", `transport_name: transport "rdma": want auto, tcp, verbs or local`},
		{b2bv1.TransportKind(99), "", "", "transport 99 is not a known TransportKind"},
		{unset, strings.Repeat("x", 65), "", "transport_name is 65 bytes, over the limit of 64"},
	} {
		got, err := kindOf(tc.enum, tc.name)
		if tc.bad != "" {
			if errs.Class(err) != errs.ErrInvalidArgument || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("kindOf(%v, %q) = %v, want InvalidArgument containing %q", tc.enum, tc.name, err, tc.bad)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("kindOf(%v, %q) = %q, %v; want %q", tc.enum, tc.name, got, err, tc.want)
		}
	}
}

// FuzzKindOf: any enum and name is a kind this daemon may run, "", or
// InvalidArgument; never a panic, never a name outside the known ones.
func FuzzKindOf(f *testing.F) {
	f.Add(int32(0), "")
	f.Add(int32(1), "tcp")
	f.Add(int32(3), "verbs")
	f.Add(int32(-1), "auto\x00")
	f.Fuzz(func(t *testing.T, e int32, name string) {
		k, err := kindOf(b2bv1.TransportKind(e), name)
		if err != nil {
			if errs.Class(err) != errs.ErrInvalidArgument {
				t.Fatalf("kindOf(%d, %q): %v, want InvalidArgument", e, name, err)
			}
			if len(err.Error()) > 4*maxKindName+200 { // %q may quadruple a byte, no more
				t.Fatalf("kindOf(%d, %d-byte name): a %d-byte message echoes the input", e, len(name), len(err.Error()))
			}
			return
		}
		if k != "" && transport.CheckName(string(k)) != nil {
			t.Fatalf("kindOf(%d, %q) = %q, not a known kind", e, name, k)
		}
	})
}
