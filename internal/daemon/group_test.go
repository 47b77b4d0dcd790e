package daemon

import (
	"errors"
	"os/user"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/errs"
)

// TestResolveGroup: --group takes a gid or a group name; without it the
// b2bd group if it exists, else none.
func TestResolveGroup(t *testing.T) {
	noB2bd := 0
	if g, err := user.LookupGroup(DefaultGroup); err == nil {
		t.Logf("group %s exists here (gid %s)", DefaultGroup, g.Gid)
		noB2bd = -1 // depends on the host: not checked
	}
	cases := []struct {
		spec string
		want int
		err  error
	}{
		{"4242", 4242, nil},
		{"root", 0, nil},
		{"", noB2bd, nil},
		{"no-such-group-b2bd-test", 0, errs.ErrInvalidArgument},
		{"-1", 0, errs.ErrInvalidArgument},
		{"99999999999", 0, errs.ErrInvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := resolveGroup(tc.spec, hclog.NewNullLogger())
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("resolveGroup(%q) = %d, %v; want %v", tc.spec, got, err, tc.err)
				}
				return
			}
			if err != nil || (tc.want >= 0 && got != tc.want) {
				t.Fatalf("resolveGroup(%q) = %d, %v; want %d", tc.spec, got, err, tc.want)
			}
		})
	}
}
