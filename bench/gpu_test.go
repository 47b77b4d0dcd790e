package bench

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadNCU(t *testing.T) {
	cases := []struct {
		name  string
		logs  []string
		label string
		zero  bool
	}{
		{"no kernels said by both", []string{"==PROF== Connected\n==WARNING== No kernels were profiled.\n", "==WARNING== No kernels were profiled.\n"}, "0 (ncu: no kernel in either daemon)", true},
		{"a kernel in one daemon", []string{"==PROF== Profiling \"k\" - 0: 0%\n", "==WARNING== No kernels were profiled.\n"}, "≥1 (ncu: 1 kernels)", false},
		{"ncu cut off before its verdict", []string{"==PROF== Trying to shutdown target application\n", "==WARNING== No kernels were profiled.\n"}, "unknown (ncu gave no verdict)", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for i, l := range c.logs {
				if err := os.WriteFile(filepath.Join(dir, "ncu-daemon-"+string(rune('a'+i))+".log"), []byte(l), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			v, err := readNCU(dir)
			if err != nil {
				t.Fatal(err)
			}
			rows := []Row{{}}
			applyNCU(rows, v)
			if rows[0].SMsUsedLabel != c.label || (rows[0].SMsUsed != nil) != c.zero {
				t.Fatalf("label %q count %v, want %q zero=%v", rows[0].SMsUsedLabel, rows[0].SMsUsed, c.label, c.zero)
			}
		})
	}
	if _, err := readNCU(t.TempDir()); err == nil {
		t.Fatal("no logs must be an error")
	}
}
