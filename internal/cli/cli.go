// Package cli is b2bctl: a command line over a b2bd's local API (status,
// regions, register, deregister, transfer, checksum, watch) plus the host
// doctor. Tables for people, --json for scripts.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/doctor"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// ErrUsage marks a bad command line (exit status 2).
var ErrUsage = errors.New("usage")

// IO is where a command reads and writes.
type IO struct {
	Stdout, Stderr io.Writer
}

type command struct {
	name, args, help string
	run              func(ctx context.Context, g *globals, args []string) error
}

var commands []command

func init() {
	commands = []command{
		{"status", "", "the daemon's version, transports and counters", runStatus},
		{"regions", "", "list registered regions", runRegions},
		{"register", "--size N [--export NAME] [--fill zero|random]", "register a host region (it stays until deregister)", runRegister},
		{"deregister", "REGION...", "release regions", runDeregister},
		{"transfer", "--src REGION --peer HOST:PORT --dst EXPORT (--blocks N --size B [--gap G] | --descriptors FILE) [--repeat N] [--verify --dst-socket S]", "send a batch of blocks to a peer", runTransfer},
		{"checksum", "--region REGION [--blocks N --size B [--gap G] | --descriptors FILE [--column src|dst]] [--per-block]", "hash blocks of a local region", runChecksum},
		{"watch", "--region REGION", "print the notifications of batches landing in a region", runWatch},
		{"doctor", "[--json] [--peer HOST:PORT ...]", "check this host (and peers) for b2bd", nil},
	}
}

// globals are the flags every command takes.
type globals struct {
	IO
	socket string
	json   bool
	c      *client.Client
}

func (g *globals) register(fs *flag.FlagSet) {
	// A command's flags start from what the global ones said.
	def := g.socket
	if def == "" {
		def = os.Getenv("B2BD_SOCKET")
	}
	if def == "" {
		def = "/run/b2bd/b2bd.sock"
	}
	fs.StringVar(&g.socket, "socket", def, "the daemon's local API: socket path, unix:///path or host:port (env B2BD_SOCKET)")
	fs.BoolVar(&g.json, "json", g.json, "print JSON")
}

func (g *globals) dial() (*client.Client, error) {
	if g.c != nil {
		return g.c, nil
	}
	c, err := client.Dial(g.socket)
	if err != nil {
		return nil, err
	}
	g.c = c
	return c, nil
}

func (g *globals) close() {
	if g.c != nil {
		g.c.Close()
		g.c = nil
	}
}

// Main runs b2bctl with args (without the program name).
func Main(ctx context.Context, args []string, io IO) error {
	g := &globals{IO: io}
	top := flag.NewFlagSet("b2bctl", flag.ContinueOnError)
	top.SetOutput(io.Stderr)
	g.register(top)
	top.Usage = func() { usage(io.Stderr) }
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if top.NArg() == 0 {
		usage(io.Stderr)
		return fmt.Errorf("%w: no command", ErrUsage)
	}
	name, rest := top.Arg(0), top.Args()[1:]
	if name == "doctor" {
		return doctor.Command(ctx, "b2bctl", rest, io.Stdout, io.Stderr)
	}
	if name == "help" {
		usage(io.Stdout)
		return nil
	}
	for _, c := range commands {
		if c.name == name {
			defer g.close()
			err := c.run(ctx, g, rest)
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return err
		}
	}
	usage(io.Stderr)
	return fmt.Errorf("%w: unknown command %q", ErrUsage, name)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: b2bctl [--socket S] [--json] COMMAND [flags]   (COMMAND -h for its flags)")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.help)
		if c.args != "" {
			fmt.Fprintf(w, "  %-10s   %s\n", "", c.args)
		}
	}
}

// flags makes a command's FlagSet with the global flags.
func (g *globals) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("b2bctl "+name, flag.ContinueOnError)
	fs.SetOutput(g.Stderr)
	g.register(fs)
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	return nil
}

func (g *globals) emit(v any) error {
	enc := json.NewEncoder(g.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

func kindName(k b2bv1.TransportKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "TRANSPORT_KIND_"))
}

func memName(k b2bv1.MemoryKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "MEMORY_KIND_"))
}

func human(n uint64) string {
	const u = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/1024, 0
	for v >= 1024 && i < len(u)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, u[i])
}

func runStatus(ctx context.Context, g *globals, args []string) error {
	fs := g.flags("status")
	if err := parse(fs, args); err != nil {
		return err
	}
	c, err := g.dial()
	if err != nil {
		return err
	}
	st, err := c.Status(ctx)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if g.json {
		return g.emit(statusJSON(st))
	}
	w := g.Stdout
	fmt.Fprintf(w, "node %s, version %s, peer address %s\n", st.GetNodeName(), st.GetVersion(), st.GetPeerAddress())
	cuda := "no"
	if st.GetCudaAvailable() {
		cuda = "yes"
	}
	fmt.Fprintf(w, "CUDA: %s (%s)\n", cuda, st.GetCudaDetail())
	fmt.Fprintf(w, "regions %d, peers connected %d, max descriptors %d, goroutines %d, open fds %d\n",
		st.GetRegions(), st.GetPeersConnected(), st.GetMaxDescriptors(), st.GetGoroutines(), st.GetOpenFds())
	fmt.Fprintf(w, "sent %d batches (%s), received %d batches (%s), failed %d\n\n",
		st.GetBatchesSent(), human(st.GetBytesSent()), st.GetBatchesReceived(), human(st.GetBytesReceived()), st.GetBatchesFailed())
	var rows [][]string
	for _, t := range st.GetTransports() {
		rows = append(rows, []string{kindName(t.GetKind()), fmt.Sprint(t.GetAvailable()), fmt.Sprint(t.GetConnections()),
			fmt.Sprint(t.GetQueuePairs()), fmt.Sprint(t.GetMemoryRegions()), t.GetDetail()})
	}
	return table(w, []string{"TRANSPORT", "AVAILABLE", "CONNS", "QPS", "MRS", "DETAIL"}, rows)
}

type transportJSON struct {
	Kind          string `json:"kind"`
	Available     bool   `json:"available"`
	Detail        string `json:"detail"`
	Connections   uint32 `json:"connections"`
	QueuePairs    uint32 `json:"queue_pairs"`
	MemoryRegions uint32 `json:"memory_regions"`
}

func statusJSON(st *b2bv1.StatusResponse) map[string]any {
	var ts []transportJSON
	for _, t := range st.GetTransports() {
		ts = append(ts, transportJSON{kindName(t.GetKind()), t.GetAvailable(), t.GetDetail(), t.GetConnections(), t.GetQueuePairs(), t.GetMemoryRegions()})
	}
	return map[string]any{
		"version": st.GetVersion(), "node_name": st.GetNodeName(), "peer_address": st.GetPeerAddress(), "transports": ts,
		"cuda_available": st.GetCudaAvailable(), "cuda_detail": st.GetCudaDetail(), "regions": st.GetRegions(),
		"batches_sent": st.GetBatchesSent(), "batches_received": st.GetBatchesReceived(), "bytes_sent": st.GetBytesSent(),
		"bytes_received": st.GetBytesReceived(), "batches_failed": st.GetBatchesFailed(), "max_descriptors": st.GetMaxDescriptors(),
		"peers_connected": st.GetPeersConnected(), "goroutines": st.GetGoroutines(), "open_fds": st.GetOpenFds(),
	}
}

// RegionJSON is a region as b2bctl prints it.
type RegionJSON struct {
	ID             string   `json:"id"`
	Export         string   `json:"export,omitempty"`
	ExportTo       []string `json:"export_to,omitempty"`
	Size           uint64   `json:"size"`
	Kind           string   `json:"kind"`
	ShmPath        string   `json:"shm_path,omitempty"`
	CUDADevice     int32    `json:"cuda_device,omitempty"`
	ActiveBatches  uint32   `json:"active_batches"`
	RegisteredWith []string `json:"registered_with"`
	Owner          string   `json:"owner"`
	PID            int32    `json:"pid,omitempty"` // the registering process; 0: unknown (TCP)
	AgeSeconds     float64  `json:"age_seconds"`
	Persist        bool     `json:"persist"` // false: goes with its client's last connection
}

func regionJSON(r *b2bv1.Region) RegionJSON {
	out := RegionJSON{ID: r.GetId(), Export: r.GetExportName(), ExportTo: r.GetExportTo(), Size: r.GetSize(), Kind: memName(r.GetKind()),
		ShmPath: r.GetShmPath(), CUDADevice: r.GetCudaDevice(), ActiveBatches: r.GetActiveBatches(), RegisteredWith: []string{},
		Owner: r.GetOwner(), PID: r.GetPid(), AgeSeconds: time.Duration(r.GetAgeNs()).Seconds(), Persist: r.GetPersist()}
	for _, k := range r.GetRegisteredWith() {
		out.RegisteredWith = append(out.RegisteredWith, kindName(k))
	}
	return out
}

func runRegions(ctx context.Context, g *globals, args []string) error {
	fs := g.flags("regions")
	if err := parse(fs, args); err != nil {
		return err
	}
	c, err := g.dial()
	if err != nil {
		return err
	}
	rs, err := c.Regions(ctx)
	if err != nil {
		return fmt.Errorf("list regions: %w", err)
	}
	sort.Slice(rs, func(a, b int) bool { return rs[a].GetId() < rs[b].GetId() })
	out := []RegionJSON{}
	for _, r := range rs {
		out = append(out, regionJSON(r))
	}
	if g.json {
		return g.emit(out)
	}
	var rows [][]string
	for _, r := range out {
		exp := r.Export
		if exp == "" {
			exp = "-"
		} else if len(r.ExportTo) > 0 {
			exp += " (to " + strings.Join(r.ExportTo, ",") + ")"
		}
		pid, lease := "-", "client"
		if r.PID > 0 {
			pid = fmt.Sprint(r.PID)
		}
		if r.Persist {
			lease = "persist"
		}
		age := (time.Duration(r.AgeSeconds * float64(time.Second))).Round(time.Second)
		rows = append(rows, []string{r.ID, exp, human(r.Size), r.Kind, fmt.Sprint(r.ActiveBatches), strings.Join(r.RegisteredWith, ","),
			r.Owner, pid, age.String(), lease})
	}
	return table(g.Stdout, []string{"ID", "EXPORT", "SIZE", "KIND", "ACTIVE", "TRANSPORTS", "OWNER", "PID", "AGE", "LEASE"}, rows)
}

func runRegister(ctx context.Context, g *globals, args []string) error {
	fs := g.flags("register")
	size := fs.Uint64("size", 0, "bytes (required)")
	export := fs.String("export", "", "export the region under this name, so peers can write it")
	exportTo := fs.String("export-to", "", "comma-separated peer identities allowed to write the export (default: every authenticated peer)")
	fill := fs.String("fill", "zero", "initial contents: zero or random")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *size == 0 {
		return fmt.Errorf("%w: register: --size is required and must be > 0", ErrUsage)
	}
	if *fill != "zero" && *fill != "random" {
		return fmt.Errorf("%w: register: --fill %q: want zero or random", ErrUsage, *fill)
	}
	c, err := g.dial()
	if err != nil {
		return err
	}
	// b2bctl exits at once: its region must outlive it (no lease).
	req := &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: *size}}, ExportName: *export, Persist: true}
	if *exportTo != "" {
		req.ExportTo = strings.Split(*exportTo, ",")
	}
	resp, err := c.API().RegisterRegion(ctx, req)
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	r := resp.GetRegion()
	if *fill == "random" {
		h, err := c.MapHostRegion(ctx, r)
		if err != nil {
			_ = c.Deregister(ctx, r.GetId())
			return err
		}
		fillRandom(h.Bytes, uint64(time.Now().UnixNano()))
		if err := h.Unmap(); err != nil {
			return fmt.Errorf("unmap: %w", err)
		}
	}
	if g.json {
		return g.emit(regionJSON(r))
	}
	fmt.Fprintln(g.Stdout, r.GetId())
	return nil
}

func runDeregister(ctx context.Context, g *globals, args []string) error {
	fs := g.flags("deregister")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: deregister: name at least one region ID", ErrUsage)
	}
	c, err := g.dial()
	if err != nil {
		return err
	}
	for _, id := range fs.Args() {
		if err := c.Deregister(ctx, id); err != nil {
			return fmt.Errorf("deregister %s: %w", id, err)
		}
	}
	return nil
}

func runWatch(ctx context.Context, g *globals, args []string) error {
	fs := g.flags("watch")
	region := fs.String("region", "", "local region ID (required)")
	count := fs.Int("count", 0, "stop after this many notifications (0: until interrupted)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *region == "" {
		return fmt.Errorf("%w: watch: --region is required", ErrUsage)
	}
	c, err := g.dial()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Watch(ctx, *region)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	for n := 0; *count == 0 || n < *count; n++ {
		m, err := st.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch: %w", err)
		}
		if g.json {
			if err := json.NewEncoder(g.Stdout).Encode(map[string]any{
				"region": m.GetRegion(), "sender": m.GetSender(), "notification": string(m.GetNotification()),
				"blocks": m.GetBlocks(), "bytes": m.GetBytes(), "dropped": m.GetDropped(),
			}); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			continue
		}
		fmt.Fprintf(g.Stdout, "%s %s from %s: %d blocks, %s: %q", time.Now().Format(time.RFC3339), m.GetRegion(), m.GetSender(), m.GetBlocks(), human(m.GetBytes()), m.GetNotification())
		if d := m.GetDropped(); d > 0 {
			fmt.Fprintf(g.Stdout, " (%d dropped before)", d)
		}
		fmt.Fprintln(g.Stdout)
	}
	return nil
}

// fillRandom fills b with a fast xorshift stream (test data, not secrets).
func fillRandom(b []byte, seed uint64) {
	x := seed | 1
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i], b[i+1], b[i+2], b[i+3], b[i+4], b[i+5], b[i+6], b[i+7] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24), byte(x>>32), byte(x>>40), byte(x>>48), byte(x>>56)
	}
	for ; i < len(b); i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}
