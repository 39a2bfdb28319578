package allocator_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	"github.com/rationhq/ration/allocator"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// Benchmarks (docs/results.md "## Allocator" records the numbers and the
// commands). Limits are large so that every key is granted on every call:
// these measure the cost of a call, not the budget.

var benchLimits = allocator.Limits{RPM: 1_000_000_000, TPM: 1_000_000_000_000}

func benchKeys(n int, prefix string) []allocator.AcquireKey {
	keys := make([]allocator.AcquireKey, n)
	for i := range keys {
		keys[i] = allocator.AcquireKey{Key: fmt.Sprintf("%s-key-%03d", prefix, i), Limits: benchLimits,
			Want: allocator.Amount{Requests: 1, Tokens: 100}, Held: allocator.Amount{Requests: 1 << 40, Tokens: 1 << 40},
			SpendRate: allocator.Amount{Requests: 60, Tokens: 6000}}
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

func reportRates(b *testing.B, keys int) {
	s := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)/s, "calls/s")
	b.ReportMetric(float64(b.N*keys)/s, "key-grants/s")
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
			b.RunParallel(func(pb *testing.PB) {
				id := fmt.Sprintf("s%d", spenderIDs.Add(1))
				keys := benchKeys(n, id)
				var seq uint64
				for pb.Next() {
					seq++
					if _, err := l.Acquire(context.Background(), allocator.Caller{SpenderID: id, Epoch: 1, Sequence: seq}, keys); err != nil {
						b.Fatal(err)
					}
				}
			})
			reportRates(b, n)
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
				reportRates(b, n)
			})
		}
	}
}

func newBenchService(b *testing.B, durable bool) *allocator.Service {
	b.Helper()
	var l *allocator.Ledger
	var err error
	if durable {
		l, err = allocator.Open(filepath.Join(b.TempDir(), "bench.db"))
	} else {
		l, err = allocator.New()
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return allocator.NewService(l)
}

// echoService answers Acquire with a reply of the same shape, doing no
// work: the framework's cost for the same messages.
type echoService struct {
	leasev1connect.UnimplementedLeaseServiceHandler
}

func (echoService) Acquire(_ context.Context, req *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	out := &leasev1.AcquireResponse{LeaseTtlUs: 10_000_000, Keys: make([]*leasev1.KeyGrant, len(req.GetKeys()))}
	for i, k := range req.GetKeys() {
		out.Keys[i] = &leasev1.KeyGrant{Status: leasev1.GrantStatus_GRANT_STATUS_OK, Granted: k.GetWant(), Returned: &leasev1.Amount{},
			Held: k.GetWant(), Snapshot: &leasev1.Snapshot{Requests: &leasev1.DimSnapshot{Limit: 1}, Tokens: &leasev1.DimSnapshot{Limit: 1}},
			ActiveSpenders: 1}
	}
	return out, nil
}

func serveLoopback(b *testing.B, h leasev1connect.LeaseServiceHandler) string {
	b.Helper()
	cs := connect.NewServer()
	leasev1connect.RegisterLeaseServiceHandler(cs, h)
	mux := http.NewServeMux()
	connecthttp.Mount(mux, cs)
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// BenchmarkLoopback compares durable Acquire over loopback h2c with the
// echo handler, for the Connect and gRPC protocols, 1 and 64 keys a call,
// 32 concurrent callers (SetParallelism 16 on 2 cores).
func BenchmarkLoopback(b *testing.B) {
	for _, proto := range []string{"connect", "grpc"} {
		for _, n := range []int{1, 64} {
			for _, handler := range []string{"echo", "allocator"} {
				b.Run(fmt.Sprintf("%s/keys=%d/%s", proto, n, handler), func(b *testing.B) {
					var h leasev1connect.LeaseServiceHandler = echoService{}
					if handler == "allocator" {
						h = newBenchService(b, true)
					}
					base := serveLoopback(b, h)
					var opts []connecthttp.Option
					if proto == "grpc" {
						opts = append(opts, connecthttp.WithGRPC())
					}
					hp := new(http.Protocols)
					hp.SetUnencryptedHTTP2(true)
					hc := &http.Client{Transport: &http.Transport{Protocols: hp}}
					client := leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(hc, base, opts...)))
					b.SetParallelism(16)
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						id := fmt.Sprintf("s%d", spenderIDs.Add(1))
						req := benchRequest(n, id)
						req.Caller.SpenderId = id
						for pb.Next() {
							req.Caller.Sequence++
							if _, err := client.Acquire(context.Background(), req); err != nil {
								b.Fatal(err)
							}
						}
					})
					reportRates(b, n)
				})
			}
		}
	}
}
