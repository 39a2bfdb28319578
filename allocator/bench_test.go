package allocator_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// Benchmarks (docs/performance.md has the numbers and the commands). Limits are large so that every key is granted on every call:
// these measure the cost of a call, not the budget.

var benchLimits = ration.Limits{RPM: 1_000_000_000, TPM: 1_000_000_000_000}

func benchKeys(n int, prefix string) []ledger.AcquireKey {
	keys := make([]ledger.AcquireKey, n)
	for i := range keys {
		keys[i] = ledger.AcquireKey{Key: fmt.Sprintf("%s-key-%03d", prefix, i), Limits: benchLimits,
			Want: ration.Amount{Requests: 1, Tokens: 100}, Held: ration.Amount{Requests: 1 << 40, Tokens: 1 << 40},
			SpendRate: ration.Amount{Requests: 60, Tokens: 6000}}
	}
	return keys
}

func benchRequest(n int, prefix string) *leasev1.AcquireRequest {
	req := &leasev1.AcquireRequest{Caller: &leasev1.Caller{Epoch: 1}}
	for _, k := range benchKeys(n, prefix) {
		req.Keys = append(req.Keys, &leasev1.KeyAcquire{Key: k.Key,
			Limits: &leasev1.Limits{Rpm: k.Limits.RPM, Tpm: k.Limits.TPM},
			Want:   &leasev1.Amount{Requests: 1, Tokens: 100}, Held: &leasev1.Amount{Requests: 1 << 40, Tokens: 1 << 40},
			SpendRate: &leasev1.Amount{Requests: 60, Tokens: 6000}})
	}
	return req
}

func reportRates(b *testing.B, keys int, cpu0 time.Duration) {
	s := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)/s, "calls/s")
	b.ReportMetric(float64(b.N*keys)/s, "key-grants/s")
	// CPU time of this process per call (user + system): unlike calls/s,
	// it does not move when other processes share the 2 cores.
	cpu := testkit.CPUTime() - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/call")
	b.ReportMetric(cpu.Seconds()/s, "cores")
}

var spenderIDs atomic.Int64

// BenchmarkLedgerAcquire: the in-process Go API, memory only.
func BenchmarkLedgerAcquire(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			l, err := allocator.New()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu0 := testkit.CPUTime()
			b.RunParallel(func(pb *testing.PB) {
				id := fmt.Sprintf("s%d", spenderIDs.Add(1))
				keys := benchKeys(n, id)
				var seq uint64
				for pb.Next() {
					seq++
					if _, err := l.Acquire(context.Background(), ledger.Caller{SpenderID: id, Epoch: 1, Sequence: seq}, keys); err != nil {
						b.Fatal(err)
					}
				}
			})
			reportRates(b, n, cpu0)
		})
	}
}

// BenchmarkServiceAcquire: the in-process entry point a spender calls
// (proto messages in and out), memory-only and durable (bbolt, fsync).
func BenchmarkServiceAcquire(b *testing.B) {
	for _, durable := range []bool{false, true} {
		for _, n := range []int{1, 64} {
			b.Run(fmt.Sprintf("durable=%v/keys=%d", durable, n), func(b *testing.B) {
				svc := newBenchService(b, durable)
				b.ReportAllocs()
				b.SetParallelism(16)
				cpu0 := testkit.CPUTime()
				b.RunParallel(func(pb *testing.PB) {
					id := fmt.Sprintf("s%d", spenderIDs.Add(1))
					req := benchRequest(n, id)
					req.Caller.SpenderId = id
					for pb.Next() {
						req.Caller.Sequence++
						if _, err := svc.Acquire(context.Background(), req); err != nil {
							b.Fatal(err)
						}
					}
				})
				reportRates(b, n, cpu0)
			})
		}
	}
}

func newBenchService(b *testing.B, durable bool) *allocator.Service {
	b.Helper()
	var l *allocator.Ledger
	var err error
	if durable {
		var commits, total atomic.Int64
		l, err = allocator.Open(filepath.Join(b.TempDir(), "bench.db"), allocator.WithCommitLinger(*benchLinger), allocator.WithCommitObserver(func(d time.Duration, _ error) {
			commits.Add(1)
			total.Add(int64(d))
		}))
		b.Cleanup(func() {
			if n := commits.Load(); n > 0 {
				b.ReportMetric(float64(b.N)/float64(n), "calls/commit")
				b.ReportMetric(float64(total.Load())/float64(n)/1e6, "ms/commit")
			}
		})
	} else {
		l, err = allocator.New()
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return allocator.NewService(l)
}

// echoService answers every Acquire with one prebuilt reply: a real
// allocator reply for the same request shape, so the bytes on the wire (and
// the framework's marshaling work) are the same as the allocator's, while
// the handler itself does nothing.
type echoService struct {
	leasev1connect.UnimplementedLeaseServiceHandler
	reply *leasev1.AcquireResponse
}

func newEchoService(b *testing.B, n int) echoService {
	b.Helper()
	req := benchRequest(n, "template")
	req.Caller.SpenderId, req.Caller.Sequence = "template", 1
	reply, err := newBenchService(b, false).Acquire(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	return echoService{reply: reply}
}

func (e echoService) Acquire(context.Context, *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	return e.reply, nil
}

func serveLoopback(b *testing.B, h leasev1connect.LeaseServiceHandler) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	serveOn(b, ln, h)
	return "http://" + ln.Addr().String()
}

// serveOn serves h's lease API on ln over HTTP/1.1 and h2c until b ends.
func serveOn(b *testing.B, ln net.Listener, h leasev1connect.LeaseServiceHandler) {
	// The production wiring (cmd/allocator mounts the same way), for echo
	// and the allocator alike.
	mux := http.NewServeMux()
	allocator.Mount(mux, h)
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	// As cmd/allocator: a durable reply waits for its commit, so a
	// connection needs more concurrent streams than the default 100.
	srv := &http.Server{Handler: mux, Protocols: p, HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 1024}}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
}

// loopbackCallers callers run concurrently, whatever GOMAXPROCS: enough
// that both handlers are throughput-bound, so the comparison measures cost
// per call rather than the fsync latency a durable reply must wait for
// (with 32 callers, a durable service does at most 32 calls per fsync).
const loopbackCallers = 256

// benchLinger is the durable services' commit linger (cmd/allocator's
// -commit-linger; its default is 8 ms).
var benchLinger = flag.Duration("bench.linger", 8*time.Millisecond, "commit linger of the durable benchmark services")

// loopbackExtraProcs is how many Ps the allocator runs with beyond the
// -cpu value in BenchmarkLoopback. 0 (the default) is production:
// cmd/allocator leaves GOMAXPROCS to the runtime, and echo runs at -cpu
// too; 1 gives the allocator a P beyond the cores, to cover fsync waits.
var loopbackExtraProcs = flag.Int("loopback.extraprocs", 0, "Ps the allocator runs with beyond -cpu (0: as cmd/allocator)")

// loopbackConns is the number of client connections the callers share.
const loopbackConns = 8

// BenchmarkLoopback compares durable Acquire over loopback h2c with the
// echo handler, for the Connect and gRPC protocols, 1 and 64 keys a call.
func BenchmarkLoopback(b *testing.B) {
	for _, proto := range []string{"connect", "grpc"} {
		for _, n := range []int{1, 64} {
			for _, handler := range []string{"echo", "allocator"} {
				b.Run(fmt.Sprintf("%s/keys=%d/%s", proto, n, handler), func(b *testing.B) {
					var h leasev1connect.LeaseServiceHandler = newEchoService(b, n)
					if handler == "allocator" {
						h = newBenchService(b, true)
						if *loopbackExtraProcs < 0 {
							b.Fatalf("-loopback.extraprocs %d: want 0 or more", *loopbackExtraProcs)
						}
						if *loopbackExtraProcs > 0 {
							prev := runtime.GOMAXPROCS(0)
							runtime.GOMAXPROCS(prev + *loopbackExtraProcs)
							defer runtime.GOMAXPROCS(prev)
						}
					}
					base := serveLoopback(b, h)
					var opts []connecthttp.Option
					if proto == "grpc" {
						opts = append(opts, connecthttp.WithGRPC())
					}
					// One h2c connection per group of callers, as gateways
					// each have their own.
					clients := make([]leasev1connect.LeaseServiceClient, loopbackConns)
					for i := range clients {
						hp := new(http.Protocols)
						hp.SetUnencryptedHTTP2(true)
						hc := &http.Client{Transport: &http.Transport{Protocols: hp}}
						clients[i] = leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(hc, base, opts...)))
					}
					// A fixed number of callers (not RunParallel's multiple
					// of GOMAXPROCS), so that echo and the allocator see the
					// same load at different GOMAXPROCS.
					reqs := make([]*leasev1.AcquireRequest, loopbackCallers)
					for i := range reqs {
						id := fmt.Sprintf("s%d", spenderIDs.Add(1))
						reqs[i] = benchRequest(n, id)
						reqs[i].Caller.SpenderId = id
					}
					var left atomic.Int64
					left.Store(int64(b.N))
					var wg sync.WaitGroup
					b.ResetTimer()
					cpu0 := testkit.CPUTime()
					for i, req := range reqs {
						client := clients[i%len(clients)]
						wg.Go(func() {
							for left.Add(-1) >= 0 {
								req.Caller.Sequence++
								if _, err := client.Acquire(context.Background(), req); err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					wg.Wait()
					b.StopTimer()
					reportRates(b, n, cpu0)
					b.ReportMetric(float64(runtime.GOMAXPROCS(0)), "procs")
				})
			}
		}
	}
}
