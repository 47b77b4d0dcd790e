//go:build cgo && linux

package gpudirect

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildFake compiles testdata/fakecuda/fakecuda.c (a stand-in for
// libcuda.so.1) with the given defines, or skips when no C compiler works.
func buildFake(t *testing.T, defines ...string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	out := filepath.Join(t.TempDir(), "libfakecuda.so")
	args := append([]string{"-shared", "-fPIC", "-o", out, filepath.Join("testdata", "fakecuda", "fakecuda.c")}, defines...)
	if msg, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Skipf("cannot build the fake CUDA driver with %s: %v\n%s", cc, err, msg)
	}
	return out
}

// TestFakeDriver runs the GPU suite over a fake libcuda: it checks the cgo
// half (symbol table, wrappers, worker threads, errors, Close) on machines
// without a GPU. The fake fails context-bound calls made off a thread with a
// current context, as CUDA does.
func TestFakeDriver(t *testing.T) {
	driverSuite(t, buildFake(t), false)
}

func TestFakeDriverVariants(t *testing.T) {
	tests := []struct {
		name       string
		defines    []string
		env        string
		loadErr    string // substring of Load's error; "" means Load succeeds
		batchSym   string
		dmabuf     bool
		failCopyAt string // how a bad batch copy is reported
	}{
		{"cuda13", nil, "", "", "cuMemcpyBatchAsync_v2", true, "cuMemcpyBatchAsync_v2(count=8) on device 0"},
		{"cuda12.8", []string{"-DFAKE_CUDA_12080"}, "", "", "cuMemcpyBatchAsync", true, "cuMemcpyBatchAsync(count=8): copy 5"},
		{"old driver", []string{"-DFAKE_OLD"}, "", "", "", false, "cuMemcpyAsync(count=8): copy 5"},
		{"missing symbol", []string{"-DFAKE_BROKEN"}, "", "lacks cuMemAlloc_v2", "", false, ""},
		{"cuInit fails", nil, "FAKE_CUDA_INIT_FAIL", "cuInit(0) via", "", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lib := buildFake(t, tt.defines...)
			if tt.env != "" {
				t.Setenv(tt.env, "1")
			}
			c, err := Load(WithLibrary(lib))
			if tt.loadErr != "" {
				if err == nil {
					c.Close()
					t.Fatal("Load succeeded")
				}
				if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), tt.loadErr) {
					t.Fatalf("Load = %v; want ErrNoDriver mentioning %q", err, tt.loadErr)
				}
				t.Logf("Load: %v", err)
				if tt.env != "" { // the driver comes up once cuInit works
					os.Unsetenv(tt.env)
					c, err := Load(WithLibrary(lib))
					if err != nil {
						t.Fatalf("Load after cuInit recovers: %v", err)
					}
					c.Close()
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			caps := c.Capabilities()
			if caps.MemcpyBatchSymbol != tt.batchSym || caps.DmabufExport != tt.dmabuf {
				t.Fatalf("Capabilities = %+v", caps)
			}
			if !tt.dmabuf {
				if _, err := c.ExportDmabuf(0, 0x200000, 4096, 0); !errors.Is(err, ErrNotSupported) {
					t.Fatalf("ExportDmabuf = %v; want ErrUnimplemented", err)
				}
			}
			testBatch(t, c, 0, 1000, 64)
			// A copy from an address the driver rejects.
			s := must(c.StreamCreate(0))(t)
			d := must(c.MemAlloc(0, 1<<20))(t)
			var dsts, srcs, lens []uint64
			for i := 0; i < 8; i++ {
				dsts = append(dsts, uint64(d)+uint64(i)*64)
				srcs = append(srcs, uint64(d)+512+uint64(i)*64)
				lens = append(lens, 64)
			}
			srcs[5] = 0x1000
			err = c.MemcpyBatchAsync(s, dsts, srcs, lens)
			if !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), tt.failCopyAt) || !strings.Contains(err.Error(), "CUDA_ERROR_INVALID_VALUE") {
				t.Fatalf("bad batch = %v; want INVALID_VALUE mentioning %q", err, tt.failCopyAt)
			}
			t.Logf("bad batch: %v", err)
		})
	}
}
