package sidecar_test

import (
	"encoding/json"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/rationhq/ration/sidecar"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// TestEnvoyExample holds docs/integrations.md's Envoy section. No Envoy
// binary installs here, so examples/envoy/envoy.yaml is decoded strictly
// into go-control-plane's Bootstrap (every field and typed config known)
// and checked by its generated validation; then the calls that its rate
// limit actions make for one streamed request are sent, as Envoy sends
// them, to a sidecar loaded with examples/envoy/ratelimit.
func TestEnvoyExample(t *testing.T) {
	b, err := os.ReadFile("../examples/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("envoy.yaml does not decode into a Bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}

	cfg, err := sidecar.LoadConfig("../examples/envoy/ratelimit")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, cfg)
	key := "api_key=sk-1"
	// The request path: the key's request, and 1000 tokens reserved under
	// the request's x-request-id.
	requestPath := func(id string) []*rlcommon.RateLimitDescriptor {
		return []*rlcommon.RateLimitDescriptor{desc(key), withHits(desc("budget=tokens", key, "ration_reserve="+id), 1000)}
	}
	res := h.call(t, "llm", requestPath("r1")...)
	if res.OverallCode != ok || res.Statuses[0].LimitRemaining != 59 || res.Statuses[1].LimitRemaining != 99000 {
		t.Fatalf("request path: %v", res)
	}
	// Stream done: 230 tokens were used; 770 come back.
	h.call(t, "llm", withHits(desc("budget=tokens", key, "ration_settle=r1"), 230))
	res = h.call(t, "llm", requestPath("r2")...)
	if res.OverallCode != ok || res.Statuses[1].LimitRemaining != 100000-230-1000 {
		t.Fatalf("after the settlement: %v", res)
	}
}
