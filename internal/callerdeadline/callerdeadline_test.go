package callerdeadline

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   time.Duration
		sent   bool
		bad    string // a piece of the error's text; "" for none
	}{
		{"absent", nil, 0, false, ""},
		{"one ms", []string{"1"}, time.Millisecond, true, ""},
		{"leading zeros", []string{"0050"}, 50 * time.Millisecond, true, ""},
		{"the limit", []string{"86400000"}, Max, true, ""},
		{"zero", []string{"0"}, 0, false, `"0": want whole milliseconds from 1 to 86400000`},
		{"over the limit", []string{"86400001"}, 0, false, `"86400001"`},
		{"negative", []string{"-5"}, 0, false, `"-5"`},
		{"plus sign", []string{"+5"}, 0, false, `"+5"`},
		{"units", []string{"5s"}, 0, false, `"5s"`},
		{"fraction", []string{"1.5"}, 0, false, `"1.5"`},
		{"empty", []string{""}, 0, false, `metadata b2b-timeout-ms is ""`},
		{"spaces", []string{" 5"}, 0, false, `" 5"`},
		{"overflow", []string{"99999999999999999999999"}, 0, false, `"99999999999999999999999"`},
		{"two values", []string{"5", "6"}, 0, false, `has 2 values`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, sent, err := Parse(tc.values)
			if tc.bad != "" {
				if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.bad) || !strings.Contains(err.Error(), Key) {
					t.Fatalf("Parse(%q) = %v, want InvalidArgument naming %s and %s", tc.values, err, Key, tc.bad)
				}
				return
			}
			if err != nil || got != tc.want || sent != tc.sent {
				t.Fatalf("Parse(%q) = %v, %v, %v; want %v, %v, nil", tc.values, got, sent, err, tc.want, tc.sent)
			}
		})
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		left time.Duration
		want string
		ok   bool
	}{
		{-time.Second, "", false},
		{0, "", false},
		{time.Nanosecond, "1", true}, // rounded up: never earlier than the caller's
		{time.Millisecond, "1", true},
		{1500 * time.Microsecond, "2", true},
		{Max, "86400000", true},
		{Max + time.Nanosecond, "", false},
	} {
		got, ok := Format(tc.left)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Format(%v) = %q, %v; want %q, %v", tc.left, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzParse: whatever the metadata holds, Parse refuses it with
// InvalidArgument or returns a time in [1 ms, Max] that Format gives back.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"1", "0", "86400000", "86400001", "-1", "1e3", "", "٣", "18446744073709551616"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, sent, err := Parse([]string{v})
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) || sent {
				t.Fatalf("Parse(%q): %v (sent %v), want an InvalidArgument", v, err, sent)
			}
			return
		}
		if !sent || d < time.Millisecond || d > Max || d%time.Millisecond != 0 {
			t.Fatalf("Parse(%q) = %v, %v: out of range", v, d, sent)
		}
		if back, ok := Format(d); !ok {
			t.Fatalf("Format(%v) refused what Parse(%q) accepted", d, v)
		} else if again, _, _ := Parse([]string{back}); again != d {
			t.Fatalf("Parse(%q) = %v, then Format/Parse = %v", v, d, again)
		}
	})
}
