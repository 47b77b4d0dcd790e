package config

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"
)

// A Rule is a flag's documented range. Check takes the value as text (what
// the command line or the TOML file gave, or the flag's String) and refuses
// it with the range; String is the range in words, for errors and usage.
type Rule interface {
	Check(s string) error
	String() string
}

// Ranges is a table of rules by flag name. Bind wraps the flags it names so
// that setting one (command line or config file) checks its rule first, and
// Check refuses a flag set with a flag the table forgot.
type Ranges map[string]Rule

// errRange marks a value outside its rule.
var errRange = errors.New("out of range")

func outOfRange(r Rule) error { return fmt.Errorf("%w: want %s", errRange, r) }

// Bind wraps every flag of fs that r names; a name r has but fs lacks is
// returned as an error (a table row for a flag that does not exist).
func (r Ranges) Bind(fs *flag.FlagSet) error {
	var missing []string
	for name, rule := range r {
		f := fs.Lookup(name)
		if f == nil {
			missing = append(missing, name)
			continue
		}
		if rv, ok := f.Value.(*Ranged); ok {
			rv.rule = rule
			continue
		}
		f.Value = &Ranged{Value: f.Value, rule: rule}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("config: range table names flags that do not exist: %s", strings.Join(missing, ", "))
	}
	return nil
}

// Check is the whole set's check, after the command line and the file are
// in: every flag has a rule (a flag added without one is refused, so none
// can be forgotten) and every value, defaults included, is in its range.
func Check(fs *flag.FlagSet) error {
	var unruled []string
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		rv, ok := f.Value.(*Ranged)
		if !ok {
			unruled = append(unruled, f.Name)
			return
		}
		if err == nil {
			if cerr := rv.rule.Check(rv.String()); cerr != nil {
				err = fmt.Errorf("--%s %q: %w", f.Name, rv.String(), cerr)
			}
		}
	})
	if len(unruled) > 0 {
		return fmt.Errorf("config: flags without a documented range (add them to the range table): %s", strings.Join(unruled, ", "))
	}
	return err
}

// RuleOf is the rule bound to fs's flag name, or nil.
func RuleOf(fs *flag.FlagSet, name string) Rule {
	if f := fs.Lookup(name); f != nil {
		if rv, ok := f.Value.(*Ranged); ok {
			return rv.rule
		}
	}
	return nil
}

// Ranged is a flag.Value whose Set checks its rule first. It keeps the
// wrapped value's Get, IsBoolFlag and type name, so config, flag and pflag
// treat it as the value it wraps.
type Ranged struct {
	flag.Value
	rule Rule
}

// Validate checks s against the rule without setting anything (Apply
// checks a whole file this way before setting any key).
func (r *Ranged) Validate(s string) error { return r.rule.Check(s) }

// Set checks s, then sets the wrapped value.
func (r *Ranged) Set(s string) error {
	if err := r.rule.Check(s); err != nil {
		return err
	}
	return r.Value.Set(s)
}

// String is safe on a zero Ranged (package flag calls it on one).
func (r *Ranged) String() string {
	if r == nil || r.Value == nil {
		return ""
	}
	return r.Value.String()
}

// Get is the wrapped value's, when it has one.
func (r *Ranged) Get() any {
	if g, ok := r.Value.(flag.Getter); ok {
		return g.Get()
	}
	return r.Value.String()
}

// IsBoolFlag lets a bool flag be given without a value.
func (r *Ranged) IsBoolFlag() bool {
	b, ok := r.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Type names the value's kind for pflag's help (int, duration, string...).
func (r *Ranged) Type() string {
	if r == nil || r.Value == nil {
		return "value"
	}
	switch r.Get().(type) {
	case bool:
		return "bool"
	case int:
		return "int"
	case int64:
		return "int64"
	case uint:
		return "uint"
	case uint64:
		return "uint64"
	case float64:
		return "float64"
	case time.Duration:
		return "duration"
	}
	return "string"
}

// Int is an integer from Min to Max (decimal, 0x hex or 0 octal, as package
// flag reads integers).
type Int struct{ Min, Max int64 }

func (r Int) Check(s string) error {
	v, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		return fmt.Errorf("not an integer: want %s", r)
	}
	if v < r.Min || v > r.Max {
		return outOfRange(r)
	}
	return nil
}

func (r Int) String() string { return fmt.Sprintf("%d to %d", r.Min, r.Max) }

// Uint is an unsigned integer from Min to Max.
type Uint struct{ Min, Max uint64 }

func (r Uint) Check(s string) error {
	v, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		return fmt.Errorf("not an unsigned integer: want %s", r)
	}
	if v < r.Min || v > r.Max {
		return outOfRange(r)
	}
	return nil
}

func (r Uint) String() string { return fmt.Sprintf("%d to %d", r.Min, r.Max) }

// Duration is a Go duration ("30s") from Min to Max.
type Duration struct{ Min, Max time.Duration }

func (r Duration) Check(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf(`not a duration such as "30s": want %s`, r)
	}
	if v < r.Min || v > r.Max {
		return outOfRange(r)
	}
	return nil
}

func (r Duration) String() string { return shortDuration(r.Min) + " to " + shortDuration(r.Max) }

// shortDuration drops a duration's zero tail: 24h, not 24h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// OneOf is one of a fixed list of words.
type OneOf []string

func (r OneOf) Check(s string) error {
	for _, w := range r {
		if s == w {
			return nil
		}
	}
	return outOfRange(r)
}

func (r OneOf) String() string { return "one of " + strings.Join(r, ", ") }

// Bool is true or false.
type Bool struct{}

func (Bool) Check(s string) error {
	if _, err := strconv.ParseBool(s); err != nil {
		return outOfRange(Bool{})
	}
	return nil
}

func (Bool) String() string { return "true or false" }

// Text is free text (a path, a name) of Min to Max bytes without NUL,
// which no path or name can hold.
type Text struct{ Min, Max int }

func (r Text) Check(s string) error {
	if len(s) < r.Min || len(s) > r.Max || strings.IndexByte(s, 0) >= 0 {
		return outOfRange(r)
	}
	return nil
}

func (r Text) String() string {
	if r.Min == 0 {
		return fmt.Sprintf("text of at most %d bytes, no NUL", r.Max)
	}
	return fmt.Sprintf("non-empty text of %d to %d bytes, no NUL", r.Min, r.Max)
}

// PathMax bounds a path (Linux's PATH_MAX).
const PathMax = 4096

// Path is a file or directory path; Optional allows "" (off).
func Path(optional bool) Text {
	if optional {
		return Text{0, PathMax}
	}
	return Text{1, PathMax}
}

// HostPort is a listen address host:port with a port from 0 to 65535;
// Optional allows "" (off).
type HostPort struct{ Optional bool }

func (r HostPort) Check(s string) error {
	if s == "" && r.Optional {
		return nil
	}
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%w: want %s (%v)", errRange, r, strings.TrimPrefix(err.Error(), "address "+s+": "))
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return outOfRange(r)
	}
	return nil
}

func (r HostPort) String() string {
	s := "host:port, port 0 to 65535"
	if r.Optional {
		s += ", or empty: off"
	}
	return s
}

// Octal is a permission mode in octal, 0000 to Max.
type Octal struct{ Max uint64 }

func (r Octal) Check(s string) error {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > r.Max {
		return outOfRange(r)
	}
	return nil
}

func (r Octal) String() string { return fmt.Sprintf("an octal mode 0000 to %04o", r.Max) }

// Func is a rule checked by a parser the flag's own package has.
type Func struct {
	Desc  string
	Parse func(string) error
}

func (r Func) Check(s string) error {
	if err := r.Parse(s); err != nil {
		return fmt.Errorf("%w: want %s (%v)", errRange, r.Desc, err)
	}
	return nil
}

func (r Func) String() string { return r.Desc }
