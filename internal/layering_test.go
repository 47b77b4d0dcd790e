package internal_test

import (
	"fmt"
	"strings"
	"testing"
)

// layers is the repository's layering, top first: a package imports only
// packages of its own layer or below. A pattern ending in "/*" names the
// packages inside a directory (the transport kinds), not the directory's
// own package; the longest matching pattern decides.
var layers = [][]string{
	{"cmd", "bench", "client", "examples", "deploy", "internal/cli", "internal/doctor", "internal/e2e", "internal/soak"},
	{"internal/daemon"},
	{"server"},
	{"internal/peer", "internal/batch", "internal/checksum", "internal/metrics", "internal/health"},
	{"internal/region", "internal/notify"},
	{"internal/transport/*"},
	{"internal/transport"},
	{"internal/staging", "internal/memguard", "internal/topology", "internal/desc", "internal/layout", "internal/auth", "internal/trigger", "internal/ring"},
	{"gpudirect", "verbs"},
	{"internal/memory", "internal/errs", "internal/callerdeadline", "internal/callid", "internal/dl", "internal/config", "proto", "internal/testca", "internal/loopport"},
}

// layerOf is p's layer index (0 is the top), -1 when no pattern names it.
func layerOf(p string) int {
	best, bestLen := -1, -1
	for i, l := range layers {
		for _, pat := range l {
			ok := false
			if base, inside := strings.CutSuffix(pat, "/*"); inside {
				ok = strings.HasPrefix(p, base+"/")
			} else {
				ok = under(p, pat)
			}
			if ok && len(pat) > bestLen {
				best, bestLen = i, len(pat)
			}
		}
	}
	return best
}

// upward lists the imports of non-test files that point up the layers,
// and the packages without a layer. Test-only packages (no GoFiles) have
// no layer to keep.
func upward(pkgs []goPackage) []string {
	var bad []string
	for _, p := range pkgs {
		if len(p.GoFiles) == 0 {
			continue
		}
		lp := layerOf(p.Path)
		if lp < 0 {
			bad = append(bad, "package "+p.Path+" has no layer: add it to layers")
			continue
		}
		for _, imp := range p.Imports {
			li := layerOf(imp)
			switch {
			case li < 0:
				bad = append(bad, "package "+imp+" has no layer: add it to layers")
			case li < lp:
				bad = append(bad, fmt.Sprintf("%s (layer %d) imports %s (layer %d): imports point down the layers", p.Path, lp, imp, li))
			}
		}
	}
	return bad
}

// TestLayering: every import of a non-test file points down the layers (or
// stays in its layer), and every package has a layer.
func TestLayering(t *testing.T) {
	for _, b := range upward(listPackages(t)) {
		t.Error(b)
	}
}

// TestLayeringCatches: the check reports an import that points up and a
// package without a layer.
func TestLayeringCatches(t *testing.T) {
	got := upward([]goPackage{
		{Path: "internal/transport", GoFiles: []string{"a.go"}, Imports: []string{"internal/errs", "internal/peer"}},
		{Path: "internal/newthing", GoFiles: []string{"a.go"}},
		{Path: "internal", Imports: []string{"cmd/b2bd"}}, // test-only
	})
	if len(got) != 2 || !strings.Contains(got[0], "internal/transport (layer 6) imports internal/peer (layer 3)") || !strings.Contains(got[1], "internal/newthing has no layer") {
		t.Fatalf("upward = %q", got)
	}
}

// TestLayerOf pins the matching rules the check relies on.
func TestLayerOf(t *testing.T) {
	for p, want := range map[string]int{
		"internal/transport":                6,
		"internal/transport/tcp":            5,
		"internal/transport/verbs/rails/vm": 5,
		"internal/errs/grpcstatus":          9,
		"proto/b2b/v1":                      9,
		"cmd/b2bd":                          0,
		"internal/daemon":                   1,
		"internal/nowhere":                  -1,
	} {
		if got := layerOf(p); got != want {
			t.Errorf("layerOf(%s) = %d, want %d", p, got, want)
		}
	}
}
