// Package cli is b2bctl: a command line over a b2bd's local API (status,
// regions, register, deregister, transfer, checksum, watch) plus the host
// doctor. Tables for people, --json for scripts.
package cli

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/doctor"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// ErrUsage marks a bad command line (exit status 2).
var ErrUsage = errors.New("usage")

// IO is where a command reads and writes.
type IO struct {
	Stdout, Stderr io.Writer
}

// runner runs a command once cobra has parsed its flags; args are the
// positional arguments.
type runner func(ctx context.Context, g *globals, args []string) error

type command struct {
	name, args, help string
	// define adds the command's flags to fs and returns what runs it.
	define func(fs *pflag.FlagSet) runner
	// positional says whether the command takes arguments (deregister).
	positional bool
}

var commands = []command{
	{name: "status", help: "the daemon's version, transports and counters", define: runStatus},
	{name: "regions", help: "list registered regions", define: runRegions},
	{name: "register", args: "--size N [--export NAME [--readers PEERS]] [--fill zero|random]", help: "register a host region (it stays until deregister)", define: runRegister},
	{name: "deregister", args: "REGION...", help: "release regions", define: runDeregister, positional: true},
	{name: "transfer", args: "--src REGION --peer HOST:PORT --dst EXPORT (--blocks N --size B [--gap G] | --descriptors FILE) [--op write|read] [--repeat N] [--verify --dst-socket S]", help: "send a batch of blocks to a peer, or pull one from it (--op read)", define: runTransfer},
	{name: "checksum", args: "--region REGION [--blocks N --size B [--gap G] | --descriptors FILE [--column src|dst]] [--per-block]", help: "hash blocks of a local region", define: runChecksum},
	{name: "watch", args: "--region REGION", help: "print the notifications of batches landing in a region (it must be exported)", define: runWatch},
}

// globals are the flags every command takes.
type globals struct {
	IO
	socket string
	json   bool
	// tlsCert, tlsKey and tlsCA are mutual TLS for a --socket (or
	// transfer --dst-api) host:port off loopback.
	tlsCert, tlsKey, tlsCA string
	c                      *client.Client
}

func (g *globals) dial() (*client.Client, error) {
	if g.c != nil {
		return g.c, nil
	}
	c, err := dialAPI("--socket", g.socket, g.tlsCert, g.tlsKey, g.tlsCA)
	if err != nil {
		return nil, err
	}
	g.c = c
	return c, nil
}

// dialAPI connects to a daemon's local API at target, a Unix socket or a
// host:port (flag names where target came from, for errors).
func dialAPI(flag, target, cert, key, ca string) (*client.Client, error) {
	t, err := apiTLS(flag, target, cert, key, ca)
	if err != nil {
		return nil, err
	}
	var opts []grpc.DialOption
	if t != nil {
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(t)))
	}
	return client.Dial(target, opts...)
}

// apiTLS is the client TLS to reach a daemon's API at target, nil for
// plaintext: a Unix socket and a loopback host:port are plaintext, as the
// daemon serves them; any other host:port is the daemon's --api-listen off
// loopback, which takes mutual TLS only, so it needs cert, key and ca.
func apiTLS(flag, target, cert, key, ca string) (*tls.Config, error) {
	if strings.HasPrefix(target, "/") || strings.HasPrefix(target, "unix:") || strings.HasPrefix(target, "unix-abstract:") {
		return nil, nil
	}
	if _, _, err := net.SplitHostPort(target); err != nil || auth.IsLoopback(target) {
		return nil, nil // not host:port: gRPC resolves it as before
	}
	if cert == "" || key == "" || ca == "" {
		return nil, fmt.Errorf("%w: %s %s is not loopback: the daemon's --api-listen there takes mutual TLS only; give --tls-cert, --tls-key and --tls-ca", ErrUsage, flag, target)
	}
	t, err := auth.LoadPeerTLS(cert, key, ca)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, target, err)
	}
	return t.ClientFor(target), nil
}

func (g *globals) close() {
	if g.c != nil {
		g.c.Close()
		g.c = nil
	}
}

// NewCommand is b2bctl's command tree (cobra): the global flags, one
// command per entry of commands, doctor, and cobra's help and completion.
// cmd/b2b-man makes the man pages from it.
func NewCommand(io IO) *cobra.Command {
	g := &globals{IO: io}
	root := &cobra.Command{
		Use:   "b2bctl",
		Short: "command-line client of the local b2bd daemon",
		Long: `b2bctl talks to the local b2bd over its API socket: status, regions, register,
deregister, transfer, checksum and watch print tables for people, or JSON with --json;
doctor checks this host (and peers) for b2bd. The socket is --socket, else
$B2BD_SOCKET, else /run/b2bd/b2bd.sock; a host:port off loopback (the daemon's
--api-listen) takes mutual TLS: give --tls-cert, --tls-key and --tls-ca.`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		DisableAutoGenTag: true,
		Args:              cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("%w: unknown command %q (b2bctl --help lists them)", ErrUsage, args[0])
			}
			_ = cmd.Usage()
			return fmt.Errorf("%w: no command", ErrUsage)
		},
	}
	def := os.Getenv("B2BD_SOCKET")
	if def == "" {
		def = "/run/b2bd/b2bd.sock"
	}
	root.PersistentFlags().StringVar(&g.socket, "socket", def, "the daemon's local API: socket path, unix:///path or host:port (env B2BD_SOCKET)")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print JSON")
	root.PersistentFlags().StringVar(&g.tlsCert, "tls-cert", "", "--socket (or transfer --dst-api) host:port off loopback: our certificate, for the daemon's mutual TLS")
	root.PersistentFlags().StringVar(&g.tlsKey, "tls-key", "", "--socket (or transfer --dst-api) host:port off loopback: its key")
	root.PersistentFlags().StringVar(&g.tlsCA, "tls-ca", "", "--socket (or transfer --dst-api) host:port off loopback: the CA that signed the daemon's certificate")
	root.SetOut(io.Stdout)
	root.SetErr(io.Stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return fmt.Errorf("%w: %v", ErrUsage, err) })
	for _, c := range commands {
		cmd := &cobra.Command{Use: c.name, Short: c.help, Args: cobra.NoArgs, SilenceUsage: true, SilenceErrors: true}
		if c.args != "" {
			cmd.Use = c.name + " " + c.args
		}
		if c.positional {
			cmd.Args = cobra.ArbitraryArgs
		}
		run := c.define(cmd.Flags())
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			defer g.close()
			return run(cmd.Context(), g, args)
		}
		root.AddCommand(cmd)
	}
	root.AddCommand(doctor.NewCommand("b2bctl"))
	return root
}

// Main runs b2bctl with args (without the program name).
func Main(ctx context.Context, args []string, io IO) error {
	root := NewCommand(io)
	root.SetArgs(LongFlags(root, args))
	err := root.ExecuteContext(ctx)
	if err != nil && !errors.Is(err, ErrUsage) && isCobraUsage(err) {
		err = fmt.Errorf("%w: %v", ErrUsage, err)
	}
	return err
}

// isCobraUsage tells cobra's own command-line errors (an argument to a
// command that takes none) from a command's failure.
func isCobraUsage(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "unknown command") || strings.Contains(msg, "accepts 0 arg(s)") || strings.HasPrefix(msg, "unknown flag")
}

// LongFlags rewrites -name to --name for every multi-letter flag name of
// root's tree: package flag, which b2bd and b2bctl used before cobra, took
// long flags with one dash, and scripts may still give them so.
func LongFlags(root *cobra.Command, args []string) []string {
	names := map[string]bool{"help": true, "version": true}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) { names[f.Name] = true })
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	out := make([]string, len(args))
	for i, a := range args {
		if a == "--" {
			copy(out[i:], args[i:])
			break
		}
		out[i] = a
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			name, _, _ := strings.Cut(a[1:], "=")
			if len(name) > 1 && names[name] {
				out[i] = "-" + a
			}
		}
	}
	return out
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

// kindName is a kind as the daemon names it: name, which a daemon fills,
// else the deprecated enum's (a daemon from before names existed).
func kindName(name string, k b2bv1.TransportKind) string {
	if name != "" {
		return name
	}
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

func runStatus(fs *pflag.FlagSet) runner {
	return func(ctx context.Context, g *globals, args []string) error {
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
			rows = append(rows, []string{kindName(t.GetKindName(), t.GetKind()), fmt.Sprint(t.GetAvailable()), fmt.Sprint(t.GetConnections()),
				fmt.Sprint(t.GetQueuePairs()), fmt.Sprint(t.GetMemoryRegions()), t.GetDetail()})
		}
		if err := table(w, []string{"TRANSPORT", "AVAILABLE", "CONNS", "QPS", "MRS", "DETAIL"}, rows); err != nil {
			return err
		}
		return printCalibration(w, st.GetCalibration())
	}
}

// printCalibration says how auto chooses for a peer on this host: each
// measured route and block size, each kind's median batch, the choice and
// why.
func printCalibration(w io.Writer, c *b2bv1.Calibration) error {
	if c == nil {
		return nil
	}
	head := fmt.Sprintf("\nauto, for a peer on this host: %s", c.GetState())
	if c.GetElapsedNs() > 0 {
		head += fmt.Sprintf(" (measured in %s)", time.Duration(c.GetElapsedNs()).Round(time.Millisecond))
	}
	if c.GetFile() != "" {
		head += ", kept in " + c.GetFile()
	}
	fmt.Fprintln(w, head)
	if len(c.GetRows()) == 0 {
		fmt.Fprintln(w, "auto takes the highest-ranked transport that reaches the peer")
		return nil
	}
	var rows [][]string
	for _, r := range c.GetRows() {
		route := memName(r.GetFrom()) + "→" + memName(r.GetTo())
		if r.GetFrom() == b2bv1.MemoryKind_MEMORY_KIND_CUDA && r.GetTo() == b2bv1.MemoryKind_MEMORY_KIND_CUDA {
			route += map[bool]string{true: " (one GPU)", false: " (two GPUs)"}[r.GetSameDevice()]
		}
		var kinds []string
		for k := range r.GetMedianNs() {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		var times []string
		for _, k := range kinds {
			times = append(times, fmt.Sprintf("%s %.3f ms", k, float64(r.GetMedianNs()[k])/1e6))
		}
		for k := range r.GetFailed() {
			times = append(times, k+" failed")
		}
		rows = append(rows, []string{route, human(r.GetBlockBytes()), fmt.Sprint(r.GetBlocks()), r.GetChosen(), strings.Join(times, ", "), r.GetWhy()})
	}
	return table(w, []string{"ROUTE", "BLOCK", "BLOCKS", "AUTO", "MEDIAN BATCH", "WHY"}, rows)
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
		ts = append(ts, transportJSON{kindName(t.GetKindName(), t.GetKind()), t.GetAvailable(), t.GetDetail(), t.GetConnections(), t.GetQueuePairs(), t.GetMemoryRegions()})
	}
	return map[string]any{
		"version": st.GetVersion(), "node_name": st.GetNodeName(), "peer_address": st.GetPeerAddress(), "transports": ts,
		"cuda_available": st.GetCudaAvailable(), "cuda_detail": st.GetCudaDetail(), "regions": st.GetRegions(),
		"batches_sent": st.GetBatchesSent(), "batches_received": st.GetBatchesReceived(), "bytes_sent": st.GetBytesSent(),
		"bytes_received": st.GetBytesReceived(), "batches_failed": st.GetBatchesFailed(), "max_descriptors": st.GetMaxDescriptors(),
		"peers_connected": st.GetPeersConnected(), "goroutines": st.GetGoroutines(), "open_fds": st.GetOpenFds(),
		"calibration": calibrationJSON(st.GetCalibration()),
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
	out.RegisteredWith = append(out.RegisteredWith, r.GetRegisteredWithNames()...)
	if len(r.GetRegisteredWithNames()) == 0 {
		for _, k := range r.GetRegisteredWith() {
			out.RegisteredWith = append(out.RegisteredWith, kindName("", k))
		}
	}
	return out
}

func runRegions(fs *pflag.FlagSet) runner {
	return func(ctx context.Context, g *globals, args []string) error {
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
}

func runRegister(fs *pflag.FlagSet) runner {
	size := fs.Uint64("size", 0, "bytes (required)")
	export := fs.String("export", "", "export the region under this name, so peers can write it")
	exportTo := fs.String("export-to", "", "comma-separated peer identities allowed to write the export (default: every authenticated peer)")
	readers := fs.String("readers", "", `comma-separated peer identities allowed to read (pull from) the export; "*": every authenticated peer (default: none)`)
	readOnly := fs.Bool("read-only", false, "no peer may write the export (with --readers: a read-only export)")
	fill := fs.String("fill", "zero", "initial contents: zero or random")
	return func(ctx context.Context, g *globals, args []string) error {
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
		if *readers != "" {
			req.Readers = strings.Split(*readers, ",")
		}
		req.ReadOnly = *readOnly
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
}

func runDeregister(fs *pflag.FlagSet) runner {
	return func(ctx context.Context, g *globals, args []string) error {
		if len(args) == 0 {
			return fmt.Errorf("%w: deregister: name at least one region ID", ErrUsage)
		}
		c, err := g.dial()
		if err != nil {
			return err
		}
		for _, id := range args {
			if err := c.Deregister(ctx, id); err != nil {
				return fmt.Errorf("deregister %s: %w", id, err)
			}
		}
		return nil
	}
}

func runWatch(fs *pflag.FlagSet) runner {
	region := fs.String("region", "", "local region ID (required)")
	count := fs.Int("count", 0, "stop after this many notifications (0: until interrupted)")
	return func(ctx context.Context, g *globals, args []string) error {
		if *region == "" {
			return fmt.Errorf("%w: watch: --region is required", ErrUsage)
		}
		if *count < 0 {
			return fmt.Errorf("%w: watch: --count %d must be >= 0 (0: until interrupted)", ErrUsage, *count)
		}
		c, err := g.dial()
		if err != nil {
			return err
		}
		if err := watchable(ctx, c, *region); err != nil {
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
}

// watchable refuses to watch a region that no notification can reach.
// Notifications come with batches from peers, and a peer names the
// destination by its export (Peer.Notify looks the export name up), so a
// region without one is never notified; the daemon would take the
// subscription and the watch would wait forever without a word.
func watchable(ctx context.Context, c *client.Client, id string) error {
	rs, err := c.Regions(ctx)
	if err != nil {
		return fmt.Errorf("watch: list regions: %w", err)
	}
	for _, r := range rs {
		if r.GetId() == id {
			if r.GetExportName() == "" {
				return fmt.Errorf("watch: region %s is not exported, so no batch can land in it and nothing would ever be printed: register it with --export NAME (peers send to the export name)", id)
			}
			return nil
		}
	}
	return fmt.Errorf("watch: no region %q on this daemon (b2bctl regions lists them)", id)
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

// calibrationJSON is Status's calibration as b2bctl status --json prints
// it.
func calibrationJSON(c *b2bv1.Calibration) map[string]any {
	if c == nil {
		return nil
	}
	rows := []map[string]any{}
	for _, r := range c.GetRows() {
		rows = append(rows, map[string]any{"from": memName(r.GetFrom()), "to": memName(r.GetTo()), "same_device": r.GetSameDevice(),
			"block_bytes": r.GetBlockBytes(), "blocks": r.GetBlocks(), "median_ns": r.GetMedianNs(), "failed": r.GetFailed(),
			"chosen": r.GetChosen(), "why": r.GetWhy()})
	}
	return map[string]any{"state": c.GetState(), "elapsed_ns": c.GetElapsedNs(), "file": c.GetFile(), "rows": rows}
}
