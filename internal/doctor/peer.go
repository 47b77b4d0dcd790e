package doctor

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/peer"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// PeerOptions says how to reach and test a peer daemon.
type PeerOptions struct {
	Addr     string        // the peer's --peer-listen address, host:port
	TLS      *auth.PeerTLS // this host's peer certificate; nil with Insecure
	Insecure bool          // plaintext, loopback only
	Socket   string        // the local daemon's API, for the round trip
	// PeerExport is a region the peer exports that the round trip may
	// overwrite (its first RoundTripBytes); PeerAPI is the peer daemon's
	// local API, through which the round trip registers its own region and
	// compares checksums on both sides. Either may be empty.
	PeerExport, PeerAPI string
	Timeout             time.Duration // per step (default 5 s)
}

// Round trip size: RoundTripBlocks blocks of RoundTripBlock bytes.
const (
	RoundTripBlocks = 16
	RoundTripBlock  = 4096
	RoundTripBytes  = RoundTripBlocks * RoundTripBlock
)

// Peer runs the peer checks: reachability, TLS trust, the transports the
// peer offers, and a small verified round trip through the local daemon.
// A check that cannot run says why.
func Peer(ctx context.Context, o PeerOptions) []Result {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	pfx := "peer " + o.Addr + " "
	out := []Result{checkReach(ctx, o, pfx+"reachable")}
	if out[0].Status == Fail {
		for _, c := range []string{"tls", "transports", "round-trip"} {
			out = append(out, res(pfx+c, Fail, "fix reachability first", "not run: the peer is unreachable"))
		}
		return out
	}
	tlsR := checkTLS(ctx, o, pfx+"tls")
	out = append(out, tlsR)
	hs, tr := checkTransports(ctx, o, pfx+"transports", tlsR.Status != Fail)
	out = append(out, tr)
	if hs == nil {
		out = append(out, res(pfx+"round-trip", tr.Status, "fix the transports check first", "not run: no handshake with the peer"))
		return out
	}
	out = append(out, checkRoundTrip(ctx, o, pfx+"round-trip", hs))
	return out
}

func checkReach(ctx context.Context, o PeerOptions, c string) Result {
	if _, _, err := net.SplitHostPort(o.Addr); err != nil {
		return res(c, Fail, "give --peer as host:port (the peer's --peer-listen)", "bad address %q: %v", o.Addr, err)
	}
	d := net.Dialer{Timeout: o.Timeout}
	start := time.Now()
	conn, err := d.DialContext(ctx, "tcp", o.Addr)
	if err != nil {
		return res(c, Fail, "check that b2bd runs there with this --peer-listen address, and that no firewall drops the TCP port", "TCP connect failed: %v", err)
	}
	conn.Close()
	return res(c, Pass, "", "TCP connect in %s", time.Since(start).Round(time.Microsecond))
}

// dialOpt is the gRPC credential for the peer control plane.
func (o PeerOptions) dialOpt() grpc.DialOption {
	if o.TLS == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(o.TLS.ClientFor(o.Addr)))
}

func checkTLS(ctx context.Context, o PeerOptions, c string) Result {
	if o.Insecure {
		if !auth.IsLoopback(o.Addr) {
			return res(c, Fail, "use --tls-cert/--tls-key/--tls-ca off this host", "--insecure is only allowed to loopback peers, and %s is not one", o.Addr)
		}
		return res(c, Warn, "nothing to do on loopback; between hosts give the daemon's --tls-cert/--tls-key/--tls-ca", "not checked: plaintext (--insecure) on loopback")
	}
	if o.TLS == nil {
		return res(c, Warn, "give --tls-cert, --tls-key and --tls-ca as the daemon has them (or --insecure for a loopback peer)", "not checked: no TLS flags given")
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: o.Timeout}, Config: o.TLS.ClientFor(o.Addr)}
	d.Config.NextProtos = []string{"h2"}
	conn, err := d.DialContext(ctx, "tcp", o.Addr)
	if err != nil {
		fix := "the peer's certificate must chain to this --tls-ca and name the host in --peer (a SAN); ours must chain to the peer's CA (make certs)"
		var ue x509.UnknownAuthorityError
		if errors.As(err, &ue) {
			fix = "the peer's certificate is signed by a CA not in --tls-ca: use the same CA bundle on both hosts"
		}
		return res(c, Fail, fix, "TLS handshake failed: %v", err)
	}
	defer conn.Close()
	st := conn.(*tls.Conn).ConnectionState()
	id := "?"
	var exp time.Time
	if len(st.PeerCertificates) > 0 {
		id, exp = auth.Identity(st.PeerCertificates[0]), st.PeerCertificates[0].NotAfter
	}
	if !exp.IsZero() && time.Until(exp) < 14*24*time.Hour {
		return res(c, Warn, "renew the peer's certificate", "peer certificate %q is trusted but expires %s", id, exp.Format(time.RFC3339))
	}
	return res(c, Pass, "", "mutual TLS %s, peer certificate %q trusted, valid until %s", tls.VersionName(st.Version), id, exp.Format("2006-01-02"))
}

func checkTransports(ctx context.Context, o PeerOptions, c string, tlsOK bool) (*b2bv1.HandshakeResponse, Result) {
	if !tlsOK {
		return nil, res(c, Fail, "fix TLS trust first", "not run: TLS handshake failed")
	}
	if o.TLS == nil && !o.Insecure {
		return nil, res(c, Warn, "give the TLS flags (or --insecure for a loopback peer)", "not run: no credentials to call the peer with")
	}
	cc, err := grpc.NewClient(o.Addr, o.dialOpt())
	if err != nil {
		return nil, res(c, Fail, "check --peer", "dial: %v", err)
	}
	defer cc.Close()
	cctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	hs, err := b2bv1.NewPeerClient(cc).Handshake(cctx, &b2bv1.HandshakeRequest{ProtocolVersion: peer.ProtocolVersion, NodeName: "b2bd-doctor"})
	if err != nil {
		if status.Code(err) == codes.FailedPrecondition {
			return nil, res(c, Fail, "run the same b2bd version on both hosts", "handshake refused: %v", err)
		}
		return nil, res(c, Fail, "check that the address is a b2bd --peer-listen port (not --data-listen or the API)", "handshake failed: %v", err)
	}
	names := make([]string, 0, len(hs.GetAdverts()))
	for k := range hs.GetAdverts() {
		names = append(names, k)
	}
	slices.Sort(names)
	d := fmt.Sprintf("peer %q (protocol %d) offers %s", hs.GetNodeName(), hs.GetProtocolVersion(), strings.Join(names, ", "))
	if len(names) == 0 {
		return hs, res(c, Fail, "check the peer's log: its transports failed to start", "%s nothing", strings.TrimSuffix(d, " offers "))
	}
	if !slices.Contains(names, "verbs") {
		return hs, res(c, Warn, "for RDMA run doctor on the peer: it needs an active RDMA port (and --transport auto or verbs)", "%s; no verbs, so batches to it use TCP", d)
	}
	return hs, res(c, Pass, "", "%s", d)
}

const roundTripHint = "give --peer-api ADDR (the peer daemon's local API: the check registers, compares and removes its own region there) or --peer-export NAME (a region the peer exports that this check may overwrite, its first 64 KiB)"

func checkRoundTrip(ctx context.Context, o PeerOptions, c string, _ *b2bv1.HandshakeResponse) Result {
	if o.Socket == "" {
		return res(c, Warn, "give --socket, the local daemon's API", "not run: no local daemon to send through")
	}
	ctx, cancel := context.WithTimeout(ctx, 6*o.Timeout)
	defer cancel()
	local, err := client.Dial(o.Socket)
	if err != nil {
		return res(c, Warn, "start b2bd here, or give its --socket", "not run: %v", err)
	}
	defer local.Close()
	if _, err := local.Status(ctx); err != nil {
		return res(c, Warn, "start b2bd here, or give its --socket", "not run: local daemon at %s does not answer: %v", o.Socket, err)
	}
	if o.PeerAPI == "" && o.PeerExport == "" {
		return res(c, Warn, roundTripHint, "not run: the peer exports nothing this check may write")
	}
	src, err := local.RegisterHost(ctx, RoundTripBytes, "")
	if err != nil {
		return res(c, Fail, "see the local daemon's log; run doctor on this host", "register a %d-byte host region locally: %v", RoundTripBytes, err)
	}
	defer func() { _ = src.Unmap(); _ = local.Deregister(context.WithoutCancel(ctx), src.GetId()) }()
	if _, err := rand.Read(src.Bytes); err != nil {
		return res(c, Fail, "", "random fill: %v", err)
	}
	// Blocks land in reverse order, so an offset bug shows in the checksums.
	offs, dst := make([]uint64, RoundTripBlocks), make([]uint64, RoundTripBlocks)
	for i := range offs {
		offs[i], dst[i] = uint64(i)*RoundTripBlock, uint64(RoundTripBlocks-1-i)*RoundTripBlock
	}
	export := o.PeerExport
	var remote *client.Client
	var remoteID string
	if o.PeerAPI != "" {
		var opts []grpc.DialOption
		if o.TLS != nil && !auth.IsLoopback(o.PeerAPI) && !strings.HasPrefix(o.PeerAPI, "/") && !strings.HasPrefix(o.PeerAPI, "unix:") {
			opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(o.TLS.ClientFor(o.PeerAPI))))
		}
		remote, err = client.Dial(o.PeerAPI, opts...)
		if err != nil {
			return res(c, Fail, "check --peer-api", "%v", err)
		}
		defer remote.Close()
		export = "b2bd-doctor-" + randHex()
		resp, err := remote.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
			Source:     &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: RoundTripBytes}},
			ExportName: export,
		})
		if err != nil {
			return res(c, Fail, "check --peer-api (off the host it needs the peer's --api-listen with TLS)", "register a region through the peer's API %s: %v", o.PeerAPI, err)
		}
		remoteID = resp.GetRegion().GetId()
		defer func() { _ = remote.Deregister(context.WithoutCancel(ctx), remoteID) }()
	}
	start := time.Now()
	br, err := local.BatchTransfer(ctx, client.Transfer{SrcRegion: src.GetId(), Peer: o.Addr, DstRegion: export,
		Blocks: client.Descriptors{Src: offs, Dst: dst, BlockLength: RoundTripBlock}})
	if err != nil {
		switch status.Code(err) {
		case codes.NotFound, codes.PermissionDenied:
			return res(c, Warn, roundTripHint+"; the export must allow this host's identity", "the peer has no usable export %q: %v", export, err)
		case codes.OutOfRange, codes.InvalidArgument:
			return res(c, Warn, fmt.Sprintf("export a region of at least %d bytes", RoundTripBytes), "transfer into %q refused: %v", export, err)
		}
		return res(c, Fail, "see both daemons' logs; run doctor on the peer too", "transfer %d x %d B to %s/%s failed: %v", RoundTripBlocks, RoundTripBlock, o.Addr, export, err)
	}
	took := time.Since(start)
	sent := fmt.Sprintf("%d blocks x %d B over %s in %s", br.GetBlocks(), RoundTripBlock, strings.ToLower(strings.TrimPrefix(br.GetTransport().String(), "TRANSPORT_KIND_")), took.Round(time.Microsecond))
	if remote == nil {
		return res(c, Warn, "give --peer-api to compare checksums on both sides", "%s, acknowledged by the peer; contents not compared (no --peer-api)", sent)
	}
	a, err := local.Checksum(ctx, src.GetId(), offs, nil, RoundTripBlock, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_XXH64, true)
	if err != nil {
		return res(c, Fail, "see the local daemon's log", "checksum locally: %v", err)
	}
	b, err := remote.Checksum(ctx, remoteID, dst, nil, RoundTripBlock, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_XXH64, true)
	if err != nil {
		return res(c, Fail, "see the peer daemon's log", "checksum at the peer: %v", err)
	}
	if !bytes.Equal(a.GetBlockDigests(), b.GetBlockDigests()) || a.GetDigest() != b.GetDigest() {
		return res(c, Fail, "this is a data corruption: keep both daemons' logs and report it", "%s, but checksums differ (local %#x, peer %#x)", sent, a.GetDigest(), b.GetDigest())
	}
	return res(c, Pass, "", "%s, per-block checksums match (%#x)", sent, a.GetDigest())
}

func randHex() string {
	n, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	return hex.EncodeToString(n.Bytes())
}
