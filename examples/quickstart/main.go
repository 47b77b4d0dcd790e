// Command quickstart moves 10,000 blocks from one b2bd daemon to another and
// verifies every block: the Go half of the README's quick start
// (examples/quickstart/quickstart.sh runs it against two fresh daemons).
//
//	go run ./examples/quickstart --src /tmp/a/b2bd.sock --dst /tmp/b/b2bd.sock --peer 127.0.0.1:7480
//
// --src is the sending host's daemon, --dst the receiving host's (here both
// on this machine), --peer the receiving daemon's peer address.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

const (
	blocks    = 10_000
	blockSize = 4096
	stride    = 2 * blockSize // a gap after every block, so that no two blocks merge into one
)

func main() {
	src := flag.String("src", os.Getenv("B2BD_SOCKET"), "the sending daemon's local API (default $B2BD_SOCKET)")
	dst := flag.String("dst", "", "the receiving daemon's local API (socket path or host:port)")
	peer := flag.String("peer", "", "the receiving daemon's peer address, host:port")
	flag.Parse()
	if *src == "" || *dst == "" || *peer == "" {
		fmt.Fprintln(os.Stderr, "quickstart: --src (or $B2BD_SOCKET), --dst and --peer are required")
		os.Exit(2)
	}
	if err := run(*src, *dst, *peer); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart: FAIL:", err)
		os.Exit(1)
	}
}

func run(srcAPI, dstAPI, peer string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	a, err := client.Dial(srcAPI) // the sending host's daemon
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := client.Dial(dstAPI) // the receiving host's daemon
	if err != nil {
		return err
	}
	defer b.Close()

	// The receiver exports a region under a name; the sender's region is
	// daemon-allocated shared memory, mapped here as src.Bytes.
	export := fmt.Sprintf("quickstart-go-%d", os.Getpid())
	dst, err := b.RegisterHost(ctx, blocks*stride, export) // on the receiving daemon
	if err != nil {
		return fmt.Errorf("register the destination: %w", err)
	}
	defer b.Deregister(context.Background(), dst.Id)
	defer dst.Unmap()
	src, err := a.RegisterHost(ctx, blocks*stride, "") // on the sending daemon; mapped here as src.Bytes
	if err != nil {
		return fmt.Errorf("register the source: %w", err)
	}
	defer a.Deregister(context.Background(), src.Id)
	defer src.Unmap()
	if _, err := rand.Read(src.Bytes); err != nil {
		return err
	}

	// Block i goes from slot i to slot blocks-1-i: gapped on both sides.
	srcOffsets := make([]uint64, blocks)
	dstOffsets := make([]uint64, blocks)
	for i := range srcOffsets {
		srcOffsets[i] = uint64(i) * stride
		dstOffsets[i] = uint64(blocks-1-i) * stride
	}
	resp, err := a.BatchTransfer(ctx, client.Transfer{
		SrcRegion: src.Id, Peer: peer, DstRegion: export,
		Blocks: client.Descriptors{Src: srcOffsets, Dst: dstOffsets, BlockLength: blockSize},
	})
	if err != nil { // nil only once every byte landed and the receiver acknowledged the batch
		return fmt.Errorf("batch transfer: %w", err)
	}
	fmt.Printf("go: %d blocks, %d bytes over %s in %.2f ms\n", resp.GetBlocks(), resp.GetBytes(),
		strings.ToLower(strings.TrimPrefix(resp.GetTransport().String(), "TRANSPORT_KIND_")), float64(resp.GetElapsedNs())/1e6)

	// Verify: each daemon hashes every block of its own region.
	want, err := a.Checksum(ctx, src.Id, srcOffsets, nil, blockSize, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_XXH64, true)
	if err != nil {
		return fmt.Errorf("checksum the source: %w", err)
	}
	got, err := b.Checksum(ctx, dst.Id, dstOffsets, nil, blockSize, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_XXH64, true)
	if err != nil {
		return fmt.Errorf("checksum the destination: %w", err)
	}
	if !slices.Equal(client.Unpack(want.GetBlockDigests()), client.Unpack(got.GetBlockDigests())) || got.GetBlocks() != blocks {
		return fmt.Errorf("the destination's %d block digests differ from the source's", got.GetBlocks())
	}
	fmt.Printf("go: verified %d blocks (xxh64 of every block on both daemons)\n", got.GetBlocks())
	return nil
}
