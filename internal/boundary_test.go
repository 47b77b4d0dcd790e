package internal_test

import (
	"fmt"
	"go/parser"
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The transport boundary: a kind's details stay in its own
// folders. Each kind is a family of packages (its Go packages and its proto
// package); nothing outside a family names it, except the one registration
// list, internal/daemon/builtins.go.
var kindFamilies = map[string][]string{
	"tcp":   {"internal/transport/tcp", "proto/b2b/transport/tcp"},
	"local": {"internal/transport/local", "proto/b2b/transport/local"},
	// rails is verbs over several RDMA devices: the same kind.
	"verbs": {"internal/transport/verbs", "internal/transport/verbs/rails", "proto/b2b/transport/verbs"},
}

// registration is the one file that imports the kinds' packages.
const registrationPkg, registrationFile = "internal/daemon", "builtins.go"

// testExceptions are the only tests outside a kind that import its
// packages, each for a reason: the e2e suite rewrites a peer's tcp advert
// to stall its data path (deadline_test.go), the server's tests run the
// real tcp transport as their data plane, and the tests of the choice by
// Caps fall back to it: the peer manager's (caps_test.go) and rails'
// (choice_test.go, the real rails Caps beside tcp).
var testExceptions = map[string][]string{
	"internal/e2e":                   {"proto/b2b/transport/tcp"},
	"internal/peer":                  {"internal/transport/tcp"},
	"internal/transport/verbs/rails": {"internal/transport/tcp"},
	"server":                         {"internal/transport/tcp"},
}

// familyOf is the kind whose family holds package p, "" for none.
func familyOf(p string) string {
	for k, dirs := range kindFamilies {
		for _, d := range dirs {
			if under(p, d) {
				return k
			}
		}
	}
	return ""
}

// importLeaks lists the imports of a kind's package from outside its
// family. fileImports gives the kind imports of one file of the
// registration package, so only the registration file may have them.
func importLeaks(pkgs []goPackage, fileImports func(dir, file string) ([]string, error)) []string {
	var bad []string
	for _, p := range pkgs {
		own := familyOf(p.Path)
		for _, imp := range p.Imports {
			k := familyOf(imp)
			if k == "" || k == own {
				continue
			}
			if p.Path != registrationPkg {
				bad = append(bad, fmt.Sprintf("%s imports %s (kind %s): only %s/%s may", p.Path, imp, k, registrationPkg, registrationFile))
			}
		}
		for _, imp := range p.TestImports {
			k := familyOf(imp)
			if k == "" || k == own || slices.ContainsFunc(testExceptions[p.Path], func(d string) bool { return under(imp, d) }) {
				continue
			}
			bad = append(bad, fmt.Sprintf("tests of %s import %s (kind %s): not one of testExceptions", p.Path, imp, k))
		}
		if p.Path != registrationPkg {
			continue
		}
		for _, f := range p.GoFiles {
			imps, err := fileImports(p.Dir, f)
			if err != nil {
				bad = append(bad, err.Error())
				continue
			}
			for _, imp := range imps {
				if k := familyOf(imp); k != "" && f != registrationFile {
					bad = append(bad, fmt.Sprintf("%s/%s imports %s (kind %s): only %s may", p.Path, f, imp, k, registrationFile))
				}
			}
		}
	}
	return bad
}

// kindImports are the module imports of one Go file.
func kindImports(dir, file string) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, file), nil, parser.ImportsOnly)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range f.Imports {
		p, _ := strconv.Unquote(s.Path.Value)
		if strings.HasPrefix(p, module) {
			out = append(out, strings.TrimPrefix(p, module))
		}
	}
	return out, nil
}

// TestKindImports: only the registration list imports a kind's packages
// (and a kind no other kind's); tests only as testExceptions say.
func TestKindImports(t *testing.T) {
	for _, b := range importLeaks(listPackages(t), kindImports) {
		t.Error(b)
	}
}

// TestKindImportsCatches: the check reports a core package importing a
// kind, a second file of the registration package doing so, one kind
// importing another, and a test outside the exceptions.
func TestKindImportsCatches(t *testing.T) {
	got := importLeaks([]goPackage{
		{Path: "internal/peer", Imports: []string{"internal/transport", "internal/transport/local"}},
		{Path: "internal/daemon", GoFiles: []string{"builtins.go", "daemon.go"}, Imports: []string{"internal/transport/tcp"}},
		{Path: "internal/transport/tcp", Imports: []string{"proto/b2b/transport/verbs/v1", "proto/b2b/transport/tcp/v1"}},
		{Path: "internal/batch", TestImports: []string{"internal/transport/tcp"}},
		{Path: "internal/e2e", TestImports: []string{"proto/b2b/transport/tcp/v1"}},
	}, func(dir, file string) ([]string, error) { return []string{"internal/transport/tcp"}, nil })
	want := []string{"internal/peer imports internal/transport/local", "internal/daemon/daemon.go imports internal/transport/tcp",
		"internal/transport/tcp imports proto/b2b/transport/verbs/v1", "tests of internal/batch import internal/transport/tcp"}
	if len(got) != len(want) {
		t.Fatalf("leaks %q, want %d", got, len(want))
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Errorf("leak %d = %q, want %q", i, got[i], want[i])
		}
	}
}

// kindNames matches, in code (identifiers and strings, not comments), the
// names of the kinds' proto packages and import paths, and the
// kind-specific types and RPCs the shared layers once had;
// kindPackages the kinds' Go package names, used as a qualifier ("rails."
// but not a variable named rails).
var kindPackages = map[string]bool{"rails": true}
var kindNames = regexp.MustCompile(`^(verbsv1|tcpv1|localv1|VerbsConnect|VerbsAccept|VerbsAcceptor|VerbsPort|VerbsRail|VerbsEndpoint|TCPEndpoint|LocalEndpoint|ConnectVerbs|DisconnectVerbs|RailKeys|GetVerbsRails|GetTcpDataAddress|GetLocal)$|"[^"]*(internal/transport/(tcp|verbs|local)|b2b/transport/(verbs|tcp|local))\b`)

// nameLeaks lists where a non-test Go file outside the kinds' folders
// names a kind, in code.
func nameLeaks(root string) ([]string, error) {
	var bad []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || familyOf(rel) != "" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") || rel == registrationPkg+"/"+registrationFile {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		var s scanner.Scanner
		s.Init(fset.AddFile(rel, -1, len(src)), src, nil, 0) // comments skipped
		var prev string
		var prevPos token.Pos
		for {
			pos, tok, lit := s.Scan()
			if tok == token.EOF {
				break
			}
			if (tok == token.IDENT || tok == token.STRING) && kindNames.MatchString(lit) {
				bad = append(bad, fmt.Sprintf("%s: %s names a transport kind's package or type", fset.Position(pos), lit))
			}
			if tok == token.PERIOD && kindPackages[prev] {
				bad = append(bad, fmt.Sprintf("%s: %s. names a transport kind's package", fset.Position(prevPos), prev))
			}
			prev, prevPos = "", pos
			if tok == token.IDENT {
				prev = lit
			}
		}
		return nil
	})
	return bad, err
}

// TestKindNames: the grep half of the boundary check.
func TestKindNames(t *testing.T) {
	bad, err := nameLeaks("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Error(b)
	}
}

// TestKindNamesCatches: a file naming a kind's proto package or an old
// kind type is reported; the same words in comments are not.
func TestKindNamesCatches(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("internal/peer/a.go", "package peer\n\n// verbsv1 and rails in a comment are fine.\nimport verbsv1 \"x/proto/b2b/transport/verbs/v1\"\n\nvar _ = verbsv1.Advert{}\n")
	write("internal/peer/b_test.go", "package peer\n\nvar x rails.Endpoint\n")
	write("internal/metrics/e.go", "package metrics\n\nfunc f(local int) int { return local + rails.MaxStreams }\n")
	write("internal/transport/local/c.go", "package local\n\ntype Endpoint struct{}\n")
	write("internal/batch/d.go", "package batch\n\nvar _ transport.VerbsPort\n")
	bad, err := nameLeaks(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"internal/batch/d.go:3:17: VerbsPort", "internal/metrics/e.go:3:40: rails.", "internal/peer/a.go:4:8: verbsv1", "internal/peer/a.go:4:16: \"x/proto/b2b/transport/verbs/v1\"", "internal/peer/a.go:6:9: verbsv1"}
	if len(bad) != len(want) {
		t.Fatalf("leaks %q, want %d", bad, len(want))
	}
	for i := range want {
		if !strings.Contains(bad[i], want[i]) {
			t.Errorf("leak %d = %q, want %q", i, bad[i], want[i])
		}
	}
}

// TestPeerProtoNamesNoKind: the Peer service's RPCs and messages carry
// kinds as strings and their data as bytes; none is named in them (the B2B
// service above it may name kinds, for the user's choice and Status).
func TestPeerProtoNamesNoKind(t *testing.T) {
	src, err := os.ReadFile("../proto/b2b/v1/b2b.proto")
	if err != nil {
		t.Fatal(err)
	}
	_, peer, ok := strings.Cut(string(src), "\nservice Peer {")
	if !ok {
		t.Fatal("b2b.proto has no Peer service")
	}
	kind := regexp.MustCompile(`(?i)verbs|tcp|local|rail|TransportKind|rkey|qp`)
	for i, line := range strings.Split(peer, "\n") {
		code, _, _ := strings.Cut(line, "//")
		if m := kind.FindString(code); m != "" && !strings.HasPrefix(strings.TrimSpace(code), "reserved") {
			t.Errorf("b2b.proto, Peer service line %d: %q names a transport kind (%s)", i+1, strings.TrimSpace(line), m)
		}
	}
}
