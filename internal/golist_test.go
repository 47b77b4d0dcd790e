package internal_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// module is this repository's Go module path.
const module = "github.com/b2bd/b2bd/"

// goPackage is what `go list` says of one package, import paths relative to
// the module ("internal/peer"); other modules' imports are left out.
type goPackage struct {
	Path        string
	Dir         string
	Imports     []string // of its non-test files
	TestImports []string // of its _test files, in-package and external
	GoFiles     []string
}

// listPackages runs `go list` over the whole module (from its root, one
// directory up).
func listPackages(t *testing.T) []goPackage {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil { // make may run the tests with a go that is not on PATH
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goBin, "list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .Imports \" \"}}\t{{join .TestImports \" \"}} {{join .XTestImports \" \"}}\t{{join .GoFiles \" \"}}", "./...")
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	own := func(list string) []string {
		var r []string
		for _, p := range strings.Fields(list) {
			if strings.HasPrefix(p, module) {
				r = append(r, strings.TrimPrefix(p, module))
			}
		}
		return r
	}
	var pkgs []goPackage
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 {
			t.Fatalf("go list line %q", sc.Text())
		}
		pkgs = append(pkgs, goPackage{Path: strings.TrimPrefix(f[0], module), Dir: f[1], Imports: own(f[2]), TestImports: own(f[3]), GoFiles: strings.Fields(f[4])})
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	return pkgs
}

// under says whether package path p is dir or inside it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
