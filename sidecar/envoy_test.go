package sidecar_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/rationhq/ration/sidecar"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// step is n identical calls, each expected to answer want.
type step struct {
	domain string
	descs  [][]string // each descriptor's "k=v" entries
	n      int
	want   rlsv3.RateLimitResponse_Code
}

// TestReadmeExamples enforces envoyproxy/ratelimit's documented example
// configurations (testdata/ratelimit-readme, each file on its own) through
// go-control-plane's gRPC client: the limits, the matching rules (most
// specific first, depth must match, wildcards), unlimited, shadow_mode,
// replaces, share_threshold and a blocked value. The clock stands still,
// so every budget is exactly its configured number of hits.
func TestReadmeExamples(t *testing.T) {
	d := func(kv ...string) []string { return kv }
	cases := []struct {
		file  string
		steps []step
	}{
		{"example1.yaml", []step{
			{"mongo_cps", [][]string{d("database=users")}, 500, ok},
			{"mongo_cps", [][]string{d("database=users")}, 1, over},
			{"mongo_cps", [][]string{d("database=default")}, 500, ok}, // a budget of its own
			{"mongo_cps", [][]string{d("database=other")}, 1000, ok},  // no rule
		}},
		{"example2.yaml", []step{
			{"messaging", [][]string{d("message_type=marketing", "to_number=2061111111")}, 5, ok},
			{"messaging", [][]string{d("message_type=marketing", "to_number=2061111111")}, 1, over},
			{"messaging", [][]string{d("message_type=marketing", "to_number=2062222222")}, 5, ok}, // each number its own
			{"messaging", [][]string{d("to_number=2061111111")}, 100, ok},
			{"messaging", [][]string{d("to_number=2061111111")}, 1, over},
		}},
		{"example3.yaml", []step{
			{"edge_proxy_per_ip", [][]string{d("remote_address=50.0.0.1")}, 10, ok},
			{"edge_proxy_per_ip", [][]string{d("remote_address=50.0.0.1")}, 1, over},
			{"edge_proxy_per_ip", [][]string{d("remote_address=50.0.0.5")}, 1, over}, // requests_per_unit 0: blocked
		}},
		{"example4a.yaml", []step{
			{"example4", [][]string{d("key=value", "subkey=subvalue")}, 400, ok}, // deeper than the rule: no limit
			{"example4", [][]string{d("key=value")}, 300, ok},
			{"example4", [][]string{d("key=value")}, 1, over},
		}},
		{"example4b.yaml", []step{
			{"example4", [][]string{d("key=value", "subkey=subvalue")}, 300, ok},
			{"example4", [][]string{d("key=value", "subkey=subvalue")}, 1, over},
			{"example4", [][]string{d("key=value")}, 400, ok}, // no rule at that level
		}},
		{"example5.yaml", []step{
			{"internal", [][]string{d("ldap=x")}, 1000, ok},
			{"internal", [][]string{d("azure=x")}, 100, ok},
			{"internal", [][]string{d("azure=x")}, 1, over},
		}},
		{"example6.yaml", []step{
			{"example6", [][]string{d("service=auth-service", "user=user-a")}, 30, ok}, // shadow_mode: never refused
			{"example6", [][]string{d("service=auth-service", "user=user-b")}, 20, ok},
			{"example6", [][]string{d("service=auth-service", "user=user-b")}, 1, over},
		}},
		{"example7.yaml", []step{
			// Both rules match: the 10/s one replaces the 5/s one, which is not charged.
			{"example7", [][]string{d("key_1=value_1", "user=bkthomps"), d("key_2=value_2", "user=bkthomps")}, 10, ok},
			{"example7", [][]string{d("key_1=value_1", "user=bkthomps"), d("key_2=value_2", "user=bkthomps")}, 1, over},
			{"example7", [][]string{d("key_1=value_1", "user=bkthomps")}, 5, ok},
			{"example7", [][]string{d("key_1=value_1", "user=bkthomps")}, 1, over},
		}},
		{"example8.yaml", []step{
			{"example8", [][]string{d("key1=unspecified_value")}, 10, ok},
			{"example8", [][]string{d("key1=unspecified_value")}, 1, over},
			{"example8", [][]string{d("key1=value1")}, 20, ok},
			{"example8", [][]string{d("key1=value1")}, 1, over},
		}},
		{"example9a.yaml", []step{
			{"example9", [][]string{d("key1=value1")}, 20, ok},
			{"example9", [][]string{d("key1=value1")}, 1, over},
			{"example9", [][]string{d("key1=valueXYZ")}, 20, ok}, // each matched value its own budget
			{"example9", [][]string{d("key1=other")}, 100, ok},   // no match
		}},
		{"example9b.yaml", []step{
			{"example9", [][]string{d("path=/api/123/action")}, 20, ok},
			{"example9", [][]string{d("path=/api/123/action")}, 1, over},
			{"example9", [][]string{d("path=/api/123/other")}, 100, ok},
		}},
		{"example9c.yaml", []step{
			{"example9", [][]string{d("route=/api/v1/resource/123/action")}, 20, ok},
			{"example9", [][]string{d("route=/api/v1/resource/123/action")}, 1, over},
			{"example9", [][]string{d("route=/api/v1/other/123/action")}, 100, ok},
		}},
		{"example10a.yaml", []step{
			{"example10", [][]string{d("route=api", "http_method=GET", "subject_id=123")}, 60, ok},
			{"example10", [][]string{d("route=api", "http_method=GET", "subject_id=123")}, 1, over},
			{"example10", [][]string{d("route=web", "http_method=POST", "subject_id=456")}, 60, ok},
		}},
		{"example10b.yaml", []step{
			{"example10_wildcard", [][]string{d("user=alice", "action=readfile", "resource=documents")}, 100, ok},
			{"example10_wildcard", [][]string{d("user=alice", "action=readfile", "resource=documents")}, 1, over},
			{"example10_wildcard", [][]string{d("user=alice", "action=write", "resource=documents")}, 200, ok},
		}},
		{"example11a.yaml", []step{
			{"example11", [][]string{d("files=files/a.pdf")}, 5, ok},
			{"example11", [][]string{d("files=files/b.csv")}, 5, ok},
			{"example11", [][]string{d("files=files/c.txt")}, 1, over}, // one shared budget of 10
			{"example11", [][]string{d("files_no_share=files_no_share/a.pdf")}, 10, ok},
			{"example11", [][]string{d("files_no_share=files_no_share/a.pdf")}, 1, over},
			{"example11", [][]string{d("files_no_share=files_no_share/b.csv")}, 10, ok},
		}},
		{"example11b.yaml", []step{
			{"example11_metrics", [][]string{d("route=api/v1", "method=GET")}, 30, ok},
			{"example11_metrics", [][]string{d("route=api/v2", "method=GET")}, 30, ok},
			{"example11_metrics", [][]string{d("route=api/v3", "method=GET")}, 1, over},
		}},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			cfg, err := parseFiles(t, "testdata/ratelimit-readme", c.file)
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, cfg)
			for si, s := range c.steps {
				ds := make([]*rlcommon.RateLimitDescriptor, len(s.descs))
				for i := 0; i < s.n; i++ {
					for j, e := range s.descs {
						ds[j] = desc(e...)
					}
					if got := h.call(t, s.domain, ds...).OverallCode; got != s.want {
						t.Fatalf("step %d %v, call %d of %d: %v, want %v", si, s.descs, i+1, s.n, got, s.want)
					}
				}
			}
		})
	}
}

// TestRepositoryExampleRefused: the repository's own example uses
// quota_mode, which ration does not enforce; the load says so and names
// the descriptor.
func TestRepositoryExampleRefused(t *testing.T) {
	_, err := parseFiles(t, "testdata/ratelimit-readme", "example.yaml")
	if !errors.Is(err, sidecar.ErrConfig) || !strings.Contains(err.Error(), "quota_mode is not supported") ||
		!strings.Contains(err.Error(), "rl.service_service_1") {
		t.Fatalf("err = %v", err)
	}
}

// TestConfigRefusals: what envoyproxy/ratelimit refuses, and what ration
// cannot hold, is refused with the file and the reason.
func TestConfigRefusals(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"descriptors: []", "the domain is empty"},
		{"domain: d\nbogus: 1", "field bogus not found"},
		{"domain: d\ndescriptors: [{value: v}]", "empty key"},
		{"domain: d\ndescriptors: [{key: k}, {key: k}]", `duplicate descriptor "d.k"`},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unit: fortnight, requests_per_unit: 1}}]", "invalid rate limit unit"},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unit: month, requests_per_unit: 1}}]", "ration's longest window is a week"},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unlimited: true, unit: second}}]", "has no unit"},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {name: a, replaces: [{name: a}], unit: second}}]", "own name"},
		{"domain: d\ndescriptors: [{key: k, share_threshold: true, rate_limit: {unit: second}}]", "needs a wildcard"},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: -1}}]", "cannot unmarshal"},
	} {
		_, err := sidecar.ParseConfig(map[string][]byte{"f.yaml": []byte(c.yaml)})
		if !errors.Is(err, sidecar.ErrConfig) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "f.yaml") {
			t.Errorf("%q: err = %v, want %q", c.yaml, err, c.want)
		}
	}
	two := map[string][]byte{"a.yaml": []byte("domain: d"), "b.yaml": []byte("domain: d")}
	if _, err := sidecar.ParseConfig(two); err == nil || !strings.Contains(err.Error(), "another file") {
		t.Errorf("a domain in two files: err = %v", err)
	}
}

var perMinute = mustConfig(`
domain: gw
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 5}
`)

func mustConfig(y string) *sidecar.Config {
	c, err := sidecar.ParseConfig(map[string][]byte{"c.yaml": []byte(y)})
	if err != nil {
		panic(err)
	}
	return c
}

// TestOverLimitWaitIsHonoured: OVER_LIMIT carries duration_until_reset,
// the exact wait after which the same request is admitted (and the
// Retry-After header, rounded up to seconds, for the filter to pass on);
// one instant earlier it is still refused.
func TestOverLimitWaitIsHonoured(t *testing.T) {
	h := newHarness(t, perMinute)
	for range 60 {
		h.call(t, "gw", desc("api_key=k1"))
	}
	res := h.call(t, "gw", desc("api_key=k1"))
	st := res.Statuses[0]
	if res.OverallCode != over || st.Code != over || st.CurrentLimit.GetRequestsPerUnit() != 60 ||
		st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.LimitRemaining != 0 {
		t.Fatalf("61st request: %v", res)
	}
	wait := st.DurationUntilReset.AsDuration()
	if wait != time.Second { // one request's refill at 60 per minute
		t.Fatalf("duration_until_reset = %v, want 1s", wait)
	}
	if hdr := res.ResponseHeadersToAdd; len(hdr) != 1 || hdr[0].Key != "retry-after" || hdr[0].Value != "1" {
		t.Fatalf("headers = %v", hdr)
	}
	h.clock.Advance(wait - time.Microsecond)
	if got := h.call(t, "gw", desc("api_key=k1")).OverallCode; got != over {
		t.Fatalf("1µs before the wait: %v", got)
	}
	h.clock.Advance(time.Microsecond)
	res = h.call(t, "gw", desc("api_key=k1"))
	if res.OverallCode != ok || res.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 60 {
		t.Fatalf("after the wait: %v", res)
	}
	// A per-day budget's wait is in hours: 5 a day, one back every 4.8 h.
	for range 5 {
		h.call(t, "gw", desc("daily=k1"))
	}
	res = h.call(t, "gw", desc("daily=k1"))
	if got := res.Statuses[0].DurationUntilReset.AsDuration(); res.OverallCode != over || got != 24*time.Hour/5 {
		t.Fatalf("per-day: %v, wait %v", res.OverallCode, got)
	}
}

// TestHitsAddend: the request's hits_addend is each descriptor's cost, a
// descriptor's own hits_addend overrides it, and a cost above the limit
// is refused without a wait (it never fits).
func TestHitsAddend(t *testing.T) {
	h := newHarness(t, perMinute)
	ctx := context.Background()
	res, err := h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "gw", HitsAddend: 400,
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("tokens=k1"), withHits(desc("api_key=k1"), 1)}})
	if err != nil {
		t.Fatal(err)
	}
	if res.OverallCode != ok || res.Statuses[0].LimitRemaining != 600 || res.Statuses[1].LimitRemaining != 59 {
		t.Fatalf("400 tokens and 1 request: %v", res)
	}
	res = h.call(t, "gw", withHits(desc("tokens=k1"), 700), withHits(desc("api_key=k1"), 1))
	if res.OverallCode != over || res.Statuses[0].Code != over || res.Statuses[1].Code != ok ||
		res.Statuses[0].DurationUntilReset.AsDuration() != 6*time.Second { // 100 tokens at 1000/min
		t.Fatalf("700 more tokens: %v", res)
	}
	// All or nothing: the refused request charged neither budget.
	res = h.call(t, "gw", withHits(desc("tokens=k1"), 600), withHits(desc("api_key=k1"), 1))
	if res.OverallCode != ok || res.Statuses[0].LimitRemaining != 0 || res.Statuses[1].LimitRemaining != 58 {
		t.Fatalf("600 tokens: %v", res)
	}
	res = h.call(t, "gw", withHits(desc("tokens=k2"), 1001))
	if res.OverallCode != over || res.Statuses[0].DurationUntilReset != nil || len(res.ResponseHeadersToAdd) != 0 {
		t.Fatalf("1001 tokens against 1000: %v", res)
	}
	// hits_addend 0 asks without charging: OK while the budget is not in debt.
	if res := h.call(t, "gw", withHits(desc("tokens=k1"), 0)); res.OverallCode != ok || res.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("a check: %v", res)
	}
}

// TestUnlimitedAndUnmatched: an unlimited rule answers OK with the
// largest remaining, as envoyproxy/ratelimit does; a descriptor no rule
// matches (or an unknown domain) answers OK with no limit.
func TestUnlimitedAndUnmatched(t *testing.T) {
	cfg, err := parseFiles(t, "testdata/ratelimit-readme", "example5.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, cfg)
	res := h.call(t, "internal", desc("ldap=x"), desc("nothing=y"))
	if res.Statuses[0].LimitRemaining != math.MaxUint32 || res.Statuses[0].CurrentLimit != nil || res.Statuses[1].CurrentLimit != nil {
		t.Fatalf("%v", res)
	}
	if res := h.call(t, "unknown", desc("azure=x")); res.OverallCode != ok || res.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unknown domain: %v", res)
	}
}

// TestBadRequests: what envoyproxy/ratelimit answers with an error, and
// what exceeds the sidecar's bounds, is INVALID_ARGUMENT with a reason
// and charges nothing; without a configuration the service is
// UNAVAILABLE.
func TestBadRequests(t *testing.T) {
	h := newHarness(t, perMinute)
	ctx := context.Background()
	many := make([]*rlcommon.RateLimitDescriptor, 65)
	for i := range many {
		many[i] = desc("api_key=k")
	}
	for _, c := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{&rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key=k")}}, "domain must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "gw"}, "descriptor list must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "gw", Descriptors: many}, "at most 64"},
		{&rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*rlcommon.RateLimitDescriptor{
			desc("api_key=k", "ration_reserve=a", "ration_settle=a")}}, "more than one"},
		{&rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key=k", "ration_reserve=")}}, "want 1 to 256 bytes"},
	} {
		_, err := h.rls.ShouldRateLimit(ctx, c.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want InvalidArgument %q", c.req, err, c.want)
		}
	}
	if res := h.call(t, "gw", desc("api_key=k")); res.Statuses[0].LimitRemaining != 59 {
		t.Fatalf("the bad requests charged something: %v", res)
	}
	bare := newHarness(t, nil)
	if _, err := bare.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "gw",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key=k")}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("no configuration: %v", err)
	}
}

// TestStreamDonePairs: a request's call with ration_reserve=ID reserves
// its estimate at once (a concurrent request sees it); the stream-end
// call with ration_settle=ID settles it with the actual usage. A
// stream-end call that matches nothing is charged after the fact, as debt
// the next requests wait off; a reservation never settled is settled at
// its reserved cost after the hold time.
func TestStreamDonePairs(t *testing.T) {
	h := newHarness(t, perMinute, sidecar.WithHold(time.Minute))
	// Request 1 reserves 800 tokens; request 2 (concurrent) finds 200 left.
	if res := h.call(t, "gw", withHits(desc("tokens=k1", "ration_reserve=req-1"), 800)); res.OverallCode != ok || res.Statuses[0].LimitRemaining != 200 {
		t.Fatalf("reserve: %v", res)
	}
	if res := h.call(t, "gw", withHits(desc("tokens=k1", "ration_reserve=req-2"), 300)); res.OverallCode != over {
		t.Fatalf("a concurrent request slipped through: %v", res)
	}
	if h.svc.Open() != 1 {
		t.Fatalf("open = %d, want 1", h.svc.Open())
	}
	// Request 1 used 300: 500 come back.
	h.call(t, "gw", withHits(desc("tokens=k1", "ration_settle=req-1"), 300))
	if res := h.call(t, "gw", withHits(desc("tokens=k1"), 0)); res.Statuses[0].LimitRemaining != 700 {
		t.Fatalf("after the settlement: %v", res)
	}
	if h.svc.Open() != 0 {
		t.Fatalf("open = %d after the settlement", h.svc.Open())
	}
	// A settlement nobody reserved: 900 charged after the fact, 200 of
	// them as debt; a check waits it off (200 tokens at 1000/min: 12s).
	h.call(t, "gw", withHits(desc("tokens=k1", "ration_settle=unknown"), 900))
	res := h.call(t, "gw", withHits(desc("tokens=k1"), 0))
	if res.OverallCode != over || res.Statuses[0].DurationUntilReset.AsDuration() != 12*time.Second {
		t.Fatalf("after a post-hoc charge: %v", res)
	}
	h.clock.Advance(12 * time.Second)
	// A reservation left open is settled at its reserved cost after the hold.
	h.call(t, "gw", withHits(desc("tokens=k2", "ration_reserve=req-3"), 400))
	h.clock.Advance(time.Minute)
	waitOpen(t, h.svc, 0)
	if res := h.call(t, "gw", withHits(desc("tokens=k2"), 0)); res.Statuses[0].LimitRemaining != 600+400 {
		// 400 back by refill over the minute: the charge stood, nothing more.
		t.Fatalf("after the hold: %v", res)
	}
	// A refund (is_negative_hits) of what the pair reserved: usage = reserved - refund.
	h.call(t, "gw", withHits(desc("tokens=k3", "ration_reserve=req-4"), 1000))
	neg := withHits(desc("tokens=k3", "ration_settle=req-4"), 750)
	neg.IsNegativeHits = true
	h.call(t, "gw", neg)
	if res := h.call(t, "gw", withHits(desc("tokens=k3"), 0)); res.Statuses[0].LimitRemaining != 750 {
		t.Fatalf("after a refund of 750: %v", res)
	}
}

// waitOpen waits until svc holds n reservations (an expiry runs on the
// clock's timer goroutine).
func waitOpen(t *testing.T, svc *sidecar.Service, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for svc.Open() != n {
		if time.Now().After(deadline) {
			t.Fatalf("open = %d, want %d", svc.Open(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestConnectCarriesEnvoyMessages: the same method answers the Connect
// protocol's JSON, for a curl user debugging a configuration.
func TestConnectCarriesEnvoyMessages(t *testing.T) {
	h := newHarness(t, perMinute)
	code, body := postJSON(t, h.url+sidecar.ShouldRateLimitProcedure,
		`{"domain":"gw","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}]}`)
	if code != 200 || !strings.Contains(body, `"overallCode":"OK"`) || !strings.Contains(body, `"limitRemaining":59`) {
		t.Fatalf("%d %s", code, body)
	}
}
