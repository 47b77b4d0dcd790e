package callid

import (
	"errors"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		sent   bool
		bad    string // a piece of the error's text; "" for none
	}{
		{"absent", nil, false, ""},
		{"hex", []string{"0123456789abcdef0123456789abcdef"}, true, ""},
		{"every allowed character", []string{"azAZ09_-"}, true, ""},
		{"the limit", []string{strings.Repeat("a", MaxLen)}, true, ""},
		{"empty", []string{""}, false, `metadata b2b-call-id is "": want 1 to 64 characters of [0-9A-Za-z_-]`},
		{"over the limit", []string{strings.Repeat("a", MaxLen+1)}, false, "want 1 to 64 characters"},
		{"space", []string{"a b"}, false, `"a b"`},
		{"slash", []string{"a/b"}, false, `"a/b"`},
		{"non-ASCII", []string{"é"}, false, "want 1 to 64"},
		{"two values", []string{"a", "b"}, false, "metadata b2b-call-id has 2 values"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, sent, err := Parse(tc.values)
			if tc.bad == "" {
				if err != nil || sent != tc.sent || (sent && id != tc.values[0]) {
					t.Fatalf("Parse(%q) = %q %v %v, want %v and no error", tc.values, id, sent, err, tc.sent)
				}
				return
			}
			if err == nil || !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.bad) || sent {
				t.Fatalf("Parse(%q) = %q %v %v, want InvalidArgument containing %q", tc.values, id, sent, err, tc.bad)
			}
		})
	}
}

func TestNew(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := New()
		if err := Check("id", id); err != nil || len(id) != 32 {
			t.Fatalf("New() = %q: %v", id, err)
		}
		if seen[id] {
			t.Fatalf("New() repeated %q", id)
		}
		seen[id] = true
	}
}

// FuzzParse: any value either parses to itself or is an InvalidArgument
// that quotes no more than twice the limit.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "a", New(), strings.Repeat("z", 65), "a b", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		id, sent, err := Parse([]string{v})
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) || sent || len(err.Error()) > 4*MaxLen+200 {
				t.Fatalf("Parse(%q): %v (sent %v)", v, err, sent)
			}
			return
		}
		if !sent || id != v || len(v) == 0 || len(v) > MaxLen {
			t.Fatalf("Parse(%q) = %q %v", v, id, sent)
		}
	})
}
