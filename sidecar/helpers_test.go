package sidecar_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/proto/ration/sidecar/v1/sidecarv1connect"
	"github.com/rationhq/ration/sidecar"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// harness is a sidecar.Service on a standalone Limiter and a manual clock,
// served on a loopback port, with the two clients a gateway uses: Envoy's
// (go-control-plane's generated gRPC client, the protocol Envoy speaks) and
// the reserve/settle API's (Connect JSON).
type harness struct {
	clock *fakeclock.Clock
	svc   *sidecar.Service
	url   string
	rls   rlsv3.RateLimitServiceClient
	res   sidecarv1connect.ReservationServiceClient
}

func newHarness(t *testing.T, cfg *sidecar.Config, opts ...sidecar.Option) *harness {
	t.Helper()
	clk := fakeclock.New()
	svc, err := sidecar.New(testkit.Limiter(t, clk), append([]sidecar.Option{sidecar.WithClock(clk)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		svc.SetConfig(cfg)
	}
	mux := http.NewServeMux()
	sidecar.Mount(mux, svc)
	url := testkit.H2C(t, mux)
	conn, err := grpc.NewClient(strings.TrimPrefix(url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	res := sidecarv1connect.NewReservationServiceClient(connect.NewClient(
		connecthttp.NewTransport(http.DefaultClient, url, connecthttp.WithProtoJSON())))
	return &harness{clock: clk, svc: svc, url: url, rls: rlsv3.NewRateLimitServiceClient(conn), res: res}
}

// parseFiles parses the named files of dir as one configuration.
func parseFiles(t *testing.T, dir string, names ...string) (*sidecar.Config, error) {
	t.Helper()
	files := map[string][]byte{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		files[n] = b
	}
	return sidecar.ParseConfig(files)
}

// desc builds a descriptor from "k=v" entries ("k=" for an empty value).
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for _, e := range kv {
		k, v, _ := strings.Cut(e, "=")
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

// withHits sets a descriptor's own hits_addend.
func withHits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func (h *harness) call(t *testing.T, domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s %v): %v", domain, ds, err)
	}
	return res
}
