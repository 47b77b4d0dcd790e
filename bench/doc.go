// Package bench is b2bd's benchmark: batches of thousands of discrete blocks
// moved between two daemons, swept over block sizes, every block verified,
// and compared with a plain TCP stream on the same machine.
//
// Method, per block size:
//
//   - Layout: the source and destination regions are cut into slots of a
//     block plus a gap (min(block, 4 KiB)); block i goes to a random slot on
//     each side, from independent permutations. No two blocks touch, so the
//     daemons cannot merge neighbours and every block costs what it costs.
//   - Regions: one source region (mapped into the bench, which fills it) and
//     one exported destination region (never mapped here, so the same code
//     serves two hosts) are registered once, sized for the largest planned
//     size, and reused. The source is refilled with fresh pseudo-random data
//     per size, so what an earlier size left in the destination cannot match.
//   - Batches: one warm-up, then --iters timed BatchTransfer calls, timed
//     around the API call (what an application waits for). Before each batch
//     the first and last 8 bytes of every source block get a new stamp, so
//     the final verification proves the last batch delivered every block.
//   - Verification: both daemons' per-block CRC32C of every block, compared
//     block by block; a sample of source blocks is also hashed by the bench
//     itself, so a checksum that ignored the data could not pass.
//   - Memory cap: both regions (embedded mode) live on this host's tmpfs;
//     the block count is capped to MemAvailable less a tenth (at least
//     2 GiB), and to the tmpfs's free space, unless --full.
//   - CPU: daemon CPU time (utime+stime from /proc) over the timed batches,
//     and the CPU time other processes and the hypervisor took meanwhile,
//     so a disturbed measurement says so.
//   - Yardstick: one TCP connection on 127.0.0.1 with 4 MiB writes, best of
//     three, at least 1 GiB; b2bd's GB/s is divided by it from 256 KiB up.
//
// --workload kv (kv.go, kvrun.go) measures one KV-cache request instead:
// --kv-segments segments x --kv-request block ids (drawn without repeats
// from a pool of --kv-pool blocks per segment), moved as one BatchTransfer
// of descriptors over a region spanning the pool and as one TransferBlocks
// between two registered layouts, interleaved per repeat. Every block of
// every segment is verified after each request, and the daemon's non-wire
// phases of the two modes are compared (docs/kv.md).
//
// --workload control (control.go) measures the control path: empty requests
// and prepared submits over gRPC and over the shared-memory ring
// (docs/ring.md), on the same embedded daemons.
//
// --workload paths (paths.go) measures what --transport auto chooses on
// one host: per memory route (host and GPU, both ways, one GPU to itself)
// and size, batches over auto and over every transport, interleaved in
// balanced orders, every transport's batch verified; auto over the fastest
// is the figure (docs/samehost.md, "How auto chooses on one host").
//
// Run writes the table to stdout, a progress bar to stderr when it is a
// terminal, and optionally JSON and an SVG plot.
package bench
