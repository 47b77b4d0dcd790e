package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	"github.com/b2bd/b2bd/internal/testca"
)

type node struct {
	d    *daemon.Daemon
	sock string
}

// startNode runs a real daemon (TCP, plaintext on loopback) in this process;
// opts change its config.
func startNode(t *testing.T, name string, opts ...func(*daemon.Config)) *node {
	t.Helper()
	dir := t.TempDir()
	cfg := daemon.Config{
		NodeName: name, Socket: filepath.Join(dir, "b2bd.sock"), SocketMode: "0660",
		PeerListen: "127.0.0.1:0", ShmDir: filepath.Join(dir, "shm"), Transport: "tcp",
		DefaultTimeout: 20 * time.Second, ShutdownGrace: 5 * time.Second, MaxDescriptors: 1 << 20, Insecure: true,
	}
	cfg.KindFlags = map[string]string{"data-listen": "127.0.0.1:0"}
	for _, o := range opts {
		o(&cfg)
	}
	d, err := daemon.New(cfg, hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Warn, Output: os.Stderr}))
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s exit: %v", name, err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("%s did not stop", name)
		}
	})
	return &node{d: d, sock: cfg.Socket}
}

// ctl runs b2bctl and returns its stdout.
func ctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := Main(ctx, args, IO{Stdout: &out, Stderr: &errb})
	if errb.Len() > 0 {
		t.Logf("b2bctl %s: stderr: %s", strings.Join(args, " "), errb.String())
	}
	return out.String(), err
}

func ctlJSON[T any](t *testing.T, args ...string) T {
	t.Helper()
	s, err := ctl(t, args...)
	if err != nil {
		t.Fatalf("b2bctl: %v", err)
	}
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("json %q: %v", s, err)
	}
	return v
}

func mapRegion(t *testing.T, sock, id string) []byte {
	t.Helper()
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rs, err := c.Regions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.GetId() == id {
			h, err := c.MapHostRegion(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = h.Unmap() })
			return h.Bytes
		}
	}
	t.Fatalf("no region %s", id)
	return nil
}

// TestTransferVerified is `b2bctl transfer --blocks 10000 --size 4096
// --verify` between two real daemons; the test then compares every byte
// itself.
func TestTransferVerified(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	const n, size, gap = 10000, 4096, 64
	regionSize := fmt.Sprint(n * (size + gap))
	src := ctlJSON[RegionJSON](t, "--socket", a.sock, "register", "--size", regionSize, "--fill", "random", "--json")
	dst := ctlJSON[RegionJSON](t, "--socket", b.sock, "register", "--json", "--size", regionSize, "--export", "dst")
	if src.ID == "" || dst.Export != "dst" || dst.Size != n*(size+gap) {
		t.Fatalf("regions %+v %+v", src, dst)
	}
	res := ctlJSON[TransferResult](t, "--socket", a.sock, "transfer", "--json",
		"--blocks", fmt.Sprint(n), "--size", fmt.Sprint(size), "--gap", fmt.Sprint(gap),
		"--src", src.ID, "--peer", b.d.PeerAddr(), "--dst", "dst", "--verify", "--dst-socket", b.sock, "--repeat", "2")
	if res.Verified == nil || !*res.Verified || res.Mismatched != 0 || res.BlocksPerBatch != n || res.BytesPerBatch != n*size || res.Batches != 2 || res.Transport != "tcp" {
		t.Fatalf("result %+v", res)
	}
	sb, db := mapRegion(t, a.sock, src.ID), mapRegion(t, b.sock, dst.ID)
	zero := make([]byte, gap)
	for i := 0; i < n; i++ {
		off := i * (size + gap)
		if !bytes.Equal(sb[off:off+size], db[off:off+size]) {
			t.Fatalf("block %d differs", i)
		}
		if !bytes.Equal(db[off+size:off+size+gap], zero) {
			t.Fatalf("gap after block %d was written", i)
		}
	}
	if bytes.Equal(sb[:size], make([]byte, size)) {
		t.Fatal("source block 0 is all zero: --fill random did nothing")
	}
	st := ctlJSON[map[string]any](t, "--socket", a.sock, "status", "--json")
	if st["batches_sent"].(float64) != 2 || st["bytes_sent"].(float64) != 2*n*size {
		t.Fatalf("status %v", st)
	}
	regs := ctlJSON[[]RegionJSON](t, "--json", "--socket", b.sock, "regions")
	if len(regs) != 1 || regs[0].ID != dst.ID || regs[0].Export != "dst" || !regs[0].Persist || regs[0].Owner == "" || regs[0].PID == 0 {
		t.Fatalf("regions %+v (b2bctl register persists; owner and pid shown)", regs)
	}
	// Tables for people.
	out, err := ctl(t, "--socket", b.sock, "regions")
	if err != nil || !strings.Contains(out, "EXPORT") || !strings.Contains(out, dst.ID) || !strings.Contains(out, "OWNER") || !strings.Contains(out, "persist") {
		t.Fatalf("regions table %q %v", out, err)
	}
}

func TestTransferToOwnPeerRefused(t *testing.T) {
	a := startNode(t, "a")
	src := ctlJSON[RegionJSON](t, "--socket", a.sock, "register", "--size", "8192", "--json")
	_, err := ctl(t, "--socket", a.sock, "transfer", "--blocks", "2", "--size", "4096", "--src", src.ID, "--peer", a.d.PeerAddr(), "--dst", "nothing")
	if err == nil || !strings.Contains(err.Error(), "batch 1 of 1") {
		t.Fatalf("err = %v", err)
	}
}

// TestChecksumFindsCorruption transfers blocks from a descriptor file,
// corrupts one landed block, and checks that checksum --per-block on both
// sides tells exactly that block apart, and that transfer --verify fails.
func TestChecksumFindsCorruption(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	src := ctlJSON[RegionJSON](t, "--socket", a.sock, "register", "--size", "65536", "--fill", "random", "--json")
	dst := ctlJSON[RegionJSON](t, "--socket", b.sock, "register", "--size", "65536", "--export", "d", "--json")
	desc := filepath.Join(t.TempDir(), "blocks.txt")
	if err := os.WriteFile(desc, []byte("# src dst len\n0 0x8000 4096\n8192 0 100\n\n16384 4096 4096 # last\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := ctlJSON[TransferResult](t, "--socket", a.sock, "transfer", "--json", "--descriptors", desc, "--src", src.ID, "--peer", b.d.PeerAddr(), "--dst", "d", "--verify", "--dst-socket", b.sock)
	if res.Verified == nil || !*res.Verified || res.BlocksPerBatch != 3 || res.BytesPerBatch != 4096+100+4096 {
		t.Fatalf("result %+v", res)
	}
	mapRegion(t, b.sock, dst.ID)[4096+7] ^= 0xff // block 2 as landed
	type sum struct {
		Digest string   `json:"digest"`
		Blocks uint64   `json:"blocks"`
		Per    []string `json:"block_digests"`
	}
	x := ctlJSON[sum](t, "--socket", a.sock, "checksum", "--json", "--per-block", "--region", src.ID, "--descriptors", desc)
	y := ctlJSON[sum](t, "--socket", b.sock, "checksum", "--json", "--per-block", "--region", dst.ID, "--descriptors", desc, "--column", "dst")
	if x.Blocks != 3 || len(x.Per) != 3 || len(y.Per) != 3 || x.Per[0] != y.Per[0] || x.Per[1] != y.Per[1] || x.Per[2] == y.Per[2] || x.Digest == y.Digest {
		t.Fatalf("checksums %+v %+v", x, y)
	}
	// --verify alone (re-sending repairs the block, so corrupt the source).
	mapRegion(t, a.sock, src.ID)[8192] ^= 0xff
	if err := os.WriteFile(desc, []byte("0 0x8000 4096\n8192 0 100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl(t, "--socket", a.sock, "transfer", "--descriptors", desc, "--src", src.ID, "--peer", b.d.PeerAddr(), "--dst", "d", "--verify", "--dst-socket", b.sock); err != nil {
		t.Fatalf("verified re-send: %v", err)
	}
}

func TestWatch(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	src := ctlJSON[RegionJSON](t, "--socket", a.sock, "register", "--size", "4096", "--json")
	dst := ctlJSON[RegionJSON](t, "--socket", b.sock, "register", "--size", "4096", "--export", "w", "--json")
	got := make(chan string, 1)
	go func() {
		out, err := ctl(t, "--socket", b.sock, "watch", "--json", "--count", "1", "--region", dst.ID)
		if err != nil {
			out = "error: " + err.Error()
		}
		got <- out
	}()
	// The watcher subscribes asynchronously: send until it has seen one.
	for {
		if _, err := ctl(t, "--socket", a.sock, "transfer", "--blocks", "1", "--size", "4096", "--src", src.ID, "--peer", b.d.PeerAddr(), "--dst", "w", "--notify", "hello"); err != nil {
			t.Fatal(err)
		}
		select {
		case out := <-got:
			var m map[string]any
			if err := json.Unmarshal([]byte(out), &m); err != nil {
				t.Fatalf("watch output %q: %v", out, err)
			}
			if m["notification"] != "hello" || m["sender"] != "a" || m["blocks"].(float64) != 1 || m["region"] != "w" {
				t.Fatalf("notification %v", m)
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"frob"}, `unknown command "frob"`},
		{[]string{"transfer", "--blocks", "1", "--size", "1"}, "--src, --peer, --dst required"},
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--blocks", "0", "--size", "1"}, "--blocks and --size must be > 0"},
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--verify"}, "--verify needs exactly one"},
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--transport", "udp"}, `--transport "udp"`},
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--blocks", "3", "--size", "1", "--descriptors", "x"}, "not both"},
		{[]string{"register"}, "--size is required"},
		{[]string{"register", "--size", "1", "--fill", "ones"}, `--fill "ones"`},
		{[]string{"checksum"}, "--region is required"},
		{[]string{"watch"}, "--region is required"},
		{[]string{"deregister"}, "at least one region"},
		// Counts and durations that make no sense: refused before the daemon is asked.
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--blocks", "1", "--size", "1", "--repeat", "0"}, "--repeat 0 must be >= 1"},
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--blocks", "1", "--size", "1", "--repeat", "-1"}, "--repeat -1 must be >= 1"},
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--blocks", "1", "--size", "1", "--timeout", "0s"}, "--timeout 0s must be > 0"},
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--blocks", "1", "--size", "1", "--timeout", "0"}, "--timeout 0s must be > 0"},
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--blocks", "1", "--size", "1", "--timeout", "-1s"}, "--timeout -1s must be > 0"},
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--blocks", "-1", "--size", "1"}, "--blocks and --size must be > 0 (got -1 and 1)"},
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--blocks", "1", "--size", "-1"}, `invalid argument "-1" for "--size"`},
		{[]string{"transfer", "--src", "r", "--peer", "p:1", "--dst", "d", "--blocks", "1", "--size", "1", "--gap", "-1"}, `invalid argument "-1" for "--gap"`},
		{[]string{"register", "--size", "0"}, "--size is required and must be > 0"},
		{[]string{"register", "--size", "-1"}, `invalid argument "-1" for "--size"`},
		{[]string{"checksum", "--region", "r", "--blocks", "-1", "--size", "8"}, "--blocks and --size must be > 0 (got -1 and 8)"},
		{[]string{"checksum", "--region", "r", "--blocks", "2", "--size", "0"}, "--blocks and --size must be > 0 (got 2 and 0)"},
		{[]string{"checksum", "--region", "r", "--blocks", "0", "--size", "8"}, "--blocks 0 must be >= 1"},
		{[]string{"checksum", "--region", "r", "--size", "8"}, "--blocks 0 must be >= 1"},
		{[]string{"checksum", "--region", "r", "--gap", "8"}, "--blocks 0 must be >= 1"},
		{[]string{"watch", "--region", "r", "--count", "-1"}, "--count -1 must be >= 0"},
	} {
		_, err := ctl(t, tc.args...)
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want usage error with %q", tc.args, err, tc.want)
		}
	}
}

func TestParseDescriptors(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Blocks
		err  string
	}{
		{in: "1 2 3\n0x10 0x20 0x30 # c\n", want: Blocks{Src: []uint64{1, 16}, Dst: []uint64{2, 32}, Len: []uint64{3, 48}}},
		{in: "# only\n\n", err: "no blocks"},
		{in: "1 2\n", err: "line 1: want 3 fields"},
		{in: "\n1 2 x\n", err: `line 2: field length "x"`},
		{in: "-1 2 3\n", err: "field src_offset"},
		{in: "1 2 0\n", err: "line 1: length is 0"},
		{in: "18446744073709551616 0 1\n", err: "not an unsigned 64-bit"},
	} {
		got, err := ParseDescriptors(strings.NewReader(tc.in), "f")
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "descriptors f") {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%q: got %v %v", tc.in, got, err)
		}
	}
}

func TestGenerate(t *testing.T) {
	b, err := Generate(3, 4096, 64)
	if err != nil || fmt.Sprint(b.Src) != "[0 4160 8320]" || fmt.Sprint(b.Dst) != fmt.Sprint(b.Src) || b.Uniform() != 4096 || b.Bytes() != 3*4096 {
		t.Fatalf("%v %v", b, err)
	}
	if _, err := Generate(4, 1<<62, 1<<62); err == nil || !strings.Contains(err.Error(), "overflows") {
		t.Fatalf("overflow: %v", err)
	}
}

func FuzzParseDescriptors(f *testing.F) {
	for _, s := range []string{"1 2 3\n", "0x1 0x2 0x3 # x\n", "1 2\n", "\n\n# c", "1 2 0", "9 9 18446744073709551615\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseDescriptors(strings.NewReader(s), "fuzz")
		if err != nil {
			if !errors.Is(err, ErrUsage) {
				t.Fatalf("error %v is not ErrUsage", err)
			}
			return
		}
		if len(b.Src) == 0 || len(b.Src) != len(b.Dst) || len(b.Src) != len(b.Len) {
			t.Fatalf("lengths %d %d %d", len(b.Src), len(b.Dst), len(b.Len))
		}
		for _, l := range b.Len {
			if l == 0 {
				t.Fatal("zero length accepted")
			}
		}
	})
}

// TestTransportNames: b2bctl takes every transport name the daemon takes
// (auto, tcp, verbs, local), and a refusal lists them all.
func TestTransportNames(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	for _, name := range []string{"auto", "tcp", "verbs", "local"} {
		_, err := ctl(t, "--socket", sock, "transfer", "--transport", name, "--timeout", "5s",
			"--src", "r", "--peer", "127.0.0.1:1", "--dst", "d", "--blocks", "1", "--size", "1")
		if err == nil || errors.Is(err, ErrUsage) || strings.Contains(err.Error(), "--transport") {
			t.Errorf("--transport %s: err = %v; want it taken (and the batch to fail on the missing daemon)", name, err)
		}
	}
	_, err := ctl(t, "transfer", "--transport", "udp", "--src", "r", "--peer", "127.0.0.1:1", "--dst", "d", "--blocks", "1", "--size", "1")
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "want auto, tcp, verbs or local") {
		t.Errorf("--transport udp: err = %v", err)
	}
}

// TestWatchUnexported: a region without an export can never be a batch's
// destination, so nothing would ever notify it; watch says so at once
// instead of waiting forever.
func TestWatchUnexported(t *testing.T) {
	a := startNode(t, "a")
	r := ctlJSON[RegionJSON](t, "--socket", a.sock, "register", "--size", "4096", "--json")
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // bounds the old hang
	defer cancel()
	err := Main(ctx, []string{"--socket", a.sock, "watch", "--region", r.ID}, IO{Stdout: &out, Stderr: &errb})
	if err == nil || !strings.Contains(err.Error(), "not exported") || !strings.Contains(err.Error(), r.ID) || ctx.Err() != nil {
		t.Fatalf("watch of an unexported region: err = %v (ctx %v)", err, ctx.Err())
	}
	_, err = ctl(t, "--socket", a.sock, "watch", "--region", "no-such-region")
	if err == nil || !strings.Contains(err.Error(), "no-such-region") {
		t.Fatalf("watch of a missing region: err = %v", err)
	}
}

// TestTransferRepeatStats: --repeat reports each batch's median and p99
// (and the total), in JSON and in the table.
func TestTransferRepeatStats(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	src := ctlJSON[RegionJSON](t, "--socket", a.sock, "register", "--size", "65536", "--json")
	ctlJSON[RegionJSON](t, "--socket", b.sock, "register", "--size", "65536", "--export", "d", "--json")
	args := []string{"--socket", a.sock, "transfer", "--blocks", "16", "--size", "1024", "--gap", "1024", "--repeat", "7",
		"--src", src.ID, "--peer", b.d.PeerAddr(), "--dst", "d"}
	res := ctlJSON[TransferResult](t, append(args, "--json")...)
	if res.Batches != 7 || res.BatchMedianSeconds <= 0 || res.BatchP99Seconds < res.BatchMedianSeconds || res.BatchP99Seconds > res.WallSeconds {
		t.Fatalf("result %+v: want 0 < median <= p99 <= wall", res)
	}
	out, err := ctl(t, args...)
	if err != nil || !strings.Contains(out, "MEDIAN") || !strings.Contains(out, "P99") || !strings.Contains(out, "TOTAL") {
		t.Fatalf("table %q %v", out, err)
	}
}

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	for _, tc := range []struct {
		in   []time.Duration
		p    int
		want time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 99, 7 * time.Millisecond},
		{ms(5, 1, 3), 50, 3 * time.Millisecond},
		{ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 100), 99, 100 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 100), 50, 5 * time.Millisecond},
	} {
		if got := percentile(tc.in, tc.p); got != tc.want {
			t.Errorf("percentile(%v, %d) = %v, want %v", tc.in, tc.p, got, tc.want)
		}
	}
}

// TestHelpListsFlags: every command's help shows its own flags and the
// global ones (what the man pages are made from), and one-dash long flags
// still work as they did with package flag.
func TestHelpListsFlags(t *testing.T) {
	for cmd, want := range map[string][]string{
		"transfer": {"--gap", "--repeat", "--transport", "auto, tcp, verbs or local", "--socket"},
		"watch":    {"--region", "--count", "--json"},
		"doctor":   {"--config", "--peer", "--rdma-netdev"},
	} {
		out, err := ctl(t, cmd, "--help")
		if err != nil {
			t.Fatalf("%s --help: %v", cmd, err)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s --help lacks %q:\n%s", cmd, w, out)
			}
		}
	}
	out, err := ctl(t, "--help")
	if err != nil || !strings.Contains(out, "doctor") || !strings.Contains(out, "completion") {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	if _, err := ctl(t, "-socket", "/nonexistent/b2bd.sock", "watch"); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "--region is required") {
		t.Fatalf("one-dash flags: %v", err)
	}
	out, err = ctl(t, "completion", "bash")
	if err != nil || !strings.Contains(out, "__start_b2bctl") {
		t.Fatalf("completion bash: %v", err)
	}
}

// TestSocketTLS: --socket host:port off loopback needs --tls-cert, --tls-key
// and --tls-ca (global flags, before or after the command); without them
// b2bctl refuses as usage and says why, before dialling.
func TestSocketTLS(t *testing.T) {
	ca := testca.New(t, "test CA")
	cert, key := ca.Issue(t, "ctl")
	const off = "192.0.2.2:17479"
	cases := []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"no tls flags", []string{"--socket", off, "status"}, true,
			"--socket 192.0.2.2:17479 is not loopback: the daemon's --api-listen there takes mutual TLS only; give --tls-cert, --tls-key and --tls-ca"},
		{"no --tls-ca", []string{"--socket", off, "--tls-cert", cert, "--tls-key", key, "regions"}, true, "give --tls-cert, --tls-key and --tls-ca"},
		{"flags after the command", []string{"status", "--socket", off, "--tls-cert", cert, "--tls-key", key}, true, "mutual TLS only"},
		{"unreadable cert", []string{"--socket", off, "--tls-cert", "/nonexistent.pem", "--tls-key", key, "--tls-ca", ca.PEM, "status"}, false,
			"--socket 192.0.2.2:17479: invalid argument: load --tls-cert /nonexistent.pem"},
		{"transfer --dst-api", []string{"--socket", "/nonexistent.sock", "transfer", "--src", "r", "--peer", "127.0.0.1:1", "--dst", "d",
			"--blocks", "1", "--size", "1", "--verify", "--dst-api", off, "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca.PEM}, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ctl(t, tc.args...)
			if tc.want == "" { // it parses, then fails on the source socket
				if err == nil || errors.Is(err, ErrUsage) {
					t.Fatalf("b2bctl %s: %v; want a dial error, not usage", strings.Join(tc.args, " "), err)
				}
				return
			}
			if err == nil || errors.Is(err, ErrUsage) != tc.usage || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("b2bctl %s: %v; want usage=%v and %q", strings.Join(tc.args, " "), err, tc.usage, tc.want)
			}
		})
	}
}

// TestAPITLS: which targets get TLS, and the client config they get.
func TestAPITLS(t *testing.T) {
	ca := testca.New(t, "test CA")
	cert, key := ca.Issue(t, "ctl")
	for _, target := range []string{"/run/b2bd/b2bd.sock", "unix:///run/b2bd.sock", "127.0.0.1:7479", "localhost:7479", "[::1]:7479"} {
		c, err := apiTLS("--socket", target, "", "", "")
		if c != nil || err != nil {
			t.Errorf("apiTLS(%s) without flags = %v, %v; want plaintext", target, c, err)
		}
	}
	c, err := apiTLS("--socket", "node-b.example:7479", cert, key, ca.PEM)
	if err != nil {
		t.Fatal(err)
	}
	if c.ServerName != "node-b.example" || len(c.Certificates) != 1 || c.RootCAs == nil {
		t.Fatalf("TLS config %+v: want ServerName node-b.example, our certificate and the CA", c)
	}
}

// TestSocketLoopbackPlaintext: a loopback host:port (--api-listen
// 127.0.0.1:PORT) stays plaintext and needs no --tls-* flags.
func TestSocketLoopbackPlaintext(t *testing.T) {
	n := startNode(t, "a", func(c *daemon.Config) { c.APIListen = "127.0.0.1:0" })
	st := ctlJSON[map[string]any](t, "--socket", n.d.APITCPAddr(), "status", "--json")
	if len(st) == 0 {
		t.Fatalf("status over %s: %v", n.d.APITCPAddr(), st)
	}
}
